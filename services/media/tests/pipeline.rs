//! The pipeline on a real display: Xvfb at a new session's 1600x1000, an X client painting it,
//! the change seen through Damage, the pixels captured, converted and encoded, and the H.264
//! decoded back to the colour that was painted. Needs Debian's xvfb; without it the test skips
//! through `corral_testkit::skip` (CI requires it).

use std::time::Duration;

use corral_core::browser::media::{Capture, FRAME_RATE, bitrate};
use corral_media::FrameTimes;
use corral_media::capture::Display;
use corral_media::encode::H264;
use corral_media::xvfb::{XVFB, Xvfb};
use openh264::decoder::Decoder;
use openh264::formats::YUVSource as _;
use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::{ChangeGCAux, ConnectionExt as _, CreateGCAux, Rectangle};
use x11rb::wrapper::ConnectionExt as _;

/// Xvfb at `capture`'s size, or `None` after skipping the test for want of it.
fn xvfb(test: &str, capture: Capture) -> Option<Xvfb> {
    if !corral_testkit::programs_or_skip(test, &[("xvfb", XVFB)]) {
        return None;
    }
    Some(Xvfb::start(capture).expect("Xvfb starts"))
}

/// Another X client fills the whole screen with `rgb`.
fn paint(display: &str, rgb: u32) {
    paint_rect(display, rgb, None);
}

/// Another X client fills `rect` (the whole screen when `None`) with `rgb`.
fn paint_rect(display: &str, rgb: u32, rect: Option<Rectangle>) {
    let (connection, screen) = x11rb::connect(Some(display)).unwrap();
    let root = connection.setup().roots[screen].root;
    let (width, height) = {
        let s = &connection.setup().roots[screen];
        (s.width_in_pixels, s.height_in_pixels)
    };
    let gc = connection.generate_id().unwrap();
    connection
        .create_gc(gc, root, &CreateGCAux::new().foreground(rgb))
        .unwrap();
    connection
        .change_gc(
            gc,
            &ChangeGCAux::new()
                .subwindow_mode(x11rb::protocol::xproto::SubwindowMode::INCLUDE_INFERIORS),
        )
        .unwrap();
    connection
        .poly_fill_rectangle(
            root,
            gc,
            &[rect.unwrap_or(Rectangle {
                x: 0,
                y: 0,
                width,
                height,
            })],
        )
        .unwrap();
    connection.sync().unwrap();
}

/// The colour at the centre of a decoded frame.
fn centre(decoder: &mut Decoder, frame: &[u8], capture: Capture) -> (u8, u8, u8) {
    let decoded = decoder.decode(frame).unwrap().expect("a picture");
    let (width, height) = decoded.dimensions();
    assert_eq!(
        (width, height),
        (capture.width as usize, capture.height as usize)
    );
    let mut rgb = vec![0u8; width * height * 3];
    decoded.write_rgb8(&mut rgb);
    let at = ((height / 2) * width + width / 2) * 3;
    (rgb[at], rgb[at + 1], rgb[at + 2])
}

fn near(found: (u8, u8, u8), wanted: (u8, u8, u8)) -> bool {
    let close = |a: u8, b: u8| a.abs_diff(b) <= 12;
    close(found.0, wanted.0) && close(found.1, wanted.1) && close(found.2, wanted.2)
}

#[test]
fn brow_05_brow_11_a_change_is_seen_captured_and_encoded_at_the_derived_bitrate() {
    let test = "brow_05_brow_11_a_change_is_seen_captured_and_encoded_at_the_derived_bitrate";
    let capture = Capture::NEW_SESSION;
    let Some(xvfb) = xvfb(test, capture) else {
        return;
    };
    let name = xvfb.display.clone();
    let mut display = Display::connect(&name).unwrap();
    assert_eq!(display.size(), (1600, 1000));
    assert!(
        display.shared_memory(),
        "Xvfb offers MIT-SHM 1.2: the capture should use it"
    );
    let mut encoder = H264::new(capture, FRAME_RATE).unwrap();
    assert_eq!(encoder.bitrate, bitrate(capture, FRAME_RATE));
    assert_eq!(encoder.bitrate, 4_000_000);
    let mut decoder = Decoder::new().unwrap();
    let mut times = FrameTimes::default();
    // The first frame is always wanted, and is a keyframe when asked.
    assert!(display.wait_change(Duration::from_secs(1)).unwrap());
    let pixels = display.grab().unwrap();
    let first = encoder.encode(&pixels, true, &mut times).unwrap();
    assert!(first.keyframe, "a keyframe was asked for");
    let _ = centre(&mut decoder, &first.data, capture);
    // Nothing changes: nothing to do.
    assert!(!display.wait_change(Duration::from_millis(300)).unwrap());
    // Another client paints the screen: the change is seen, and the encoded frame decodes to it.
    for (rgb, wanted) in [
        (0x00c0_2020, (0xc0, 0x20, 0x20)),
        (0x0020_80e0, (0x20, 0x80, 0xe0)),
    ] {
        paint(&name, rgb);
        assert!(
            display.wait_change(Duration::from_secs(5)).unwrap(),
            "the paint was not seen"
        );
        let pixels = display.grab().unwrap();
        let frame = encoder.encode(&pixels, false, &mut times).unwrap();
        let found = centre(&mut decoder, &frame.data, capture);
        assert!(near(found, wanted), "painted {wanted:?}, decoded {found:?}");
    }
    // A small change is a small predicted frame: not a keyframe, a fraction of the first's size.
    paint_rect(
        &name,
        0x00ff_ff00,
        Some(Rectangle {
            x: 768,
            y: 468,
            width: 64,
            height: 64,
        }),
    );
    assert!(display.wait_change(Duration::from_secs(5)).unwrap());
    let pixels = display.grab().unwrap();
    let small = encoder.encode(&pixels, false, &mut times).unwrap();
    assert!(!small.keyframe, "a small change made a keyframe");
    assert!(
        small.data.len() * 4 < first.data.len(),
        "{} bytes for a 64x64 change, {} for the keyframe",
        small.data.len(),
        first.data.len()
    );
    let found = centre(&mut decoder, &small.data, capture);
    assert!(near(found, (0xff, 0xff, 0x00)), "decoded {found:?}");
    // A frame of the wrong size is refused, not encoded.
    assert!(encoder.encode(&pixels[..16], false, &mut times).is_err());
}

/// BROW-10: a member's events, judged by corral-core, reach the display through XTest: the
/// pointer lands on the mapped device pixel, a button and a key go down and come up again.
#[test]
fn brow_10_mapped_input_reaches_the_display_through_xtest() {
    use corral_core::browser::input::map;
    use corral_media::input::Injector;
    use x11rb::protocol::xproto::ConnectionExt as _;

    let test = "brow_10_mapped_input_reaches_the_display_through_xtest";
    let capture = Capture::NEW_SESSION;
    let Some(xvfb) = xvfb(test, capture) else {
        return;
    };
    let injector = Injector::connect(&xvfb.display).unwrap();
    let (observer, screen) = x11rb::connect(Some(&xvfb.display)).unwrap();
    let root = observer.setup().roots[screen].root;
    let perform = |text: &str| {
        for injection in map(text.as_bytes(), capture).unwrap() {
            injector.inject(injection).unwrap();
        }
    };
    let pointer = || observer.query_pointer(root).unwrap().reply().unwrap();
    perform(r#"{"t":"move","x":0.25,"y":0.75}"#);
    let at = pointer();
    assert_eq!((at.root_x, at.root_y), (400, 749));
    perform(r#"{"t":"button","x":0.5,"y":0.5,"button":1,"down":true}"#);
    let at = pointer();
    assert_eq!((at.root_x, at.root_y), (800, 500));
    assert!(u16::from(at.mask) & u16::from(x11rb::protocol::xproto::KeyButMask::BUTTON1) != 0);
    perform(r#"{"t":"button","x":0.5,"y":0.5,"button":1,"down":false}"#);
    assert!(
        u16::from(pointer().mask) & u16::from(x11rb::protocol::xproto::KeyButMask::BUTTON1) == 0
    );
    let keycode = injector.keycode(0x61).expect("the keyboard has an a");
    let down = |keycode: u8| {
        let keys = observer.query_keymap().unwrap().reply().unwrap().keys;
        keys[usize::from(keycode / 8)] & (1 << (keycode % 8)) != 0
    };
    perform(r#"{"t":"key","code":"KeyA","down":true}"#);
    assert!(down(keycode), "the key is not down");
    perform(r#"{"t":"key","code":"KeyA","down":false}"#);
    assert!(!down(keycode), "the key is still down");
}

/// BROW-5: the screen mode is changed to the pane's device pixels through RandR, within the size
/// the display started at, and the capture follows; a size past it is refused.
#[test]
fn brow_05_the_screen_mode_follows_the_pane() {
    use corral_core::browser::media::capture_for_pane;

    let test = "brow_05_the_screen_mode_follows_the_pane";
    let Some(xvfb) = xvfb(test, Capture::bounded(u32::MAX, u32::MAX)) else {
        return;
    };
    let mut display = Display::connect(&xvfb.display).unwrap();
    assert_eq!(display.size(), (3840, 2160));
    // A pane of 1001x667 CSS pixels at a device pixel ratio of 1.5.
    let pane = capture_for_pane(1001.0, 667.0, 1.5).unwrap();
    assert_eq!((pane.width, pane.height), (1502, 1000));
    for capture in [Capture::NEW_SESSION, pane, Capture::NEW_SESSION] {
        display.set_mode(capture).unwrap();
        assert_eq!(
            display.size(),
            (
                u16::try_from(capture.width).unwrap(),
                u16::try_from(capture.height).unwrap()
            )
        );
        // Another client sees the new size, and a grab is exactly that many pixels.
        let (observer, screen) = x11rb::connect(Some(&xvfb.display)).unwrap();
        let root = observer.setup().roots[screen].root;
        let geometry = observer.get_geometry(root).unwrap().reply().unwrap();
        assert_eq!(
            (u32::from(geometry.width), u32::from(geometry.height)),
            (capture.width, capture.height)
        );
        assert!(display.wait_change(Duration::from_millis(10)).unwrap());
        let pixels = display.grab().unwrap();
        assert_eq!(pixels.len(), (capture.pixels() * 4) as usize);
    }
    // A display started smaller cannot be made larger than it started.
    let small = xvfb_sized(Capture {
        width: 800,
        height: 600,
    });
    let mut display = Display::connect(&small.display).unwrap();
    assert!(display.set_mode(Capture::NEW_SESSION).is_err());
    assert_eq!(display.size(), (800, 600));
}

fn xvfb_sized(capture: Capture) -> Xvfb {
    Xvfb::start(capture).expect("Xvfb starts")
}
