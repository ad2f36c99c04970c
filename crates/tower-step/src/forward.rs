//! The Step-3.7 vision forward pass on the host (f32 values, f64 accumulation): the reference
//! the CUDA path is checked against, and the path CI runs against the upstream fixtures.
//!
//! transformers 5.23 `Step3p7VisionModel.forward` (modeling_step3p7.py:412-435) + the projector
//! and the per-image merge of `Step3p7Model.get_image_features` (:958-1001). Every view (crop
//! tile or global view, of every image) runs in one pass with its own attention segment, which
//! is what upstream's per-batch-row attention computes.

use crate::config::{StepConfig, NUM_CHANNELS};
use crate::error::{Result, StepError};
use crate::weights::StepWeights;
use gpu_core::{conv3x3s2_out, host, rope_inv_freq, Clamp};
use std::collections::BTreeMap;
pub use tower_core::{StepImage, StepView};

/// `Step3p7VisionAttention.scale = head_dim ** -0.5` (modeling_step3p7.py:199).
pub fn attention_scale(head_dim: usize) -> f32 {
    (1.0 / (head_dim as f64).sqrt()) as f32
}

/// What the Step-3.7 processor emits for a batch, as flat slices (upstream names).
#[derive(Debug, Clone, Copy)]
pub struct StepProcessorOutput<'a> {
    /// `pixel_values [B, 3, S, S]`: the global views.
    pub pixel_values: &'a [f32],
    /// `S`.
    pub side: usize,
    /// `pixel_values_local [ΣP, 3, C, C]`: every crop tile of the batch, image by image.
    pub pixel_values_local: &'a [f32],
    /// `C` (ignored when there is no tile).
    pub local_side: usize,
    /// `num_local_patches [B]`.
    pub num_local_patches: &'a [usize],
    /// `patch_newline_masks [B, maxP]` flattened, or none (then every flag is false).
    pub patch_newline_masks: Option<&'a [bool]>,
}

impl<'a> StepProcessorOutput<'a> {
    /// Splits the batch into one [`StepImage`] per image.
    pub fn images(&self) -> Result<Vec<StepImage<'a>>> {
        let bad = |m: String| StepError::Input(m);
        let b = self.num_local_patches.len();
        let view_len = |side: usize| {
            side.checked_mul(side)
                .and_then(|a| a.checked_mul(NUM_CHANNELS))
                .ok_or_else(|| bad(format!("view side {side} overflows")))
        };
        let g = view_len(self.side)?;
        if Some(self.pixel_values.len()) != b.checked_mul(g) {
            return Err(bad(format!(
                "pixel_values has {} values, not {b} views of 3×{s}×{s}",
                self.pixel_values.len(),
                s = self.side
            )));
        }
        let total = self
            .num_local_patches
            .iter()
            .try_fold(0usize, |a, &n| a.checked_add(n))
            .ok_or_else(|| bad("num_local_patches overflows".into()))?;
        let l = view_len(self.local_side)?;
        // An empty tile (side 0) would make any count "fit" the data: refuse it before the count
        // sizes an allocation.
        if total > 0 && l == 0 {
            return Err(bad(format!(
                "num_local_patches says {total} tiles but the tiles have no pixels"
            )));
        }
        if Some(self.pixel_values_local.len()) != total.checked_mul(l) {
            return Err(bad(format!(
                "pixel_values_local has {} values, not {total} tiles of 3×{c}×{c}",
                self.pixel_values_local.len(),
                c = self.local_side
            )));
        }
        let max_p = self.num_local_patches.iter().copied().max().unwrap_or(0);
        let masks = match self.patch_newline_masks {
            Some(m) if m.len() % b.max(1) == 0 && m.len() / b.max(1) >= max_p => Some(m),
            Some(m) => {
                return Err(bad(format!(
                    "patch_newline_masks has {} flags for {b} images of up to {max_p} tiles",
                    m.len()
                )))
            }
            None => None,
        };
        let stride = masks.map_or(0, |m| m.len() / b.max(1));
        let mut next = 0;
        let mut out = Vec::with_capacity(b);
        for (i, &np) in self.num_local_patches.iter().enumerate() {
            let crops = (next..next + np)
                .map(|t| StepView {
                    pixels: &self.pixel_values_local[t * l..(t + 1) * l],
                    height: self.local_side,
                    width: self.local_side,
                })
                .collect();
            next += np;
            out.push(StepImage {
                crops,
                global: StepView {
                    pixels: &self.pixel_values[i * g..(i + 1) * g],
                    height: self.side,
                    width: self.side,
                },
                newline_mask: masks
                    .map_or(vec![false; np], |m| m[i * stride..i * stride + np].to_vec()),
            });
        }
        Ok(out)
    }
}

/// One image's output rows in the LM width.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRows {
    /// `[n, text_hidden]`: every crop's rows in crop order, then the global view's rows.
    pub rows: Vec<f32>,
    /// Rows of each crop (81 at the release's 504-pixel tiles).
    pub crop_rows: Vec<usize>,
    /// Rows of the global view (169 at the release's 728-pixel view).
    pub global_rows: usize,
    /// The processor's newline mask, returned with the rows it belongs to.
    pub newline_mask: Vec<bool>,
}

/// The rows alone, in the LM width (the mask and the crop split dropped).
impl From<StepRows> for Vec<f32> {
    fn from(r: StepRows) -> Vec<f32> {
        r.rows
    }
}

/// Activations of one kind of view (the global views, or the crop tiles), views concatenated
/// in batch order, every tensor token-major in raster order.
#[derive(Debug, Clone, Default)]
pub struct ViewStages {
    /// Patch conv + position table `[Σg², H]`.
    pub patch_embed: Vec<f32>,
    /// After `pre_layernorm` `[Σg², H]`.
    pub pre_ln: Vec<f32>,
    /// After encoder layer 0 `[Σg², H]`.
    pub block_0: Vec<f32>,
    /// After every layer (no post-LN) `[Σg², H]`.
    pub blocks_out: Vec<f32>,
    /// After `downsampler1` `[Σg1², 2H]`.
    pub downsample1: Vec<f32>,
    /// After `downsampler2` `[Σg2², 4H]`.
    pub downsample2: Vec<f32>,
}

impl ViewStages {
    /// `(name, values)` for each stage, in forward order.
    pub fn named(&self) -> [(&'static str, &[f32]); 6] {
        [
            ("patch_embed", &self.patch_embed),
            ("pre_ln", &self.pre_ln),
            ("block_0", &self.block_0),
            ("blocks_out", &self.blocks_out),
            ("downsample1", &self.downsample1),
            ("downsample2", &self.downsample2),
        ]
    }
}

/// Activations at each stage (for parity checks against the fixtures' `global/…`, `local/…`).
#[derive(Debug, Clone, Default)]
pub struct StepStages {
    /// The global views (upstream's `pixel_values` batch).
    pub global: ViewStages,
    /// The crop tiles (upstream's `pixel_values_local` batch).
    pub local: ViewStages,
    /// Projector output `[Σn, text_hidden]`, per image crops first then global.
    pub rows: Vec<f32>,
}

/// A validated view: where it sits and its patch grid.
#[derive(Clone, Copy)]
pub(crate) struct Grid<'a> {
    pub(crate) view: StepView<'a>,
    /// The image (request) it belongs to.
    pub(crate) image: usize,
    /// A crop tile (else the global view).
    pub(crate) local: bool,
    /// Patch rows.
    pub(crate) gh: usize,
    /// Patch columns.
    pub(crate) gw: usize,
}

impl Grid<'_> {
    /// Whether the patch grid covers every pixel (each side a multiple of the patch size), so
    /// the patch rows read every value of the view.
    pub(crate) fn covers_every_pixel(&self, patch: usize) -> bool {
        self.gh * patch == self.view.height && self.gw * patch == self.view.width
    }

    /// The error for a NaN or an infinity among this view's values.
    pub(crate) fn non_finite(&self) -> StepError {
        view_error(self.image, self.local, "non-finite pixel value".into())
    }
}

/// The first of `grids` with a NaN or an infinity among its values (all of them, read whole).
pub(crate) fn first_non_finite<'g, 'a>(grids: &'g [Grid<'a>]) -> Option<&'g Grid<'a>> {
    grids.iter().find(|g| !gpu_core::all_finite(g.view.pixels))
}

/// An input error about one view of image `image` (a crop tile if `local`).
fn view_error(image: usize, local: bool, m: String) -> StepError {
    let what = if local { "crop" } else { "global view" };
    StepError::Input(format!("image {image} {what}: {m}"))
}

/// One view checked: its length and patch grid ([`validate_shape`]), then its values.
fn validate<'a>(
    cfg: &StepConfig,
    view: StepView<'a>,
    image: usize,
    local: bool,
) -> Result<Grid<'a>> {
    let g = validate_shape(cfg, view, image, local)?;
    if !gpu_core::all_finite(view.pixels) {
        return Err(g.non_finite());
    }
    Ok(g)
}

/// One view's length against its sides and its patch grid (at least one patch), not its values.
fn validate_shape<'a>(
    cfg: &StepConfig,
    view: StepView<'a>,
    image: usize,
    local: bool,
) -> Result<Grid<'a>> {
    let bad = |m: String| view_error(image, local, m);
    let len = view
        .height
        .checked_mul(view.width)
        .and_then(|a| a.checked_mul(NUM_CHANNELS));
    if len != Some(view.pixels.len()) {
        return Err(bad(format!(
            "{} values for 3×{}×{}",
            view.pixels.len(),
            view.height,
            view.width
        )));
    }
    // The patch conv (stride = kernel = p) keeps ⌊side/p⌋ patches per axis (modeling:405).
    let (gh, gw) = (view.height / cfg.patch, view.width / cfg.patch);
    if gh == 0 || gw == 0 {
        return Err(bad(format!(
            "{}×{} pixels is smaller than one {}-pixel patch",
            view.height, view.width, cfg.patch
        )));
    }
    Ok(Grid {
        view,
        image,
        local,
        gh,
        gw,
    })
}

/// Every view of `images` validated, in upstream order: per image its crops, then its global
/// view (the one input check of the host and CUDA paths).
pub(crate) fn validate_images<'a>(
    cfg: &StepConfig,
    images: &[StepImage<'a>],
) -> Result<Vec<Grid<'a>>> {
    walk_images(images, |view, i, local| validate(cfg, view, i, local))
}

/// [`validate_images`] that leaves the values of the views whose patch grid covers every pixel
/// unchecked: the caller checks them while it reads them (the CUDA path's patch rows, one pass
/// over the pixels instead of two), and reports the first such view in upstream order that holds
/// a non-finite value with [`Grid::non_finite`] — after any error this returns, which is the one
/// [`validate_images`] gives: on an error at a view, an earlier unchecked view with a non-finite
/// value is reported instead, as the full check would have met it first.
pub(crate) fn validate_images_deferring_values<'a>(
    cfg: &StepConfig,
    images: &[StepImage<'a>],
) -> Result<Vec<Grid<'a>>> {
    let mut unchecked: Vec<Grid<'a>> = Vec::new();
    let got = walk_images(images, |view, i, local| {
        let g = validate_shape(cfg, view, i, local)?;
        if g.covers_every_pixel(cfg.patch) {
            unchecked.push(g);
        } else if !gpu_core::all_finite(view.pixels) {
            return Err(g.non_finite());
        }
        Ok(g)
    });
    got.map_err(|e| first_non_finite(&unchecked).map_or(e, Grid::non_finite))
}

/// Every view of `images` through `check` in upstream order (per image its crops, then its global
/// view, then the image's newline flags checked against its crops).
fn walk_images<'a>(
    images: &[StepImage<'a>],
    mut check: impl FnMut(StepView<'a>, usize, bool) -> Result<Grid<'a>>,
) -> Result<Vec<Grid<'a>>> {
    let mut grids = Vec::new();
    for (i, img) in images.iter().enumerate() {
        for &c in &img.crops {
            grids.push(check(c, i, true)?);
        }
        grids.push(check(img.global, i, false)?);
        if img.newline_mask.len() != img.crops.len() {
            return Err(StepError::Input(format!(
                "image {i}: {} newline flags for {} crops",
                img.newline_mask.len(),
                img.crops.len()
            )));
        }
    }
    Ok(grids)
}

/// A view's rope positions: raster over its grid (`get_vision_position_ids`: (row, col)),
/// as (x = col, y = row) pairs, the order the rope kernels take.
pub(crate) fn grid_positions(gh: usize, gw: usize) -> impl Iterator<Item = i32> {
    (0..gh * gw).flat_map(move |i| [(i % gw) as i32, (i / gw) as i32])
}

/// The patch rows of one view, raster over patches, each row (c, ky, kx) like the conv weight.
pub(crate) fn patchify(g: &Grid<'_>, p: usize, out: &mut Vec<f32>) {
    let (h, w) = (g.view.height, g.view.width);
    for r in 0..g.gh {
        for col in 0..g.gw {
            for c in 0..NUM_CHANNELS {
                for ky in 0..p {
                    let start = c * h * w + (r * p + ky) * w + col * p;
                    out.extend_from_slice(&g.view.pixels[start..start + p]);
                }
            }
        }
    }
}

/// Runs the tower on `images` (one attention segment per view) and returns each image's rows in
/// the LM width (crops first, then the global view), plus the stage activations when
/// `keep_stages`.
pub fn forward_host(
    cfg: &StepConfig,
    w: &StepWeights,
    images: &[StepImage<'_>],
    keep_stages: bool,
) -> Result<(Vec<StepRows>, Option<StepStages>)> {
    let grids = validate_images(cfg, images)?;
    let (h, hd, heads, inner) = (cfg.hidden, cfg.head_dim, cfg.heads, cfg.intermediate);
    let eps = cfg.eps as f32;
    let pd = cfg.patch_dim();

    let mut pixels = Vec::new();
    let mut pos = Vec::new();
    let mut cu = vec![0i32];
    for g in &grids {
        patchify(g, cfg.patch, &mut pixels);
        pos.extend(grid_positions(g.gh, g.gw));
        let tokens = i32::try_from(pos.len() / 2)
            .map_err(|_| StepError::Input("more tokens than an i32 counts".into()))?;
        cu.push(tokens);
    }
    let n = pos.len() / 2;
    // Per-view stage slices are cut out of whole-pass tensors at these token offsets.
    let spans: Vec<(usize, usize)> = cu
        .windows(2)
        .map(|s| (s[0] as usize, s[1] as usize))
        .collect();

    // Patch conv (no bias) as a GEMM, then the learned table: as-is when the grid is the
    // table's, else bilinear (align_corners=False, no antialias) to the grid (modeling:301-327).
    let mut x = host::gemm(&pixels, &w.patch, None, n, h, pd);
    let t = cfg.pos_side;
    let mut tables: BTreeMap<(usize, usize), Vec<f32>> = BTreeMap::new();
    for (g, &(s0, s1)) in grids.iter().zip(&spans) {
        let table = tables.entry((g.gh, g.gw)).or_insert_with(|| {
            if (g.gh, g.gw) == (t, t) {
                w.pos.clone()
            } else {
                host::bilinear_resize(&w.pos, t, t, g.gh, g.gw, h)
            }
        });
        host::residual_add(&mut x[s0 * h..s1 * h], table, h, None, Clamp::NONE);
    }
    let mut stages = keep_stages.then(StepStages::default);
    let keep =
        |stages: &mut Option<StepStages>, sel: fn(&mut ViewStages) -> &mut Vec<f32>, x: &[f32]| {
            if let Some(s) = stages.as_mut() {
                for (g, &(s0, s1)) in grids.iter().zip(&spans) {
                    let v = if g.local { &mut s.local } else { &mut s.global };
                    sel(v).extend_from_slice(&x[s0 * h..s1 * h]);
                }
            }
        };
    keep(&mut stages, |v| &mut v.patch_embed, &x);

    x = host::layer_norm(&x, h, Some(&w.ln_pre_w), Some(&w.ln_pre_b), eps);
    keep(&mut stages, |v| &mut v.pre_ln, &x);

    let inv_freq = rope_inv_freq(hd, cfg.rope_theta);
    let rope = w.layout.rope();
    let offsets = [0, h, 2 * h];
    let scale = attention_scale(hd);
    for (li, layer) in w.layers.iter().enumerate() {
        // x += λ1 ⊙ out_proj(attn(LN1(x)))   (modeling_step3p7.py:257-268)
        let hn = host::layer_norm(&x, h, Some(&layer.ln1_w), Some(&layer.ln1_b), eps);
        let mut qkv = host::gemm(&hn, &layer.qkv_w, Some(&layer.qkv_b), n, 3 * h, h);
        host::qk_norm_rope(
            &mut qkv,
            n,
            heads,
            hd,
            3 * h,
            offsets,
            [None, None],
            [false; 3],
            eps,
            [Clamp::NONE; 3],
            Some((rope, &pos, &inv_freq)),
        );
        let attn = host::attention(&qkv, &qkv, &qkv, 3 * h, offsets, heads, hd, &cu, scale);
        let o = host::gemm(&attn, &layer.out_w, Some(&layer.out_b), n, h, h);
        host::residual_add(&mut x, &o, h, Some(&layer.ls1), Clamp::NONE);
        // x += λ2 ⊙ fc2(quick_gelu(fc1(LN2(x))))   (:270-275)
        let hn = host::layer_norm(&x, h, Some(&layer.ln2_w), Some(&layer.ln2_b), eps);
        let f = host::gemm(&hn, &layer.fc1_w, Some(&layer.fc1_b), n, inner, h);
        let a = host::act(&f, cfg.activation, Clamp::NONE, Clamp::NONE);
        let d = host::gemm(&a, &layer.fc2_w, Some(&layer.fc2_b), n, h, inner);
        host::residual_add(&mut x, &d, h, Some(&layer.ls2), Clamp::NONE);
        if li == 0 {
            keep(&mut stages, |v| &mut v.block_0, &x);
        }
    }
    keep(&mut stages, |v| &mut v.blocks_out, &x);

    // No post-LN; two 3×3 stride-2 pad-1 convs with bias, raster flatten, then the projector
    // (modeling_step3p7.py:430-434, :958-960).
    let mut per_view = Vec::with_capacity(grids.len());
    for (g, &(s0, s1)) in grids.iter().zip(&spans) {
        let (h1, w1) = (conv3x3s2_out(g.gh), conv3x3s2_out(g.gw));
        let (h2, w2) = (conv3x3s2_out(h1), conv3x3s2_out(w1));
        let col = host::im2col_3x3s2(&x[s0 * h..s1 * h], 1, g.gh, g.gw, h);
        let d1 = host::gemm(&col, &w.down1_w, Some(&w.down1_b), h1 * w1, 2 * h, 9 * h);
        let col = host::im2col_3x3s2(&d1, 1, h1, w1, 2 * h);
        let d2 = host::gemm(&col, &w.down2_w, Some(&w.down2_b), h2 * w2, 4 * h, 18 * h);
        let rows = host::gemm(
            &d2,
            &w.proj,
            w.proj_b.as_deref(),
            h2 * w2,
            cfg.text_hidden,
            cfg.out_width(),
        );
        if let Some(s) = stages.as_mut() {
            let v = if g.local { &mut s.local } else { &mut s.global };
            v.downsample1.extend_from_slice(&d1);
            v.downsample2.extend_from_slice(&d2);
        }
        per_view.push((g.image, g.local, h2 * w2, rows));
    }

    // Step3p7Model.get_image_features: per image the crops (in order), then the global view.
    let mut out: Vec<StepRows> = images
        .iter()
        .map(|img| StepRows {
            rows: Vec::new(),
            crop_rows: Vec::with_capacity(img.crops.len()),
            global_rows: 0,
            newline_mask: img.newline_mask.clone(),
        })
        .collect();
    for (image, local, count, rows) in per_view {
        if let Some(o) = out.get_mut(image) {
            if local {
                o.crop_rows.push(count);
            } else {
                o.global_rows = count;
            }
            o.rows.extend(rows);
        }
    }
    if let Some(s) = stages.as_mut() {
        for o in &out {
            s.rows.extend_from_slice(&o.rows);
        }
    }
    Ok((out, stages))
}
