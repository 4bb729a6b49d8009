//! The jail's stages run from `corral-stage` beside `corral` when it is of the same build, and from
//! `corral` itself otherwise (decision 0057): never from a stage binary of another build.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use corral_testkit::registries::TempDir;
use corral_worker::Reexec;

const STAGE: &str = env!("CARGO_BIN_EXE_corral-stage");

#[test]
fn the_stage_binary_of_this_build_beside_is_chosen_and_executed_through_its_descriptor() {
    let chosen = Reexec::beside(Path::new(STAGE).parent().unwrap(), &["jail"]);
    assert!(
        chosen.program.starts_with("/proc/self/fd/"),
        "{:?}",
        chosen.program
    );
    assert!(chosen.prefix.is_empty(), "{:?}", chosen.prefix);
    // What the descriptor names is the stage binary, and it answers for this build.
    let answer = std::process::Command::new(&chosen.program)
        .arg("__build")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&answer.stdout).trim_end(),
        corral_worker::STAGE_BUILD
    );
}

#[test]
fn without_a_stage_binary_or_with_one_of_another_build_the_stages_run_from_this_binary() {
    let empty = TempDir::new("stage-test-empty");
    let fallback = Reexec::beside(empty.path(), &["jail"]);
    assert_eq!(fallback.program, Path::new("/proc/self/exe"));
    assert_eq!(fallback.prefix, ["jail"]);

    let stale = TempDir::new("stage-test-stale");
    let path = stale.path().join("corral-stage");
    // A binary that answers `__build` with something else: `echo` answers with the word itself.
    std::fs::copy("/bin/echo", &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let why = Reexec::stage_binary(&path).unwrap_err();
    assert!(why.contains("of build \"__build\""), "{why}");
    let fallback = Reexec::beside(stale.path(), &["jail"]);
    assert_eq!(fallback.program, Path::new("/proc/self/exe"));
    assert_eq!(fallback.prefix, ["jail"]);
}

/// `corral jail run` (as a worker does) executes its jail's stages from `corral-stage` beside it:
/// the jail's stage 1, found on the host by its name while the code runs, is that file.
#[test]
fn corral_jail_run_executes_its_stages_from_the_stage_binary_beside_it() {
    let test = "corral_jail_run_executes_its_stages_from_the_stage_binary_beside_it";
    if !corral_testkit::is_root() {
        corral_testkit::skip(test, corral_testkit::Need::Root, "a jail needs root");
        return;
    }
    let dir = TempDir::new("stage-test-run");
    let code = dir.path().join("main.py");
    // Long enough to be found; the run then ends by itself, and its reset proves it gone.
    std::fs::write(&code, "import time\ntime.sleep(2)\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_corral"))
        .args([
            "jail",
            "run",
            "--language",
            "python",
            "--wall-seconds",
            "20",
        ])
        .arg(&code)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mine = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let stage1 = loop {
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .find_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let parent: u32 = stat
                    .rsplit(')')
                    .next()?
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                (comm.trim_end() == "corral-stage1" && parent == mine).then_some(pid)
            });
        if let Some(pid) = found {
            break pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no stage 1 of this run appeared"
        );
        std::thread::yield_now();
    };
    let exe = std::fs::read_link(format!("/proc/{stage1}/exe")).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        exe,
        Path::new(STAGE).canonicalize().unwrap(),
        "stage 1's program"
    );
    assert!(status.success(), "corral jail run: {status}");
}
