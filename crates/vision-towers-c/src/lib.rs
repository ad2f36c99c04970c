//! The C ABI of vision-towers: `include/vision_towers.h` (generated from this crate by cbindgen,
//! committed, checked by `tests/header.rs`), built as `libvision_towers_c.so` and
//! `libvision_towers_c.a`.
//!
//! The conventions (the header's preamble says the same to C callers):
//! - **Handles** are opaque ([`vt_model`], [`vt_plan`], [`vt_rows`], [`vt_tensors`],
//!   [`vt_video_plan`]); each one
//!   the library allocates has its `_free`, and every `_free` accepts NULL.
//! - **Status and message**: every fallible call returns a [`vt_status`]. The message of the
//!   last status-returning call is per thread: [`vt_last_error`] (empty after `VT_OK`), valid
//!   until the next `vt_` call on the same thread; [`vt_last_error_image`] names the image a
//!   refusal is about.
//! - **Out-params** are written only on `VT_OK`, with one exception stated where it applies: a
//!   call that fills a caller's buffer also writes `*needed` when it returns
//!   `VT_ERR_BUFFER_TOO_SMALL`.
//! - **No panic crosses the boundary**: every entry point runs under `catch_unwind`; a caught
//!   panic is `VT_ERR_PANIC` (a bug) with its message.
//! - **Pointers** are checked: a NULL where one is required is `VT_ERR_NULL_ARGUMENT`; a length
//!   with a NULL pointer, an unaligned pointer or a length past `PTRDIFF_MAX` bytes is
//!   `VT_ERR_INVALID_ARGUMENT`.
//! - **Threads**: a `const vt_model*` may be used from several threads at once (the Rust
//!   `Model` is `Send + Sync`; CUDA passes take turns on the device); plans, rows and tensor sets
//!   are plain values: read from any thread, mutate or free from one.
//!
//! The Rust API (`vision_towers::Model`) is the law; this crate only moves values across the
//! boundary. [`model_of`] gives Rust tests the `Model` behind a handle.
#![allow(non_camel_case_types)]
#![deny(missing_docs)]

mod encode;
mod error;
mod ffi;
mod model;
mod plan;
mod tensors;
mod video;

pub use encode::{
    vt_dtype, vt_image, vt_image_kind, vt_model_encode, vt_model_encode_device,
    vt_model_encode_into, vt_rows, vt_rows_count, vt_rows_data, vt_rows_free, vt_rows_images,
    vt_rows_offsets, vt_rows_width,
};
pub use error::{vt_last_error, vt_last_error_image, vt_status, vt_status_name, vt_testing_panic};
pub use model::{
    model_of, vt_family, vt_lm_attention, vt_model, vt_model_cpu_reason, vt_model_device_ordinal,
    vt_model_family, vt_model_family_name, vt_model_free, vt_model_gpu_tier, vt_model_lm_attention,
    vt_model_open, vt_model_precision, vt_model_width, vt_open_options, vt_open_options_default,
    vt_precision,
};
pub use plan::{
    vt_model_plan, vt_plan, vt_plan_free, vt_plan_grid, vt_plan_grid_len, vt_plan_image_height,
    vt_plan_image_width, vt_plan_prompt_len, vt_plan_rows, vt_plan_run_count, vt_plan_run_counts,
    vt_plan_run_embeds, vt_plan_run_ids, vt_plan_run_text, vt_plan_target_height,
    vt_plan_target_width, VT_TOKEN_UNKNOWN,
};
pub use tensors::{
    vt_model_encode_tensors, vt_model_encode_tensors_device, vt_tensors, vt_tensors_add_f32,
    vt_tensors_add_i64, vt_tensors_free, vt_tensors_new,
};

pub use video::{
    vt_model_encode_video, vt_model_encode_video_device, vt_model_encode_video_into,
    vt_model_plan_video, vt_video, vt_video_plan, vt_video_plan_frame_count,
    vt_video_plan_frames_indices, vt_video_plan_free, vt_video_plan_grid,
    vt_video_plan_piece_count, vt_video_plan_piece_counts, vt_video_plan_piece_embeds,
    vt_video_plan_piece_ids, vt_video_plan_piece_is_text, vt_video_plan_piece_text,
    vt_video_plan_rows, vt_video_plan_target_height, vt_video_plan_target_width,
    vt_video_plan_timestamps, vt_video_settings, vt_video_settings_default,
};

use std::ffi::c_char;

/// The ABI version this header describes; [`vt_abi_version`] gives the library's. A program
/// built against one header must refuse a library whose number differs.
pub const VT_ABI_VERSION: u32 = 1;

/// The library's version (`"0.1.0"`), a static NUL-terminated string. Never fails.
#[no_mangle]
pub extern "C" fn vt_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The library's ABI version ([`VT_ABI_VERSION`] of the header it was built with). Never fails.
#[no_mangle]
pub extern "C" fn vt_abi_version() -> u32 {
    VT_ABI_VERSION
}
