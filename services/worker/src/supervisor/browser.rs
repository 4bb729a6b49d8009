//! Browser sessions in a jail (BROW-1, BROW-3, BROW-10, BROW-13). A session's jail runs the
//! bridge (`browser/bridge.py`, standard-library Python) as its program: it starts Xvfb with
//! XTest, Openbox, PulseAudio and one headed Chromium with a fresh profile in the jail's scratch
//! space, owns Chromium over an inherited pipe (no debugger socket), and answers one JSON line per
//! action on the pipes the supervisor holds. Chromium's only route out is the egress relay in the
//! jail's network namespace, with the session's grant; loopback is subtracted from its proxy
//! bypass, so a page's request for the worker's own ports reaches the egress proxy, which refuses
//! it (BROW-7).
//!
//! A session holds the worker until it is closed: no run and no second session meanwhile. Close
//! tells the bridge to stop every process, waits for the jail to end, then resets as a run does
//! (every process killed and counted, the scratch space with the profile unmounted, the cgroups
//! removed); `confirmed` says whether the runtime stopped when told to.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read as _, Write as _};
use std::os::fd::AsFd as _;
use std::process::{ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use corral_contract::messages::{
    BrowserActReply, BrowserCloseReply, BrowserNavigated, BrowserOpenReply, BrowserOpenRequest,
    EvidenceReport,
};
use corral_core::bounds::ExecutionBounds;
use corral_core::browser::{self, Action, ActionError};
use corral_core::ids::OpToken;
use corral_core::jail::Language;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde_json::{Value, json};

use super::launch::Started;
use super::{ActiveRun, Worker};
use crate::result::{RunResult, note};

/// The bridge, written beside a session's program like a run's code.
const BRIDGE: &str = include_str!("../browser/bridge.py");
/// Where the jail sees it.
const BRIDGE_PATH: &str = "/run/corral/bridge.py";
/// The session runtime's programs by the bridge's names for them, from Debian's packages
/// (`scripts/setup-services` installs them); Chromium is the binary, not its wrapper script.
pub const RUNTIME_PROGRAMS: [(&str, &str); 4] = [
    ("chromium", "/usr/lib/chromium/chromium"),
    ("xvfb", "/usr/bin/Xvfb"),
    ("openbox", "/usr/bin/openbox"),
    ("pulseaudio", "/usr/bin/pulseaudio"),
];
/// The X display number inside the jail (its own network and IPC namespaces: no clash).
const DISPLAY: u32 = 99;
/// How the bridge's line saying its display is up begins.
const DISPLAY_UP: &str = "{\"display\"";
/// The largest line the bridge may answer with: a screenshot in base64 and its envelope.
const REPLY_LINE_MAX: usize = browser::SCREENSHOT_MAX_BYTES / 3 * 4 + 64 * 1024;
/// How long the bridge may take to stop everything when told to close.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The session display's socket seen from the worker: in the jail's `/tmp`, its scratch space.
fn display_socket(dirs: &crate::workspace::RunDirs) -> std::path::PathBuf {
    dirs.scratch().join(format!("tmp/.X11-unix/X{DISPLAY}"))
}

/// A session's bounds: a headed browser needs more than a run of code (processes count threads).
fn session_bounds(configured: &ExecutionBounds) -> ExecutionBounds {
    ExecutionBounds {
        max_memory_bytes: configured.max_memory_bytes.max(2 << 30),
        max_processes: configured.max_processes.max(2048),
        tmp_max_bytes: configured.tmp_max_bytes.max(1 << 30),
        max_wall_seconds: 24 * 60 * 60,
        ..configured.clone()
    }
}

/// An open session.
pub(super) struct Session {
    pub(super) run: ActiveRun,
    started: Started,
    stdin: ChildStdin,
    pending: Vec<u8>,
    next: u64,
}

/// Why a session call failed.
#[derive(Debug)]
pub enum SessionError {
    /// A session holds the worker already.
    Open,
    /// No session is open.
    Absent,
    /// The action failed, with its code and a message.
    Action(ActionError, String),
    /// The runtime did not start; what its reset found.
    Start(String, EvidenceReport),
}

/// Reads one line from the bridge within `deadline`, keeping what follows it.
fn read_line(
    stdout: &mut ChildStdout,
    pending: &mut Vec<u8>,
    deadline: Instant,
) -> Result<String, String> {
    loop {
        if let Some(at) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            return Ok(String::from_utf8_lossy(&line[..at]).into_owned());
        }
        if pending.len() > REPLY_LINE_MAX {
            return Err("the bridge's answer is over its bound".to_owned());
        }
        let mut chunk = [0u8; 64 * 1024];
        match stdout.read(&mut chunk) {
            Ok(0) => return Err("the bridge ended".to_owned()),
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err("the bridge did not answer in time".to_owned());
                }
                let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
                let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(millis));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read the bridge: {e}")),
        }
    }
}

/// The bridge's parameters: the display and capture sizes, the runtime's paths and programs, the
/// bounds, and the first URL.
fn bridge_params(order: &BrowserOpenRequest, capture: browser::media::Capture) -> Value {
    // The first navigation, checked as an action is (the API admitted it already).
    let first_url = order.url.clone().filter(|url| {
        Action::Navigate {
            url: url.clone(),
            timeout_ms: None,
        }
        .check()
        .is_ok()
    });
    json!({
        "display": DISPLAY,
        "width": capture.width,
        "height": capture.height,
        "screen": [browser::media::MAX_WIDTH, browser::media::MAX_HEIGHT],
        "home": "/tmp/home",
        "runtime_dir": "/tmp/runtime",
        "profile": "/tmp/profile",
        "proxy": crate::relay::PROXY_URL,
        "programs": RUNTIME_PROGRAMS
            .into_iter()
            .map(|(name, path)| (name.to_owned(), Value::from(path)))
            .collect::<serde_json::Map<_, _>>(),
        "step_seconds": browser::STEP_MAX_MS / 1000,
        "reply_max_bytes": browser::REPLY_MAX_BYTES,
        "url": first_url,
    })
}

/// A started runtime: the bridge's jail, its stdin, what it said past its ready line, and when
/// each step of its start finished.
struct Opened {
    started: Started,
    stdin: ChildStdin,
    pending: Vec<u8>,
    phases_ms: BTreeMap<String, u64>,
    navigated: Option<BrowserNavigated>,
}

impl Worker {
    /// The open session's X display, seen from the worker: the socket in the jail's `/tmp`
    /// (its scratch space), which the live view's adapter connects to from outside the jail.
    #[must_use]
    pub fn session_display(&self) -> Option<std::path::PathBuf> {
        let dirs = self.session.as_ref()?.run.dirs.as_ref()?;
        Some(display_socket(dirs))
    }

    /// Whether a browser session holds this worker.
    #[must_use]
    pub fn has_session(&self) -> bool {
        self.session.is_some()
    }

    /// Opens a session: its jail, with the bridge as its program, and the runtime it starts.
    ///
    /// # Errors
    /// A session already open, or a runtime that did not start (the worker reset what it began).
    pub fn open_browser(
        &mut self,
        order: &BrowserOpenRequest,
    ) -> Result<BrowserOpenReply, SessionError> {
        if self.session.is_some() {
            return Err(SessionError::Open);
        }
        let started_at = Instant::now();
        let mut result = RunResult::default();
        let bounds = session_bounds(&self.settings.bounds);
        let configured = std::mem::replace(&mut self.settings.bounds, bounds);
        let mut run = self.new_run();
        let opened = self.start_session(order, &mut run, &mut result);
        self.settings.bounds = configured;
        match opened {
            Ok(Opened {
                started,
                stdin,
                pending,
                phases_ms,
                navigated,
            }) => {
                self.session = Some(Session {
                    run,
                    started,
                    stdin,
                    pending,
                    next: 0,
                });
                Ok(BrowserOpenReply {
                    start_ms: u64::try_from(started_at.elapsed().as_millis()).unwrap_or(u64::MAX),
                    phases_ms,
                    navigated,
                    relayed: None,
                    isolation: result.reply.isolation,
                    diagnostics: result.reply.diagnostics,
                })
            }
            Err(why) => {
                note(&mut result.reply.diagnostics, why.clone());
                let evidence = self.reset(&mut run, order.token, &mut result.reply.diagnostics);
                Err(SessionError::Start(
                    format!("{why}; {}", result.reply.diagnostics.join("; ")),
                    EvidenceReport::judged(evidence),
                ))
            }
        }
    }

    fn start_session(
        &self,
        order: &BrowserOpenRequest,
        run: &mut ActiveRun,
        result: &mut RunResult,
    ) -> Result<Opened, String> {
        let posture = self
            .decide_posture(result)
            .map_err(|reason| format!("isolation: {}", reason.code()))?;
        let dirs = self
            .create_dirs(run, result)
            .map_err(|reason| format!("directories: {}", reason.code()))?;
        self.create_cgroups(run, &posture, result)
            .map_err(|reason| format!("cgroups: {}", reason.code()))?;
        dirs.write_code("bridge.py", BRIDGE.as_bytes())?;
        let capture = browser::media::Capture::bounded(order.width, order.height);
        let params = bridge_params(order, capture);
        let mut plan = self.plan(
            Language::Python,
            run,
            &posture,
            self.settings.bounds.max_wall_seconds,
            None,
        );
        plan.argv = vec![
            super::stack::SYSTEM_PYTHON.to_owned(),
            BRIDGE_PATH.to_owned(),
            BASE64.encode(params.to_string()),
        ];
        let (started, stdin) = self
            .start_jail(
                &plan,
                run,
                order.grant.as_deref(),
                None,
                &mut result.reply.diagnostics,
                true,
            )
            .map_err(|reason| format!("jail: {}", reason.code()))?;
        let stdin = stdin.ok_or("the bridge's stdin is missing")?;
        Self::await_ready(started, stdin, &dirs, capture)
    }

    /// Waits for the bridge's display, sets the capture's mode on it, lets the bridge go on, and
    /// reads its ready line.
    fn await_ready(
        mut started: Started,
        stdin: ChildStdin,
        dirs: &crate::workspace::RunDirs,
        capture: browser::media::Capture,
    ) -> Result<Opened, String> {
        let mut pending = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(browser::OPEN_MAX_SECONDS);
        let mut line = read_line(&mut started.stdout, &mut pending, deadline)?;
        // The display is up at its largest: its mode becomes the capture (BROW-5, BROW-11), then
        // the bridge starts the window manager and Chromium at that size.
        if line.starts_with(DISPLAY_UP) {
            let socket = display_socket(dirs);
            corral_media::capture::set_screen_mode(&socket.to_string_lossy(), capture)
                .map_err(|e| format!("the screen's mode: {e}"))?;
            let mut stdin = stdin;
            stdin
                .write_all(b"go\n")
                .map_err(|e| format!("the bridge is gone: {e}"))?;
            line = read_line(&mut started.stdout, &mut pending, deadline)?;
            return Self::finish_open(&line, started, stdin, pending);
        }
        Err(format!("the runtime did not start: {line}"))
    }

    /// Reads the bridge's ready line.
    fn finish_open(
        line: &str,
        started: Started,
        stdin: ChildStdin,
        pending: Vec<u8>,
    ) -> Result<Opened, String> {
        let ready: Value = serde_json::from_str(line).map_err(|_| "the bridge said nothing")?;
        if ready["ready"] != true {
            return Err(format!("the runtime did not start: {}", ready["error"]));
        }
        let phases_ms = ready["phases"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(step, ms)| Some((step.clone(), ms.as_u64()?)))
            .collect();
        let navigated = ready.get("navigated").map(|navigated| {
            let took_ms = navigated["took_ms"].as_u64().unwrap_or_default();
            match (navigated.get("ok"), navigated.get("error")) {
                (Some(result), _) => BrowserNavigated {
                    result: Some(result.clone()),
                    error: None,
                    took_ms,
                },
                (None, error) => {
                    let error = error.cloned().unwrap_or(Value::Null);
                    let code = ActionError::of_code(error["code"].as_str().unwrap_or_default());
                    BrowserNavigated {
                        result: None,
                        error: Some((
                            code.code().to_owned(),
                            error["message"].as_str().unwrap_or_default().to_owned(),
                        )),
                        took_ms,
                    }
                }
            }
        });
        Ok(Opened {
            started,
            stdin,
            pending,
            phases_ms,
            navigated,
        })
    }

    /// One action on the open session.
    ///
    /// # Errors
    /// No session, or the action's failure with its code.
    pub fn browser_act(&mut self, action: &Action) -> Result<BrowserActReply, SessionError> {
        let session = self.session.as_mut().ok_or(SessionError::Absent)?;
        if let Err(why) = action.check() {
            return Err(SessionError::Action(ActionError::Invalid, why));
        }
        let started = Instant::now();
        session.next += 1;
        let mut request = serde_json::to_value(action).unwrap_or(Value::Null);
        request["id"] = json!(session.next);
        let gone = |why: String| SessionError::Action(ActionError::BrowserGone, why);
        session
            .stdin
            .write_all(format!("{request}\n").as_bytes())
            .map_err(|e| gone(format!("the bridge is gone: {e}")))?;
        // The bridge bounds each step; this bounds the bridge.
        let deadline = started + Duration::from_millis(browser::STEP_MAX_MS + 5_000);
        let line =
            read_line(&mut session.started.stdout, &mut session.pending, deadline).map_err(gone)?;
        let answer: Value =
            serde_json::from_str(&line).map_err(|_| gone("the bridge answered garbage".into()))?;
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if answer["id"] != json!(session.next) {
            return Err(gone("the bridge answered another action".into()));
        }
        match (answer.get("ok"), answer.get("error")) {
            (Some(result), _) => Ok(BrowserActReply {
                result: result.clone(),
                took_ms,
            }),
            (None, Some(error)) => Err(SessionError::Action(
                ActionError::of_code(error["code"].as_str().unwrap_or_default()),
                error["message"].as_str().unwrap_or_default().to_owned(),
            )),
            (None, None) => Err(gone("the bridge answered neither".into())),
        }
    }

    /// Closes the session: the runtime told to stop, then the reset with `token`.
    ///
    /// # Errors
    /// No session is open.
    pub fn close_browser(&mut self, token: OpToken) -> Result<BrowserCloseReply, SessionError> {
        let Some(mut session) = self.session.take() else {
            return Err(SessionError::Absent);
        };
        let mut diagnostics = Vec::new();
        let _ = session
            .stdin
            .write_all(b"{\"action\":\"close\",\"id\":0}\n");
        drop(session.stdin);
        let deadline = Instant::now() + CLOSE_GRACE;
        let mut confirmed = false;
        // The bridge says it closes, then ends when every process it started has: the jail's
        // stdout reaches its end.
        loop {
            match read_line(&mut session.started.stdout, &mut session.pending, deadline) {
                Ok(_) => {}
                Err(why) if why == "the bridge ended" => {
                    confirmed = true;
                    break;
                }
                Err(why) => {
                    note(&mut diagnostics, format!("close: {why}"));
                    break;
                }
            }
        }
        let evidence = self.reset(&mut session.run, token, &mut diagnostics);
        Ok(BrowserCloseReply {
            confirmed,
            reset_evidence: EvidenceReport::judged(evidence),
            diagnostics,
        })
    }
}
