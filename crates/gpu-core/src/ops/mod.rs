//! Shape-checked launchers for the PTX kernels (one method per operation on [`Device`]), one
//! module per kernel family of `kernels/*.cu`: `norm`, `act`, `rope`, `flash_attn` (both
//! attention families), `gemm_act` (the fused-epilogue GEMM), `layout`; `common` holds what they share.
//!
//! [`Device`]: crate::Device
#![allow(clippy::too_many_arguments, clippy::type_complexity)]

mod act;
mod common;
mod flash_attn;
mod gemm_act;
mod layout;
mod norm;
mod rope;

pub use act::{ActElem, Gate, HalfElem};
pub use common::Clamp;
pub use common::Mat;
pub use flash_attn::{AttnArgs, FlashVariant, MAX_F32_ATTN_HEAD_DIM};
pub use gemm_act::{interleave_gate_up, FusedAct, InterleavedGateUp, GATE_UP_GROUP};
pub use layout::conv3x3s2_out;
pub use norm::{NormOut, MAX_NORM_WIDTH};
pub use rope::{rope_inv_freq, QkvSpec, RopeLayout, RopeSpec};
