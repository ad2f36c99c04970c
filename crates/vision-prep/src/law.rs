//! The size laws of the four upstream image processors, computed from the header alone.
//!
//! Every function mirrors the upstream Python, including its float arithmetic (f64), Python's
//! `round` (half to even), `int()` truncation and `//` floor division; sources are cited per item.

use crate::error::{PrepError, Result};
use crate::resize::Filter;

/// OpenAI CLIP mean (transformers `utils/constants.py` `OPENAI_CLIP_MEAN`).
pub const OPENAI_CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// OpenAI CLIP std (transformers `utils/constants.py` `OPENAI_CLIP_STD`).
pub const OPENAI_CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// gemma4 image processor: `max_soft_tokens` must be one of these (image_processing_gemma4.py `_SUPPORTED_SOFT_TOKENS`).
pub const GEMMA4_SUPPORTED_SOFT_TOKENS: [u32; 5] = [70, 140, 280, 560, 1120];

/// Parameters of `Gemma4ImageProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Law {
    /// `patch_size` (16).
    pub patch_size: u32,
    /// `pooling_kernel_size` (3).
    pub pooling_kernel_size: u32,
    /// `max_soft_tokens` budget (280).
    pub max_soft_tokens: u32,
    /// Resampling filter (`resample`, BICUBIC).
    pub filter: Filter,
    /// `rescale_factor` (1/255).
    pub rescale_factor: f64,
}

/// Parameters of `Glm5NextImageProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct Glm5NextLaw {
    /// `patch_size` (14).
    pub patch_size: u32,
    /// `temporal_patch_size` (2).
    pub temporal_patch_size: u32,
    /// `merge_size` (2).
    pub merge_size: u32,
    /// `patch_expand_factor` (1).
    pub patch_expand_factor: u32,
    /// `min_image_tokens` (16).
    pub min_image_tokens: u64,
    /// `max_image_tokens` (8000).
    pub max_image_tokens: u64,
    /// Resampling filter (BICUBIC).
    pub filter: Filter,
    /// `image_mean`.
    pub mean: [f64; 3],
    /// `image_std`.
    pub std: [f64; 3],
    /// `rescale_factor` (1/255).
    pub rescale_factor: f64,
}

/// Parameters of `Glm46VImageProcessor` (what GLM-OCR checkpoints name).
#[derive(Debug, Clone, PartialEq)]
pub struct Glm46VLaw {
    /// `patch_size` (14).
    pub patch_size: u32,
    /// `temporal_patch_size` (2).
    pub temporal_patch_size: u32,
    /// `merge_size` (2).
    pub merge_size: u32,
    /// `size.shortest_edge` — a pixel budget despite the name (112·112).
    pub shortest_edge: u64,
    /// `size.longest_edge` — a pixel budget (28·28·15000).
    pub longest_edge: u64,
    /// Resampling filter (BICUBIC).
    pub filter: Filter,
    /// `image_mean`.
    pub mean: [f64; 3],
    /// `image_std`.
    pub std: [f64; 3],
    /// `rescale_factor` (1/255).
    pub rescale_factor: f64,
}

/// Parameters of `Step3p7ImageProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step3p7Law {
    /// `size.height` of the global view (728).
    pub image_size: u32,
    /// Local crop side `patch_size` (504).
    pub patch_size: u32,
    /// `max_image_size` cap (3024).
    pub max_image_size: u32,
    /// ViT patch (14).
    pub vision_patch_size: u32,
    /// Total downsampler stride (4).
    pub downsampler_stride: u32,
    /// Resampling filter (BILINEAR).
    pub filter: Filter,
    /// `image_mean`.
    pub mean: [f64; 3],
    /// `image_std`.
    pub std: [f64; 3],
    /// `rescale_factor` (1/255).
    pub rescale_factor: f64,
}

/// One image processor law, chosen by the processor class the model's config names.
#[derive(Debug, Clone, PartialEq)]
pub enum Law {
    /// `Gemma4ImageProcessor`.
    Gemma4(Gemma4Law),
    /// `Glm5NextImageProcessor`.
    Glm5Next(Glm5NextLaw),
    /// `Glm46VImageProcessor` (GLM-OCR).
    Glm46V(Glm46VLaw),
    /// `Step3p7ImageProcessor`.
    Step3p7(Step3p7Law),
}

impl Law {
    /// Upstream class name.
    pub fn processor_class(&self) -> &'static str {
        match self {
            Law::Gemma4(_) => "Gemma4ImageProcessor",
            Law::Glm5Next(_) => "Glm5NextImageProcessor",
            Law::Glm46V(_) => "Glm46VImageProcessor",
            Law::Step3p7(_) => "Step3p7ImageProcessor",
        }
    }
}

impl Default for Gemma4Law {
    fn default() -> Self {
        Gemma4Law {
            patch_size: 16,
            pooling_kernel_size: 3,
            max_soft_tokens: 280,
            filter: Filter::Bicubic,
            rescale_factor: 1.0 / 255.0,
        }
    }
}
impl Default for Glm5NextLaw {
    fn default() -> Self {
        Glm5NextLaw {
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            patch_expand_factor: 1,
            min_image_tokens: 16,
            max_image_tokens: 8000,
            filter: Filter::Bicubic,
            mean: OPENAI_CLIP_MEAN,
            std: OPENAI_CLIP_STD,
            rescale_factor: 1.0 / 255.0,
        }
    }
}
impl Default for Glm46VLaw {
    fn default() -> Self {
        Glm46VLaw {
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            shortest_edge: 112 * 112,
            longest_edge: 28 * 28 * 15000,
            filter: Filter::Bicubic,
            mean: OPENAI_CLIP_MEAN,
            std: OPENAI_CLIP_STD,
            rescale_factor: 1.0 / 255.0,
        }
    }
}
impl Default for Step3p7Law {
    fn default() -> Self {
        Step3p7Law {
            image_size: 728,
            patch_size: 504,
            max_image_size: 3024,
            vision_patch_size: 14,
            downsampler_stride: 4,
            filter: Filter::Bilinear,
            mean: OPENAI_CLIP_MEAN,
            std: OPENAI_CLIP_STD,
            rescale_factor: 1.0 / 255.0,
        }
    }
}

fn unplannable(class: &str, w: u32, h: u32, reason: impl Into<String>) -> PrepError {
    PrepError::Unplannable {
        processor: class.into(),
        width: w,
        height: h,
        reason: reason.into(),
    }
}

/// Python `round` (half to even) of an f64.
fn py_round(x: f64) -> f64 {
    x.round_ties_even()
}

/// gemma4 target `(height, width)`: image_processing_gemma4.py `get_aspect_ratio_preserving_size` —
/// `f = sqrt(max_patches·p²/(h·w))`, each side `floor(f·side/(k·p))·(k·p)` (scales up as well as down);
/// a side that rounds to 0 becomes `k·p` and the other `min(floor(long/short)·k·p, (max_patches//k²)·k·p)`.
pub fn gemma4_target(law: &Gemma4Law, height: u32, width: u32) -> Result<(u32, u32)> {
    let (h, w) = (f64::from(height), f64::from(width));
    let k2 = u64::from(law.pooling_kernel_size).pow(2);
    let max_patches = u64::from(law.max_soft_tokens) * k2;
    let target_px = max_patches * u64::from(law.patch_size).pow(2);
    let factor = (target_px as f64 / (h * w)).sqrt();
    let side = u64::from(law.pooling_kernel_size) * u64::from(law.patch_size);
    let mut th = ((factor * h) / side as f64).floor() as u64 * side;
    let mut tw = ((factor * w) / side as f64).floor() as u64 * side;
    if th == 0 && tw == 0 {
        return Err(unplannable(
            "Gemma4ImageProcessor",
            width,
            height,
            "resize to a 0 x 0 image",
        ));
    }
    let max_side = (max_patches / k2) * side;
    if th == 0 {
        th = side;
        tw = ((w / h).floor() as u64 * side).min(max_side);
    } else if tw == 0 {
        tw = side;
        th = ((h / w).floor() as u64 * side).min(max_side);
    }
    if th * tw > target_px {
        return Err(unplannable(
            "Gemma4ImageProcessor",
            width,
            height,
            format!("{th}x{tw} exceeds {max_patches} patches"),
        ));
    }
    Ok((th as u32, tw as u32))
}

/// glm5_next canvas `(height, width)`: image_processing_glm5_next.py `smart_resize` with
/// `num_frames = temporal_factor` (as `resize` calls it).
pub fn glm5_next_canvas(law: &Glm5NextLaw, height: u32, width: u32) -> Result<(u64, u64)> {
    let factor =
        u64::from(law.patch_size) * u64::from(law.merge_size) * u64::from(law.patch_expand_factor);
    let tf = u64::from(law.temporal_patch_size);
    let num_frames = tf;
    let ppt = tf * factor * factor;
    let min_pixels = law.min_image_tokens * ppt;
    let max_pixels = law.max_image_tokens * ppt;
    let align = |v: f64| -> u64 { (v / factor as f64).ceil() as u64 * factor };
    let (h, w) = (u64::from(height), u64::from(width));
    let aligned_frames = tf.max(py_round(num_frames as f64 / tf as f64) as u64 * tf);
    let mut ah = align(h as f64);
    let mut aw = align(w as f64);
    let mut budget = aligned_frames * ah * aw;
    if budget < min_pixels {
        let scale = (min_pixels as f64 / (num_frames * h * w) as f64).sqrt();
        ah = align(((h as f64 * scale).ceil()).max(1.0));
        aw = align(((w as f64 * scale).ceil()).max(1.0));
        budget = aligned_frames * ah * aw;
    }
    if budget > max_pixels {
        let minimum = aligned_frames * factor * factor;
        if max_pixels < minimum {
            return Err(unplannable(
                "Glm5NextImageProcessor",
                width,
                height,
                format!("max_pixels={max_pixels} is too small"),
            ));
        }
        let (mut low, mut high) = (1i64, h as i64);
        let (mut bh, mut bw) = (factor, factor);
        while low <= high {
            let ch = (low + high) / 2;
            let cw = ((w * ch as u64) as f64 / h as f64).floor().max(1.0);
            let cand_h = align(ch as f64);
            let cand_w = align(cw);
            if aligned_frames * cand_h * cand_w <= max_pixels {
                bh = cand_h;
                bw = cand_w;
                low = ch + 1;
            } else {
                high = ch - 1;
            }
        }
        ah = bh;
        aw = bw;
    }
    Ok((ah, aw))
}

/// glm5_next content `(height, width)` pasted at the top-left of the canvas (`Glm5NextImageProcessor.resize`):
/// `s = min(th/h, tw/w)`, capped at 1 unless the image is under the minimum budget;
/// `content = max(1, min(t, floor(dim·s)))`.
pub fn glm5_next_content(
    law: &Glm5NextLaw,
    height: u32,
    width: u32,
    canvas: (u64, u64),
) -> (u64, u64) {
    let factor =
        u64::from(law.patch_size) * u64::from(law.merge_size) * u64::from(law.patch_expand_factor);
    let tf = u64::from(law.temporal_patch_size);
    let ppt = tf * factor * factor;
    let (h, w) = (f64::from(height), f64::from(width));
    let (th, tw) = canvas;
    let mut scale = (th as f64 / h).min(tw as f64 / w);
    if tf * u64::from(height) * u64::from(width) >= ppt * law.min_image_tokens {
        scale = scale.min(1.0);
    }
    let ch = ((h * scale).floor() as u64).min(th).max(1);
    let cw = ((w * scale).floor() as u64).min(tw).max(1);
    (ch, cw)
}

/// glm46v `smart_resize` refuses an aspect ratio over this (image_processing_glm46v.py
/// `smart_resize`: "absolute aspect ratio must be smaller than 200").
pub const GLM46V_MAX_ASPECT_RATIO: f64 = 200.0;

/// glm46v (GLM-OCR) resized `(height, width)`: image_processing_glm46v.py `smart_resize`
/// (Qwen2-VL style, Python banker's `round`, aspect > 200 refused).
pub fn glm46v_size(law: &Glm46VLaw, height: u32, width: u32) -> Result<(u64, u64)> {
    let factor = u64::from(law.patch_size) * u64::from(law.merge_size);
    let tf = u64::from(law.temporal_patch_size);
    let num_frames = tf;
    let f = factor as f64;
    // Python ints that may become floats' int() below.
    let (mut h, mut w) = (u64::from(height), u64::from(width));
    if h < factor || w < factor {
        let scale = (f / h as f64).max(f / w as f64);
        h = (h as f64 * scale) as u64;
        w = (w as f64 * scale) as u64;
    }
    if h == 0 || w == 0 {
        return Err(unplannable(
            "Glm46VImageProcessor",
            width,
            height,
            "division by zero",
        ));
    }
    let ratio = h.max(w) as f64 / h.min(w) as f64;
    if ratio > GLM46V_MAX_ASPECT_RATIO {
        return Err(unplannable(
            "Glm46VImageProcessor",
            width,
            height,
            format!("absolute aspect ratio must be smaller than 200, got {ratio}"),
        ));
    }
    let mut hb = py_round(h as f64 / f) as u64 * factor;
    let mut wb = py_round(w as f64 / f) as u64 * factor;
    let tb = py_round(num_frames as f64 / tf as f64) as u64 * tf;
    if tb * hb * wb > law.longest_edge {
        let beta = ((num_frames * h * w) as f64 / law.longest_edge as f64).sqrt();
        hb = factor.max((h as f64 / beta / f).floor() as u64 * factor);
        wb = factor.max((w as f64 / beta / f).floor() as u64 * factor);
    } else if tb * hb * wb < law.shortest_edge {
        let beta = (law.shortest_edge as f64 / (num_frames * h * w) as f64).sqrt();
        hb = (h as f64 * beta / f).ceil() as u64 * factor;
        wb = (w as f64 * beta / f).ceil() as u64 * factor;
    }
    Ok((hb, wb))
}

/// Most step3p7 local crops one image may be tiled into: 2¹⁶. Upstream has no cap. A strip of
/// 1-pixel windows gives at most `max_image_size` crops (≤ 2¹⁶ for any config within
/// `MAX_CONFIG_SIDE`; 3024 for the release config); only a crop side under 1/256 of
/// `max_image_size` (release: 504 of 3024) goes past it, with ~4 prompt runs per crop held in
/// the plan before any output budget applies.
pub const MAX_STEP3P7_CROPS: u64 = 1 << 16;

/// step3p7 patch layout (image_processing_step3p7.py `_plan_patches`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step3p7Layout {
    /// `(width, height)` the global view is resized to before squaring (after the 3024 cap).
    pub global: (u64, u64),
    /// `(crop_width, crop_height)` the padded *uncapped* image is resized to before tiling.
    pub crop: (u64, u64),
    /// Window side (0 = no local crops).
    pub window: u64,
    /// Tiles across.
    pub nx: u64,
    /// Tiles down.
    pub ny: u64,
    /// Whether the source is zero-padded (right/bottom) to a square first.
    pub square_pad: bool,
}

/// step3p7 `_plan_patches`: a source whose short side is under this is "extreme" when its
/// aspect ratio is over [`STEP3P7_EXTREME_RATIO`] (image_processing_step3p7.py `_plan_patches`).
pub const STEP3P7_EXTREME_SHORT_SIDE: u64 = 32;
/// step3p7 `_plan_patches`: the aspect ratio over which a thin source is squared, and over which a
/// view longer than the global side takes its short side as the window (`ratio > 4`).
pub const STEP3P7_EXTREME_RATIO: f64 = 4.0;
/// step3p7 `_plan_patches`: a view no longer than the global side gets crops only when its aspect
/// ratio is over this (`ratio > 1.5`), with its short side as the window.
pub const STEP3P7_SMALL_CROP_RATIO: f64 = 1.5;
/// step3p7 `_plan_patches`: a side snaps up to one more window when its remainder is over this
/// fraction of the window (`dim % win > 0.2·win`, an int compared with a float).
pub const STEP3P7_SNAP_FRACTION: f64 = 0.2;

/// step3p7 `_plan_patches`, first half: the `(width, height)` the law works on after the
/// extreme-aspect square pad (`min(w,h) < 32` and ratio `> 4`: both sides become `max(w,h)`) and
/// the `int()` cap of the long side at `max_image_size`; and whether the source was squared.
pub fn step3p7_view(law: &Step3p7Law, height: u32, width: u32) -> (u64, u64, bool) {
    let (mut w, mut h) = (u64::from(width), u64::from(height));
    let extreme = w.min(h) < STEP3P7_EXTREME_SHORT_SIDE
        && (w as f64 / h as f64).max(h as f64 / w as f64) > STEP3P7_EXTREME_RATIO;
    if extreme {
        let s = w.max(h);
        w = s;
        h = s;
    }
    let max_size = u64::from(law.max_image_size);
    if h.max(w) > max_size {
        let scale = max_size as f64 / h.max(w) as f64;
        w = (w as f64 * scale) as u64;
        h = (h as f64 * scale) as u64;
    }
    (w, h, extreme)
}

/// step3p7 `_plan_patches`, second half, on a view from [`step3p7_view`] whose sides are both
/// at least 1: the window law and the integer-modulo snap. Returns `(window, (cw, ch), nx, ny)`;
/// window 0 = no local crops (then `nx = ny = 0`).
pub fn step3p7_tiles(law: &Step3p7Law, w: u64, h: u64) -> (u64, (u64, u64), u64, u64) {
    let (short, long) = (h.min(w), h.max(w));
    let ratio = long as f64 / short as f64;
    let window = if long <= u64::from(law.image_size) {
        if ratio > STEP3P7_SMALL_CROP_RATIO {
            short
        } else {
            0
        }
    } else if ratio > STEP3P7_EXTREME_RATIO {
        short.min(u64::from(law.patch_size))
    } else {
        u64::from(law.patch_size)
    };
    if window == 0 {
        return (0, (w, h), 0, 0);
    }
    let snap = |dim: u64| -> u64 {
        if dim >= window {
            // `dim % win > 0.2·win` compares an int with a float.
            window
                * (dim / window
                    + u64::from((dim % window) as f64 > STEP3P7_SNAP_FRACTION * window as f64))
        } else {
            dim
        }
    };
    let (cw, ch) = (snap(w), snap(h));
    (window, (cw, ch), (cw / window).max(1), (ch / window).max(1))
}

/// step3p7 embedding rows: `(rows per local crop, rows of the global view)` =
/// `((patch_size // (vision_patch_size·downsampler_stride))², (image_size // …)²)`
/// (processing_step3p7.py:38-42: 81 and 169 at the vendor's 504 / 728).
pub fn step3p7_rows(law: &Step3p7Law) -> (u64, u64) {
    let stride = u64::from(law.vision_patch_size) * u64::from(law.downsampler_stride);
    (
        (u64::from(law.patch_size) / stride).pow(2),
        (u64::from(law.image_size) / stride).pow(2),
    )
}

/// step3p7 `_plan_patches`: extreme-aspect square pad, `int()` 3024 cap ([`step3p7_view`]), window
/// law and integer-modulo snap ([`step3p7_tiles`]).
pub fn step3p7_layout(law: &Step3p7Law, height: u32, width: u32) -> Result<Step3p7Layout> {
    let (w, h, extreme) = step3p7_view(law, height, width);
    if h.min(w) == 0 {
        return Err(unplannable(
            "Step3p7ImageProcessor",
            width,
            height,
            "ZeroDivisionError: capped short side is 0",
        ));
    }
    let (window, crop, nx, ny) = step3p7_tiles(law, w, h);
    if nx.saturating_mul(ny) > MAX_STEP3P7_CROPS {
        return Err(unplannable(
            "Step3p7ImageProcessor",
            width,
            height,
            format!(
                "{nx}x{ny} local crops of {window} pixels exceed the limit of {MAX_STEP3P7_CROPS}"
            ),
        ));
    }
    Ok(Step3p7Layout {
        global: (w, h),
        crop,
        window,
        nx,
        ny,
        square_pad: extreme,
    })
}
