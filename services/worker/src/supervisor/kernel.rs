//! A persistent kernel's cell (KER-1 to KER-3, decision 0016), the supervisor's half: the
//! runtime tag of each interpreter, the driver program that wraps the cell, the judgement of the
//! checkpoint before the cell runs, and its seal after. The driver runs in the jail as the code
//! does; the seal key never enters it.

use std::fs::OpenOptions;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use corral_contract::messages::{KernelOrder, KernelReport};
use corral_core::bounds::BoundObservations;
use corral_core::jail::{Language, NotRun};
use corral_core::kernel::{self, Refusal};

use super::{ActiveRun, Worker};
use crate::result::{RunResult, note};
use crate::workspace::RunDirs;

const PYTHON_DRIVER: &str = include_str!("kernel/driver.py");
const NODE_DRIVER: &str = include_str!("kernel/driver.js");

/// Where the jail sees the workspace.
const JAIL_WORKSPACE: &str = "/workspace";

/// A persistent cell, as the supervisor holds it for the run.
#[derive(Clone)]
pub(super) struct KernelCell {
    key: [u8; 32],
    runtime: String,
    nonce: String,
    /// The names restored before the cell ran (from the checkpoint judged).
    restored: Vec<String>,
}

impl Worker {
    /// The cell `order` asks for: its key, this worker's runtime tag for `language`, and a nonce.
    ///
    /// # Errors
    /// The key is not 64 hex digits, or the interpreter could not say what it is.
    pub(super) fn kernel_cell(
        &mut self,
        language: Language,
        order: &KernelOrder,
    ) -> Result<KernelCell, String> {
        let key = order
            .key()
            .ok_or_else(|| "the kernel's seal key is not 64 hex digits".to_owned())?;
        let runtime = self.runtime(language)?;
        let nonce = corral_core::ids::hex(&corral_contract::credential::random_bytes()[..16]);
        Ok(KernelCell {
            key,
            runtime,
            nonce,
            restored: Vec::new(),
        })
    }

    /// Before a persistent cell runs, with its workspace in place: judges the checkpoint.
    pub(super) fn judge_kernel(
        &self,
        language: Language,
        run: &mut ActiveRun,
        dirs: &RunDirs,
        result: &mut RunResult,
    ) -> Result<(), NotRun> {
        let max_bytes = self.settings.bounds.workspace_max_bytes;
        match run.kernel.as_mut() {
            Some(cell) => judge(
                language,
                &dirs.workspace(),
                cell,
                max_bytes,
                &mut result.reply.diagnostics,
            ),
            None => Ok(()),
        }
    }

    /// After a persistent cell, before its workspace is packed: seals the checkpoint and reports
    /// it, when nothing of the run survived (otherwise nothing is sealed, and the run's
    /// workspace is not packed either).
    pub(super) fn seal_kernel(
        &self,
        language: Language,
        run: &ActiveRun,
        dirs: &RunDirs,
        (observed, all_dead): (&mut BoundObservations, bool),
        result: &mut RunResult,
    ) {
        let Some(cell) = &run.kernel else {
            return;
        };
        if !all_dead {
            return;
        }
        // The driver leaves a checkpoint that did not fit where it was writing it: with the
        // workspace at its bound, that bound is hit (KER-3); the partial file goes either way,
        // and the previous checkpoint stays.
        let partial = dirs
            .workspace()
            .join(format!("{}.tmp", kernel::checkpoint_path(language)));
        if kernel_dirs_are_real(&dirs.workspace())
            && std::fs::symlink_metadata(&partial).is_ok_and(|meta| meta.is_file())
        {
            let max = self.settings.bounds.workspace_max_bytes;
            let full = crate::workspace::filesystem_use(&dirs.workspace(), 0)
                .is_some_and(|fs| fs.at_bound(max));
            let _ = std::fs::remove_file(&partial);
            if full {
                observed.workspace_filled = true;
                note(
                    &mut result.reply.diagnostics,
                    "kernel: the checkpoint did not fit in SANDBOX_WORKSPACE_MAX_BYTES; the previous one stays",
                );
            } else {
                note(
                    &mut result.reply.diagnostics,
                    "kernel: the cell ended while its checkpoint was being written; the previous one stays",
                );
            }
        }
        let max_bytes = self.settings.bounds.workspace_max_bytes;
        result.reply.kernel = Some(seal(
            language,
            &dirs.workspace(),
            cell,
            max_bytes,
            &mut result.reply.diagnostics,
        ));
    }

    /// The runtime tag of `language`'s interpreter, asked once per worker.
    fn runtime(&mut self, language: Language) -> Result<String, String> {
        if let Some(tag) = self.runtimes.get(&language) {
            return Ok(tag.clone());
        }
        let (program, args): (String, [&str; 3]) = match language {
            Language::Python => (
                self.python(),
                [
                    "-I",
                    "-c",
                    "import sys; print(sys.implementation.cache_tag)",
                ],
            ),
            Language::Node => (
                "/usr/bin/node".to_owned(),
                ["-p", "'node-' + process.versions.node.split('.')[0]", ""],
            ),
        };
        let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
        let output = std::process::Command::new(&program)
            .args(&args)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("ask {program} its version: {e}"))?;
        let interpreter = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if !output.status.success() || interpreter.is_empty() || interpreter.len() > 64 {
            return Err(format!("{program} did not say its version"));
        }
        let tag = kernel::runtime_tag(language, &interpreter, self.python_stack.is_ok());
        self.runtimes.insert(language, tag.clone());
        Ok(tag)
    }
}

/// `request` as its imports read for the pre-import decisions: a persistent cell's code with
/// an `import` of each module its checkpoint's restore needs (from the header of the checkpoint
/// in the staged workspace, unverified: a hint that can only make the run wait for imports).
pub(super) fn imports_of(request: &super::RunRequest) -> super::RunRequest {
    let hint = match (&request.kernel, &request.workspace) {
        // Only the header is read: the whole file is read once, when it is judged.
        (Some(_), Some(workspace)) => {
            open_checked(workspace, &kernel::checkpoint_path(request.language))
                .ok()
                .flatten()
                .and_then(|file| {
                    let mut head = Vec::new();
                    let limit = (kernel::HEADER_MAX_BYTES + kernel::MAGIC.len() + 1) as u64;
                    file.take(limit).read_to_end(&mut head).ok()?;
                    Some(kernel::import_hint(&head))
                })
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let mut code: Vec<u8> = hint
        .iter()
        .filter(|m| m.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        .flat_map(|m| format!("import {m}\n").into_bytes())
        .collect();
    code.extend_from_slice(&request.code);
    super::RunRequest {
        code,
        ..request.clone()
    }
}

/// The program a persistent cell runs: the driver, with the cell and its parameters.
pub(super) fn program(language: Language, cell: &[u8], kernel: &KernelCell, path: &str) -> Vec<u8> {
    let params = serde_json::json!({
        "cell": String::from_utf8_lossy(cell),
        "filename": path,
        "checkpoint": format!("{JAIL_WORKSPACE}/{}", kernel::checkpoint_path(language)),
        "runtime": kernel.runtime,
        "nonce": kernel.nonce,
        "magic": kernel::MAGIC,
        "reason_max": kernel::REASON_MAX_CHARS,
        "results": super::command::results_path(),
    });
    let params = BASE64.encode(params.to_string());
    match language {
        // The display code first, which the driver takes for the cell's rich results.
        Language::Python => format!(
            "{}{PYTHON_DRIVER}\n_corral_kernel('{params}', {})\n",
            super::command::DISPLAY_SOURCE,
            super::command::results_limits()
        ),
        Language::Node => format!("{NODE_DRIVER}\ncorralKernel('{params}');\n"),
    }
    .into_bytes()
}

/// Judges the checkpoint in `workspace` (the host's path of the run's workspace) before the cell
/// runs. On refusal the cell does not run: nothing is restored.
pub(super) fn judge(
    language: Language,
    workspace: &Path,
    kernel: &mut KernelCell,
    max_bytes: u64,
    diagnostics: &mut Vec<String>,
) -> Result<(), NotRun> {
    let checkpoint = read(workspace, &kernel::checkpoint_path(language), max_bytes);
    let seal = read(workspace, &kernel::seal_path(language), 256);
    let refuse = |diagnostics: &mut Vec<String>, refusal: Refusal, why: String| {
        note(diagnostics, format!("{}: {why}", refusal.code()));
        Err(refusal.not_run())
    };
    let checkpoint = match checkpoint {
        Ok(found) => found,
        Err(why) => return refuse(diagnostics, Refusal::Corrupt, why),
    };
    let seal = seal.ok().flatten();
    match kernel::judge(
        language,
        checkpoint.as_deref(),
        seal.as_deref(),
        &kernel.key,
        &kernel.runtime,
    ) {
        Ok(header) => {
            kernel.restored = header.map(|h| h.kept).unwrap_or_default();
            Ok(())
        }
        Err((refusal, why)) => refuse(diagnostics, refusal, why),
    }
}

/// After the cell, with nothing of it alive: reads the checkpoint the workspace now holds, seals
/// it if it is well formed (and removes the seal otherwise, so that it is never restored), and
/// reports what it carries.
pub(super) fn seal(
    language: Language,
    workspace: &Path,
    kernel: &KernelCell,
    max_bytes: u64,
    diagnostics: &mut Vec<String>,
) -> KernelReport {
    let mut report = KernelReport {
        restored: kernel.restored.clone(),
        ..KernelReport::default()
    };
    let seal_path = workspace.join(kernel::seal_path(language));
    // Nothing of the run is alive: what is checked here stays true. The kernel's directories
    // must be directories, not links, before anything is removed or written under them.
    if !kernel_dirs_are_real(workspace) {
        note(
            diagnostics,
            format!(
                "kernel: {} is not a directory; nothing was sealed",
                kernel::CHECKPOINT_DIR
            ),
        );
        return report;
    }
    let checkpoint = match read(workspace, &kernel::checkpoint_path(language), max_bytes) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            let _ = std::fs::remove_file(&seal_path);
            return report;
        }
        Err(why) => {
            note(
                diagnostics,
                format!("kernel: the checkpoint was not sealed: {why}"),
            );
            let _ = std::fs::remove_file(&seal_path);
            return report;
        }
    };
    let header = match kernel::parse(&checkpoint) {
        Ok(header) => header,
        Err((_, why)) => {
            note(
                diagnostics,
                format!("kernel: the checkpoint was not sealed: {why}"),
            );
            let _ = std::fs::remove_file(&seal_path);
            return report;
        }
    };
    let text = kernel::seal(&kernel.key, language, &checkpoint);
    // A fresh file: whatever the code left at the name (a FIFO that would block, a hard link to
    // another file) is removed, and the new one is created exclusively, never followed.
    let _ = std::fs::remove_file(&seal_path);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&seal_path)
        .and_then(|mut file| file.write_all(text.as_bytes()));
    if let Err(e) = written {
        note(
            diagnostics,
            format!("kernel: the checkpoint was not sealed: {e}"),
        );
        let _ = std::fs::remove_file(&seal_path);
        return report;
    }
    report.checkpointed = header.nonce == kernel.nonce;
    report.checkpoint_bytes = u64::try_from(checkpoint.len()).unwrap_or(u64::MAX);
    if report.checkpointed {
        report.kept = header.kept;
        report.not_kept = header.not_kept;
    }
    report
}

/// Whether the kernel's directories under `workspace` are real directories (or absent): never
/// a link the supervisor would follow out of the workspace.
fn kernel_dirs_are_real(workspace: &Path) -> bool {
    let mut at = workspace.to_path_buf();
    kernel::CHECKPOINT_DIR.split('/').all(|part| {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) => meta.is_dir(),
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    })
}

/// Reads `relative` under `root` if it exists, at most `max_bytes`: every directory on the way
/// must be a directory and the file a regular file, none of them a link (nothing of the run is
/// alive while this reads, so what is checked stays true).
fn read(root: &Path, relative: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, String> {
    let Some(file) = open_checked(root, relative)? else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{relative}: {e}"))?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max_bytes {
        return Err(format!("{relative}: larger than the workspace bound"));
    }
    Ok(Some(bytes))
}

/// Opens `relative` under `root` for reading if it exists, with the checks [`read`] describes.
pub(super) fn open_checked(root: &Path, relative: &str) -> Result<Option<std::fs::File>, String> {
    let mut at = root.to_path_buf();
    let parts: Vec<&str> = relative.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{relative}: {e}")),
        };
        let last = i + 1 == parts.len();
        if (last && !meta.is_file()) || (!last && !meta.is_dir()) {
            return Err(format!("{relative}: not a regular file in a directory"));
        }
    }
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&at)
        .map(Some)
        .map_err(|e| format!("{relative}: {e}"))
}
