//! The decoded image every decoder (`jpeg`, `pngfast`, `source`) hands to the processor: below
//! them all, so no decoder module imports another's types.

/// A decoded, RGB-converted u8 image, interleaved (H, W, 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `height·width·3` bytes, row-major, RGB.
    pub data: Vec<u8>,
}
