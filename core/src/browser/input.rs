//! The live view's shared input (BROW-10): a member's pointer and keyboard events from the data
//! channel, judged and mapped onto the session's display.
//!
//! The viewer sends positions as fractions of the picture it shows (0 at the left or top edge, 1
//! at the right or bottom), so the mapping onto device pixels is exact whatever size the pane is
//! scaled to; keys by their `KeyboardEvent.code`, mapped to X keysyms from one table. Anything
//! else is refused with a stable code and never reaches the display: a message that is not a
//! known event, a position outside the picture or not a number, an unknown key or button, a wheel
//! step out of bounds. A flood is bounded by [`InputBudget`]: events past it are dropped.

use std::fmt;

use serde::Deserialize;

use super::media::Capture;
use crate::time::UnixMillis;

/// The longest input message read, in bytes.
pub const MESSAGE_MAX_BYTES: usize = 512;
/// Events a member may send at once before the budget refills.
pub const BURST: u32 = 120;
/// Events per second the budget refills.
pub const PER_SECOND: u32 = 240;
/// The largest wheel step, in notches.
pub const WHEEL_MAX: i32 = 10;

/// One event as the viewer sends it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// The pointer moved to (`x`, `y`).
    Move {
        /// Fraction of the picture's width.
        x: f64,
        /// Fraction of the picture's height.
        y: f64,
    },
    /// A button went down or up at (`x`, `y`): 1 left, 2 middle, 3 right.
    Button {
        /// Fraction of the picture's width.
        x: f64,
        /// Fraction of the picture's height.
        y: f64,
        /// The button.
        button: u8,
        /// Down (true) or up.
        down: bool,
    },
    /// The wheel turned by `dy` notches (positive: down) at (`x`, `y`).
    Wheel {
        /// Fraction of the picture's width.
        x: f64,
        /// Fraction of the picture's height.
        y: f64,
        /// Notches.
        dy: i32,
    },
    /// A key went down or up.
    Key {
        /// `KeyboardEvent.code`.
        code: String,
        /// Down (true) or up.
        down: bool,
    },
    /// The viewer's pane: `width` x `height` CSS pixels at `ratio` device pixels per CSS pixel.
    /// The driver's pane sets the screen's mode (BROW-5).
    Pane {
        /// CSS pixels.
        width: f64,
        /// CSS pixels.
        height: f64,
        /// `window.devicePixelRatio`.
        ratio: f64,
    },
}

/// What the display is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Injection {
    /// Move the pointer to device pixel (`x`, `y`).
    Move {
        /// Column.
        x: u16,
        /// Row.
        y: u16,
    },
    /// Move there, then press or release `button` (X button numbers; 4 and 5 are the wheel).
    Button {
        /// Column.
        x: u16,
        /// Row.
        y: u16,
        /// X button number.
        button: u8,
        /// Press (true) or release.
        down: bool,
    },
    /// Press or release the key of this X keysym.
    Key {
        /// The keysym.
        keysym: u32,
        /// Press (true) or release.
        down: bool,
    },
    /// The viewer's pane as a capture (`super::media::capture_for_pane`): the screen's mode when
    /// this viewer drives (BROW-5). Not an input event: the adapter sets the mode.
    Pane(Capture),
}

/// Why an input message reaches nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputRefusal {
    /// Not an event this channel knows, or too long (`input_invalid`).
    Invalid(String),
    /// A position outside the picture, or not a number (`input_out_of_range`).
    OutOfRange,
    /// A key or button with no mapping (`input_unknown_key`).
    UnknownKey,
    /// Over the member's budget: dropped (`input_dropped`).
    Dropped,
    /// A pane size that is not a positive finite number (`resize_invalid`).
    Pane,
}

impl InputRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "input_invalid",
            Self::OutOfRange => "input_out_of_range",
            Self::UnknownKey => "input_unknown_key",
            Self::Dropped => "input_dropped",
            Self::Pane => super::media::ResizeRefusal::NotANumber.code(),
        }
    }
}

impl fmt::Display for InputRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid(why) => write!(f, "not an input event: {why}"),
            Self::OutOfRange => f.write_str("a position is a fraction of the picture, 0 to 1"),
            Self::UnknownKey => f.write_str("no such key or button"),
            Self::Dropped => f.write_str("too many input events: dropped"),
            Self::Pane => write!(f, "{}", super::media::ResizeRefusal::NotANumber),
        }
    }
}

/// `KeyboardEvent.code` to X keysym, for the keys a browser page needs.
const KEYS: &[(&str, u32)] = &[
    ("Enter", 0xff0d),
    ("NumpadEnter", 0xff8d),
    ("Backspace", 0xff08),
    ("Tab", 0xff09),
    ("Escape", 0xff1b),
    ("Delete", 0xffff),
    ("Home", 0xff50),
    ("End", 0xff57),
    ("PageUp", 0xff55),
    ("PageDown", 0xff56),
    ("ArrowLeft", 0xff51),
    ("ArrowUp", 0xff52),
    ("ArrowRight", 0xff53),
    ("ArrowDown", 0xff54),
    ("ShiftLeft", 0xffe1),
    ("ShiftRight", 0xffe2),
    ("ControlLeft", 0xffe3),
    ("ControlRight", 0xffe4),
    ("AltLeft", 0xffe9),
    ("AltRight", 0xffea),
    ("Space", 0x0020),
    ("Minus", 0x002d),
    ("Equal", 0x003d),
    ("BracketLeft", 0x005b),
    ("BracketRight", 0x005d),
    ("Backslash", 0x005c),
    ("Semicolon", 0x003b),
    ("Quote", 0x0027),
    ("Backquote", 0x0060),
    ("Comma", 0x002c),
    ("Period", 0x002e),
    ("Slash", 0x002f),
];

/// The keysym of `code`: a table key, `KeyA`..`KeyZ` (lower-case letters: the shift key is its
/// own event), `Digit0`..`Digit9`, `F1`..`F12`.
#[must_use]
pub fn keysym(code: &str) -> Option<u32> {
    if let Some((_, keysym)) = KEYS.iter().find(|(name, _)| *name == code) {
        return Some(*keysym);
    }
    let one = |rest: &str| {
        let mut chars = rest.chars();
        chars.next().filter(|_| chars.next().is_none())
    };
    if let Some(letter) = code.strip_prefix("Key").and_then(one)
        && letter.is_ascii_uppercase()
    {
        return Some(u32::from(letter.to_ascii_lowercase()));
    }
    if let Some(digit) = code.strip_prefix("Digit").and_then(one)
        && digit.is_ascii_digit()
    {
        return Some(u32::from(digit));
    }
    let function: u32 = code.strip_prefix('F')?.parse().ok()?;
    (1..=12).contains(&function).then(|| 0xffbe + function - 1)
}

/// The device pixel of fraction `f` along a side of `size` pixels.
fn pixel(f: f64, size: u32) -> Result<u16, InputRefusal> {
    if !(f.is_finite() && (0.0..=1.0).contains(&f)) {
        return Err(InputRefusal::OutOfRange);
    }
    let last = f64::from(size.saturating_sub(1));
    // In 0..=last by the check above, so the conversion is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let at = (f * last).round() as u32;
    u16::try_from(at).map_err(|_| InputRefusal::OutOfRange)
}

/// Reads one data-channel message and maps it onto `capture`: the injections to perform, in
/// order (a wheel step is a press and a release per notch).
///
/// # Errors
/// [`InputRefusal`] naming what is wrong; nothing is injected.
pub fn map(text: &[u8], capture: Capture) -> Result<Vec<Injection>, InputRefusal> {
    if text.len() > MESSAGE_MAX_BYTES {
        return Err(InputRefusal::Invalid(format!(
            "over {MESSAGE_MAX_BYTES} bytes"
        )));
    }
    let message: Message = serde_json::from_slice(text)
        .map_err(|e| InputRefusal::Invalid(e.to_string().chars().take(200).collect()))?;
    let at = |x: f64, y: f64| {
        Ok::<_, InputRefusal>((pixel(x, capture.width)?, pixel(y, capture.height)?))
    };
    Ok(match message {
        Message::Move { x, y } => {
            let (x, y) = at(x, y)?;
            vec![Injection::Move { x, y }]
        }
        Message::Button { x, y, button, down } => {
            if !(1..=3).contains(&button) {
                return Err(InputRefusal::UnknownKey);
            }
            let (x, y) = at(x, y)?;
            vec![Injection::Button { x, y, button, down }]
        }
        Message::Wheel { x, y, dy } => {
            if dy == 0 || dy.abs() > WHEEL_MAX {
                return Err(InputRefusal::OutOfRange);
            }
            let (x, y) = at(x, y)?;
            let button = if dy > 0 { 5 } else { 4 };
            (0..dy.unsigned_abs())
                .flat_map(|_| [true, false].map(|down| Injection::Button { x, y, button, down }))
                .collect()
        }
        Message::Key { code, down } => {
            let keysym = keysym(&code).ok_or(InputRefusal::UnknownKey)?;
            vec![Injection::Key { keysym, down }]
        }
        Message::Pane {
            width,
            height,
            ratio,
        } => vec![Injection::Pane(
            super::media::capture_for_pane(width, height, ratio).map_err(|_| InputRefusal::Pane)?,
        )],
    })
}

/// Whether `text` says it is a pane message (its `t` is `"pane"`), however wrong the rest of it
/// is: the adapter answers every pane message (BROW-11), so that a viewer learns what became of
/// it.
#[must_use]
pub fn is_pane(text: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Tag {
        t: String,
    }
    text.len() <= MESSAGE_MAX_BYTES
        && serde_json::from_slice::<Tag>(text).is_ok_and(|tag| tag.t == "pane")
}

/// The adapter's answer to a pane message, on the data channel: the capture the pane asked for,
/// or the code it was refused with, and the screen's mode after it (BROW-5, BROW-11):
/// `{"t":"pane","capture":{"width":W,"height":H},"screen":{…}}` or
/// `{"t":"pane","refused":"<code>","screen":{…}}`. The screen follows only the driver's pane.
#[must_use]
pub fn pane_answer(asked: Result<Capture, &'static str>, screen: Capture) -> String {
    let size = |c: Capture| format!(r#"{{"width":{},"height":{}}}"#, c.width, c.height);
    match asked {
        Ok(capture) => format!(
            r#"{{"t":"pane","capture":{},"screen":{}}}"#,
            size(capture),
            size(screen)
        ),
        Err(code) => format!(
            r#"{{"t":"pane","refused":"{code}","screen":{}}}"#,
            size(screen)
        ),
    }
}

/// A member's input budget: [`BURST`] events at once, refilled at [`PER_SECOND`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputBudget {
    /// Events available, in thousandths.
    available_milli: u64,
    /// When it was last refilled.
    at: UnixMillis,
}

impl InputBudget {
    /// A full budget at `now`.
    #[must_use]
    pub fn new(now: UnixMillis) -> Self {
        Self {
            available_milli: u64::from(BURST) * 1_000,
            at: now,
        }
    }

    /// Spends one event at `now`, or refuses it as [`InputRefusal::Dropped`].
    ///
    /// # Errors
    /// The budget is spent.
    pub fn spend(&mut self, now: UnixMillis) -> Result<(), InputRefusal> {
        let elapsed = now.0.saturating_sub(self.at.0);
        self.at = UnixMillis(self.at.0.max(now.0));
        self.available_milli =
            (self.available_milli + elapsed * u64::from(PER_SECOND)).min(u64::from(BURST) * 1_000);
        if self.available_milli < 1_000 {
            return Err(InputRefusal::Dropped);
        }
        self.available_milli -= 1_000;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Capture = Capture::NEW_SESSION;

    #[test]
    fn brow_05_a_pane_message_is_its_capture_clamped_and_even_and_a_bad_one_is_refused() {
        let one = |text: &str| map(text.as_bytes(), C);
        assert_eq!(
            one(r#"{"t":"pane","width":1001,"height":667,"ratio":1.5}"#),
            Ok(vec![Injection::Pane(Capture {
                width: 1502,
                height: 1000
            })])
        );
        // Zero, odd and enormous sizes are clamped and made even, never refused.
        assert_eq!(
            one(r#"{"t":"pane","width":0,"height":0,"ratio":1}"#),
            Ok(vec![Injection::Pane(Capture::bounded(0, 0))])
        );
        assert_eq!(
            one(r#"{"t":"pane","width":1e12,"height":333,"ratio":1}"#),
            Ok(vec![Injection::Pane(Capture::bounded(u32::MAX, 332))])
        );
        for bad in [
            r#"{"t":"pane","width":-5,"height":600,"ratio":1}"#,
            r#"{"t":"pane","width":800,"height":600,"ratio":0}"#,
            r#"{"t":"pane","width":"800","height":600,"ratio":1}"#,
        ] {
            let refused = one(bad).unwrap_err();
            assert!(
                matches!(refused, InputRefusal::Pane | InputRefusal::Invalid(_)),
                "{bad}: {refused:?}"
            );
        }
        assert_eq!(
            one(r#"{"t":"pane","width":-5,"height":600,"ratio":1}"#)
                .unwrap_err()
                .code(),
            "resize_invalid"
        );
    }

    #[test]
    fn brow_11_every_pane_message_is_answered_with_its_capture_or_its_refusal() {
        for text in [
            r#"{"t":"pane","width":1001,"height":667,"ratio":1.5}"#,
            r#"{"t":"pane","width":-1,"height":5,"ratio":1}"#,
            r#"{"t":"pane","width":null,"height":5,"ratio":1}"#,
            r#"{"ratio":1,"t":"pane"}"#,
        ] {
            assert!(is_pane(text.as_bytes()), "{text}");
        }
        for text in [
            r#"{"t":"move","x":0,"y":0}"#,
            r#"{"t":"what"}"#,
            "{",
            r#"{"t":5}"#,
            "",
        ] {
            assert!(!is_pane(text.as_bytes()), "{text}");
        }
        let long = format!(
            r#"{{"t":"pane","pad":"{}"}}"#,
            "x".repeat(MESSAGE_MAX_BYTES)
        );
        assert!(!is_pane(long.as_bytes()));
        let screen = Capture {
            width: 1502,
            height: 1000,
        };
        let answered: serde_json::Value =
            serde_json::from_str(&pane_answer(Ok(screen), screen)).unwrap();
        assert_eq!(answered["t"], "pane");
        assert_eq!(answered["capture"]["width"], 1502);
        assert_eq!(answered["capture"]["height"], 1000);
        assert_eq!(answered["screen"]["height"], 1000);
        let refused: serde_json::Value =
            serde_json::from_str(&pane_answer(Err(InputRefusal::Pane.code()), screen)).unwrap();
        assert_eq!(refused["refused"], "resize_invalid");
        assert_eq!(refused["screen"]["width"], 1502);
        assert!(refused.get("capture").is_none());
    }

    #[test]
    fn brow_10_positions_are_fractions_of_the_picture_mapped_to_device_pixels() {
        let one = |text: &str| map(text.as_bytes(), C).unwrap();
        assert_eq!(
            one(r#"{"t":"move","x":0,"y":0}"#),
            [Injection::Move { x: 0, y: 0 }]
        );
        assert_eq!(
            one(r#"{"t":"move","x":1,"y":1}"#),
            [Injection::Move { x: 1599, y: 999 }]
        );
        assert_eq!(
            one(r#"{"t":"move","x":0.5,"y":0.5}"#),
            [Injection::Move { x: 800, y: 500 }]
        );
        // The same fraction lands on the same content whatever the capture.
        let small = Capture {
            width: 800,
            height: 500,
        };
        assert_eq!(
            map(br#"{"t":"move","x":0.25,"y":0.5}"#, small).unwrap(),
            [Injection::Move { x: 200, y: 250 }]
        );
        assert_eq!(
            one(r#"{"t":"button","x":0.1,"y":0.2,"button":1,"down":true}"#),
            [Injection::Button {
                x: 160,
                y: 200,
                button: 1,
                down: true
            }]
        );
        assert_eq!(
            one(r#"{"t":"wheel","x":0,"y":0,"dy":-2}"#),
            [true, false, true, false].map(|down| Injection::Button {
                x: 0,
                y: 0,
                button: 4,
                down
            })
        );
        assert_eq!(
            one(r#"{"t":"key","code":"KeyA","down":true}"#),
            [Injection::Key {
                keysym: 0x61,
                down: true
            }]
        );
        assert_eq!(
            one(r#"{"t":"key","code":"Enter","down":false}"#),
            [Injection::Key {
                keysym: 0xff0d,
                down: false
            }]
        );
        assert_eq!(keysym("Digit7"), Some(0x37));
        assert_eq!(keysym("F12"), Some(0xffc9));
    }

    #[test]
    fn brow_10_anything_else_is_refused_with_its_code_and_reaches_nothing() {
        let code = |text: &str| map(text.as_bytes(), C).unwrap_err().code();
        for (text, expected) in [
            ("not json", "input_invalid"),
            (r#"{"t":"teleport","x":0,"y":0}"#, "input_invalid"),
            (r#"{"t":"move","x":0}"#, "input_invalid"),
            (r#"{"t":"move","x":0,"y":0,"z":1}"#, "input_invalid"),
            (r#"{"t":"move","x":"0","y":0}"#, "input_invalid"),
            (r#"{"t":"move","x":1.01,"y":0}"#, "input_out_of_range"),
            (r#"{"t":"move","x":-0.01,"y":0}"#, "input_out_of_range"),
            (r#"{"t":"move","x":1e308,"y":0}"#, "input_out_of_range"),
            (
                r#"{"t":"button","x":0,"y":0,"button":4,"down":true}"#,
                "input_unknown_key",
            ),
            (
                r#"{"t":"button","x":0,"y":0,"button":0,"down":true}"#,
                "input_unknown_key",
            ),
            (r#"{"t":"wheel","x":0,"y":0,"dy":0}"#, "input_out_of_range"),
            (r#"{"t":"wheel","x":0,"y":0,"dy":11}"#, "input_out_of_range"),
            (
                r#"{"t":"key","code":"KeyAB","down":true}"#,
                "input_unknown_key",
            ),
            (
                r#"{"t":"key","code":"Keya","down":true}"#,
                "input_unknown_key",
            ),
            (
                r#"{"t":"key","code":"F13","down":true}"#,
                "input_unknown_key",
            ),
            (
                r#"{"t":"key","code":"Power","down":true}"#,
                "input_unknown_key",
            ),
        ] {
            assert_eq!(code(text), expected, "{text}");
        }
        let long = format!(r#"{{"t":"key","code":"{}","down":true}}"#, "A".repeat(600));
        assert_eq!(code(&long), "input_invalid");
    }

    #[test]
    fn brow_10_a_flood_is_held_to_the_budget() {
        let start = UnixMillis(1_000_000);
        let mut budget = InputBudget::new(start);
        let taken = (0..1_000).filter(|_| budget.spend(start).is_ok()).count();
        assert_eq!(taken, BURST as usize);
        assert_eq!(budget.spend(start), Err(InputRefusal::Dropped));
        // A quarter second refills a quarter of the rate.
        let later = UnixMillis(start.0 + 250);
        let taken = (0..1_000).filter(|_| budget.spend(later).is_ok()).count();
        assert_eq!(taken, (PER_SECOND / 4) as usize);
        // A long pause refills no more than the burst; a clock going back refills nothing.
        let much_later = UnixMillis(start.0 + 3_600_000);
        let taken = (0..1_000)
            .filter(|_| budget.spend(much_later).is_ok())
            .count();
        assert_eq!(taken, BURST as usize);
        assert_eq!(budget.spend(start), Err(InputRefusal::Dropped));
    }
}
