//! `corral resources`: administers the embedded resource authority (decision 0020) that
//! `corral up` uses: projects and their members, rooms (conversations) and theirs, documents and
//! their versions (the bytes put in the object store under their digest), links into rooms (a
//! private chat's attachments, a shared room's files) and private selections. Each command prints
//! one JSON line. The arguments are [`corral::cli::ResourcesArgs`]; the database is opened only
//! once they have parsed.

use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;
use corral::cli::{
    DocumentAdd, DocumentCommand, DocumentKind, ProjectCommand, ProjectMember, ResourcesArgs,
    ResourcesCommand, RoomCommand, RoomMember,
};
use corral_api::resources::sqlite::{Embedded, NewDocument, processing_of};
use corral_api::workspaces::Workspaces;
use corral_core::projection::Kind;
use serde_json::{Value, json};

/// Runs `corral resources`.
pub fn run(args: ResourcesArgs) -> ExitCode {
    match try_run(args) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("corral resources: {message}");
            ExitCode::from(2)
        }
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

fn try_run(args: ResourcesArgs) -> Result<Value, String> {
    let ResourcesArgs { db, store, command } = args;
    let authority = Embedded::open(&db.unwrap_or_else(default_db))?;
    match command {
        ResourcesCommand::Project(ProjectCommand::Create { project }) => {
            authority.create_project(&project)?;
            Ok(json!({ "project": project }))
        }
        ResourcesCommand::Project(ProjectCommand::AddMember(ProjectMember { project, member })) => {
            authority.set_project_member(&project, &member, true)?;
            Ok(json!({ "project": project, "member": member, "present": true }))
        }
        ResourcesCommand::Project(ProjectCommand::RemoveMember(ProjectMember {
            project,
            member,
        })) => {
            authority.set_project_member(&project, &member, false)?;
            Ok(json!({ "project": project, "member": member, "present": false }))
        }
        ResourcesCommand::Room(RoomCommand::Create {
            room,
            project,
            member,
        }) => {
            let members: Vec<&str> = member.iter().map(String::as_str).collect();
            authority.create_room(&room, project.as_deref(), &members)?;
            Ok(json!({ "room": room }))
        }
        ResourcesCommand::Room(RoomCommand::AddMember(RoomMember { room, member })) => {
            authority.set_room_member(&room, &member, true)?;
            Ok(json!({ "room": room, "member": member, "present": true }))
        }
        ResourcesCommand::Room(RoomCommand::RemoveMember(RoomMember { room, member })) => {
            authority.set_room_member(&room, &member, false)?;
            Ok(json!({ "room": room, "member": member, "present": false }))
        }
        ResourcesCommand::Document(DocumentCommand::Add(add)) => {
            add_document(&authority, store, add)
        }
        ResourcesCommand::Document(DocumentCommand::Set {
            reference,
            processing,
            revoked,
        }) => {
            let processing = processing
                .processing
                .as_deref()
                .map(processing_of)
                .transpose()?;
            authority.set_document(&reference, processing, revoked)?;
            Ok(json!({ "reference": reference }))
        }
        ResourcesCommand::Link {
            room,
            reference,
            turn,
            member,
        } => {
            let position =
                authority.link_document(&room, &reference, turn.as_deref(), member.as_deref())?;
            Ok(json!({ "room": room, "reference": reference, "position": position }))
        }
        ResourcesCommand::Select {
            room,
            member,
            reference,
        } => {
            authority.select(&room, &member, &reference)?;
            Ok(json!({ "room": room, "member": member, "reference": reference }))
        }
        ResourcesCommand::List { room } => {
            Ok(json!({ "room": room, "documents": authority.room_documents(&room)? }))
        }
    }
}

/// `document add`: the bytes into the object store under their digest, then the document.
fn add_document(
    authority: &Embedded,
    store: Option<String>,
    add: DocumentAdd,
) -> Result<Value, String> {
    let file = add.file.display().to_string();
    let bytes = std::fs::read(&add.file).map_err(|e| format!("{file}: {e}"))?;
    let name = add.name.unwrap_or_else(|| {
        add.file
            .file_name()
            .map_or_else(|| file.clone(), |n| n.to_string_lossy().into_owned())
    });
    let media_type = add
        .media_type
        .unwrap_or_else(|| corral_core::downloads::media_type(&name).to_owned());
    let kind = match add.kind {
        DocumentKind::Document => Kind::Document,
        DocumentKind::Artifact => Kind::Artifact,
    };
    let digest = corral_core::ids::sha256_hex(&bytes);
    let size = bytes.len() as u64;
    put(&store.map_or_else(default_store, Ok)?, &digest, bytes)?;
    let (reference, root, version) = authority.add_document(&NewDocument {
        owner: add.owner,
        name: name.clone(),
        media_type,
        kind,
        digest: digest.clone(),
        size,
        processing: processing_of(add.processing.processing.as_deref().unwrap_or("ready"))?,
        revises: add.revises,
    })?;
    Ok(
        json!({ "reference": reference, "root": root, "version": version, "name": name, "digest": digest, "size": size }),
    )
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
