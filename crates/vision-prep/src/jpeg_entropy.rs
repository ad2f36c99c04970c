//! Our own entropy decode of a baseline JPEG scan into [`crate::jpeg_frame::Coefficients`]
//! (to be written).

use crate::jpeg_frame::Frame;

/// The frame header, tables and scan layout of `bytes`, or `None` where our decode does not take
/// the file (to be written: always `None` for now).
pub(crate) fn parse_frame(_bytes: &[u8]) -> Option<Frame> {
    None
}
