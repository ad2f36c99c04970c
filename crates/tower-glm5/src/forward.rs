//! The GLM vision forward pass on the host (f32 values, f64 accumulation), built only from
//! `gpu_core::host` twins: the reference the CUDA path is checked against, and the path CI
//! runs against the upstream fixtures.

use crate::config::{GlmConfig, MERGER_LAYER_NORM_EPS};
use crate::error::{GlmError, Result};
use crate::weights::{GlmWeights, Linear};
use gpu_core::{host, rope_inv_freq, Activation, Clamp, Gate, RopeLayout};
pub use tower_core::GlmImage;

/// transformers glm vision attention `scaling = head_dim ** -0.5` (modeling_glm5_next.py,
/// `Glm5NextVisionAttention.__init__`; modeling_glm_ocr.py:350).
pub fn attention_scale(head_dim: usize) -> f32 {
    (1.0 / (head_dim as f64).sqrt()) as f32
}

/// Splits the processor's batch (`pixel_values [N, C·T·p²]`, `image_grid_thw [n, 3]`) into
/// images, checking that the rows add up.
pub fn split_images<'a>(
    cfg: &GlmConfig,
    pixel_values: &'a [f32],
    grid_thw: &[[usize; 3]],
) -> Result<Vec<GlmImage<'a>>> {
    let pd = cfg.patch_dim();
    let mut out = Vec::with_capacity(grid_thw.len());
    let mut start = 0usize;
    for (i, &g) in grid_thw.iter().enumerate() {
        let rows = grid_rows(g)
            .ok_or_else(|| GlmError::Input(format!("image {i}: grid_thw {g:?} overflows")))?;
        let end = rows
            .checked_mul(pd)
            .and_then(|n| n.checked_add(start))
            .filter(|&e| e <= pixel_values.len())
            .ok_or_else(|| {
                GlmError::Input(format!(
                    "image {i}: grid_thw {g:?} needs rows past the {} pixel values given",
                    pixel_values.len()
                ))
            })?;
        out.push(GlmImage {
            patches: &pixel_values[start..end],
            grid_thw: g,
        });
        start = end;
    }
    if start != pixel_values.len() {
        return Err(GlmError::Input(format!(
            "grid_thw accounts for {} of {} pixel values",
            start,
            pixel_values.len()
        )));
    }
    Ok(out)
}

/// `t·h·w`, or `None` on overflow.
fn grid_rows([t, h, w]: [usize; 3]) -> Option<usize> {
    t.checked_mul(h)?.checked_mul(w)
}

/// Activations at each stage, all images concatenated (for parity checks).
#[derive(Debug, Clone, Default)]
pub struct GlmStages {
    /// After the patch embedding `[N, H]`.
    pub patch_embed: Vec<f32>,
    /// After block 0 `[N, H]`.
    pub block_0: Vec<f32>,
    /// After every block `[N, H]`.
    pub blocks_out: Vec<f32>,
    /// After `post_layernorm` `[N, H]`.
    pub post_norm: Vec<f32>,
    /// After the 2×2 downsample conv `[N/4, O]`.
    pub downsample: Vec<f32>,
    /// Merger output, the LM's rows `[N/4, O]`.
    pub rows: Vec<f32>,
}

/// The rope positions of one grid entry, as (x = column w, y = row h) pairs per token, in the
/// processor's block-major order, repeated for every temporal patch
/// (transformers `vision_utils.get_vision_position_ids`, vision_utils.py:81-127).
pub fn vision_positions(grid_thw: [usize; 3], merge: usize) -> Vec<i32> {
    let [t, h, w] = grid_thw;
    let mut frame = Vec::with_capacity(2 * h * w);
    if merge == 0 {
        return frame;
    }
    for br in 0..h / merge {
        for bc in 0..w / merge {
            for ir in 0..merge {
                for ic in 0..merge {
                    frame.push((bc * merge + ic) as i32);
                    frame.push((br * merge + ir) as i32);
                }
            }
        }
    }
    frame.repeat(t)
}

/// The attention segments (`cu_seqlens`) of a batch: one per temporal patch of every entry,
/// `h·w` tokens each (transformers `vision_utils.get_vision_cu_seqlens` with
/// `merge_temporal=False`, the glm4v convention, vision_utils.py:42-65).
pub fn vision_cu_seqlens(grids: &[[usize; 3]]) -> Result<Vec<i32>> {
    let mut cu = vec![0i32];
    let mut total = 0i64;
    for &[t, h, w] in grids {
        let seg = i64::try_from(h.saturating_mul(w)).unwrap_or(i64::MAX);
        for _ in 0..t {
            total = total.saturating_add(seg);
            cu.push(i32::try_from(total).map_err(|_| {
                GlmError::Input(format!("{total} tokens exceed the i32 segment bound"))
            })?);
        }
    }
    Ok(cu)
}

/// The input checks both paths share; returns the image's token rows.
pub(crate) fn validate(cfg: &GlmConfig, img: &GlmImage<'_>, index: usize) -> Result<usize> {
    let rows = validate_shape(cfg, img, index)?;
    if !gpu_core::all_finite(img.patches) {
        return Err(non_finite(index));
    }
    Ok(rows)
}

/// The refusal of image `index` for a NaN or an infinity among its pixel values.
pub(crate) fn non_finite(index: usize) -> GlmError {
    GlmError::Input(format!("image {index}: non-finite pixel value"))
}

/// [`validate`] less the finiteness of the values (the CUDA path checks it while converting
/// them); returns the image's token rows.
pub(crate) fn validate_shape(cfg: &GlmConfig, img: &GlmImage<'_>, index: usize) -> Result<usize> {
    let bad = |m: String| GlmError::Input(format!("image {index}: {m}"));
    let [t, h, w] = img.grid_thw;
    if t == 0 || h == 0 || w == 0 {
        return Err(bad(format!("empty grid_thw {:?}", img.grid_thw)));
    }
    if !h.is_multiple_of(cfg.merge) || !w.is_multiple_of(cfg.merge) {
        return Err(bad(format!(
            "grid {h}×{w} is not a multiple of the spatial merge {}",
            cfg.merge
        )));
    }
    if h > i32::MAX as usize || w > i32::MAX as usize {
        return Err(bad(format!("grid {h}×{w} is too large")));
    }
    let rows = grid_rows(img.grid_thw).ok_or_else(|| bad("grid_thw overflows".into()))?;
    let pd = cfg.patch_dim();
    if rows.checked_mul(pd) != Some(img.patches.len()) {
        return Err(bad(format!(
            "{} pixel values are not grid_thw {:?} rows of {pd}",
            img.patches.len(),
            img.grid_thw
        )));
    }
    Ok(rows)
}

/// `W·x (+ b)` for dense rows.
fn linear(x: &[f32], l: &Linear) -> Vec<f32> {
    host::gemm(x, &l.w, l.b.as_deref(), x.len() / l.inp, l.out, l.inp)
}

/// The SwiGLU of a config: glm5_next `act(min(g, L))·clamp(u, −L, L)`
/// (modeling_glm5_next.py:1534-1540, :1557-1563); glm_ocr `act(g)·u` (modeling_glm_ocr.py:83, :473).
fn swiglu(cfg: &GlmConfig) -> Gate {
    match cfg.swiglu_limit {
        Some(l) => Gate {
            act: cfg.activation,
            gate_limit: l,
            gate: Clamp::NONE,
            up: Clamp::new(-l, l),
            out: Clamp::NONE,
        },
        None => Gate::plain(cfg.activation),
    }
}

/// Runs the tower on `images` (one attention segment per image frame) and returns each
/// image's rows in the LM width (`t·h·w/4` rows of `text_hidden` each), plus the stage
/// activations when `keep_stages`.
pub fn forward_host(
    cfg: &GlmConfig,
    w: &GlmWeights,
    images: &[GlmImage<'_>],
    keep_stages: bool,
) -> Result<(Vec<Vec<f32>>, Option<GlmStages>)> {
    let rows_per = images
        .iter()
        .enumerate()
        .map(|(i, img)| validate(cfg, img, i))
        .collect::<Result<Vec<_>>>()?;
    let mut stages = keep_stages.then(GlmStages::default);
    if images.is_empty() {
        return Ok((Vec::new(), stages));
    }
    let (h, hd, heads, o) = (cfg.hidden, cfg.head_dim, cfg.heads, cfg.text_hidden);
    let eps = cfg.eps as f32;
    let grids: Vec<[usize; 3]> = images.iter().map(|i| i.grid_thw).collect();
    let cu = vision_cu_seqlens(&grids)?;
    let mut pixels = Vec::with_capacity(images.iter().map(|i| i.patches.len()).sum());
    let mut pos = Vec::new();
    for img in images {
        pixels.extend_from_slice(img.patches);
        pos.extend(vision_positions(img.grid_thw, cfg.merge));
    }
    let n = pos.len() / 2;

    // Conv3d patch embedding (kernel = stride) ≡ a GEMM over the pixel rows, with bias.
    let mut x = linear(&pixels, &w.patch);
    if let Some(s) = stages.as_mut() {
        s.patch_embed = x.clone();
    }

    let inv_freq = rope_inv_freq(hd, cfg.rope_theta);
    let scale = attention_scale(hd);
    let gate = swiglu(cfg);
    let offsets = [0, h, 2 * h];
    for (li, b) in w.blocks.iter().enumerate() {
        // x += proj(attn(RMS(x)·norm1))
        let hn = host::rms_norm(&x, h, Some(&b.norm1), eps, Clamp::NONE);
        let mut qkv = linear(&hn, &b.qkv);
        // reshape (N, 3, nh, hd): q | k | v; per-head RMS·q_norm / RMS·k_norm before the rope;
        // NeoX over the full head with cos [h, w, h, w] (RopeLayout::Glm reads pos as (x, y)).
        host::qk_norm_rope(
            &mut qkv,
            n,
            heads,
            hd,
            3 * h,
            offsets,
            [Some(&b.q_norm), Some(&b.k_norm)],
            [true, true, false],
            eps,
            [Clamp::NONE; 3],
            Some((RopeLayout::Glm, &pos, &inv_freq)),
        );
        let attn = host::attention(&qkv, &qkv, &qkv, 3 * h, offsets, heads, hd, &cu, scale);
        let y = linear(&attn, &b.proj);
        host::residual_add(&mut x, &y, h, None, Clamp::NONE);
        // x += down(swiglu(gate(RMS(x)·norm2), up(…)))
        let hn = host::rms_norm(&x, h, Some(&b.norm2), eps, Clamp::NONE);
        let a = host::gated_act(&linear(&hn, &b.gate), &linear(&hn, &b.up), gate);
        let y = linear(&a, &b.down);
        host::residual_add(&mut x, &y, h, None, Clamp::NONE);
        if let (Some(s), 0) = (stages.as_mut(), li) {
            s.block_0 = x.clone();
        }
    }
    if let Some(s) = stages.as_mut() {
        s.blocks_out = x.clone();
    }

    let x = host::rms_norm(&x, h, Some(&w.post_norm), eps, Clamp::NONE);
    // view(−1, 2, 2, H).permute(0, 3, 1, 2) → Conv2d 2×2 stride 2 (modeling_glm5_next.py:1874-1880):
    // four consecutive tokens, gathered (c, ky, kx) to match the [O, H, 2, 2] weight's flattening.
    let gathered = host::block_gather_2x2(&x, n, h, None);
    let ds = linear(&gathered, &w.downsample);
    // Merger: proj → LayerNorm(eps 1e-5) → exact erf GELU (nn.GELU()) → SwiGLU → down.
    let m = linear(&ds, &w.merger_proj);
    let m = host::layer_norm(
        &m,
        o,
        Some(&w.merger_norm_w),
        Some(&w.merger_norm_b),
        MERGER_LAYER_NORM_EPS as f32,
    );
    let m = host::act(&m, Activation::GeluErf, Clamp::NONE, Clamp::NONE);
    let a = host::gated_act(&linear(&m, &w.merger_gate), &linear(&m, &w.merger_up), gate);
    let rows = linear(&a, &w.merger_down);
    if let Some(s) = stages.as_mut() {
        s.post_norm = x;
        s.downsample = ds;
        s.rows = rows.clone();
    }
    let unit = cfg.merge_unit();
    let mut out = Vec::with_capacity(images.len());
    let mut start = 0;
    for r in rows_per {
        let len = r / unit * o;
        out.push(rows[start..start + len].to_vec());
        start += len;
    }
    Ok((out, stages))
}
