//! Before the jail: the run's posture, directories, cgroups and workspace.

use std::path::Path;

use corral_core::downloads;
use corral_core::jail::{Language, NotRun, Posture, Primitive};

use super::{ActiveRun, RunRequest, Worker};
use crate::cgroup::RunCgroups;
use crate::result::{RunResult, note};
use crate::workspace::{self, CopyInError, RunDirs};

impl Worker {
    /// Records the posture in `result`, or refuses with the missing primitives.
    pub(super) fn decide_posture(&self, result: &mut RunResult) -> Result<Posture, NotRun> {
        result.reply.isolation.missing = self.missing.keys().map(|p| p.code().to_owned()).collect();
        match self.posture() {
            Ok(posture) => {
                result.reply.isolation.posture = match posture {
                    Posture::Full => "full",
                    Posture::Weaker { .. } => "weaker",
                }
                .to_owned();
                for (primitive, why) in &self.missing {
                    note(
                        &mut result.reply.diagnostics,
                        format!("waived {}: {why}", primitive.code()),
                    );
                }
                Ok(posture)
            }
            Err(refusing) => {
                result.reply.isolation.posture = "refused".to_owned();
                for primitive in refusing {
                    let why = self.missing.get(&primitive).map_or("", String::as_str);
                    note(
                        &mut result.reply.diagnostics,
                        format!("missing {}: {why}", primitive.code()),
                    );
                }
                Err(NotRun::IsolationUnavailable)
            }
        }
    }

    /// Creates the run's directories (recorded in `run` even when half-made, so that the reset
    /// removes what was made).
    pub(super) fn create_dirs(
        &self,
        run: &mut ActiveRun,
        result: &mut RunResult,
    ) -> Result<RunDirs, NotRun> {
        let bounds = &self.settings.bounds;
        let setup_failed = |diagnostics: &mut Vec<String>, error: String| {
            note(diagnostics, error);
            NotRun::JailSetupFailed
        };
        let dirs = RunDirs::create(
            run.run_dir.clone(),
            (run.uids[1], run.uids[1]),
            bounds.workspace_max_bytes,
            bounds.tmp_max_bytes,
        );
        run.dirs = Some(RunDirs {
            run_dir: run.run_dir.clone(),
        });
        dirs.map_err(|e| setup_failed(&mut result.reply.diagnostics, e))
    }

    /// Creates the run's cgroups (recorded in `run`, for the reset).
    pub(super) fn create_cgroups(
        &self,
        run: &mut ActiveRun,
        posture: &Posture,
        result: &mut RunResult,
    ) -> Result<(), NotRun> {
        let bounds = &self.settings.bounds;
        let waived = |primitive| matches!(posture, Posture::Weaker { waived } if waived.contains(&primitive));
        let memory_cgroup = !waived(Primitive::CgroupMemory);
        let pids_cgroup = !waived(Primitive::CgroupPids);
        run.cgroups = RunCgroups::create(
            Path::new(&self.settings.jail.cgroup_root),
            &format!("run-{}-{}", std::process::id(), run.uids[0]),
            memory_cgroup.then_some(bounds.max_memory_bytes),
            pids_cgroup.then_some(bounds.max_processes),
        )
        .map_err(|(primitive, e)| {
            note(
                &mut result.reply.diagnostics,
                format!("{}: {e}", primitive.code()),
            );
            NotRun::JailSetupFailed
        })?;
        Ok(())
    }

    /// Copies the request's workspace in and writes the code file; returns the workspace as it
    /// was before the code ran.
    pub(super) fn fill_workspace(
        &self,
        request: &RunRequest,
        language: Language,
        run: &ActiveRun,
        dirs: &RunDirs,
        result: &mut RunResult,
    ) -> Result<downloads::Snapshot, NotRun> {
        let bounds = &self.settings.bounds;
        let setup_failed = |diagnostics: &mut Vec<String>, error: String| {
            note(diagnostics, error);
            NotRun::JailSetupFailed
        };
        if let Some(source) = &request.workspace {
            match workspace::copy_in(
                source,
                &dirs.workspace(),
                (run.uids[1], run.uids[1]),
                bounds.workspace_max_bytes,
                &mut result.reply.diagnostics,
            ) {
                Ok(()) => {}
                Err(CopyInError::TooLarge(why)) => {
                    note(
                        &mut result.reply.diagnostics,
                        format!("workspace: {why} (SANDBOX_WORKSPACE_MAX_BYTES)"),
                    );
                    return Err(NotRun::WorkspaceTooLarge);
                }
                Err(CopyInError::Io(why)) => {
                    return Err(setup_failed(&mut result.reply.diagnostics, why));
                }
            }
        }
        // Also in a warm run, though the code arrives on the pipe: the code may read its own
        // file, as it can in a cold run.
        let code_name = format!("main.{}", language.extension());
        dirs.write_code(&code_name, &request.code)
            .map_err(|e| setup_failed(&mut result.reply.diagnostics, e))?;
        // The library the code calls its tools with, beside it (KER-5); in every persistent
        // cell, so that a kernel that imported it restores in a cell without tools.
        if request.tools.is_some() || request.kernel.is_some() {
            let (name, library) = match language {
                Language::Python => ("corral_tools.py", crate::tools::PYTHON_LIBRARY),
                Language::Node => ("corral_tools.js", crate::tools::NODE_LIBRARY),
            };
            dirs.write_code(name, library.as_bytes())
                .map_err(|e| setup_failed(&mut result.reply.diagnostics, e))?;
        }
        let (before, _, _) = workspace::snapshot(&dirs.workspace())
            .map_err(|e| setup_failed(&mut result.reply.diagnostics, e))?;
        Ok(before)
    }

    /// Verifies the turn's projection (PROJ-6: names, the admitted manifest's digest, sizes,
    /// content digests) and writes it, read-only, where the jail mounts it outside the
    /// workspace. Before the jail exists, so no code ever sees an unverified byte.
    pub(super) fn project_resources(
        request: &RunRequest,
        dirs: &RunDirs,
        result: &mut RunResult,
    ) -> Result<bool, NotRun> {
        let Some(projected) = request.resources.as_deref() else {
            return Ok(false);
        };
        if projected.manifest.entries.is_empty() {
            return Ok(false);
        }
        let files: Vec<&[u8]> = projected.files.iter().map(Vec::as_slice).collect();
        if let Err(failed) = corral_core::projection::verify_files(
            &projected.manifest,
            &projected.manifest_digest,
            &files,
        ) {
            note(
                &mut result.reply.diagnostics,
                format!(
                    "resources: {}{}",
                    failed.detail,
                    failed.file.map(|f| format!(" ({f})")).unwrap_or_default()
                ),
            );
            return Err(failed.mismatch.not_run());
        }
        workspace::write_resources(&dirs.resources(), &projected.manifest, &files).map_err(
            |e| {
                note(&mut result.reply.diagnostics, e);
                NotRun::JailSetupFailed
            },
        )?;
        Ok(true)
    }
}
