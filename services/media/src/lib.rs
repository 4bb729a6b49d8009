//! The live view's media pipeline inside the worker (issue 18; BROW-5, BROW-11): the session's X
//! display captured when it changes, converted to I420 and encoded as H.264 with OpenH264 at the
//! bitrate corral-core derives from the capture's pixels and frame rate.
//!
//! - [`capture::Display`]: one connection to the display; `wait_change` blocks on the Damage
//!   extension's notification (so an idle page costs nothing: no polling, no frames), and
//!   `grab` reads the root window's pixels (BGRX); `set_mode` changes the screen's size to the
//!   pane's through RandR (BROW-5).
//! - [`encode::H264`]: the conversion (OpenH264's SIMD RGB-to-YUV) and the encoder, configured
//!   for screen content at `corral_core::browser::media::bitrate`, with a keyframe on request.
//!
//! - [`input::Injector`]: a member's pointer and keys, as `corral_core::browser::input::map`
//!   judged them, performed through XTest.
//!
//! Each stage's duration is measured per frame ([`FrameTimes`]), which is what the media
//! benchmark reports.
//!
//! - [`live`]: the adapter that puts them together for a session's viewers: a WebRTC peer per
//!   viewer (str0m), relayed only through the session's TURN allocation ([`turn`]).

pub mod capture;
pub mod encode;
pub mod input;
pub mod live;
pub mod turn;
pub mod xvfb;

use x11rb::rust_connection::{DefaultStream, RustConnection};

/// A connection to the display `name`: a display name (`:99`), or the path of its socket (a
/// session's display seen from outside its jail, whose `/tmp` is the jail's scratch space).
pub(crate) fn open_display(name: &str) -> Result<(RustConnection, usize), String> {
    let failed = |e: &dyn std::fmt::Display| format!("connect to the display {name}: {e}");
    if name.starts_with('/') {
        let stream = std::os::unix::net::UnixStream::connect(name).map_err(|e| failed(&e))?;
        let (stream, _) = DefaultStream::from_unix_stream(stream).map_err(|e| failed(&e))?;
        let connection = RustConnection::connect_to_stream(stream, 0).map_err(|e| failed(&e))?;
        return Ok((connection, 0));
    }
    x11rb::connect(Some(name)).map_err(|e| failed(&e))
}

use std::time::Duration;

/// How long each stage of one frame took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameTimes {
    /// Reading the display's pixels.
    pub capture: Duration,
    /// BGRX to I420.
    pub convert: Duration,
    /// I420 to H.264.
    pub encode: Duration,
}
