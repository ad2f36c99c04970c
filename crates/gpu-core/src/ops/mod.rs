//! Shape-checked launchers for the PTX kernels (one method per operation on [`Device`]), one
//! module per kernel family of `kernels/*.cu`: `norm`, `act`, `rope`, `flash_attn` (both
//! attention families), `layout`; `common` holds what they share.
//!
//! [`Device`]: crate::Device
#![allow(clippy::too_many_arguments, clippy::type_complexity)]

mod act;
mod common;
mod flash_attn;
mod layout;
mod norm;
mod rope;

pub use act::{ActElem, Activation, Clamp, Gate};
pub use common::Mat;
pub use flash_attn::{AttnArgs, FlashVariant, MAX_F32_ATTN_HEAD_DIM};
pub use layout::conv3x3s2_out;
pub use norm::{NormOut, MAX_NORM_WIDTH};
pub use rope::{rope_inv_freq, QkvSpec, RopeLayout, RopeSpec};
