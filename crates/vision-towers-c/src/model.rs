//! Opening a model and what it says about itself.

use std::ffi::c_char;
use std::path::Path;

use vision_towers::vision_prep::PrepSettings;
use vision_towers::{
    Device, Family, LmAttention, Model, Precision, TowerOptions, DEFAULT_MAX_PATCHES_PER_PASS,
};

use crate::error::{guard, guard_value, model_failure, vt_status, Failure};
use crate::ffi::{c_str, need_out, utf8};
use vision_towers::tower_core::{Classify, ErrorKind};

/// A model: its image processor and its vision tower, on the CPU or a CUDA device. Made by
/// [`vt_model_open`], freed by [`vt_model_free`].
///
/// Thread safety: a `const vt_model*` may be used from several threads at once (plans and
/// encodes run concurrently; on CUDA their passes take turns on the device). Only
/// `vt_model_free` needs exclusive use, after every other call on it has returned.
pub struct vt_model {
    pub(crate) model: Model,
    /// [`Model::cpu_reason`] as a C string, alive as long as the handle.
    cpu_reason: Option<std::ffi::CString>,
    /// [`Model::tier`] as a C string, alive as long as the handle.
    gpu_tier: Option<std::ffi::CString>,
}

/// The `Model` behind a handle, for Rust code linked with this crate (tests compare the C ABI
/// with the Rust API on the very same model).
///
/// # Safety
/// `model` is NULL or a live handle from [`vt_model_open`] that outlives `'a`.
pub unsafe fn model_of<'a>(model: *const vt_model) -> Option<&'a Model> {
    // SAFETY: the caller's contract.
    unsafe { model.as_ref() }.map(|m| &m.model)
}

/// The arithmetic of a tower.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum vt_precision {
    /// As an option: the device's own (f32 on the CPU; on CUDA bf16, or f16 on a tier without
    /// bf16 tensor cores: Turing, 7.5).
    VT_PRECISION_DEFAULT = 0,
    /// f32 values: the host reference, or CUDA's exactness mode (f32 GEMMs).
    VT_PRECISION_F32 = 1,
    /// bf16 weights and GEMM inputs on the tensor cores, f32 accumulation (CUDA only, compute
    /// capability 8.0 or newer).
    VT_PRECISION_BF16 = 2,
    /// f16 (IEEE half) weights and GEMM inputs on the tensor cores, f32 accumulation (CUDA only,
    /// every tier from 7.5); rows that leave f16's range are refused, never returned.
    VT_PRECISION_F16 = 3,
}

/// A model family.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum vt_family {
    /// Not a model (a NULL handle).
    VT_FAMILY_NONE = 0,
    /// Gemma-4 vision (`Gemma4VisionModel` + `Gemma4MultimodalEmbedder`).
    VT_FAMILY_GEMMA4 = 1,
    /// GLM-5.3-Flash vision (`Glm5NextVisionModel`).
    VT_FAMILY_GLM5_NEXT = 2,
    /// GLM-OCR (`GlmOcrVisionModel`).
    VT_FAMILY_GLM_OCR = 3,
    /// Step-3.7-Flash (`Step3p7VisionModel` + projector).
    VT_FAMILY_STEP3P7 = 4,
}

/// How the language model attends over an image's rows (llama.cpp's
/// `mtmd_decode_use_non_causal`, in full): an engine refuses a serving path that cannot honour it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum vt_lm_attention {
    /// Causal everywhere, image rows included (glm5_next, glm_ocr, step3p7, and gemma4 unless
    /// its text config says otherwise). Also the answer for a NULL handle.
    VT_LM_ATTENTION_CAUSAL = 0,
    /// gemma4 with `text_config.use_bidirectional_attention = "vision"`: sliding-window layers
    /// attend bidirectionally within one contiguous run of image placeholders (BOI/EOI are not
    /// part of it); full-attention layers stay causal.
    VT_LM_ATTENTION_BIDIRECTIONAL_IMAGE_RUNS_IN_SLIDING_LAYERS = 1,
    /// The whole text model is non-causal (gemma4 `"all"`; step3p7's
    /// `use_bidirectional_attention = true`).
    VT_LM_ATTENTION_BIDIRECTIONAL = 2,
}

/// How [`vt_model_open`] opens a model. Start from [`vt_open_options_default`]; a zeroed struct
/// is the same (every field's 0 means its default).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vt_open_options {
    /// `"auto"` (CUDA device 0 when one opens, else the CPU), `"cpu"`, `"cuda"` (= `"cuda:0"`)
    /// or `"cuda:N"`; NULL = `"auto"`.
    pub device: *const c_char,
    /// A `vt_precision`: `VT_PRECISION_DEFAULT` (0), `VT_PRECISION_F32` or `VT_PRECISION_BF16`
    /// (CUDA only).
    pub precision: u32,
    /// The most patches (tower tokens before merging or pooling) one pass holds; a request over
    /// it runs in several passes of whole images; one image over it is refused. 0 = 65536.
    pub max_patches_per_pass: u64,
    /// true: never capture or replay CUDA graphs (by default a bf16 pass whose layout was seen
    /// before replays a graph).
    pub disable_graphs: bool,
    /// gemma4 `max_soft_tokens`, one of 70, 140, 280, 560, 1120; 0 = the model's processor
    /// config (else 280). Ignored by the other families.
    pub max_soft_tokens: u32,
    /// glm5_next `max_image_tokens`; 0 = the model's processor config (else 8000). Ignored by
    /// the other families.
    pub max_image_tokens: u64,
    /// The decode budget: an image whose header claims more than this many pixels (width ×
    /// height) is refused before decoding. 0 = 50 000 000 (50 megapixels).
    pub max_pixels: u64,
    /// The longest `data:` URI accepted, in bytes before base64 decoding. 0 = 20 MiB.
    pub max_data_uri_bytes: u64,
}

/// The default options: device `"auto"`, the device's precision, 65536 patches per pass, CUDA
/// graphs on, the model's own token budgets, 50 megapixels. Never fails.
#[no_mangle]
pub extern "C" fn vt_open_options_default() -> vt_open_options {
    vt_open_options {
        device: std::ptr::null(),
        precision: 0,
        max_patches_per_pass: 0,
        disable_graphs: false,
        max_soft_tokens: 0,
        max_image_tokens: 0,
        max_pixels: 0,
        max_data_uri_bytes: 0,
    }
}

/// The tower options and processor settings `o` states.
///
/// # Safety
/// `o.device` is NULL or a NUL-terminated string.
unsafe fn settings_of(o: &vt_open_options) -> Result<(TowerOptions, PrepSettings), Failure> {
    let device = if o.device.is_null() {
        Device::Auto
    } else {
        // SAFETY: the caller's contract.
        let name = unsafe { utf8(o.device, "options->device") }?;
        name.parse::<Device>()
            .map_err(|e| Failure::invalid(format!("options->device: {e}")))?
    };
    let precision = match o.precision {
        0 => None,
        1 => Some(Precision::F32),
        2 => Some(Precision::Bf16),
        3 => Some(Precision::F16),
        p => {
            return Err(Failure::invalid(format!(
                "options->precision: {p} is not a vt_precision (0, 1, 2 or 3)"
            )))
        }
    };
    let max_patches_per_pass = match o.max_patches_per_pass {
        0 => DEFAULT_MAX_PATCHES_PER_PASS,
        n => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let options = TowerOptions {
        device,
        precision,
        max_patches_per_pass,
        graphs: !o.disable_graphs,
        // GPU_CORE_FORCE_TIER forces a tier from C (read when the device opens)
        force_tier: None,
    };
    let mut settings = PrepSettings {
        max_soft_tokens: (o.max_soft_tokens != 0).then_some(o.max_soft_tokens),
        max_image_tokens: (o.max_image_tokens != 0).then_some(o.max_image_tokens),
        ..PrepSettings::default()
    };
    if o.max_pixels != 0 {
        settings.limits.max_pixels = o.max_pixels;
    }
    if o.max_data_uri_bytes != 0 {
        settings.limits.max_data_uri_bytes =
            usize::try_from(o.max_data_uri_bytes).unwrap_or(usize::MAX);
    }
    Ok((options, settings))
}

/// Opens the weight file or model directory at `path` (a llama.cpp mmproj GGUF, a
/// `.safetensors` file, a model directory or a sharded directory) as `options` say (NULL = the
/// defaults) and writes the new handle to `*out`.
///
/// The file is memory-mapped: it must not change while the model is open. On CUDA the weights
/// are uploaded here, once.
///
/// Statuses: `VT_ERR_NULL_ARGUMENT`, `VT_ERR_INVALID_ARGUMENT` (an option out of range, a
/// `max_soft_tokens` or `max_image_tokens` the model's processor refuses), `VT_ERR_IO`,
/// `VT_ERR_MODEL` (also a budget in the model's own processor config out of range), `VT_ERR_NO_DEVICE` (`"cuda…"` asked for and none opens),
/// `VT_ERR_UNSUPPORTED` (bf16 on the CPU), `VT_ERR_OUT_OF_MEMORY`, `VT_ERR_DEVICE`.
///
/// # Safety
/// `path` is a NUL-terminated string; `options` is NULL or points at a `vt_open_options` whose
/// `device` is NULL or a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_open(
    path: *const c_char,
    options: *const vt_open_options,
    out: *mut *mut vt_model,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let path = unsafe { c_str(path, "path") }?;
        need_out(out, "out")?;
        // SAFETY: NULL or a valid `vt_open_options`, by the caller's contract.
        let o = unsafe { options.as_ref() }
            .copied()
            .unwrap_or_else(|| vt_open_options_default());
        // SAFETY: the caller's contract on `options->device`.
        let (tower, settings) = unsafe { settings_of(&o) }?;
        #[cfg(unix)]
        let path: &Path = Path::new(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()),
        );
        #[cfg(not(unix))]
        let path: &Path = Path::new(
            path.to_str()
                .map_err(|_| Failure::invalid("path is not valid UTF-8"))?,
        );
        let model = Model::open_with(path, &tower, settings).map_err(|e| {
            let mut f = model_failure(&e);
            // A budget the processor refuses is the caller's when the caller set one, else the
            // model's config's.
            if e.kind() == ErrorKind::Setting && o.max_soft_tokens == 0 && o.max_image_tokens == 0 {
                f.status = vt_status::VT_ERR_MODEL;
            }
            f
        })?;
        // NUL bytes cannot occur in these texts; were one there, the getter would say nothing
        let c = |s: Option<&str>| s.and_then(|s| std::ffi::CString::new(s).ok());
        let handle = Box::into_raw(Box::new(vt_model {
            cpu_reason: c(model.cpu_reason()),
            gpu_tier: c(model.tier()),
            model,
        }));
        // SAFETY: checked non-NULL and aligned above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a model (NULL: nothing). Every other call on it must have returned, and rows it wrote
/// to a device buffer are ordered on the caller's stream already.
///
/// # Safety
/// `model` is NULL or a handle from [`vt_model_open`] not freed before.
#[no_mangle]
pub unsafe extern "C" fn vt_model_free(model: *mut vt_model) {
    guard_value((), || {
        if !model.is_null() {
            // SAFETY: a handle from `Box::into_raw` in `vt_model_open`, freed once.
            drop(unsafe { Box::from_raw(model) });
        }
    })
}

/// Reads the model behind a const handle for a getter.
///
/// # Safety
/// `model` is NULL or a live handle.
unsafe fn get<'a>(model: *const vt_model) -> Option<&'a Model> {
    // SAFETY: the caller's contract.
    unsafe { model_of(model) }
}

/// Its family (`VT_FAMILY_NONE` for NULL).
///
/// # Safety
/// `model` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vt_model_family(model: *const vt_model) -> vt_family {
    guard_value(vt_family::VT_FAMILY_NONE, || {
        // SAFETY: the caller's contract.
        match unsafe { get(model) }.map(Model::family) {
            None => vt_family::VT_FAMILY_NONE,
            Some(Family::Gemma4) => vt_family::VT_FAMILY_GEMMA4,
            Some(Family::Glm5Next) => vt_family::VT_FAMILY_GLM5_NEXT,
            Some(Family::GlmOcr) => vt_family::VT_FAMILY_GLM_OCR,
            Some(Family::Step3p7) => vt_family::VT_FAMILY_STEP3P7,
        }
    })
}

/// Its family's name (`"gemma4"`, `"glm5_next"`, `"glm_ocr"`, `"step3p7"`), a static string;
/// NULL for NULL.
///
/// # Safety
/// `model` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vt_model_family_name(model: *const vt_model) -> *const c_char {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        match unsafe { get(model) }.map(Model::family) {
            None => std::ptr::null(),
            Some(Family::Gemma4) => c"gemma4".as_ptr(),
            Some(Family::Glm5Next) => c"glm5_next".as_ptr(),
            Some(Family::GlmOcr) => c"glm_ocr".as_ptr(),
            Some(Family::Step3p7) => c"step3p7".as_ptr(),
        }
    })
}

/// The LM width: the columns of every row (0 for NULL).
///
/// # Safety
/// `model` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vt_model_width(model: *const vt_model) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(model) }.map_or(0, Model::width))
}

/// The LM attention law for this model's image spans.
///
/// # Safety
/// `model` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vt_model_lm_attention(model: *const vt_model) -> vt_lm_attention {
    guard_value(vt_lm_attention::VT_LM_ATTENTION_CAUSAL, || {
        // SAFETY: the caller's contract.
        match unsafe { get(model) }.map(Model::lm_attention) {
            None | Some(LmAttention::Causal) => vt_lm_attention::VT_LM_ATTENTION_CAUSAL,
            Some(LmAttention::BidirectionalImageRunsInSlidingLayers) => {
                vt_lm_attention::VT_LM_ATTENTION_BIDIRECTIONAL_IMAGE_RUNS_IN_SLIDING_LAYERS
            }
            Some(LmAttention::Bidirectional) => vt_lm_attention::VT_LM_ATTENTION_BIDIRECTIONAL,
        }
    })
}

/// The CUDA device ordinal the tower runs on, or -1 for the CPU (what `"auto"` chose) and for
/// NULL.
///
/// # Safety
/// `model` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vt_model_device_ordinal(model: *const vt_model) -> i32 {
    guard_value(-1, || {
        // SAFETY: the caller's contract.
        match unsafe { get(model) }.map(Model::device) {
            Some(Device::Cuda(n)) => i32::try_from(n).unwrap_or(-1),
            _ => -1,
        }
    })
}

/// The tower's arithmetic: `VT_PRECISION_F32`, `VT_PRECISION_BF16` or `VT_PRECISION_F16`
/// (`VT_PRECISION_DEFAULT` for NULL).
///
/// # Safety
/// `model` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vt_model_precision(model: *const vt_model) -> vt_precision {
    guard_value(vt_precision::VT_PRECISION_DEFAULT, || {
        // SAFETY: the caller's contract.
        match unsafe { get(model) }.map(Model::precision) {
            None => vt_precision::VT_PRECISION_DEFAULT,
            Some(Precision::F32) => vt_precision::VT_PRECISION_F32,
            Some(Precision::Bf16) => vt_precision::VT_PRECISION_BF16,
            Some(Precision::F16) => vt_precision::VT_PRECISION_F16,
        }
    })
}

/// Why `"auto"` runs this model on the CPU although a CUDA device is present (an architecture
/// without a GPU tier, a driver older than CUDA 13 needs, no cuBLASLt, or a model the CUDA path
/// does not take), as a NUL-terminated string that lives as long as the model; NULL when the
/// model runs on CUDA, on an explicit `"cpu"`, where the machine has no CUDA device, and for NULL.
///
/// # Safety
/// `model` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vt_model_cpu_reason(model: *const vt_model) -> *const c_char {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { model.as_ref() }
            .and_then(|m| m.cpu_reason.as_deref())
            .map_or(std::ptr::null(), |s| s.as_ptr())
    })
}

/// The GPU tier the model's tower runs (e.g. `"9.0 Hopper (H100, H200, GH200)"`, or
/// `"8.0 Ampere (A100, A30), forced on 9.0"` under `GPU_CORE_FORCE_TIER`), a NUL-terminated
/// string that lives as long as the model; NULL on the CPU and for NULL.
///
/// # Safety
/// `model` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vt_model_gpu_tier(model: *const vt_model) -> *const c_char {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { model.as_ref() }
            .and_then(|m| m.gpu_tier.as_deref())
            .map_or(std::ptr::null(), |s| s.as_ptr())
    })
}

/// The model behind `model` for a status-returning call.
///
/// # Safety
/// `model` is NULL or a live handle that outlives `'a`.
pub(crate) unsafe fn model_arg<'a>(model: *const vt_model) -> Result<&'a Model, Failure> {
    // SAFETY: the caller's contract.
    unsafe { model_of(model) }.ok_or_else(|| Failure::null("model"))
}
