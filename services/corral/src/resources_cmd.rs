//! `corral resources`: administers the embedded resource authority (decision 0020) that
//! `corral up` uses: projects and their members, rooms (conversations) and theirs, documents and
//! their versions (the bytes put in the object store under their digest), links into rooms (a
//! private chat's attachments, a shared room's files) and private selections. Each command prints
//! one JSON line.

use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;
use corral_api::resources::sqlite::{Embedded, NewDocument, processing_of};
use corral_api::workspaces::Workspaces;
use corral_core::projection::Kind;
use serde_json::{Value, json};

const USAGE: &str = "usage: corral resources [--db PATH] [--store URL] COMMAND
  project create PROJECT
  project add-member|remove-member PROJECT MEMBER
  room create ROOM [--project PROJECT] [--member MEMBER]...
  room add-member|remove-member ROOM MEMBER
  document add --owner MEMBER --file PATH [--name NAME] [--media-type TYPE]
               [--kind document|artifact] [--revises ROOT] [--processing ready|processing|failed]
  document set REFERENCE [--processing ready|processing|failed] [--revoked true|false]
  link ROOM REFERENCE [--turn TURN --member MEMBER]
  select ROOM MEMBER REFERENCE
  list ROOM

--db defaults to CORRAL_RESOURCE_AUTHORITY_URL's sqlite:// path, else .corral/resources.db (the
one `corral up` uses); --store to CORRAL_WORKSPACE_URL, else .corral/workspaces.";

/// Runs `corral resources <args>`.
pub fn run(args: &[String]) -> ExitCode {
    match try_run(args) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("corral resources: {message}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The arguments after the command words: positionals, and `--flag value` pairs (repeatable).
struct Parsed {
    positional: Vec<String>,
    flags: Vec<(String, String)>,
}

impl Parsed {
    fn of(args: &[String]) -> Result<Self, String> {
        let mut parsed = Self {
            positional: Vec::new(),
            flags: Vec::new(),
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            if let Some(flag) = arg.strip_prefix("--") {
                let value = args
                    .next()
                    .ok_or_else(|| format!("--{flag} needs a value"))?;
                parsed.flags.push((flag.to_owned(), value.clone()));
            } else {
                parsed.positional.push(arg.clone());
            }
        }
        Ok(parsed)
    }

    fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.flags
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// Refuses a flag not in `known`, and positionals other than `count`.
    fn expect(&self, count: usize, known: &[&str]) -> Result<(), String> {
        if let Some((flag, _)) = self
            .flags
            .iter()
            .find(|(n, _)| !known.contains(&n.as_str()))
        {
            return Err(format!("unknown option --{flag}"));
        }
        if self.positional.len() != count {
            return Err(format!(
                "expected {count} argument(s), got {}",
                self.positional.len()
            ));
        }
        Ok(())
    }
}

fn default_db() -> PathBuf {
    std::env::var("CORRAL_RESOURCE_AUTHORITY_URL")
        .ok()
        .and_then(|url| url.strip_prefix("sqlite://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(".corral/resources.db"))
}

fn default_store() -> Result<String, String> {
    if let Some(url) = std::env::var("CORRAL_WORKSPACE_URL")
        .ok()
        .filter(|v| !v.is_empty())
    {
        return Ok(url);
    }
    let dir = std::env::current_dir().map_err(|e| e.to_string())?;
    Ok(format!(
        "file://{}",
        dir.join(".corral/workspaces").display()
    ))
}

fn try_run(args: &[String]) -> Result<Value, String> {
    let mut db = default_db();
    let mut store: Option<String> = None;
    let mut rest = args;
    loop {
        match rest {
            [flag, value, tail @ ..] if flag == "--db" => {
                db = PathBuf::from(value);
                rest = tail;
            }
            [flag, value, tail @ ..] if flag == "--store" => {
                store = Some(value.clone());
                rest = tail;
            }
            _ => break,
        }
    }
    let authority = Embedded::open(&db)?;
    let words: Vec<&str> = rest.iter().take(2).map(String::as_str).collect();
    let parsed = Parsed::of(rest.get(2..).unwrap_or_default())?;
    let p = &parsed.positional;
    match words.as_slice() {
        ["project", "create"] => {
            parsed.expect(1, &[])?;
            authority.create_project(&p[0])?;
            Ok(json!({ "project": p[0] }))
        }
        ["project", verb @ ("add-member" | "remove-member")] => {
            parsed.expect(2, &[])?;
            authority.set_project_member(&p[0], &p[1], *verb == "add-member")?;
            Ok(json!({ "project": p[0], "member": p[1], "present": *verb == "add-member" }))
        }
        ["room", "create"] => {
            parsed.expect(1, &["project", "member"])?;
            authority.create_room(&p[0], parsed.flag("project"), &parsed.all("member"))?;
            Ok(json!({ "room": p[0] }))
        }
        ["room", verb @ ("add-member" | "remove-member")] => {
            parsed.expect(2, &[])?;
            authority.set_room_member(&p[0], &p[1], *verb == "add-member")?;
            Ok(json!({ "room": p[0], "member": p[1], "present": *verb == "add-member" }))
        }
        ["document", "add"] => {
            parsed.expect(
                0,
                &[
                    "owner",
                    "file",
                    "name",
                    "media-type",
                    "kind",
                    "revises",
                    "processing",
                ],
            )?;
            let file = parsed.flag("file").ok_or("--file is required")?;
            let owner = parsed.flag("owner").ok_or("--owner is required")?;
            let bytes = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
            let name = parsed.flag("name").map_or_else(
                || {
                    std::path::Path::new(file)
                        .file_name()
                        .map_or_else(|| file.to_owned(), |n| n.to_string_lossy().into_owned())
                },
                str::to_owned,
            );
            let media_type = parsed.flag("media-type").map_or_else(
                || corral_core::downloads::media_type(&name).to_owned(),
                str::to_owned,
            );
            let kind = match parsed.flag("kind").unwrap_or("document") {
                "document" => Kind::Document,
                "artifact" => Kind::Artifact,
                other => return Err(format!("--kind {other:?}: document or artifact")),
            };
            let digest = corral_core::ids::sha256_hex(&bytes);
            let size = bytes.len() as u64;
            put(&store.map_or_else(default_store, Ok)?, &digest, bytes)?;
            let (reference, root, version) = authority.add_document(&NewDocument {
                owner: owner.to_owned(),
                name: name.clone(),
                media_type,
                kind,
                digest: digest.clone(),
                size,
                processing: processing_of(parsed.flag("processing").unwrap_or("ready"))?,
                revises: parsed.flag("revises").map(str::to_owned),
            })?;
            Ok(
                json!({ "reference": reference, "root": root, "version": version, "name": name, "digest": digest, "size": size }),
            )
        }
        ["document", "set"] => {
            parsed.expect(1, &["processing", "revoked"])?;
            let processing = parsed.flag("processing").map(processing_of).transpose()?;
            let revoked = match parsed.flag("revoked") {
                None => None,
                Some("true") => Some(true),
                Some("false") => Some(false),
                Some(other) => return Err(format!("--revoked {other:?}: true or false")),
            };
            authority.set_document(&p[0], processing, revoked)?;
            Ok(json!({ "reference": p[0] }))
        }
        ["link", room] => {
            parsed.expect(1, &["turn", "member"])?;
            let position =
                authority.link_document(room, &p[0], parsed.flag("turn"), parsed.flag("member"))?;
            Ok(json!({ "room": room, "reference": p[0], "position": position }))
        }
        ["select", room] => {
            parsed.expect(2, &[])?;
            authority.select(room, &p[0], &p[1])?;
            Ok(json!({ "room": room, "member": p[0], "reference": p[1] }))
        }
        ["list", room] => {
            parsed.expect(0, &[])?;
            Ok(json!({ "room": room, "documents": authority.room_documents(room)? }))
        }
        _ => Err("unknown command".to_owned()),
    }
}

/// Puts `bytes` in the object store at `url` under `digest`.
fn put(url: &str, digest: &str, bytes: Vec<u8>) -> Result<(), String> {
    let store = Workspaces::open(url)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime
        .block_on(store.put_resource(digest, Bytes::from(bytes)))
        .map_err(|e| e.to_string())
}
