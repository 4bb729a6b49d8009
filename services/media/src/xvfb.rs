//! A virtual display of a given size on a display number of its choosing (Debian's Xvfb), for the media
//! test and benchmark; stopped when dropped. A session's own display is started by the worker's
//! bridge inside the jail.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

use corral_core::browser::media::Capture;

/// Where Debian's Xvfb is.
pub const XVFB: &str = "/usr/bin/Xvfb";

/// A running Xvfb.
pub struct Xvfb {
    child: Child,
    /// Its display name (`:N`).
    pub display: String,
}

impl Xvfb {
    /// Xvfb at `capture`'s size on a display number it chooses itself (`-displayfd`, so that
    /// concurrent starts never race for one), once it accepts connections.
    ///
    /// # Errors
    /// Xvfb did not start or did not say its display.
    pub fn start(capture: Capture) -> Result<Xvfb, String> {
        let mut child = Command::new(XVFB)
            .args([
                "-displayfd",
                "1",
                "-screen",
                "0",
                &format!("{}x{}x24", capture.width, capture.height),
                "-nolisten",
                "tcp",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{XVFB}: {e}"))?;
        // Xvfb writes its display number once it is ready for clients.
        let mut line = String::new();
        let read = child
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut line));
        let number = line.trim().parse::<u32>();
        match (read, number) {
            (Some(Ok(_)), Ok(number)) => Ok(Xvfb {
                child,
                display: format!(":{number}"),
            }),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("Xvfb did not say its display ({line:?})"))
            }
        }
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
