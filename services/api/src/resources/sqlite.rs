//! The embedded resource authority (decision 0020): rooms, projects, members, documents, the
//! link journal and private selections in one SQLite database, for `corral up` and the tests.
//! `corral resources` administers it; the API reads it and links outputs into it. A platform
//! with its own rooms implements the HTTP contract instead ([`super::http`]).
//!
//! The model:
//! - A room's audience is its direct members and the members of its project; its version goes
//!   up whenever either changes (a member added or removed, the room moved to a project).
//! - A document version is a row: a reference, the root every version of it shares, its version,
//!   kind, processing state, digest, media type, size, display name and owner. A revoked
//!   document is readable by nobody.
//! - The link journal orders every link into a room by position; a room's files are its linked
//!   documents (in a private chat, every attachment of the conversation). A new version of a
//!   linked document is linked beside the old one, which stays active.
//! - A selection binds a member's private document to a room without linking it.
//!
//! A member reads a document they own, or one linked into a room whose audience has them.

use std::path::Path;
use std::sync::{Arc, Mutex};

use corral_core::projection::{Audience, Document, Kind, Processing};
use rusqlite::{Connection, OptionalExtension as _, Transaction, params};

use super::{
    AuthorityError, Documents, Journal, JournalQuery, Link, LinkRequest, Linked, RoomQuery, Scope,
    ScopeQuery, SelectionQuery,
};

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA foreign_keys = ON;
CREATE TABLE IF NOT EXISTS projects (id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS project_members (
    project TEXT NOT NULL REFERENCES projects(id), member TEXT NOT NULL,
    PRIMARY KEY (project, member));
CREATE TABLE IF NOT EXISTS rooms (
    id TEXT PRIMARY KEY, project TEXT REFERENCES projects(id),
    audience_version INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS room_members (
    room TEXT NOT NULL REFERENCES rooms(id), member TEXT NOT NULL,
    PRIMARY KEY (room, member));
CREATE TABLE IF NOT EXISTS documents (
    reference TEXT PRIMARY KEY, root TEXT NOT NULL, version INTEGER NOT NULL,
    kind TEXT NOT NULL, processing TEXT NOT NULL, revoked INTEGER NOT NULL DEFAULT 0,
    digest TEXT NOT NULL, media_type TEXT NOT NULL, size INTEGER NOT NULL,
    name TEXT NOT NULL, owner TEXT NOT NULL,
    UNIQUE (root, version));
CREATE TABLE IF NOT EXISTS links (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    room TEXT NOT NULL REFERENCES rooms(id), reference TEXT NOT NULL REFERENCES documents(reference),
    turn TEXT, member TEXT,
    UNIQUE (room, reference));
CREATE TABLE IF NOT EXISTS selections (
    room TEXT NOT NULL REFERENCES rooms(id), member TEXT NOT NULL,
    reference TEXT NOT NULL REFERENCES documents(reference),
    PRIMARY KEY (room, member, reference));
";

/// The audience of `?1`, in one query: the version and every active member, direct or through
/// the room's project (one row per member; one row with a null member for an empty room).
const AUDIENCE: &str = "
SELECT r.audience_version, m.member FROM rooms r
LEFT JOIN (
    SELECT room, member FROM room_members WHERE room = ?1
    UNION
    SELECT r2.id, pm.member FROM rooms r2 JOIN project_members pm ON pm.project = r2.project
    WHERE r2.id = ?1
) m ON m.room = r.id
WHERE r.id = ?1";

const DOCUMENT_COLUMNS: &str = "d.reference, d.root, d.version, d.kind, d.processing, d.revoked, d.digest, d.media_type, \
     d.size, d.name, d.owner";

/// The embedded authority.
#[derive(Clone, Debug)]
pub struct Embedded {
    db: Arc<Mutex<Connection>>,
}

fn failed(error: &rusqlite::Error) -> AuthorityError {
    AuthorityError::Unreachable(format!("the embedded authority: {error}"))
}

fn kind_text(kind: Kind) -> &'static str {
    match kind {
        Kind::Document => "document",
        Kind::Artifact => "artifact",
        Kind::Output => "output",
    }
}

fn kind_of(text: &str) -> Kind {
    match text {
        "artifact" => Kind::Artifact,
        "output" => Kind::Output,
        _ => Kind::Document,
    }
}

/// `ready`, `processing` or `failed`.
#[must_use]
pub fn processing_text(processing: Processing) -> &'static str {
    match processing {
        Processing::Ready => "ready",
        Processing::Processing => "processing",
        Processing::Failed => "failed",
    }
}

/// The processing state `text` names.
///
/// # Errors
/// Anything but `ready`, `processing` or `failed`.
pub fn processing_of(text: &str) -> Result<Processing, String> {
    match text {
        "ready" => Ok(Processing::Ready),
        "processing" => Ok(Processing::Processing),
        "failed" => Ok(Processing::Failed),
        other => Err(format!(
            "{other:?}: a processing state is ready, processing or failed"
        )),
    }
}

/// A document row, with whether `member` may read it given `audience`.
struct Row {
    doc: Document,
    revoked: bool,
    owner: String,
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let kind: String = r.get(3)?;
    let processing: String = r.get(4)?;
    Ok(Row {
        doc: Document {
            reference: r.get(0)?,
            root: r.get(1)?,
            version: r.get(2)?,
            kind: kind_of(&kind),
            processing: processing_of(&processing).unwrap_or(Processing::Failed),
            readable: false,
            digest: r.get(6)?,
            media_type: r.get(7)?,
            size: r.get(8)?,
            name: r.get(9)?,
        },
        revoked: r.get::<_, i64>(5)? != 0,
        owner: r.get(10)?,
    })
}

fn audience(tx: &Transaction<'_>, room: &str) -> rusqlite::Result<Option<Audience>> {
    let mut statement = tx.prepare_cached(AUDIENCE)?;
    let rows: Vec<(u64, Option<String>)> = statement
        .query_map(params![room], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let Some((version, _)) = rows.first() else {
        return Ok(None);
    };
    Ok(Some(Audience {
        version: *version,
        members: rows.iter().filter_map(|(_, m)| m.clone()).collect(),
    }))
}

/// Whether `member` reads `row`: not revoked, and theirs or linked into a room they are in.
fn reads(tx: &Transaction<'_>, member: &str, row: &Row) -> rusqlite::Result<bool> {
    if row.revoked {
        return Ok(false);
    }
    if row.owner == member {
        return Ok(true);
    }
    let rooms: Vec<String> = tx
        .prepare_cached("SELECT room FROM links WHERE reference = ?1")?
        .query_map(params![row.doc.reference], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for room in rooms {
        if audience(tx, &room)?.is_some_and(|a| a.members.contains(member)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The documents linked into `room`, by position.
fn linked_rows(tx: &Transaction<'_>, room: &str) -> rusqlite::Result<Vec<Row>> {
    tx.prepare_cached(&format!(
        "SELECT {DOCUMENT_COLUMNS} FROM links l JOIN documents d ON d.reference = l.reference \
         WHERE l.room = ?1 ORDER BY l.position"
    ))?
    .query_map(params![room], row)?
    .collect()
}

/// The turn's documents: the room's linked ones by position, then each retrieved one not among
/// them (those the authority does not know are left out), each judged readable under `member`.
fn turn_documents(
    tx: &Transaction<'_>,
    room: &str,
    member: &str,
    retrieved: &[String],
) -> rusqlite::Result<Vec<Document>> {
    let mut rows = linked_rows(tx, room)?;
    for reference in retrieved {
        if rows.iter().any(|r| &r.doc.reference == reference) {
            continue;
        }
        let found = tx
            .prepare_cached(&format!(
                "SELECT {DOCUMENT_COLUMNS} FROM documents d WHERE d.reference = ?1"
            ))?
            .query_row(params![reference], row)
            .optional()?;
        rows.extend(found);
    }
    let mut documents = Vec::with_capacity(rows.len());
    for mut r in rows {
        r.doc.readable = reads(tx, member, &r)?;
        documents.push(r.doc);
    }
    Ok(documents)
}

fn position(tx: &Transaction<'_>) -> rusqlite::Result<u64> {
    tx.query_row("SELECT COALESCE(MAX(position), 0) FROM links", [], |r| {
        r.get(0)
    })
}

fn room_exists(tx: &Transaction<'_>, room: &str) -> rusqlite::Result<bool> {
    tx.query_row("SELECT 1 FROM rooms WHERE id = ?1", params![room], |_| {
        Ok(())
    })
    .optional()
    .map(|found| found.is_some())
}

fn bump_room(tx: &Transaction<'_>, room: &str) -> rusqlite::Result<usize> {
    tx.execute(
        "UPDATE rooms SET audience_version = audience_version + 1 WHERE id = ?1",
        params![room],
    )
}

fn bump_project(tx: &Transaction<'_>, project: &str) -> rusqlite::Result<usize> {
    tx.execute(
        "UPDATE rooms SET audience_version = audience_version + 1 WHERE project = ?1",
        params![project],
    )
}

/// A roster: a project's members or a room's direct ones.
#[derive(Clone, Copy)]
enum Roster {
    Project,
    Room,
}

/// Adds `member` to (or removes them from) `roster` of `id`; how many rows changed.
fn set_member(
    tx: &Transaction<'_>,
    roster: Roster,
    id: &str,
    member: &str,
    present: bool,
) -> rusqlite::Result<usize> {
    let (table, column) = match roster {
        Roster::Project => ("project_members", "project"),
        Roster::Room => ("room_members", "room"),
    };
    let statement = if present {
        format!("INSERT OR IGNORE INTO {table} ({column}, member) VALUES (?1, ?2)")
    } else {
        format!("DELETE FROM {table} WHERE {column} = ?1 AND member = ?2")
    };
    tx.execute(&statement, params![id, member])
}

fn fresh_reference(prefix: &str) -> String {
    let bytes = corral_contract::credential::random_bytes();
    format!("{prefix}-{}", corral_core::ids::hex(&bytes[..8]))
}

/// A new document: its description, and who owns it.
#[derive(Clone, Debug)]
pub struct NewDocument {
    /// The owner.
    pub owner: String,
    /// The display name.
    pub name: String,
    /// The media type.
    pub media_type: String,
    /// What it is.
    pub kind: Kind,
    /// SHA-256 of its bytes, 64 hex digits.
    pub digest: String,
    /// Its size.
    pub size: u64,
    /// Its processing state.
    pub processing: Processing,
    /// A new version of this root; `None`: a new document.
    pub revises: Option<String>,
}

impl Embedded {
    /// Opens (creating) the database at `path`.
    ///
    /// # Errors
    /// A database that cannot be opened or set up.
    pub fn open(path: &Path) -> Result<Self, String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let db = Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        db.busy_timeout(std::time::Duration::from_secs(5))
            .and_then(|()| db.execute_batch(SCHEMA))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self {
            db: Arc::new(Mutex::new(db)),
        })
    }

    /// Runs `f` in one transaction on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, AuthorityError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db_transaction(&db, f))
            .await
            .map_err(|e| AuthorityError::Unreachable(e.to_string()))?
            .map_err(|e| failed(&e))
    }

    pub(super) async fn scope(&self, q: ScopeQuery) -> Result<Option<Scope>, AuthorityError> {
        self.read(move |tx| {
            let Some(audience) = audience(tx, &q.room)? else {
                return Ok(None);
            };
            Ok(Some(Scope {
                position: position(tx)?,
                documents: turn_documents(tx, &q.room, &q.member, &q.retrieved)?,
                audience,
            }))
        })
        .await
    }

    pub(super) async fn audience(&self, q: RoomQuery) -> Result<Option<Audience>, AuthorityError> {
        self.read(move |tx| audience(tx, &q.room)).await
    }

    pub(super) async fn selection(
        &self,
        q: SelectionQuery,
    ) -> Result<Option<Documents>, AuthorityError> {
        self.read(move |tx| {
            if !room_exists(tx, &q.room)? {
                return Ok(None);
            }
            let rows: Vec<Row> = tx
                .prepare_cached(&format!(
                    "SELECT {DOCUMENT_COLUMNS} FROM selections s \
                     JOIN documents d ON d.reference = s.reference \
                     WHERE s.room = ?1 AND s.member = ?2 ORDER BY s.rowid"
                ))?
                .query_map(params![q.room, q.member], row)?
                .collect::<rusqlite::Result<_>>()?;
            let mut documents = Vec::with_capacity(rows.len());
            for mut r in rows {
                r.doc.readable = reads(tx, &q.member, &r)?;
                documents.push(r.doc);
            }
            Ok(Some(Documents { documents }))
        })
        .await
    }

    pub(super) async fn journal(&self, q: JournalQuery) -> Result<Option<Journal>, AuthorityError> {
        self.read(move |tx| {
            if !room_exists(tx, &q.room)? {
                return Ok(None);
            }
            let links: Vec<Link> = tx
                .prepare_cached(
                    "SELECT position, reference, turn, member FROM links \
                     WHERE room = ?1 AND position > ?2 ORDER BY position",
                )?
                .query_map(params![q.room, q.since], |r| {
                    Ok(Link {
                        position: r.get(0)?,
                        reference: r.get(1)?,
                        turn: r.get(2)?,
                        member: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            Ok(Some(Journal {
                documents: turn_documents(tx, &q.room, &q.member, &q.retrieved)?,
                links,
            }))
        })
        .await
    }

    pub(super) async fn link(&self, q: LinkRequest) -> Result<Option<Linked>, AuthorityError> {
        self.read(move |tx| {
            if !room_exists(tx, &q.room)? {
                return Ok(None);
            }
            let (reference, _, version) = insert_document(
                tx,
                &NewDocument {
                    owner: q.member.clone(),
                    name: q.name,
                    media_type: q.media_type,
                    kind: q.kind,
                    digest: q.digest,
                    size: q.size,
                    processing: Processing::Ready,
                    revises: None,
                },
            )?;
            let position = insert_link(tx, &q.room, &reference, Some(&q.turn), Some(&q.member))?;
            Ok(Some(Linked {
                reference,
                version,
                position,
            }))
        })
        .await
    }

    // -----------------------------------------------------------------------------------------
    // Administration (`corral resources`, the tests).

    fn admin<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, String> {
        db_transaction(&self.db, f).map_err(|e| e.to_string())
    }

    /// Creates a project.
    ///
    /// # Errors
    /// The database's refusal (say, a project that exists).
    pub fn create_project(&self, project: &str) -> Result<(), String> {
        self.admin(|tx| tx.execute("INSERT INTO projects (id) VALUES (?1)", params![project]))
            .map(drop)
    }

    /// Adds (or, with `present` false, removes) a project member: the audience of each of the
    /// project's rooms changes.
    ///
    /// # Errors
    /// The database's refusal.
    pub fn set_project_member(
        &self,
        project: &str,
        member: &str,
        present: bool,
    ) -> Result<(), String> {
        self.admin(|tx| {
            if set_member(tx, Roster::Project, project, member, present)? > 0 {
                bump_project(tx, project)?;
            }
            Ok(())
        })
    }

    /// Creates a room (a conversation), in `project` if given, with `members`.
    ///
    /// # Errors
    /// The database's refusal.
    pub fn create_room(
        &self,
        room: &str,
        project: Option<&str>,
        members: &[&str],
    ) -> Result<(), String> {
        self.admin(|tx| {
            tx.execute(
                "INSERT INTO rooms (id, project) VALUES (?1, ?2)",
                params![room, project],
            )?;
            for member in members {
                set_member(tx, Roster::Room, room, member, true)?;
            }
            Ok(())
        })
    }

    /// Adds (or removes) a direct member of a room.
    ///
    /// # Errors
    /// The database's refusal, or no such room.
    pub fn set_room_member(&self, room: &str, member: &str, present: bool) -> Result<(), String> {
        self.admin(|tx| {
            if !room_exists(tx, room)? {
                return Err(rusqlite::Error::QueryReturnedNoRows);
            }
            if set_member(tx, Roster::Room, room, member, present)? > 0 {
                bump_room(tx, room)?;
            }
            Ok(())
        })
    }

    /// Adds a document version (its bytes are the caller's to put in the object store under its
    /// digest); its reference, root and version.
    ///
    /// # Errors
    /// The database's refusal, or a revision of an unknown root.
    pub fn add_document(&self, new: &NewDocument) -> Result<(String, String, u64), String> {
        self.admin(|tx| insert_document(tx, new))
    }

    /// Sets a document's processing state, or revokes it.
    ///
    /// # Errors
    /// The database's refusal, or no such document.
    pub fn set_document(
        &self,
        reference: &str,
        processing: Option<Processing>,
        revoked: Option<bool>,
    ) -> Result<(), String> {
        self.admin(|tx| {
            let mut changed = 0;
            if let Some(processing) = processing {
                changed += tx.execute(
                    "UPDATE documents SET processing = ?2 WHERE reference = ?1",
                    params![reference, processing_text(processing)],
                )?;
            }
            if let Some(revoked) = revoked {
                changed += tx.execute(
                    "UPDATE documents SET revoked = ?2 WHERE reference = ?1",
                    params![reference, i64::from(revoked)],
                )?;
            }
            if changed == 0 {
                return Err(rusqlite::Error::QueryReturnedNoRows);
            }
            Ok(())
        })
    }

    /// Links a document into a room (an attachment, or a file of a shared room), as `turn` and
    /// `member` when a turn made it; its journal position.
    ///
    /// # Errors
    /// The database's refusal (an unknown room or document, or one already linked).
    pub fn link_document(
        &self,
        room: &str,
        reference: &str,
        turn: Option<&str>,
        member: Option<&str>,
    ) -> Result<u64, String> {
        self.admin(|tx| insert_link(tx, room, reference, turn, member))
    }

    /// Binds a member's private document to a room as their selection (PROJ-3).
    ///
    /// # Errors
    /// The database's refusal.
    pub fn select(&self, room: &str, member: &str, reference: &str) -> Result<(), String> {
        self.admin(|tx| {
            tx.execute(
                "INSERT OR IGNORE INTO selections (room, member, reference) VALUES (?1, ?2, ?3)",
                params![room, member, reference],
            )
        })
        .map(drop)
    }

    /// Every document of a room (linked, by position), for `corral resources list`.
    ///
    /// # Errors
    /// The database's refusal.
    pub fn room_documents(&self, room: &str) -> Result<Vec<Document>, String> {
        self.admin(|tx| {
            Ok(linked_rows(tx, room)?
                .into_iter()
                .map(|r| Document {
                    readable: !r.revoked,
                    ..r.doc
                })
                .collect())
        })
    }
}

fn db_transaction<T>(
    db: &Mutex<Connection>,
    f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let mut db = db.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let tx = db.transaction()?;
    let value = f(&tx)?;
    tx.commit()?;
    Ok(value)
}

fn insert_document(
    tx: &Transaction<'_>,
    new: &NewDocument,
) -> rusqlite::Result<(String, String, u64)> {
    let (root, version) = match &new.revises {
        None => (fresh_reference("root"), 1),
        Some(root) => {
            let latest: Option<u64> = tx.query_row(
                "SELECT MAX(version) FROM documents WHERE root = ?1",
                params![root],
                |r| r.get(0),
            )?;
            let Some(latest) = latest else {
                return Err(rusqlite::Error::QueryReturnedNoRows);
            };
            (root.clone(), latest + 1)
        }
    };
    let reference = fresh_reference("doc");
    tx.execute(
        "INSERT INTO documents (reference, root, version, kind, processing, digest, media_type, \
         size, name, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            reference,
            root,
            version,
            kind_text(new.kind),
            processing_text(new.processing),
            new.digest,
            new.media_type,
            new.size,
            new.name,
            new.owner
        ],
    )?;
    Ok((reference, root, version))
}

fn insert_link(
    tx: &Transaction<'_>,
    room: &str,
    reference: &str,
    turn: Option<&str>,
    member: Option<&str>,
) -> rusqlite::Result<u64> {
    tx.execute(
        "INSERT INTO links (room, reference, turn, member) VALUES (?1, ?2, ?3, ?4)",
        params![room, reference, turn, member],
    )?;
    u64::try_from(tx.last_insert_rowid()).map_err(|_| rusqlite::Error::QueryReturnedNoRows)
}
