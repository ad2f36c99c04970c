//! One video in (every frame, encoded or raw RGB, with its metadata), its plan and its rows out
//! (glm5_next, gemma4; docs/VIDEO.md). The metadata budgets are checked before any frame is
//! read; of encoded frames only the sampled ones are read.

use std::ffi::{c_char, c_void, CString};

use vision_towers::vision_prep::video::{VideoMetadata, VideoSettings};
use vision_towers::vision_prep::{
    ImageSource, PrepError, Video, VideoFrames, VideoPiece, VideoPlan, VideoPreprocessor,
};
use vision_towers::{EncodedVideo, Model, ModelError, PrepOpenError};

use crate::encode::{device_out, device_target, image_source, offsets_of, vt_image, vt_rows};
use crate::error::{guard, guard_value, vt_status, Failure};
use crate::ffi::{check_extent, need_out, slice, slice_mut, write_opt};
use crate::model::{model_arg, vt_model};
use crate::plan::VT_TOKEN_UNKNOWN;

/// One video: every frame of it, in order, and its metadata. Give the frames either encoded
/// (`frames`: `n_frames` `vt_image`s; only the sampled ones are read) or raw (`rgb`: frames of
/// `height · width · 3` bytes back to back, `rgb_len` bytes in all), the other pointer NULL. Read
/// only during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vt_video {
    /// Encoded frames (`n_frames` of them), or NULL for raw frames.
    pub frames: *const vt_image,
    /// Raw RGB u8 frames, row-major, or NULL for encoded frames.
    pub rgb: *const u8,
    /// Bytes at `rgb`. Frames past them count as empty: the metadata budgets are checked first
    /// (so a video refused by them needs no bytes at all), then a short frame is `VT_ERR_IMAGE`.
    pub rgb_len: usize,
    /// Frames in the video (its metadata's `total_num_frames`; the encoded frames given).
    pub n_frames: usize,
    /// Raw frames' width (ignored for encoded frames, whose headers say it).
    pub width: u32,
    /// Raw frames' height.
    pub height: u32,
    /// The video's frame rate (glm5_next needs it); 0 or less, or NaN = unknown.
    pub fps: f64,
    /// Duration in seconds if the container states it; 0 or less = unknown (derived from the
    /// frame count and `fps`, as upstream does).
    pub duration: f64,
}

/// How a video is sampled, over the model's video processor config. Start from
/// [`vt_video_settings_default`]; a zeroed struct is the same (every field's 0 means the
/// config's value).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vt_video_settings {
    /// glm5_next: the target sampling rate in frames per second (gemma4 refuses one).
    pub sample_fps: f64,
    /// gemma4: frames sampled, uniformly (a video with fewer frames is refused, as upstream).
    pub num_frames: u64,
    /// Most frames sampled.
    pub max_frames: u64,
    /// gemma4: soft tokens per frame, one of 70, 140, 280, 560, 1120.
    pub max_soft_tokens: u32,
    /// glm5_next: the whole video's token budget, lower bound.
    pub min_image_tokens: u64,
    /// glm5_next: the whole video's token budget.
    pub max_image_tokens: u64,
}

/// The default video settings: every value from the model's video processor config. Never
/// fails.
#[no_mangle]
pub extern "C" fn vt_video_settings_default() -> vt_video_settings {
    vt_video_settings {
        sample_fps: 0.0,
        num_frames: 0,
        max_frames: 0,
        max_soft_tokens: 0,
        min_image_tokens: 0,
        max_image_tokens: 0,
    }
}

impl vt_video_settings {
    fn settings(&self) -> VideoSettings {
        let some = |v: u64| (v != 0).then_some(v);
        VideoSettings {
            fps: (self.sample_fps != 0.0).then_some(self.sample_fps),
            num_frames: some(self.num_frames),
            max_frames: some(self.max_frames),
            max_soft_tokens: (self.max_soft_tokens != 0).then_some(self.max_soft_tokens),
            min_image_tokens: some(self.min_image_tokens),
            max_image_tokens: some(self.max_image_tokens),
            ..VideoSettings::default()
        }
    }
}

/// One video's plan, from its metadata and frame size alone (nothing decoded): the rows, the
/// frames sampled and their timestamps, `video_grid_thw`, and the prompt as pieces in order:
/// token runs (`ids[i]` repeated `counts[i]` times, `embeds[i]` = 1 where the rows replace them)
/// and text pieces (`is_text[i]` = 1: the timestamps, for the caller's tokenizer; id
/// [`VT_TOKEN_UNKNOWN`], count 0). Made by [`vt_model_plan_video`] or [`vt_model_encode_video`],
/// freed by [`vt_video_plan_free`]; the arrays it hands out live as long as it does.
///
/// Thread safety: immutable; a `const vt_video_plan*` may be read from several threads.
pub struct vt_video_plan {
    rows: u64,
    ids: Vec<u32>,
    counts: Vec<u64>,
    embeds: Vec<u8>,
    is_text: Vec<u8>,
    texts: Vec<CString>,
    indices: Vec<u64>,
    timestamps: Vec<f64>,
    grid: [u64; 3],
    target: (u64, u64),
}

impl vt_video_plan {
    fn new(plan: &VideoPlan) -> vt_video_plan {
        let text = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
        let mut p = vt_video_plan {
            rows: plan.rows,
            ids: Vec::new(),
            counts: Vec::new(),
            embeds: Vec::new(),
            is_text: Vec::new(),
            texts: Vec::new(),
            indices: plan.frames_indices.clone(),
            timestamps: plan.timestamps.clone(),
            grid: plan.grid_thw,
            target: plan.target,
        };
        for piece in &plan.prompt {
            match piece {
                VideoPiece::Run(r) => {
                    p.ids.push(r.token.id.unwrap_or(VT_TOKEN_UNKNOWN));
                    p.counts.push(r.count);
                    p.embeds.push(u8::from(r.embeds));
                    p.is_text.push(0);
                    p.texts.push(text(&r.token.text));
                }
                VideoPiece::Text(t) => {
                    p.ids.push(VT_TOKEN_UNKNOWN);
                    p.counts.push(0);
                    p.embeds.push(0);
                    p.is_text.push(1);
                    p.texts.push(text(t));
                }
            }
        }
        p
    }
}

/// A vision-prep refusal of the video, named by the model's path as the facade names it.
fn prep_failure(m: &Model, source: PrepError) -> Failure {
    Failure::from(ModelError::Prep(PrepOpenError::Prep {
        path: m.path().to_path_buf(),
        source,
    }))
}

/// The video's preprocessor and the video, handed to `run`.
///
/// # Safety
/// `video` is NULL or points at a `vt_video` whose pointers hold what its fields say, alive
/// for the call; `settings` is NULL or valid.
unsafe fn with_video<T>(
    m: &Model,
    video: *const vt_video,
    settings: *const vt_video_settings,
    run: impl FnOnce(&VideoPreprocessor, &Video<'_>) -> Result<T, Failure>,
) -> Result<T, Failure> {
    // SAFETY: the caller's contract.
    let v = unsafe { video.as_ref() }.ok_or_else(|| Failure::null("video"))?;
    // SAFETY: the caller's contract.
    let s = unsafe { settings.as_ref() }
        .copied()
        .unwrap_or_else(|| vt_video_settings_default());
    let known = |x: f64| (x.is_finite() && x > 0.0).then_some(x);
    let metadata = VideoMetadata {
        total_num_frames: v.n_frames as u64,
        fps: known(v.fps),
        duration: known(v.duration),
    };
    if !v.frames.is_null() && !v.rgb.is_null() {
        return Err(Failure::invalid(
            "video: frames and rgb are both set (encoded frames or raw ones, not both)",
        ));
    }
    let pre = m.video_preprocessor(s.settings()).map_err(Failure::from)?;
    // The metadata first: its frame budget bounds everything made below, and a video refused
    // by it has no frame read (nor, raw, any byte).
    let sampled = pre
        .sampled_indices(&metadata)
        .map_err(|e| prep_failure(m, e))?;
    if v.frames.is_null() {
        if v.width == 0 || v.height == 0 {
            return Err(Failure::invalid(format!(
                "video: raw frames of {}x{} (width and height must be positive)",
                v.width, v.height
            )));
        }
        // SAFETY: the caller's contract: `rgb` holds `rgb_len` bytes (NULL only with 0).
        let bytes = unsafe { slice(v.rgb, v.rgb_len, "video.rgb") }?;
        let each = (v.width as usize)
            .checked_mul(v.height as usize)
            .and_then(|p| p.checked_mul(3))
            .ok_or_else(|| Failure::invalid("video: a raw frame overflows size_t"))?;
        let mut frames: Vec<&[u8]> = bytes.chunks(each).collect();
        if frames.len() < v.n_frames {
            frames.resize(v.n_frames, &[]);
        }
        let video = Video {
            frames: VideoFrames::Rgb {
                width: v.width,
                height: v.height,
                frames: &frames,
            },
            metadata,
        };
        run(&pre, &video)
    } else {
        // SAFETY: the caller's contract: `n_frames` `vt_image`s at `frames`.
        let images = unsafe { slice(v.frames, v.n_frames, "video.frames") }?;
        let mut sources = vec![ImageSource::Bytes(&[]); images.len()];
        for &i in &sampled {
            let i = usize::try_from(i).unwrap_or(usize::MAX);
            if let (Some(img), Some(slot)) = (images.get(i), sources.get_mut(i)) {
                // SAFETY: the caller's contract on every frame's bytes.
                *slot = unsafe { image_source(img, i) }.map_err(|mut f| {
                    f.image = Some(i);
                    f
                })?;
            }
        }
        let video = Video {
            frames: VideoFrames::Encoded(&sources),
            metadata,
        };
        run(&pre, &video)
    }
}

/// The elements the video's rows take (its plan's rows × the model's width), decided from the
/// plan alone (metadata and headers; no frame decoded): a caller's buffer `what` of `have`
/// elements that holds fewer is `VT_ERR_BUFFER_TOO_SMALL`, with `*needed` written.
///
/// # Safety
/// `needed` is NULL or valid for a write.
unsafe fn rows_fit(
    m: &Model,
    pre: &VideoPreprocessor,
    v: &Video<'_>,
    what: &str,
    have: usize,
    needed: *mut usize,
) -> Result<usize, Failure> {
    let planned = pre.plan(v).map_err(|e| prep_failure(m, e))?;
    let elements = usize::try_from(planned.rows)
        .ok()
        .and_then(|r| r.checked_mul(m.width()))
        .ok_or_else(|| Failure::invalid("the video's rows overflow size_t"))?;
    if have < elements {
        // SAFETY: the caller's contract.
        unsafe { write_opt(needed, elements) };
        return Err(Failure::new(
            vt_status::VT_ERR_BUFFER_TOO_SMALL,
            format!(
                "{what} holds {have} elements; the video's rows need {} × {} = {elements}",
                planned.rows,
                m.width()
            ),
        ));
    }
    Ok(elements)
}

/// Checks the optional out-params `needed` and `plan` (NULL, or aligned).
fn optional_outs(needed: *mut usize, plan: *mut *mut vt_video_plan) -> Result<(), Failure> {
    if !needed.is_null() {
        need_out(needed, "needed")?;
    }
    if !plan.is_null() {
        need_out(plan, "plan")?;
    }
    Ok(())
}

/// Writes a new [`vt_video_plan`] of `p` to `*plan` if `plan` is not NULL.
///
/// # Safety
/// `plan` is NULL or valid for a write (checked by [`need_out`]).
unsafe fn write_plan(plan: *mut *mut vt_video_plan, p: &VideoPlan) {
    if !plan.is_null() {
        let handle = Box::into_raw(Box::new(vt_video_plan::new(p)));
        // SAFETY: the caller's contract.
        unsafe { plan.write(handle) };
    }
}

/// Plans `video` from its metadata and frame size (raw frames: `width` and `height`; encoded
/// frames: the sampled frames' headers; nothing decoded) and writes the new plan to `*out`.
/// `settings` NULL = [`vt_video_settings_default`].
///
/// Statuses: `VT_ERR_NULL_ARGUMENT`, `VT_ERR_INVALID_ARGUMENT` (both `frames` and `rgb` set, a
/// zero raw size, an unknown frame `kind`, a setting out of range), `VT_ERR_UNSUPPORTED` (a family without a
/// video path: step3p7, glm_ocr), `VT_ERR_IMAGE_TOO_LARGE` (over a metadata budget: frames,
/// pixels of the sampled frames, bytes handed in; checked before any frame is read),
/// `VT_ERR_IMAGE` (no `fps` for glm5_next, fewer frames than gemma4's `num_frames`, frames of
/// different sizes, a short raw frame, a sampled frame refused as an image, which
/// `vt_last_error_image` names), `VT_ERR_MODEL` (the model's video config).
///
/// # Safety
/// `model` is a live handle; `video` points at a `vt_video` whose `frames` (and each frame's
/// bytes) or `rgb` hold what its fields say, valid for the call; `settings` is NULL or valid;
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_plan_video(
    model: *const vt_model,
    video: *const vt_video,
    settings: *const vt_video_settings,
    out: *mut *mut vt_video_plan,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        need_out(out, "out")?;
        // SAFETY: the caller's contract.
        let plan = unsafe {
            with_video(m, video, settings, |pre, v| {
                pre.plan(v).map_err(|e| prep_failure(m, e))
            })
        }?;
        let handle = Box::into_raw(Box::new(vt_video_plan::new(&plan)));
        // SAFETY: checked non-NULL and aligned above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Samples, decodes and prepares `video`'s frames and runs the tower once over the whole video
/// (glm5_next: one attention segment per frame pair; gemma4: each sampled frame one image),
/// writing the new rows to `*out` (f32 on the host, whatever the device; one "image" of
/// `vt_video_plan_rows` rows, in the order of the plan's embedding runs) and, if `plan` is not
/// NULL, the video's plan to `*plan`.
///
/// Statuses: those of [`vt_model_plan_video`], and `VT_ERR_OUT_OF_MEMORY` (the model stays
/// usable), `VT_ERR_DEVICE`.
///
/// # Safety
/// As [`vt_model_plan_video`]; `out` is valid for a write; `plan` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_encode_video(
    model: *const vt_model,
    video: *const vt_video,
    settings: *const vt_video_settings,
    out: *mut *mut vt_rows,
    plan: *mut *mut vt_video_plan,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        need_out(out, "out")?;
        if !plan.is_null() {
            need_out(plan, "plan")?;
        }
        // SAFETY: the caller's contract.
        let encoded = unsafe {
            with_video(m, video, settings, |pre, v| {
                m.encode_video_with(pre, v).map_err(Failure::from)
            })
        }?;
        let rows = vt_rows {
            offsets: offsets_of([encoded.plan.rows as usize]),
            data: encoded.rows,
            width: encoded.width,
        };
        let handle = Box::into_raw(Box::new(rows));
        // SAFETY: checked non-NULL and aligned above.
        unsafe { out.write(handle) };
        // SAFETY: NULL, or checked aligned above (the caller's contract: valid for a write).
        unsafe { write_plan(plan, &encoded.plan) };
        Ok(())
    })
}

/// [`vt_model_encode_video`] into the caller's host buffer `out` of `out_len` floats (the rows
/// at its start, `vt_video_plan_rows × width` of them; size it from [`vt_model_plan_video`]).
///
/// Out-params (each may be NULL): `*plan` on `VT_OK`; `*needed` (the elements the rows take) on
/// `VT_OK` and on `VT_ERR_BUFFER_TOO_SMALL`, which is decided from the plan (metadata and
/// headers) before any frame is decoded or anything written.
///
/// # Safety
/// As [`vt_model_encode_video`]; `out` is NULL (with `out_len == 0`) or `out_len` writable
/// floats not overlapping the video's bytes; `needed` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_encode_video_into(
    model: *const vt_model,
    video: *const vt_video,
    settings: *const vt_video_settings,
    out: *mut f32,
    out_len: usize,
    needed: *mut usize,
    plan: *mut *mut vt_video_plan,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        if out.is_null() && out_len > 0 {
            return Err(Failure::null("out"));
        }
        check_extent::<f32>(out as usize, out_len, "out")?;
        optional_outs(needed, plan)?;
        let run = |pre: &VideoPreprocessor, v: &Video<'_>| -> Result<EncodedVideo, Failure> {
            // SAFETY: the caller's contract on `needed`.
            unsafe { rows_fit(m, pre, v, "out", out_len, needed) }?;
            m.encode_video_with(pre, v).map_err(Failure::from)
        };
        // SAFETY: the caller's contract.
        let encoded = unsafe { with_video(m, video, settings, run) }?;
        if encoded.rows.len() > out_len {
            return Err(Failure::new(
                vt_status::VT_ERR_INTERNAL,
                "the tower gave more rows than the plan",
            ));
        }
        // SAFETY: `out` holds out_len >= rows.len() writable floats (the caller's contract;
        // checked for alignment and extent above).
        let dst = unsafe { slice_mut(out, encoded.rows.len(), "out") }?;
        dst.copy_from_slice(&encoded.rows);
        // SAFETY: the caller's contract.
        unsafe { write_opt(needed, encoded.rows.len()) };
        // SAFETY: NULL, or checked aligned above (the caller's contract: valid for a write).
        unsafe { write_plan(plan, &encoded.plan) };
        Ok(())
    })
}

/// [`vt_model_encode_video`] with the rows written to the caller's CUDA memory `dst` (`dst_len`
/// elements of `dtype`), ordered with the caller's `stream` as [`vt_model_encode_device`] writes
/// an image's: the tower starts after the work `stream` has queued, and `stream` waits (on the
/// device) for the rows. Returns once the work is queued: read the rows in `stream`'s order (or
/// after synchronising it). The rows are at the start of `dst`, `vt_video_plan_rows × width` of
/// them, in the order of the plan's embedding runs; size `dst` from [`vt_model_plan_video`].
///
/// The arguments are [`vt_model_encode_video_into`]'s with its host buffer (`out`, `out_len`)
/// replaced by [`vt_model_encode_device`]'s device target (`dst`, `dst_len`, `dtype`, `stream`,
/// in that function's order): the model, the video and its sampling, where the rows go, then the
/// out-params, `needed` before `plan` as in `vt_model_encode_video_into`. No `row_offsets`: a
/// video is one "image", its rows `0 .. *needed / width`.
///
/// Checks, in order: `dtype` and the model as `vt_model_encode_device` checks them
/// (`VT_ERR_UNSUPPORTED` for a model on the CPU or 16-bit rows from another precision: no `dst_len`
/// would do, so `*needed` is not written, and no video config is read), then `dst` as it does
/// (NULL: `VT_ERR_NULL_ARGUMENT`; misaligned for `dtype` or past the address space:
/// `VT_ERR_INVALID_ARGUMENT`), then the out-params and the video as `vt_model_encode_video_into`
/// does (the destination before the video); `VT_ERR_BUFFER_TOO_SMALL` is decided from the plan
/// (metadata and headers) before any frame is decoded or the device touched.
///
/// Out-params (each may be NULL): `*plan` on `VT_OK`; `*needed` (the elements the rows take) on
/// `VT_OK` and on `VT_ERR_BUFFER_TOO_SMALL`.
///
/// Statuses: those of [`vt_model_encode_video`], and `VT_ERR_UNSUPPORTED` (a model on the CPU;
/// 16-bit rows from a model of another precision), `VT_ERR_BUFFER_TOO_SMALL`, `VT_ERR_OUT_OF_MEMORY` (nothing
/// usable in `dst`; the model stays usable).
///
/// # Safety
/// As [`vt_model_plan_video`]; `dst` and `stream` as in [`vt_model_encode_device`] (`dst` device
/// memory of the model's device holding `dst_len` elements of `dtype`, not used by anything else
/// until the rows are written in `stream`'s order; `stream` NULL or a live stream of that
/// device's primary context, alive until the queued work completes); `needed` and `plan` are
/// NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_encode_video_device(
    model: *const vt_model,
    video: *const vt_video,
    settings: *const vt_video_settings,
    dst: *mut c_void,
    dst_len: usize,
    dtype: u32,
    stream: *mut c_void,
    needed: *mut usize,
    plan: *mut *mut vt_video_plan,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        let (ordinal, dtype) = device_target(m, dtype)?;
        // SAFETY: the caller's contract on `dst` and `stream`.
        let out = unsafe { device_out(dst, dst_len, dtype, ordinal, stream) }?;
        optional_outs(needed, plan)?;
        let run = |pre: &VideoPreprocessor, v: &Video<'_>| -> Result<(VideoPlan, usize), Failure> {
            // SAFETY: the caller's contract on `needed`.
            let elements = unsafe { rows_fit(m, pre, v, "dst", dst_len, needed) }?;
            let planned = m
                .encode_video_device_into(pre, v, &out)
                .map_err(Failure::from)?;
            Ok((planned, elements))
        };
        // SAFETY: the caller's contract.
        let (planned, elements) = unsafe { with_video(m, video, settings, run) }?;
        // SAFETY: the caller's contract.
        unsafe { write_opt(needed, elements) };
        // SAFETY: NULL, or checked aligned above (the caller's contract: valid for a write).
        unsafe { write_plan(plan, &planned) };
        Ok(())
    })
}

/// Frees a video plan (NULL: nothing).
///
/// # Safety
/// `plan` is NULL or a plan from this library not freed before.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_free(plan: *mut vt_video_plan) {
    guard_value((), || {
        if !plan.is_null() {
            // SAFETY: a plan from `Box::into_raw` in this module, freed once.
            drop(unsafe { Box::from_raw(plan) });
        }
    })
}

/// Reads a plan for a getter.
///
/// # Safety
/// `plan` is NULL or a live plan.
unsafe fn get<'a>(plan: *const vt_video_plan) -> Option<&'a vt_video_plan> {
    // SAFETY: the caller's contract.
    unsafe { plan.as_ref() }
}

/// Embedding rows the tower emits for the video (= the tokens of the runs marked in
/// `vt_video_plan_piece_embeds`); 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_rows(plan: *const vt_video_plan) -> u64 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.rows))
}

/// Prompt pieces, token runs and text in order: how many (0 for NULL).
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_piece_count(plan: *const vt_video_plan) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.ids.len()))
}

/// The pieces' token ids ([`VT_TOKEN_UNKNOWN`] for text, and where the model's files do not
/// state the id); NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_piece_ids(plan: *const vt_video_plan) -> *const u32 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.ids.as_ptr())
    })
}

/// The pieces' repetition counts (0 for text); NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_piece_counts(plan: *const vt_video_plan) -> *const u64 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.counts.as_ptr())
    })
}

/// The placeholder mask: 1 where a run's tokens are replaced by the video's rows (in order),
/// 0 for tokens the engine embeds itself and for text; NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_piece_embeds(plan: *const vt_video_plan) -> *const u8 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.embeds.as_ptr())
    })
}

/// 1 where a piece is text for the caller's tokenizer (e.g. glm5_next's `"2.0 seconds"`,
/// gemma4's `"00:01 "`), 0 for a token run; NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_piece_is_text(plan: *const vt_video_plan) -> *const u8 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.is_text.as_ptr())
    })
}

/// Piece `i`'s text: a run's token text (e.g. `"<|image|>"`) or the text itself,
/// NUL-terminated; NULL past the last piece or for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_piece_text(
    plan: *const vt_video_plan,
    i: usize,
) -> *const c_char {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }
            .and_then(|p| p.texts.get(i))
            .map_or(std::ptr::null(), |t| t.as_ptr())
    })
}

/// Frames sampled (0 for NULL).
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_frame_count(plan: *const vt_video_plan) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.indices.len()))
}

/// The sampled frames' indices in the video (upstream's `frames_indices`); NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_frames_indices(plan: *const vt_video_plan) -> *const u64 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.indices.as_ptr())
    })
}

/// The sampled frames' timestamps in seconds (`index / fps`); NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_timestamps(plan: *const vt_video_plan) -> *const f64 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.timestamps.as_ptr())
    })
}

/// The grid, 3 numbers: glm5_next `video_grid_thw` (`[frame pairs, patch rows, patch
/// columns]`), gemma4 `[frames, patch rows, patch columns]`; NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_grid(plan: *const vt_video_plan) -> *const u64 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.grid.as_ptr())
    })
}

/// The size every sampled frame is brought to, width (glm5_next: its canvas); 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_target_width(plan: *const vt_video_plan) -> u64 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.target.0))
}

/// The target height (see [`vt_video_plan_target_width`]); 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_video_plan_target_height(plan: *const vt_video_plan) -> u64 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.target.1))
}
