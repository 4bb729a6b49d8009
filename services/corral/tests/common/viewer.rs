//! A member's browser for the live-view tests: headless Chromium (`viewer.py`, over an inherited
//! DevTools pipe) that loads a viewport URL and answers expressions evaluated in the page.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// One viewer page in its own headless Chromium, stopped when dropped.
pub struct Viewer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

/// What the page reports of its connection: the selected candidate pair's types, frames decoded,
/// the picture's size, the signaling relay's state, what the status line says (its words and its
/// code) and the notice over the picture, and how many signaling connections it has made.
pub const STATE: &str = r"(async () => {
  const v = window.corralViewer;
  if (!v) return { loaded: false };
  const screen = document.getElementById('screen');
  const status = document.getElementById('status');
  const out = { loaded: true, state: v.state, closed: v.closed, final: v.final, errors: v.errors,
                sent: v.sent, frames: 0, pair: null, width: screen.videoWidth,
                height: screen.videoHeight, code: status.dataset.code,
                text: document.getElementById('status-text').textContent,
                notice: document.getElementById('notice').hidden ? null
                  : document.getElementById('notice').textContent,
                connections: v.connections, reconnects: v.reconnects };
  if (v.pc) {
    const stats = await v.pc.getStats();
    let pairId = null;
    stats.forEach(s => { if (s.type === 'transport' && s.selectedCandidatePairId) pairId = s.selectedCandidatePairId; });
    stats.forEach(s => { if (s.type === 'inbound-rtp' && s.kind === 'video') out.frames = s.framesDecoded || 0; });
    if (pairId) {
      const pair = stats.get(pairId);
      out.pair = [stats.get(pair.localCandidateId).candidateType, stats.get(pair.remoteCandidateId).candidateType];
    }
  }
  return out;
})()";

/// A script that draws the picture a viewer decoded (what the member sees) onto a canvas and
/// returns what `read` (JavaScript with `canvas` and `context` in scope) returns from it; `null`
/// before the first frame.
#[must_use]
pub fn from_picture(read: &str) -> String {
    format!(
        r"(() => {{
  const video = document.getElementById('screen');
  if (!video || !video.videoWidth) return null;
  const canvas = document.createElement('canvas');
  canvas.width = video.videoWidth; canvas.height = video.videoHeight;
  const context = canvas.getContext('2d');
  context.drawImage(video, 0, 0);
  {read}
}})()"
    )
}

/// The colour of the picture at fractions (`x`, `y`) of it, read back from the video element
/// (what the member sees), as `[r, g, b]`.
#[must_use]
pub fn colour_at(x: f64, y: f64) -> String {
    from_picture(&format!(
        "const d = context.getImageData(Math.floor({x} * canvas.width), Math.floor({y} * canvas.height), 1, 1).data;\n  \
         return [d[0], d[1], d[2]];"
    ))
}

impl Viewer {
    /// Opens `url` in a `width`x`height` window.
    ///
    /// # Panics
    /// When Chromium does not start.
    #[must_use]
    pub fn open(url: &str, width: u32, height: u32) -> Viewer {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(include_str!("viewer.py"))
            .arg(url)
            .arg(format!("{width}x{height}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the viewer's driver");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        stdout.read_line(&mut ready).unwrap();
        assert!(
            ready.contains("\"ready\""),
            "the viewer did not start: {ready}"
        );
        Viewer {
            child,
            stdin: Some(stdin),
            stdout,
        }
    }

    fn ask(&mut self, command: &Value) -> Value {
        writeln!(self.stdin.as_mut().unwrap(), "{command}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        assert!(answer.get("error").is_none(), "the viewer failed: {answer}");
        answer["ok"].clone()
    }

    /// The value of `expression` in the page (a promise is awaited).
    pub fn eval(&mut self, expression: &str) -> Value {
        self.ask(&json!({ "eval": expression }))
    }

    /// Loads `url` in the same window (no new Chromium).
    pub fn navigate(&mut self, url: &str) {
        self.ask(&json!({ "navigate": url }));
    }

    /// Makes the window `width`x`height` CSS pixels at `ratio` device pixels each.
    pub fn metrics(&mut self, width: u32, height: u32, ratio: f64) {
        self.ask(&json!({ "metrics": [width, height, ratio] }));
    }

    /// The page as the member sees it, as PNG.
    ///
    /// # Panics
    /// When the driver's answer is not base64.
    pub fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine as _;
        let png = self.ask(&json!({ "screenshot": true }));
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("a PNG in base64")
    }

    /// Every cookie the viewer's browser holds, for any site (its whole cookie store, including
    /// cookies a page's script cannot see).
    pub fn cookies(&mut self) -> Value {
        self.ask(&json!({ "cookies": true }))
    }

    /// Evaluates `expression` until `duration` has passed, and checks that `holds` is true of
    /// every value read; the last value.
    ///
    /// # Panics
    /// The first value of which it does not hold.
    pub fn holds_for(
        &mut self,
        expression: &str,
        what: &str,
        duration: Duration,
        holds: impl Fn(&Value) -> bool,
    ) -> Value {
        let until = Instant::now() + duration;
        loop {
            let value = self.eval(expression);
            assert!(holds(&value), "{what}: no longer so: {value}");
            if Instant::now() >= until {
                return value;
            }
            // Each evaluation is a round trip to Chromium; this only spaces them.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A real mouse click at (`x`, `y`) CSS pixels of the viewer's window.
    pub fn click(&mut self, x: u32, y: u32) {
        self.ask(&json!({ "click": [x, y] }));
    }

    /// Evaluates [`STATE`] until `done` holds of it, within `timeout`; the last state read.
    ///
    /// # Panics
    /// When it does not hold in time, with the last state.
    pub fn wait(&mut self, what: &str, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
        self.wait_for(STATE, what, timeout, done)
    }

    /// Evaluates `expression` until `done` holds of its value, within `timeout`.
    ///
    /// # Panics
    /// When it does not hold in time, with the last value.
    pub fn wait_for(
        &mut self,
        expression: &str,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.eval(expression);
            if done(&value) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {timeout:?}: {value}"
            );
            // Each evaluation is a round trip to Chromium; this only spaces them.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Viewer {
    /// Closing its input ends the driver, which stops its Chromium (which would also die with it).
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `colour` is within `tolerance` of `expected` in every channel (H.264 is lossy).
#[must_use]
pub fn near(colour: &Value, expected: [u8; 3], tolerance: i64) -> bool {
    colour.as_array().is_some_and(|c| {
        c.len() == 3
            && c.iter().zip(expected).all(|(got, want)| {
                got.as_i64()
                    .is_some_and(|g| (g - i64::from(want)).abs() <= tolerance)
            })
    })
}
