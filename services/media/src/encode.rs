//! BGRX to I420 to H.264, at the bitrate corral-core derives (BROW-11).

use std::time::Instant;

use corral_core::browser::media::{Capture, bitrate};
use openh264::encoder::{
    BitRate, Encoder, EncoderConfig, FrameRate, FrameType, RateControlMode, UsageType, VuiConfig,
};
use openh264::formats::{BgraSliceU8, YUVBuffer};
use openh264::{OpenH264API, Timestamp};

use crate::FrameTimes;

/// One encoded frame.
#[derive(Debug)]
pub struct Encoded {
    /// The H.264 access unit (Annex B NAL units); empty when the rate control dropped the frame.
    pub data: Vec<u8>,
    /// An IDR frame: a viewer can start here.
    pub keyframe: bool,
}

/// The encoder of one capture size.
pub struct H264 {
    encoder: Encoder,
    yuv: YUVBuffer,
    capture: Capture,
    started: Instant,
    /// The bitrate it was configured with, in bits per second.
    pub bitrate: u32,
}

impl H264 {
    /// An encoder for `capture` at `frame_rate`, for screen content, at the derived bitrate.
    ///
    /// # Errors
    /// OpenH264 refused the configuration.
    pub fn new(capture: Capture, frame_rate: u32) -> Result<H264, String> {
        let bits = bitrate(capture, frame_rate);
        #[allow(clippy::cast_precision_loss)]
        let config = EncoderConfig::new()
            .bitrate(BitRate::from_bps(bits))
            .max_frame_rate(FrameRate::from_hz(frame_rate as f32))
            .usage_type(UsageType::ScreenContentRealTime)
            // Not available for screen content (OpenH264 turns them off and says so).
            .adaptive_quantization(false)
            .background_detection(false)
            // Held to the bitrate by dropping a frame rather than blurring text; a dropped frame
            // comes back empty.
            .rate_control_mode(RateControlMode::Bitrate)
            .skip_frames(true)
            // What the conversion below produces (limited-range BT.601), said in the stream: a
            // decoder otherwise assumes BT.709 for HD sizes and shifts the page's colours.
            .vui(VuiConfig::bt601());
        let encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| format!("OpenH264: {e}"))?;
        let (width, height) = (capture.width as usize, capture.height as usize);
        Ok(H264 {
            encoder,
            yuv: YUVBuffer::new(width, height),
            capture,
            started: Instant::now(),
            bitrate: bits,
        })
    }

    /// Converts `bgrx` (the capture's size) and encodes it; a keyframe when `keyframe`.
    ///
    /// # Errors
    /// A frame of another size, or OpenH264 failed.
    pub fn encode(
        &mut self,
        bgrx: &[u8],
        keyframe: bool,
        times: &mut FrameTimes,
    ) -> Result<Encoded, String> {
        let (width, height) = (self.capture.width as usize, self.capture.height as usize);
        if bgrx.len() != width * height * 4 {
            return Err(format!(
                "a frame of {} bytes for a {width}x{height} capture",
                bgrx.len()
            ));
        }
        let began = Instant::now();
        self.yuv.read_bgra8(BgraSliceU8::new(bgrx, (width, height)));
        times.convert = began.elapsed();
        let began = Instant::now();
        if keyframe {
            self.encoder.force_intra_frame();
        }
        // The frame's time, which the encoder's rate control paces by.
        let millis = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let stream = self
            .encoder
            .encode_at(&self.yuv, Timestamp::from_millis(millis))
            .map_err(|e| format!("OpenH264: {e}"))?;
        let encoded = Encoded {
            keyframe: matches!(stream.frame_type(), FrameType::IDR),
            data: stream.to_vec(),
        };
        times.encode = began.elapsed();
        Ok(encoded)
    }
}
