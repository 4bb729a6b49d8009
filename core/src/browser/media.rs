//! The live view's capture and encoding rules (BROW-5, BROW-11): the size of the desktop the
//! adapter captures, and the bitrate it encodes at.
//!
//! The capture is the driver's pane in device pixels: the viewer reports its pane in CSS pixels
//! and its device pixel ratio, and the desktop becomes exactly that many device pixels, clamped
//! to [`MIN_WIDTH`]x[`MIN_HEIGHT`] .. [`MAX_WIDTH`]x[`MAX_HEIGHT`] and rounded down to even
//! dimensions (H.264's 4:2:0 chroma needs them), so that the desktop, Chromium's window and the
//! member's pixels stay the same size and text is never rescaled soft. A new session captures
//! [`super::WIDTH`]x[`super::HEIGHT`]. The bitrate derives from the pixels and the frame rate
//! ([`BITS_PER_PIXEL_MILLI`] thousandths of a bit per pixel per frame), never an encoder default.

use std::fmt;

/// The smallest desktop.
pub const MIN_WIDTH: u32 = 320;
/// See [`MIN_WIDTH`].
pub const MIN_HEIGHT: u32 = 240;
/// The largest desktop (4K UHD).
pub const MAX_WIDTH: u32 = 3840;
/// See [`MAX_WIDTH`].
pub const MAX_HEIGHT: u32 = 2160;
/// The largest device pixel ratio believed.
pub const MAX_DEVICE_PIXEL_RATIO: f64 = 4.0;
/// The frame rate the adapter aims for while the page changes.
pub const FRAME_RATE: u32 = 25;
/// Bits per pixel per frame, in thousandths: 0.1 bit, which keeps text sharp in H.264 at the
/// rates screen content needs (1600x1000 at 25 fps: 4 Mbit/s).
pub const BITS_PER_PIXEL_MILLI: u64 = 100;
/// The bitrate's floor and ceiling, in bits per second.
pub const MIN_BITRATE: u32 = 250_000;
/// See [`MIN_BITRATE`].
pub const MAX_BITRATE: u32 = 20_000_000;

/// A desktop size in device pixels: even, and within the bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    /// Width in device pixels.
    pub width: u32,
    /// Height in device pixels.
    pub height: u32,
}

impl Capture {
    /// A new session's capture (BROW-11).
    pub const NEW_SESSION: Capture = Capture {
        width: super::WIDTH,
        height: super::HEIGHT,
    };

    /// `width` x `height` held to the bounds and rounded down to even.
    #[must_use]
    pub fn bounded(width: u32, height: u32) -> Capture {
        Capture {
            width: width.clamp(MIN_WIDTH, MAX_WIDTH) & !1,
            height: height.clamp(MIN_HEIGHT, MAX_HEIGHT) & !1,
        }
    }

    /// Pixels per frame.
    #[must_use]
    pub fn pixels(self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }
}

/// Why a pane size is not used: the size is kept as it was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ResizeRefusal {
    /// A dimension or the ratio is not a positive finite number.
    NotANumber,
}

impl ResizeRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(self) -> &'static str {
        "resize_invalid"
    }
}

impl fmt::Display for ResizeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a pane size is positive finite CSS pixels with a positive device pixel ratio")
    }
}

/// The capture for a pane of `css_width` x `css_height` CSS pixels at `device_pixel_ratio`:
/// device pixels, clamped to the bounds and rounded down to even. A zero or enormous pane is
/// clamped; one that is not a positive finite number is refused.
///
/// # Errors
/// [`ResizeRefusal::NotANumber`].
pub fn capture_for_pane(
    css_width: f64,
    css_height: f64,
    device_pixel_ratio: f64,
) -> Result<Capture, ResizeRefusal> {
    let usable = |x: f64| x.is_finite() && x >= 0.0;
    let ratio_usable = device_pixel_ratio.is_finite() && device_pixel_ratio > 0.0;
    if !(usable(css_width) && usable(css_height) && ratio_usable) {
        return Err(ResizeRefusal::NotANumber);
    }
    let ratio = device_pixel_ratio.min(MAX_DEVICE_PIXEL_RATIO);
    let device = |css: f64| -> u32 {
        // Held below u32::MAX first, so the conversion is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let pixels = (css * ratio).round().min(f64::from(u32::MAX)) as u32;
        pixels
    };
    Ok(Capture::bounded(device(css_width), device(css_height)))
}

/// The encoder's target bitrate for `capture` at `frame_rate` frames per second.
#[must_use]
pub fn bitrate(capture: Capture, frame_rate: u32) -> u32 {
    let bits = capture.pixels() * u64::from(frame_rate.max(1)) * BITS_PER_PIXEL_MILLI / 1_000;
    u32::try_from(bits)
        .unwrap_or(u32::MAX)
        .clamp(MIN_BITRATE, MAX_BITRATE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brow_11_a_new_session_captures_1600x1000_at_a_bitrate_from_its_pixels() {
        assert_eq!(
            (Capture::NEW_SESSION.width, Capture::NEW_SESSION.height),
            (1600, 1000)
        );
        assert_eq!(bitrate(Capture::NEW_SESSION, FRAME_RATE), 4_000_000);
        // Twice the pixels or twice the frames: twice the bits; a quarter: a quarter.
        let wide = Capture {
            width: 3200,
            height: 1000,
        };
        assert_eq!(bitrate(wide, FRAME_RATE), 8_000_000);
        assert_eq!(bitrate(Capture::NEW_SESSION, 50), 8_000_000);
        let small = Capture {
            width: 800,
            height: 500,
        };
        assert_eq!(bitrate(small, FRAME_RATE), 1_000_000);
        // Bounded both ways.
        assert_eq!(
            bitrate(
                Capture {
                    width: 320,
                    height: 240
                },
                1
            ),
            MIN_BITRATE
        );
        assert_eq!(
            bitrate(
                Capture {
                    width: 3840,
                    height: 2160
                },
                60
            ),
            MAX_BITRATE
        );
    }

    #[test]
    fn brow_05_the_capture_is_the_pane_in_device_pixels_clamped_and_even() {
        let size = |w, h, r| capture_for_pane(w, h, r).map(|c| (c.width, c.height));
        assert_eq!(size(1600.0, 1000.0, 1.0), Ok((1600, 1000)));
        // Device pixels, not CSS pixels.
        assert_eq!(size(800.0, 500.0, 2.0), Ok((1600, 1000)));
        assert_eq!(size(1000.0, 700.0, 1.25), Ok((1250, 874)));
        // Odd sizes round down to even.
        assert_eq!(size(1601.0, 999.0, 1.0), Ok((1600, 998)));
        assert_eq!(size(1023.4, 767.6, 1.0), Ok((1022, 768)));
        // Zero and enormous are clamped.
        assert_eq!(size(0.0, 0.0, 1.0), Ok((MIN_WIDTH, MIN_HEIGHT)));
        assert_eq!(size(1e12, 1e12, 1.0), Ok((MAX_WIDTH, MAX_HEIGHT)));
        assert_eq!(size(2000.0, 1200.0, 1e9), Ok((MAX_WIDTH, MAX_HEIGHT)));
        // Not a size at all is refused.
        for (w, h, r) in [
            (f64::NAN, 10.0, 1.0),
            (10.0, f64::INFINITY, 1.0),
            (-1.0, 10.0, 1.0),
            (10.0, 10.0, 0.0),
            (10.0, 10.0, -2.0),
            (10.0, 10.0, f64::NAN),
        ] {
            assert_eq!(size(w, h, r), Err(ResizeRefusal::NotANumber), "{w} {h} {r}");
        }
        // Every answer is even and in bounds.
        for w in (0..5000).step_by(37) {
            let c = capture_for_pane(f64::from(w), f64::from(w) * 0.6, 1.5).unwrap();
            assert!(
                c.width.is_multiple_of(2) && c.height.is_multiple_of(2),
                "{c:?}"
            );
            assert!((MIN_WIDTH..=MAX_WIDTH).contains(&c.width), "{c:?}");
            assert!((MIN_HEIGHT..=MAX_HEIGHT).contains(&c.height), "{c:?}");
        }
    }
}
