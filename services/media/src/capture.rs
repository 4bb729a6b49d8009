//! The session's X display: its size, its pixels, and when they change.

use std::os::fd::AsFd as _;
use std::time::Duration;

use corral_core::browser::media::{Capture, MAX_HEIGHT, MAX_WIDTH};
use std::os::unix::fs::FileExt as _;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::memfd::{MFdFlags, memfd_create};
use x11rb::connection::Connection as _;
use x11rb::protocol::Event;
use x11rb::protocol::damage::{self, ConnectionExt as _};
use x11rb::protocol::randr::{self, ConnectionExt as _};
use x11rb::protocol::shm::ConnectionExt as _;
use x11rb::protocol::xproto::{
    ChangeWindowAttributesAux, ConnectionExt as _, EventMask, ImageFormat,
};
use x11rb::rust_connection::RustConnection;

#[allow(clippy::cast_possible_truncation)]
const MAX_SIDE_WIDTH: u16 = MAX_WIDTH as u16;
#[allow(clippy::cast_possible_truncation)]
const MAX_SIDE_HEIGHT: u16 = MAX_HEIGHT as u16;

/// A memfd attached to the server as a shared-memory segment.
struct Shared {
    segment: u32,
    file: std::fs::File,
}

/// One connection to a display, watching its root window for damage.
pub struct Display {
    connection: RustConnection,
    root: u32,
    /// One damage watch on the root and one on each of its children (a window's own drawing
    /// is not the root's damage).
    damages: Vec<u32>,
    width: u16,
    height: u16,
    /// Damage seen and not yet captured.
    changed: bool,
    /// The shared-memory segment the server writes the screen into (MIT-SHM 1.2, a memfd it
    /// maps), sized for the largest screen; `None` when the server cannot attach one.
    shared: Option<Shared>,
    /// The sequence number of the request that last re-armed the watch: a notification of
    /// damage done before it (still queued when the screen was read) is stale.
    armed_at: u16,
}

fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Display {
    /// Connects to `name` (`:99`, or the path of its socket) and starts watching the whole screen for damage.
    ///
    /// # Errors
    /// The display cannot be reached, or lacks the Damage extension.
    pub fn connect(name: &str) -> Result<Display, String> {
        let (connection, screen) = crate::open_display(name)?;
        let (root, width, height) = {
            let screen = &connection.setup().roots[screen];
            (screen.root, screen.width_in_pixels, screen.height_in_pixels)
        };
        connection
            .damage_query_version(1, 1)
            .map_err(|e| failed("Damage")(&e))?
            .reply()
            .map_err(|e| failed("Damage")(&e))?;
        // New top-level windows are announced, and watched as they come.
        connection
            .change_window_attributes(
                root,
                &ChangeWindowAttributesAux::new().event_mask(EventMask::SUBSTRUCTURE_NOTIFY),
            )
            .map_err(|e| failed("watch for windows")(&e))?;
        let children = connection
            .query_tree(root)
            .map_err(|e| failed("list the windows")(&e))?
            .reply()
            .map_err(|e| failed("list the windows")(&e))?
            .children;
        let mut display = Display {
            connection,
            root,
            damages: Vec::new(),
            width,
            height,
            // The first frame is always wanted.
            changed: true,
            shared: None,
            armed_at: 0,
        };
        display.shared = display.attach_shared();
        for window in std::iter::once(root).chain(children) {
            display.watch(window)?;
        }
        display
            .connection
            .flush()
            .map_err(|e| failed("flush")(&e))?;
        Ok(display)
    }

    /// A memfd as large as the screen can be, attached to the server; `None` when the server has
    /// no MIT-SHM 1.2 (fd passing) or refuses it, and the capture reads through the socket.
    fn attach_shared(&self) -> Option<Shared> {
        let version = self.connection.shm_query_version().ok()?.reply().ok()?;
        if (version.major_version, version.minor_version) < (1, 2) {
            return None;
        }
        // As large as the screen can become (a mode change may grow it up to the size the display
        // started at); the file is sparse until the server writes into it.
        let bytes = u64::from(self.width.max(MAX_SIDE_WIDTH))
            * u64::from(self.height.max(MAX_SIDE_HEIGHT))
            * 4;
        let fd = memfd_create("corral-capture", MFdFlags::MFD_CLOEXEC).ok()?;
        let file = std::fs::File::from(fd);
        file.set_len(bytes).ok()?;
        let segment = self.connection.generate_id().ok()?;
        let shared_fd = file.try_clone().ok()?;
        self.connection
            .shm_attach_fd(segment, std::os::fd::OwnedFd::from(shared_fd), false)
            .ok()?
            .check()
            .ok()?;
        Some(Shared { segment, file })
    }

    /// Starts a damage watch on `window`.
    fn watch(&mut self, window: u32) -> Result<(), String> {
        let damage = self
            .connection
            .generate_id()
            .map_err(|e| failed("an X id")(&e))?;
        // A window gone before the request arrives is an error event, ignored.
        self.connection
            .damage_create(damage, window, damage::ReportLevel::NON_EMPTY)
            .map_err(|e| failed("watch the screen")(&e))?
            .ignore_error();
        self.damages.push(damage);
        Ok(())
    }

    /// Whether the screen is read through shared memory (MIT-SHM) rather than the socket.
    #[must_use]
    pub fn shared_memory(&self) -> bool {
        self.shared.is_some()
    }

    /// The screen's size in pixels.
    #[must_use]
    pub fn size(&self) -> (u16, u16) {
        (self.width, self.height)
    }

    /// Waits up to `timeout` for the screen to change since the last [`Display::grab`]; true
    /// when it has. Blocks in poll(2) on the connection: no work while nothing changes.
    ///
    /// # Errors
    /// The connection failed.
    pub fn wait_change(&mut self, timeout: Duration) -> Result<bool, String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.changed()? {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.as_fd(), PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(millis)).map_err(|e| failed("poll")(&e))?;
        }
    }

    /// Whether the screen changed since the last [`Display::grab`], reading what the server sent
    /// without waiting. A caller that waits on [`Display::as_fd`] itself calls this first: a
    /// notification may have been read already while a reply was awaited.
    ///
    /// # Errors
    /// The connection failed.
    pub fn changed(&mut self) -> Result<bool, String> {
        while let Some(event) = self
            .connection
            .poll_for_event()
            .map_err(|e| failed("read the display")(&e))?
        {
            // Sequence numbers wrap at 16 bits: "at or after" is a forward distance under half.
            match event {
                Event::DamageNotify(notify)
                    if notify.sequence.wrapping_sub(self.armed_at) < 0x8000 =>
                {
                    self.changed = true;
                }
                Event::CreateNotify(created) => {
                    self.watch(created.window)?;
                    self.connection.flush().map_err(|e| failed("flush")(&e))?;
                    self.changed = true;
                }
                _ => {}
            }
        }
        Ok(self.changed)
    }

    /// The connection's descriptor, readable when the server has sent something.
    #[must_use]
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.connection.stream().as_fd()
    }

    /// Changes the screen's mode to `capture` through RandR (BROW-5): the desktop becomes exactly
    /// the pane's device pixels. The display must have been started at least that large (a
    /// session's starts at `corral_core::browser::media`'s maximum); a mode is created once per
    /// size and reused.
    ///
    /// # Errors
    /// The server refused the size (larger than it started), or the connection failed.
    pub fn set_mode(&mut self, capture: Capture) -> Result<(), String> {
        set_mode_on(&self.connection, self.root, capture)?;
        // Both fit in u16: `set_mode_on` refused anything else.
        #[allow(clippy::cast_possible_truncation)]
        {
            self.width = capture.width as u16;
            self.height = capture.height as u16;
        }
        self.changed = true;
        Ok(())
    }

    /// The screen's pixels now, as BGRX rows of `width * 4` bytes; re-arms the damage watch
    /// first, so a change during the read is seen by the next [`Display::wait_change`].
    ///
    /// # Errors
    /// The connection failed.
    pub fn grab(&mut self) -> Result<Vec<u8>, String> {
        self.changed = false;
        let mut first = None;
        for damage in &self.damages {
            let armed = self
                .connection
                .damage_subtract(*damage, x11rb::NONE, x11rb::NONE)
                .map_err(|e| failed("re-arm the watch")(&e))?;
            first.get_or_insert(armed.sequence_number());
            // A watch whose window is gone fails harmlessly.
            armed.ignore_error();
        }
        // The low 16 bits, as events carry them.
        #[allow(clippy::cast_possible_truncation)]
        if let Some(sequence) = first {
            self.armed_at = sequence as u16;
        }
        let expected = usize::from(self.width) * usize::from(self.height) * 4;
        if let Some(shared) = &self.shared {
            // The server writes the screen into the segment; the reply says it is done.
            self.connection
                .shm_get_image(
                    self.root,
                    0,
                    0,
                    self.width,
                    self.height,
                    u32::MAX,
                    ImageFormat::Z_PIXMAP.into(),
                    shared.segment,
                    0,
                )
                .map_err(|e| failed("read the screen")(&e))?
                .reply()
                .map_err(|e| failed("read the screen")(&e))?;
            let mut pixels = vec![0u8; expected];
            shared
                .file
                .read_exact_at(&mut pixels, 0)
                .map_err(|e| failed("read the segment")(&e))?;
            return Ok(pixels);
        }
        let image = self
            .connection
            .get_image(
                ImageFormat::Z_PIXMAP,
                self.root,
                0,
                0,
                self.width,
                self.height,
                u32::MAX,
            )
            .map_err(|e| failed("read the screen")(&e))?
            .reply()
            .map_err(|e| failed("read the screen")(&e))?;
        if image.data.len() != expected {
            return Err(format!(
                "the screen came as {} bytes, not {expected} (a depth other than 24 in 32 bits)",
                image.data.len()
            ));
        }
        Ok(image.data)
    }
}

/// Sets the screen of `root` on `c` to `capture`'s size through RandR (see [`Display::set_mode`]).
fn set_mode_on(c: &RustConnection, root: u32, capture: Capture) -> Result<(), String> {
    let (width, height) = (
        u16::try_from(capture.width).map_err(|e| e.to_string())?,
        u16::try_from(capture.height).map_err(|e| e.to_string())?,
    );
    let resources = c
        .randr_get_screen_resources_current(root)
        .map_err(|e| failed("RandR")(&e))?
        .reply()
        .map_err(|e| failed("RandR")(&e))?;
    let (Some(&crtc), Some(&output)) = (resources.crtcs.first(), resources.outputs.first()) else {
        return Err("the display has no CRTC or output to set a mode on".to_owned());
    };
    let name = format!("corral-{width}x{height}");
    // The modes' names are one string, each mode's `name_len` bytes in turn.
    let mut at = 0usize;
    let existing = resources.modes.iter().find_map(|mode| {
        let end = at + usize::from(mode.name_len);
        let text = resources.names.get(at..end);
        at = end;
        (text == Some(name.as_bytes())).then_some(mode.id)
    });
    let mode = match existing {
        Some(mode) => mode,
        None => {
            let info = randr::ModeInfo {
                id: 0,
                width,
                height,
                dot_clock: 0,
                hsync_start: 0,
                hsync_end: 0,
                htotal: width,
                hskew: 0,
                vsync_start: 0,
                vsync_end: 0,
                vtotal: height,
                name_len: u16::try_from(name.len()).map_err(|e| e.to_string())?,
                mode_flags: randr::ModeFlag::from(0u32),
            };
            let mode = c
                .randr_create_mode(root, info, name.as_bytes())
                .map_err(|e| failed("create the mode")(&e))?
                .reply()
                .map_err(|e| failed("create the mode")(&e))?
                .mode;
            c.randr_add_output_mode(output, mode)
                .map_err(|e| failed("add the mode")(&e))?
                .check()
                .map_err(|e| failed("add the mode")(&e))?;
            mode
        }
    };
    // The screen cannot shrink under an active CRTC: off, resize, on with the new mode.
    let crtc_set = |mode: u32, outputs: &[u32]| {
        c.randr_set_crtc_config(
            crtc,
            x11rb::CURRENT_TIME,
            resources.config_timestamp,
            0,
            0,
            mode,
            randr::Rotation::ROTATE0,
            outputs,
        )
        .map_err(|e| failed("set the CRTC")(&e))?
        .reply()
        .map_err(|e| failed("set the CRTC")(&e))
    };
    crtc_set(x11rb::NONE, &[])?;
    // At 96 dots per inch.
    let millimetres = |pixels: u16| u32::from(pixels) * 254 / 960;
    c.randr_set_screen_size(root, width, height, millimetres(width), millimetres(height))
        .map_err(|e| failed("set the screen size")(&e))?
        .check()
        .map_err(|e| failed("set the screen size")(&e))?;
    crtc_set(mode, &[output])?;
    Ok(())
}

/// Sets the display `name`'s (a name or its socket's path) screen to `capture` through RandR and
/// disconnects: what a session's start does before its window manager and browser come up, so
/// that they start at the capture's size (BROW-5, BROW-11).
///
/// # Errors
/// The display cannot be reached, or refused the size.
pub fn set_screen_mode(name: &str, capture: Capture) -> Result<(), String> {
    let (connection, screen) = crate::open_display(name)?;
    let root = connection.setup().roots[screen].root;
    set_mode_on(&connection, root, capture)
}
