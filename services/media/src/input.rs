//! Shared input into the session's display (BROW-10): what `corral_core::browser::input::map`
//! decided, performed through the XTest extension. Nothing here judges an event.

use std::collections::HashMap;

use corral_core::browser::input::Injection;
use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::{
    BUTTON_PRESS_EVENT, BUTTON_RELEASE_EVENT, ConnectionExt as _, KEY_PRESS_EVENT,
    KEY_RELEASE_EVENT, MOTION_NOTIFY_EVENT,
};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// A connection that injects input into one display.
pub struct Injector {
    connection: RustConnection,
    root: u32,
    /// The keycode of each keysym the keyboard map has, first found wins.
    keycodes: HashMap<u32, u8>,
}

fn failed(what: &'static str) -> impl Fn(&dyn std::fmt::Display) -> String {
    move |e| format!("{what}: {e}")
}

impl Injector {
    /// Connects to `name` and reads its keyboard map.
    ///
    /// # Errors
    /// The display cannot be reached, or lacks XTest.
    pub fn connect(name: &str) -> Result<Injector, String> {
        let (connection, screen) = crate::open_display(name)?;
        let root = connection.setup().roots[screen].root;
        let (min, max) = (
            connection.setup().min_keycode,
            connection.setup().max_keycode,
        );
        connection
            .xtest_get_version(2, 2)
            .map_err(|e| failed("XTest")(&e))?
            .reply()
            .map_err(|e| failed("XTest")(&e))?;
        let map = connection
            .get_keyboard_mapping(min, max - min + 1)
            .map_err(|e| failed("the keyboard map")(&e))?
            .reply()
            .map_err(|e| failed("the keyboard map")(&e))?;
        let per = usize::from(map.keysyms_per_keycode.max(1));
        let mut keycodes = HashMap::new();
        for (i, syms) in map.keysyms.chunks(per).enumerate() {
            let Ok(keycode) = u8::try_from(usize::from(min) + i) else {
                break;
            };
            for sym in syms.iter().filter(|s| **s != 0) {
                keycodes.entry(*sym).or_insert(keycode);
            }
        }
        Ok(Injector {
            connection,
            root,
            keycodes,
        })
    }

    /// Performs `injection`, and returns once the server has.
    ///
    /// # Errors
    /// A keysym the keyboard map lacks, or the connection failed.
    pub fn inject(&self, injection: Injection) -> Result<(), String> {
        let fake = |kind: u8, detail: u8, x: u16, y: u16| {
            let (x, y) = (
                i16::try_from(x).unwrap_or(i16::MAX),
                i16::try_from(y).unwrap_or(i16::MAX),
            );
            self.connection
                .xtest_fake_input(kind, detail, x11rb::CURRENT_TIME, self.root, x, y, 0)
                .map_err(|e| failed("inject")(&e))
                .map(drop)
        };
        match injection {
            Injection::Move { x, y } => fake(MOTION_NOTIFY_EVENT, 0, x, y)?,
            Injection::Button { x, y, button, down } => {
                fake(MOTION_NOTIFY_EVENT, 0, x, y)?;
                let kind = if down {
                    BUTTON_PRESS_EVENT
                } else {
                    BUTTON_RELEASE_EVENT
                };
                fake(kind, button, 0, 0)?;
            }
            Injection::Key { keysym, down } => {
                let keycode = *self
                    .keycodes
                    .get(&keysym)
                    .ok_or_else(|| format!("the keyboard has no key for keysym {keysym:#x}"))?;
                let kind = if down {
                    KEY_PRESS_EVENT
                } else {
                    KEY_RELEASE_EVENT
                };
                fake(kind, keycode, 0, 0)?;
            }
            Injection::Pane(_) => {
                return Err("a pane's size is the adapter's to apply, not an input event".into());
            }
        }
        // A round trip: when this returns the server has performed the injection, so what any
        // other client asks next already sees it.
        self.connection.sync().map_err(|e| failed("sync")(&e))
    }

    /// The keycode the keysym is pressed with, when the keyboard has one.
    #[must_use]
    pub fn keycode(&self, keysym: u32) -> Option<u8> {
        self.keycodes.get(&keysym).copied()
    }
}
