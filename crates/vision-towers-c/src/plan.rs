//! The plan of one image from its header: rows, prompt runs, placeholder mask, sizes.

use std::ffi::{c_char, CString};

use vision_towers::vision_prep::Plan;

use crate::encode::{image_source, vt_image};
use crate::error::{guard, guard_value, vt_status, Failure};
use crate::ffi::need_out;
use crate::model::{model_arg, vt_model};

/// A prompt token id the model's files do not state (`vt_plan_run_ids`).
pub const VT_TOKEN_UNKNOWN: u32 = 0xFFFF_FFFF;

/// One image's plan, from its header alone (nothing decoded): the rows the tower will emit, the
/// prompt token runs the vendor processor writes for it, which runs the rows replace, the
/// target size and the grid. Made by [`vt_model_plan`], freed by [`vt_plan_free`]; the arrays
/// it hands out live as long as it does.
///
/// Thread safety: immutable; a `const vt_plan*` may be read from several threads.
pub struct vt_plan {
    rows: u64,
    ids: Vec<u32>,
    counts: Vec<u64>,
    embeds: Vec<u8>,
    texts: Vec<CString>,
    image: (u32, u32),
    target: (u64, u64),
    grid: Vec<u64>,
    prompt_len: u64,
}

impl vt_plan {
    pub(crate) fn new(plan: &Plan) -> vt_plan {
        vt_plan {
            rows: plan.rows,
            ids: plan
                .prompt_runs
                .iter()
                .map(|r| r.token.id.unwrap_or(VT_TOKEN_UNKNOWN))
                .collect(),
            counts: plan.prompt_runs.iter().map(|r| r.count).collect(),
            embeds: plan
                .prompt_runs
                .iter()
                .map(|r| u8::from(r.embeds))
                .collect(),
            texts: plan
                .prompt_runs
                .iter()
                .map(|r| CString::new(r.token.text.replace('\0', "")).unwrap_or_default())
                .collect(),
            image: (plan.width, plan.height),
            target: plan.target,
            grid: plan.grid(),
            prompt_len: plan.prompt_len(),
        }
    }
}

/// Plans `image` from its header alone and writes the new plan to `*out`.
///
/// Statuses: `VT_ERR_NULL_ARGUMENT`, `VT_ERR_INVALID_ARGUMENT` (an unknown `kind`), `VT_ERR_IMAGE`
/// (not an image, a format not decoded, zero-sized, a header the processor cannot plan, a bad
/// data URI or a refused scheme), `VT_ERR_IMAGE_TOO_LARGE` (over `max_pixels` or the URI cap).
///
/// # Safety
/// `model` is a live handle; `image` points at a `vt_image` whose `data` holds `len` bytes;
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_plan(
    model: *const vt_model,
    image: *const vt_image,
    out: *mut *mut vt_plan,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        // SAFETY: the caller's contract.
        let img = unsafe { image.as_ref() }.ok_or_else(|| Failure::null("image"))?;
        need_out(out, "out")?;
        // SAFETY: the caller's contract on the image's bytes.
        let source = unsafe { image_source(img, 0) }?;
        let plan = m.plan(source)?;
        let handle = Box::into_raw(Box::new(vt_plan::new(&plan)));
        // SAFETY: checked non-NULL and aligned above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a plan (NULL: nothing).
///
/// # Safety
/// `plan` is NULL or a plan from [`vt_model_plan`] not freed before.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_free(plan: *mut vt_plan) {
    guard_value((), || {
        if !plan.is_null() {
            // SAFETY: a plan from `Box::into_raw` in `vt_model_plan`, freed once.
            drop(unsafe { Box::from_raw(plan) });
        }
    })
}

/// Reads a plan for a getter.
///
/// # Safety
/// `plan` is NULL or a live plan.
unsafe fn get<'a>(plan: *const vt_plan) -> Option<&'a vt_plan> {
    // SAFETY: the caller's contract.
    unsafe { plan.as_ref() }
}

/// Embedding rows the tower emits for this image (= the placeholder tokens of its prompt runs);
/// 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_rows(plan: *const vt_plan) -> u64 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.rows))
}

/// Prompt runs: how many (0 for NULL). Run `i` is `counts[i]` repetitions of token `ids[i]`.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_run_count(plan: *const vt_plan) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.ids.len()))
}

/// The runs' token ids (`vt_plan_run_count` of them; [`VT_TOKEN_UNKNOWN`] where neither
/// `config.json` nor the tokenizer files state the id); NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_run_ids(plan: *const vt_plan) -> *const u32 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.ids.as_ptr())
    })
}

/// The runs' repetition counts; NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_run_counts(plan: *const vt_plan) -> *const u64 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.counts.as_ptr())
    })
}

/// The placeholder mask: 1 where a run's tokens are replaced by the image's rows (in order,
/// run after run: gemma4's soft tokens between BOI and EOI, glm's image run, step3p7's
/// `<im_patch>` runs), 0 for text tokens the engine embeds itself. The counts of the marked runs
/// add up to `vt_plan_rows`. NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_run_embeds(plan: *const vt_plan) -> *const u8 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.embeds.as_ptr())
    })
}

/// The text of run `i`'s token (e.g. `"<|image|>"`), NUL-terminated; NULL past the last run or
/// for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_run_text(plan: *const vt_plan, i: usize) -> *const c_char {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }
            .and_then(|p| p.texts.get(i))
            .map_or(std::ptr::null(), |t| t.as_ptr())
    })
}

/// Total prompt tokens this image occupies (the sum of the run counts); 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_prompt_len(plan: *const vt_plan) -> u64 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.prompt_len))
}

/// The source image's width from its header; 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_image_width(plan: *const vt_plan) -> u32 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.image.0))
}

/// The source image's height from its header; 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_image_height(plan: *const vt_plan) -> u32 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.image.1))
}

/// The target width: gemma4's resized size, glm's canvas, step3p7's global view before
/// padding; 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_target_width(plan: *const vt_plan) -> u64 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.target.0))
}

/// The target height (see [`vt_plan_target_width`]); 0 for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_target_height(plan: *const vt_plan) -> u64 {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.target.1))
}

/// How many numbers the grid has (0 for NULL): 2 for gemma4 (`[patch rows, patch columns]`),
/// 3 for glm (`image_grid_thw` = `[1, rows, columns]`), 2 for step3p7 (`[crop rows, crop
/// columns]`).
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_grid_len(plan: *const vt_plan) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(plan) }.map_or(0, |p| p.grid.len()))
}

/// The grid (`vt_plan_grid_len` numbers); NULL for NULL.
///
/// # Safety
/// `plan` is NULL or a live plan.
#[no_mangle]
pub unsafe extern "C" fn vt_plan_grid(plan: *const vt_plan) -> *const u64 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(plan) }.map_or(std::ptr::null(), |p| p.grid.as_ptr())
    })
}
