//! A virtual display of a given size on a free display number (Debian's Xvfb), for the media
//! test and benchmark; stopped when dropped. A session's own display is started by the worker's
//! bridge inside the jail.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    /// Xvfb at `capture`'s size on the first free display number from `first`, once its socket
    /// exists.
    ///
    /// # Errors
    /// No free number, or Xvfb did not start within ten seconds.
    pub fn start(capture: Capture, first: u32) -> Result<Xvfb, String> {
        let number = (first..first + 200)
            .find(|n| !Path::new(&format!("/tmp/.X11-unix/X{n}")).exists())
            .ok_or("no free display number")?;
        let display = format!(":{number}");
        let child = Command::new(XVFB)
            .args([
                &display,
                "-screen",
                "0",
                &format!("{}x{}x24", capture.width, capture.height),
                "-nolisten",
                "tcp",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{XVFB}: {e}"))?;
        let server = Xvfb { child, display };
        let socket = format!("/tmp/.X11-unix/X{number}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&socket).exists() {
            if Instant::now() > deadline {
                return Err(format!("Xvfb did not open {socket}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
