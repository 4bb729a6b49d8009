//! The resource authority (PROJ-1 to PROJ-8, OUT-1, decision 0020): the one interface through
//! which Corral asks the calling platform about rooms and documents. Two implementations of one
//! contract: [`http::Client`] speaks the documented JSON contract
//! (`docs/resource-authority.openapi.yaml`) to the platform; [`sqlite::Embedded`] answers from
//! a SQLite database that `corral resources` administers and `corral up` uses.
//!
//! Every answer is checked here, whichever implementation gave it: a document that is not
//! well-formed (`corral_core::projection::Document::is_well_formed`), an audience with an invalid
//! member, or more than the bounds below is garbage, and the run fails closed as
//! `resource_authority_invalid`, never as "unavailable" and never on another source.

use std::collections::BTreeSet;

use corral_core::projection::{Audience, Document, Kind};
use serde::{Deserialize, Serialize};

pub mod http;
pub mod sqlite;

/// The most documents one answer may list.
pub const DOCUMENTS_MAX: usize = 1_000;
/// The most members an audience may list.
pub const MEMBERS_MAX: usize = 10_000;
/// The most links a journal may list.
pub const LINKS_MAX: usize = 10_000;
/// The most references a turn may re-authorize from retrieval.
pub use corral_core::run::admission::RETRIEVED_MAX;

/// `POST /v1/rooms/scope`: what a turn is admitted with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeQuery {
    /// The room (the conversation).
    pub room: String,
    /// The initiating member.
    pub member: String,
    /// Documents an agent re-authorized from a retrieval result for this turn (PROJ-2).
    #[serde(default)]
    pub retrieved: Vec<String>,
}

/// The answer to a [`ScopeQuery`]: the room's audience, the link journal's position the scope
/// was read at, and the documents of the turn in order: the room's linked files (a private
/// chat's whole attachment scope) by link position, then each re-authorized document not
/// already among them. `readable` is judged under the member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    /// The room's audience.
    pub audience: Audience,
    /// The link journal's position.
    pub position: u64,
    /// The documents.
    pub documents: Vec<Document>,
}

/// `POST /v1/rooms/audience`: the room's live audience, version and active roster (members who
/// reach it through a project included) in one query.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomQuery {
    /// The room.
    pub room: String,
}

/// `POST /v1/rooms/selection`: the member's private selection bound to the room (PROJ-3),
/// re-resolved under the member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectionQuery {
    /// The room.
    pub room: String,
    /// The member whose selection.
    pub member: String,
}

/// A list of documents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Documents {
    /// The documents.
    pub documents: Vec<Document>,
}

/// `POST /v1/rooms/journal`: the turn's documents now, and the links made since `since`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalQuery {
    /// The room.
    pub room: String,
    /// The initiating member.
    pub member: String,
    /// The position the turn was admitted at.
    pub since: u64,
    /// As in [`ScopeQuery::retrieved`].
    #[serde(default)]
    pub retrieved: Vec<String>,
}

/// One link of the journal: a document linked into the room, by whom and in which turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// Its position in the journal.
    pub position: u64,
    /// The document linked.
    pub reference: String,
    /// The turn that linked it, if a turn did.
    #[serde(default)]
    pub turn: Option<String>,
    /// The member who linked it, if one did.
    #[serde(default)]
    pub member: Option<String>,
}

/// The answer to a [`JournalQuery`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    /// The turn's documents now, as [`Scope::documents`].
    pub documents: Vec<Document>,
    /// The links made after `since`, in order.
    pub links: Vec<Link>,
}

/// `POST /v1/rooms/link`: link a retained output into the room by a metadata-only reference
/// (OUT-1). The bytes are already in the object store under their digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkRequest {
    /// The room.
    pub room: String,
    /// The initiating member, under whom the output is retained.
    pub member: String,
    /// The turn that made it.
    pub turn: String,
    /// Its filename.
    pub name: String,
    /// SHA-256 of its bytes, 64 hex digits.
    pub digest: String,
    /// Its media type.
    pub media_type: String,
    /// Its size.
    pub size: u64,
    /// What it is: an `output`.
    pub kind: Kind,
}

/// The answer to a [`LinkRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Linked {
    /// The new document's reference.
    pub reference: String,
    /// Its version.
    pub version: u64,
    /// The link's position in the journal.
    pub position: u64,
}

/// Why the authority gave no usable answer. The codes are stable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorityError {
    /// It could not be reached, timed out, or said it is unavailable (a tier problem).
    Unreachable(String),
    /// It answered something that is not the contract: garbage.
    Invalid(String),
}

impl AuthorityError {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "resource_authority_unreachable",
            Self::Invalid(_) => "resource_authority_invalid",
        }
    }
}

impl std::fmt::Display for AuthorityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(why) => write!(f, "the resource authority is unreachable: {why}"),
            Self::Invalid(why) => write!(f, "the resource authority answered garbage: {why}"),
        }
    }
}

/// The deployment's resource authority.
#[derive(Clone, Debug)]
pub enum Authority {
    /// The embedded one.
    Embedded(sqlite::Embedded),
    /// The platform's, over HTTP.
    Http(http::Client),
}

fn invalid(why: impl Into<String>) -> AuthorityError {
    AuthorityError::Invalid(why.into())
}

fn check_documents(documents: &[Document]) -> Result<(), AuthorityError> {
    if documents.len() > DOCUMENTS_MAX {
        return Err(invalid(format!("more than {DOCUMENTS_MAX} documents")));
    }
    match documents.iter().find(|d| !d.is_well_formed()) {
        Some(bad) => Err(invalid(format!(
            "a malformed document ({:?})",
            bad.reference.chars().take(64).collect::<String>()
        ))),
        None => Ok(()),
    }
}

fn check_audience(audience: &Audience) -> Result<(), AuthorityError> {
    if audience.members.len() > MEMBERS_MAX
        || !audience
            .members
            .iter()
            .all(|m| corral_core::ids::identity_is_valid(m))
    {
        return Err(invalid("a malformed audience"));
    }
    Ok(())
}

impl Authority {
    /// Opens the authority `CORRAL_RESOURCE_AUTHORITY_URL` names: `sqlite:///abs/path.db` or an
    /// `http(s)://` base URL.
    ///
    /// # Errors
    /// A database that cannot be opened, or a client that cannot be built.
    pub fn open(url: &str) -> Result<Self, String> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            return sqlite::Embedded::open(std::path::Path::new(path)).map(Self::Embedded);
        }
        http::Client::new(url).map(Self::Http)
    }

    /// The turn's scope; `None` when the authority knows no such room (nothing is projected).
    ///
    /// # Errors
    /// Unreachable, or garbage.
    pub async fn scope(&self, query: &ScopeQuery) -> Result<Option<Scope>, AuthorityError> {
        let scope = match self {
            Self::Embedded(db) => db.scope(query.clone()).await?,
            Self::Http(client) => client.call("scope", query).await?,
        };
        if let Some(scope) = &scope {
            check_audience(&scope.audience)?;
            check_documents(&scope.documents)?;
        }
        Ok(scope)
    }

    /// The room's live audience, in one query.
    ///
    /// # Errors
    /// Unreachable, garbage, or a room that is gone (garbage: it was there at admission).
    pub async fn audience(&self, room: &str) -> Result<Audience, AuthorityError> {
        let query = RoomQuery {
            room: room.to_owned(),
        };
        let audience = match self {
            Self::Embedded(db) => db.audience(query).await?,
            Self::Http(client) => client.call("audience", &query).await?,
        }
        .ok_or_else(|| invalid("the room is gone"))?;
        check_audience(&audience)?;
        Ok(audience)
    }

    /// The member's private selection in the room.
    ///
    /// # Errors
    /// Unreachable, or garbage.
    pub async fn selection(
        &self,
        room: &str,
        member: &str,
    ) -> Result<Vec<Document>, AuthorityError> {
        let query = SelectionQuery {
            room: room.to_owned(),
            member: member.to_owned(),
        };
        let list = match self {
            Self::Embedded(db) => db.selection(query).await?,
            Self::Http(client) => client.call("selection", &query).await?,
        }
        .map_or_else(Vec::new, |list: Documents| list.documents);
        check_documents(&list)?;
        Ok(list)
    }

    /// The turn's documents now and the links since the admission's position.
    ///
    /// # Errors
    /// Unreachable, garbage, or a room that is gone.
    pub async fn journal(&self, query: &JournalQuery) -> Result<Journal, AuthorityError> {
        let journal = match self {
            Self::Embedded(db) => db.journal(query.clone()).await?,
            Self::Http(client) => client.call("journal", query).await?,
        }
        .ok_or_else(|| invalid("the room is gone"))?;
        check_documents(&journal.documents)?;
        if journal.links.len() > LINKS_MAX
            || journal.links.iter().any(|l| l.position <= query.since)
        {
            return Err(invalid("a journal with links outside what was asked"));
        }
        Ok(journal)
    }

    /// Links a retained output into the room (OUT-1).
    ///
    /// # Errors
    /// Unreachable, garbage, or a room that is gone.
    pub async fn link(&self, request: &LinkRequest) -> Result<Linked, AuthorityError> {
        let linked = match self {
            Self::Embedded(db) => db.link(request.clone()).await?,
            Self::Http(client) => client.call("link", request).await?,
        }
        .ok_or_else(|| invalid("the room is gone"))?;
        if !corral_core::ids::identity_is_valid(&linked.reference) {
            return Err(invalid("a malformed reference"));
        }
        Ok(linked)
    }
}

/// The references of `documents`, for finding which asked-for ones an answer left out.
#[must_use]
pub fn references(documents: &[Document]) -> BTreeSet<&str> {
    documents.iter().map(|d| d.reference.as_str()).collect()
}
