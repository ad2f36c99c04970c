//! The Gemma-4 vision forward pass on the host (f32 values, f64 accumulation): the reference
//! the CUDA path is checked against, and the path CI runs against the upstream fixtures.

use crate::config::GemmaConfig;
use crate::error::{GemmaError, Result};
use crate::weights::{GemmaWeights, Linear};
use gpu_core::{host, rope_inv_freq, Clamp, Gate, RopeLayout};
use std::borrow::Cow;
pub use tower_core::GemmaImage;

/// transformers `Gemma4VisionAttention.scaling = 1.0`: q/k are RMS-normed per head instead.
pub const ATTENTION_SCALE: f32 = 1.0;

/// Activations at each stage, valid rows of all images concatenated (for parity checks).
#[derive(Debug, Clone, Default)]
pub struct GemmaStages {
    /// After patch projection + position tables `[ΣP, H]`.
    pub patch_embed: Vec<f32>,
    /// After encoder layer 0 `[ΣP, H]`.
    pub block_0: Vec<f32>,
    /// After every layer `[ΣP, H]`.
    pub blocks_out: Vec<f32>,
    /// After k×k pooling and ×√H `[Σn, H]`.
    pub pooled: Vec<f32>,
    /// After standardisation (equal to `pooled` when the config has none) `[Σn, H]`.
    pub standardized: Vec<f32>,
    /// Embedder output in the LM width `[Σn, text_hidden]`.
    pub rows: Vec<f32>,
}

/// A validated image: its patches, positions and grid (padding rows dropped).
pub(crate) struct Grid<'a> {
    /// Borrowed from the image when it has no padding rows (no copy of the batch's pixels per
    /// call); the valid rows copied out otherwise.
    pub(crate) patches: Cow<'a, [f32]>,
    pub(crate) positions: Vec<i32>,
    pub(crate) gw: usize,
    pub(crate) gh: usize,
}

/// The input checks both paths share: rows of 3·p², (x, y) positions that fit i32 and form the
/// full raster grid, a grid the pooling kernel and the position tables can take, finite pixels.
pub(crate) fn validate<'a>(
    cfg: &GemmaConfig,
    img: &GemmaImage<'a>,
    index: usize,
) -> Result<Grid<'a>> {
    let grid = validate_grid(cfg, img, index)?;
    if !gpu_core::all_finite(&grid.patches) {
        return Err(non_finite(index));
    }
    Ok(grid)
}

/// The refusal of image `index` for a NaN or an infinity among its pixel values.
pub(crate) fn non_finite(index: usize) -> GemmaError {
    GemmaError::Input(format!("image {index}: non-finite pixel value"))
}

/// [`validate`] but for the pixels' finiteness, which the CUDA path checks while it converts
/// them (one pass over the values instead of two).
pub(crate) fn validate_grid<'a>(
    cfg: &GemmaConfig,
    img: &GemmaImage<'a>,
    index: usize,
) -> Result<Grid<'a>> {
    let pd = cfg.patch_dim();
    let bad = |m: String| GemmaError::Input(format!("image {index}: {m}"));
    if !img.patches.len().is_multiple_of(pd) || img.positions.len() * pd != img.patches.len() * 2 {
        return Err(bad(format!(
            "{} patch values and {} position values do not make rows of {pd} with (x, y) each",
            img.patches.len(),
            img.positions.len()
        )));
    }
    let is_padding = |pos: &[i64]| pos[0] == -1 && pos[1] == -1;
    let padded = img.positions.chunks_exact(2).any(is_padding);
    let mut positions = Vec::with_capacity(img.positions.len());
    let mut kept = Vec::with_capacity(if padded { img.patches.len() } else { 0 });
    for (row, pos) in img
        .patches
        .chunks_exact(pd)
        .zip(img.positions.chunks_exact(2))
    {
        if is_padding(pos) {
            continue;
        }
        if padded {
            kept.extend_from_slice(row);
        }
        for &p in pos {
            positions.push(i32::try_from(p).map_err(|_| bad(format!("position {pos:?}")))?);
        }
    }
    let patches: Cow<'a, [f32]> = if padded {
        Cow::Owned(kept)
    } else {
        Cow::Borrowed(img.patches)
    };
    let n = positions.len() / 2;
    if n == 0 {
        return Err(bad("no patches".into()));
    }
    let gw = positions.chunks_exact(2).map(|p| p[0]).max().unwrap_or(0) as i64 + 1;
    let gh = positions.chunks_exact(2).map(|p| p[1]).max().unwrap_or(0) as i64 + 1;
    let (gw, gh) = (gw.max(1) as usize, gh.max(1) as usize);
    // The processor emits the full grid in raster order; the pooler's slot law assumes it.
    let raster = n == gw * gh
        && positions
            .chunks_exact(2)
            .enumerate()
            .all(|(i, p)| p[0] as usize == i % gw && p[1] as usize == i / gw && p[0] >= 0);
    if !raster {
        return Err(bad(format!(
            "positions are not the full {gw}×{gh} grid in raster order"
        )));
    }
    if gw % cfg.pool != 0 || gh % cfg.pool != 0 {
        return Err(bad(format!(
            "grid {gw}×{gh} is not a multiple of the pooling kernel {}",
            cfg.pool
        )));
    }
    if gw > cfg.pos_rows || gh > cfg.pos_rows {
        return Err(bad(format!(
            "grid {gw}×{gh} exceeds the position tables' {} rows",
            cfg.pos_rows
        )));
    }
    Ok(Grid {
        patches,
        positions,
        gw,
        gh,
    })
}

/// `clamp_out(W·clamp_in(x))` for dense rows.
fn linear(x: &[f32], l: &Linear) -> Vec<f32> {
    let rows = x.len() / l.inp;
    let clamped;
    let x = if l.clamp_in == Clamp::NONE {
        x
    } else {
        clamped = x.iter().map(|&v| l.clamp_in.apply(v)).collect::<Vec<_>>();
        &clamped
    };
    let mut y = host::gemm(x, &l.w, None, rows, l.out, l.inp);
    if l.clamp_out != Clamp::NONE {
        for v in &mut y {
            *v = l.clamp_out.apply(*v);
        }
    }
    y
}

/// Runs the tower on `images` (one attention segment each) and returns each image's rows in the
/// LM width, plus the stage activations when `keep_stages`.
pub fn forward_host(
    cfg: &GemmaConfig,
    w: &GemmaWeights,
    images: &[GemmaImage<'_>],
    keep_stages: bool,
) -> Result<(Vec<Vec<f32>>, Option<GemmaStages>)> {
    let grids = images
        .iter()
        .enumerate()
        .map(|(i, img)| validate(cfg, img, i))
        .collect::<Result<Vec<_>>>()?;
    let (h, pd, hd, heads) = (cfg.hidden, cfg.patch_dim(), cfg.head_dim, cfg.heads);
    let eps = cfg.eps as f32;
    let mut cu = vec![0i32];
    let mut pixels = Vec::new();
    let mut pos = Vec::new();
    for g in &grids {
        // transformers Gemma4VisionPatchEmbedder: input_proj(2·(pixel − 0.5)).
        pixels.extend(g.patches.iter().map(|v| 2.0 * (v - 0.5)));
        pos.extend_from_slice(&g.positions);
        let last = *cu.last().unwrap_or(&0);
        cu.push(last + (g.positions.len() / 2) as i32);
    }
    let n = pos.len() / 2;
    let mut stages = keep_stages.then(GemmaStages::default);

    let mut x = host::gemm(&pixels, &w.patch, None, n, h, pd);
    host::pos_add_xy(&mut x, h, &w.pos, cfg.pos_rows, &pos);
    if let Some(s) = stages.as_mut() {
        s.patch_embed = x.clone();
    }

    let inv_freq = rope_inv_freq(hd, cfg.rope_theta);
    let width = heads * hd;
    for (li, layer) in w.layers.iter().enumerate() {
        let hn = host::rms_norm(&x, h, Some(&layer.ln_in), eps, Clamp::NONE);
        let (q, k, v) = (
            linear(&hn, &layer.q),
            linear(&hn, &layer.k),
            linear(&hn, &layer.v),
        );
        let mut qkv = Vec::with_capacity(n * 3 * width);
        for t in 0..n {
            qkv.extend_from_slice(&q[t * width..(t + 1) * width]);
            qkv.extend_from_slice(&k[t * width..(t + 1) * width]);
            qkv.extend_from_slice(&v[t * width..(t + 1) * width]);
        }
        let offsets = [0, width, 2 * width];
        host::qk_norm_rope(
            &mut qkv,
            n,
            heads,
            hd,
            3 * width,
            offsets,
            [Some(&layer.q_norm), Some(&layer.k_norm)],
            [true, true, true],
            eps,
            [Clamp::NONE; 3],
            Some((RopeLayout::Gemma4, &pos, &inv_freq)),
        );
        let attn = host::attention(
            &qkv,
            &qkv,
            &qkv,
            3 * width,
            offsets,
            heads,
            hd,
            &cu,
            ATTENTION_SCALE,
        );
        let o = linear(&attn, &layer.o);
        host::residual_rms_add(
            &mut x,
            &o,
            h,
            Some(&layer.ln_post_attn),
            eps,
            Clamp::NONE,
            None,
        );
        let hn = host::rms_norm(&x, h, Some(&layer.ln_pre_ffn), eps, Clamp::NONE);
        let (g, u) = (linear(&hn, &layer.gate), linear(&hn, &layer.up));
        let a = host::gated_act(&g, &u, Gate::plain(cfg.activation));
        let d = linear(&a, &layer.down);
        host::residual_rms_add(
            &mut x,
            &d,
            h,
            Some(&layer.ln_post_ffn),
            eps,
            Clamp::NONE,
            None,
        );
        if let (Some(s), 0) = (stages.as_mut(), li) {
            s.block_0 = x.clone();
        }
    }
    if let Some(s) = stages.as_mut() {
        s.blocks_out = x.clone();
    }

    // transformers Gemma4VisionPooler: k×k average by position, then × sqrt(H) in f32.
    let root_h = (h as f64).sqrt() as f32;
    let mut rows_out = Vec::with_capacity(grids.len());
    let mut start = 0;
    for g in &grids {
        let p = g.gw * g.gh;
        let pooled = host::avg_pool(
            &x[start * h..(start + p) * h],
            g.gh,
            g.gw,
            cfg.pool,
            h,
            root_h,
        );
        start += p;
        let standardized = match &w.standardize {
            Some((bias, scale)) => pooled
                .chunks_exact(h)
                .flat_map(|r| r.iter().zip(bias).zip(scale).map(|((v, b), s)| (v - b) * s))
                .collect(),
            None => pooled.clone(),
        };
        // Gemma4MultimodalEmbedder: weightless RMSNorm, then the projection to the LM width.
        let normed = host::rms_norm(&standardized, h, None, eps, Clamp::NONE);
        let rows = host::gemm(&normed, &w.proj, None, normed.len() / h, cfg.text_hidden, h);
        if let Some(s) = stages.as_mut() {
            s.pooled.extend_from_slice(&pooled);
            s.standardized.extend_from_slice(&standardized);
            s.rows.extend_from_slice(&rows);
        }
        rows_out.push(rows);
    }
    Ok((rows_out, stages))
}
