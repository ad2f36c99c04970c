//! The Step-3.7 tower on a CUDA device: the same op sequence as [`crate::forward_host`], on
//! gpu-core's kernels and cuBLASLt GEMMs, for every view (crop tiles and global views) of many
//! images in one padding-free pass (one attention segment per view).
//!
//! **Architecture Invariant:** nothing is copied to the host inside [`StepCuda::run`]; only the
//! stages (when asked) and the final rows ([`StepCuda::rows`]) come back.
//!
//! Layout on the device:
//! - linear weights in bf16 ([`CudaPrecision::Bf16`], the product mode) or f32
//!   ([`CudaPrecision::F32`], the exactness mode: f32 GEMMs, rope, attention and activation);
//!   norms, the position tables and the residual stream in f32;
//! - LayerScale folded at upload (in f32, before any bf16 rounding): `λ ⊙ (a·Wᵀ + b)` =
//!   `a·(λ ⊙ W)ᵀ + λ ⊙ b`, so out_proj and c_proj accumulate straight into the f32 residual
//!   stream (`GemmShape::accumulate`, beta = 1): no add kernel, no LayerScale kernel, no `y` buffer;
//! - a GEMM whose output is in the GEMM precision (qkv, fc1, the two convolutions) takes its
//!   bias in that precision, one into f32 (out_proj, c_proj, the rows) an f32 bias;
//! - the patch rows and the patch weight get zero columns up to a multiple of 8 (588 → 592), so
//!   the bf16 GEMM's rows start 16-byte aligned;
//! - the position table for each grid size is resized (bilinear, align_corners = false) once and
//!   cached on the device; each view's table is copied into the patch-embedding buffer and the
//!   patch GEMM accumulates onto it;
//! - inside a batch the views are grouped by grid size (stable, first appearance first): the
//!   3×3 stride-2 convolutions then run once per grid size over all its views, as im2col + GEMM.
//!   bf16: gpu-core's `im2col_3x3s2` (columns (c, ky, kx), the checkpoint's weight as is); f32:
//!   strided copies with the weight's columns permuted to (ky, kx, c) at upload (gpu-core's
//!   im2col is bf16 only). Rows come back in upstream order ([`StepCuda::rows`]);
//! - bf16 mode: head dims the tensor-core attention kernels lack (they exist for 64, 72, 96; the
//!   fixtures' mini towers have 16) are zero-padded to the next one: zero q/k/v weight rows and
//!   biases, zero out_proj columns, so the padded lanes contribute exact zeros.
use std::sync::Arc;

use gpu_core::{
    bf16, conv3x3s2_out, head_groups, pad_head_cols, pad_head_rows, rope_inv_freq, ActElem,
    Activation, AttnArgs, Clamp, DeviceBuffer, DeviceInputs, Epilogue, GemmBias, GemmBuffer,
    GemmOutput, GemmShape, GraphKey, GraphStats, GraphStatus, Graphs, HostGemm, HostInputs,
    HostSource, InputBuffers, Mat, QkvSpec, Ran, RopeLayout, RopeSpec, RowsTarget, Stager,
    TensorStore, Uploader,
};
use rayon::prelude::*;

use crate::config::{StepConfig, NUM_CHANNELS};
use crate::error::StepError;
use crate::forward::{
    attention_scale, grid_positions, validate_images, Grid, StepImage, StepRows, StepStages,
    ViewStages,
};
use crate::weights::{Layer, StepWeights};

/// The device type, its error and the precision of the GEMMs, re-exported for callers of this path.
pub use gpu_core::{CudaPrecision, Device, GpuError};

/// Errors of the CUDA path.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The device or a kernel launch failed (includes [`GpuError::NoDevice`]).
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The tower refused its input or weights.
    #[error(transparent)]
    Step(#[from] StepError),
    /// A shape or mode the CUDA kernels cannot run (e.g. a head dim over 96 in bf16).
    #[error("unsupported on the CUDA path: {0}")]
    Unsupported(String),
}

/// Short for `Result<T, CudaError>`.
pub type CudaResult<T> = std::result::Result<T, CudaError>;

/// Taps of the downsamplers' 3×3 kernels (`Step3p7VisionModel.downsampler{1,2}`,
/// modeling_step3p7.py: `kernel_size=3, stride=2, padding=1`).
const CONV_TAPS: usize = 9;

/// One encoder layer on the device.
#[derive(Debug)]
struct DevLayer {
    ln1_w: DeviceBuffer<f32>,
    ln1_b: DeviceBuffer<f32>,
    /// q | k | v `[3·heads·kd, H]`, rows padded per head.
    qkv: GemmBuffer,
    qkv_b: GemmBuffer,
    /// `λ1 ⊙ out_proj` `[H, heads·kd]`, columns padded per head.
    out: GemmBuffer,
    /// `λ1 ⊙ out_proj.bias` (f32: the GEMM accumulates into the residual stream).
    out_b: DeviceBuffer<f32>,
    ln2_w: DeviceBuffer<f32>,
    ln2_b: DeviceBuffer<f32>,
    fc1: GemmBuffer,
    fc1_b: GemmBuffer,
    /// `λ2 ⊙ c_proj` `[H, I]`.
    fc2: GemmBuffer,
    /// `λ2 ⊙ c_proj.bias`.
    fc2_b: DeviceBuffer<f32>,
}

/// One view of a batch, in the batch's device order.
#[derive(Debug, Clone, Copy)]
struct DevView {
    image: usize,
    local: bool,
    gh: usize,
    gw: usize,
    /// First token.
    tok: usize,
    /// First row of the first downsampler's output (`[Σ h1·w1, 2H]`).
    r1: usize,
    /// First row of the second downsampler's output and of the rows (`[Σ h2·w2, ·]`).
    r2: usize,
}

impl DevView {
    fn tokens(&self) -> usize {
        self.gh * self.gw
    }
    fn n1(&self) -> usize {
        conv3x3s2_out(self.gh) * conv3x3s2_out(self.gw)
    }
    fn n2(&self) -> usize {
        conv3x3s2_out(conv3x3s2_out(self.gh)) * conv3x3s2_out(conv3x3s2_out(self.gw))
    }
}

/// Consecutive views (device order) of one grid size.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: usize,
    views: usize,
    gh: usize,
    gw: usize,
}

/// Where every view of a batch sits on the device: views grouped by grid size (stable, first
/// appearance first), so each grid size is one run of consecutive views.
#[derive(Debug, Clone)]
struct ViewPlan {
    /// Views in device order.
    views: Vec<DevView>,
    /// Index into the validated (upstream-order) views of each device slot.
    order: Vec<usize>,
    runs: Vec<Run>,
    /// Device slot of each view in upstream order (per image: crops, then the global view).
    upstream: Vec<usize>,
    /// Tokens, first- and second-downsampler rows of the whole batch.
    n: usize,
    n1: usize,
    n2: usize,
}

impl ViewPlan {
    fn new(grids: &[Grid<'_>]) -> CudaResult<ViewPlan> {
        let mut sizes: Vec<(usize, usize)> = Vec::new();
        for g in grids {
            if !sizes.contains(&(g.gh, g.gw)) {
                sizes.push((g.gh, g.gw));
            }
        }
        let order: Vec<usize> = sizes
            .iter()
            .flat_map(|&s| (0..grids.len()).filter(move |&i| (grids[i].gh, grids[i].gw) == s))
            .collect();
        let mut upstream = vec![0usize; grids.len()];
        let mut views: Vec<DevView> = Vec::with_capacity(grids.len());
        let mut runs: Vec<Run> = Vec::new();
        let (mut tok, mut r1, mut r2) = (0usize, 0usize, 0usize);
        for (slot, &i) in order.iter().enumerate() {
            let g = &grids[i];
            upstream[i] = slot;
            let v = DevView {
                image: g.image,
                local: g.local,
                gh: g.gh,
                gw: g.gw,
                tok,
                r1,
                r2,
            };
            tok += v.tokens();
            r1 += v.n1();
            r2 += v.n2();
            if i32::try_from(tok).is_err() {
                return Err(StepError::Input("more tokens than an i32 counts".into()).into());
            }
            match runs.last_mut() {
                Some(r) if (r.gh, r.gw) == (g.gh, g.gw) => r.views += 1,
                _ => runs.push(Run {
                    first: slot,
                    views: 1,
                    gh: g.gh,
                    gw: g.gw,
                }),
            }
            views.push(v);
        }
        Ok(ViewPlan {
            views,
            order,
            runs,
            upstream,
            n: tok,
            n1: r1,
            n2: r2,
        })
    }

    /// The attention segments, one per view in device order.
    fn cu_seqlens(&self) -> Vec<i32> {
        let mut cu = vec![0i32];
        // ViewPlan::new checked that the token count fits an i32.
        cu.extend(self.views.iter().map(|v| (v.tok + v.tokens()) as i32));
        cu
    }

    /// Rows `[n2, t]` in upstream order (as the projection writes them) split per image: its
    /// crops' rows, then the global view's.
    fn split_rows(&self, all: &[f32], t: usize, masks: &[Vec<bool>]) -> Vec<StepRows> {
        let mut out: Vec<StepRows> = masks
            .iter()
            .map(|m| StepRows {
                rows: Vec::new(),
                crop_rows: Vec::with_capacity(m.len()),
                global_rows: 0,
                newline_mask: m.clone(),
            })
            .collect();
        let mut start = 0;
        for &slot in &self.upstream {
            let v = &self.views[slot];
            let n2 = v.n2();
            if let Some(o) = out.get_mut(v.image) {
                if v.local {
                    o.crop_rows.push(n2);
                } else {
                    o.global_rows = n2;
                }
                o.rows.extend_from_slice(&all[start * t..(start + n2) * t]);
            }
            start += n2;
        }
        out
    }

    /// The projection's pieces in upstream order: `(first row in device order, rows, first row
    /// in the output)`, views that follow each other on both sides merged into one piece.
    fn out_pieces(&self) -> Vec<(usize, usize, usize)> {
        let mut pieces: Vec<(usize, usize, usize)> = Vec::new();
        let mut dst = 0;
        for &slot in &self.upstream {
            let v = &self.views[slot];
            let n2 = v.n2();
            match pieces.last_mut() {
                Some((src, rows, out)) if *src + *rows == v.r2 && *out + *rows == dst => {
                    *rows += n2
                }
                _ => pieces.push((v.r2, n2, dst)),
            }
            dst += n2;
        }
        pieces
    }

    /// Output rows of each of `images` images (crops and global view).
    fn rows_per_image(&self, images: usize) -> Vec<usize> {
        let mut rows = vec![0; images];
        for v in &self.views {
            if let Some(r) = rows.get_mut(v.image) {
                *r += v.n2();
            }
        }
        rows
    }
}

/// What a batch is, apart from its input values: where every view sits on the device, the
/// attention segments, each image's newline mask and the layout a CUDA graph is keyed by.
#[derive(Debug, Clone)]
struct BatchMeta {
    plan: ViewPlan,
    cu: Vec<i32>,
    /// Each image's newline mask, returned with its rows.
    masks: Vec<Vec<bool>>,
    key: GraphKey,
}

/// A batch of validated views prepared on the host ([`StepCuda::prepare_host`]): patch rows in
/// the GEMM precision, rope positions and attention segments, ready for [`StepCuda::stage`].
/// Building one needs no device, so it can run on another thread while the device works.
#[derive(Debug, Clone)]
pub struct StepHostBatch {
    meta: BatchMeta,
    inputs: HostInputs,
}

impl StepHostBatch {
    /// Patches (tokens) in the batch.
    pub fn tokens(&self) -> usize {
        self.meta.plan.n
    }
    /// Images (requests) in the batch.
    pub fn images(&self) -> usize {
        self.meta.masks.len()
    }
}

/// A batch of validated views on the device: pixels, rope positions, attention segments and
/// where each view's rows go.
#[derive(Debug)]
pub struct StepBatch {
    meta: BatchMeta,
    inputs: DeviceInputs,
}

impl StepBatch {
    /// Patches (tokens) in the batch.
    pub fn tokens(&self) -> usize {
        self.meta.plan.n
    }
    /// Views (crop tiles and global views) in the batch.
    pub fn views(&self) -> usize {
        self.meta.plan.views.len()
    }
    /// Images (requests) in the batch.
    pub fn images(&self) -> usize {
        self.meta.masks.len()
    }
    /// Output rows of the whole batch.
    pub fn output_rows(&self) -> usize {
        self.meta.plan.n2
    }
    /// The attention segments (one per view, device order), `[views + 1]`.
    pub fn cu_seqlens(&self) -> &[i32] {
        &self.meta.cu
    }
    /// The layout a CUDA graph of this batch is keyed by (views' grids in device order).
    pub fn graph_key(&self) -> &GraphKey {
        &self.meta.key
    }
}

/// Buffers sized for up to `cap` tokens, `cap1`/`cap2` downsampler rows.
#[derive(Debug)]
struct Workspace {
    /// The fixed input buffers every forward reads (patch rows, positions, segments).
    inp: InputBuffers,
    cap: usize,
    cap1: usize,
    cap2: usize,
    /// Widest first-downsampler output grid (f32 mode: the zero source's rows).
    capw: usize,
    /// Residual stream `[N, H]`.
    x: DeviceBuffer<f32>,
    /// Patch embedding + position table `[N, H]` (ln_pre's input).
    y: DeviceBuffer<f32>,
    /// Pre-norms `[N, H]`; bf16 mode: afterwards the blocks' output cast for the convolutions.
    hn: GemmBuffer,
    qkv: GemmBuffer,
    /// Attention output `[N, heads·kd]`; bf16 mode: afterwards a later grid size's conv input,
    /// moved to offset 0 (gpu-core's im2col reads from the start of its buffer).
    attn: GemmBuffer,
    /// fc1 output and its activation `[N, I]`.
    f: GemmBuffer,
    col1: GemmBuffer,
    d1: GemmBuffer,
    col2: GemmBuffer,
    d2: GemmBuffer,
    rows: DeviceBuffer<f32>,
    /// f32 mode: zeros for the convolutions' padding taps.
    zeros: Option<DeviceBuffer<f32>>,
}

/// The Step-3.7 tower's weights on a CUDA device, with the resized position tables and a
/// workspace kept between calls.
#[derive(Debug)]
pub struct StepCuda {
    dev: Arc<Device>,
    cfg: StepConfig,
    precision: CudaPrecision,
    /// Head dim the attention kernels run at (`head_dim`, or the next kernel size when padded).
    kd: usize,
    /// The norm + rope launches over (possibly padded) heads: `(column offset, heads)`.
    head_groups: Vec<(usize, usize)>,
    rope: RopeLayout,
    patch: GemmBuffer,
    /// The learned table `[side², H]`.
    pos: DeviceBuffer<f32>,
    /// Tables resized to other grids, computed once per grid size.
    tables: Vec<((usize, usize), DeviceBuffer<f32>)>,
    ln_pre_w: DeviceBuffer<f32>,
    ln_pre_b: DeviceBuffer<f32>,
    layers: Vec<DevLayer>,
    /// `[2H, 9H]`: bf16 columns (c, ky, kx); f32 columns (ky, kx, c).
    down1: GemmBuffer,
    down1_b: GemmBuffer,
    /// `[4H, 18H]`, columns as `down1`.
    down2: GemmBuffer,
    down2_b: GemmBuffer,
    proj: GemmBuffer,
    proj_b: Option<DeviceBuffer<f32>>,
    inv_freq: DeviceBuffer<f32>,
    weight_bytes: usize,
    ws: Option<Workspace>,
    /// CUDA graphs of the bf16 forward, per batch layout.
    graphs: Graphs,
    /// Asynchronous uploads of staged batches (created on the first [`StepCuda::stage`]).
    uploader: Option<Uploader>,
}

/// One layer's transformed tensors in host f32, as [`StepCuda::new`] uploads them; everything
/// else of the layer goes to the device straight from its store (the file's bytes).
struct HostLayer {
    /// q | k | v `[3·heads·kd, H]`, each third's rows padded per head; `None` when nothing is
    /// padded (the fused tensor is uploaded as the file has it).
    qkv: Option<Vec<f32>>,
    qkv_b: Vec<f32>,
    /// `λ1 ⊙ out_proj` with columns padded per head; `None` when nothing is padded (then it is
    /// uploaded as [`ScaledRows`] of the store).
    out: Option<Vec<f32>>,
    out_b: Vec<f32>,
    fc2_b: Vec<f32>,
    /// LayerScale of the attention and MLP branches.
    ls1: Vec<f32>,
    ls2: Vec<f32>,
}

impl HostLayer {
    fn new<T: TensorStore>(cfg: &StepConfig, l: &Layer<T>, kd: usize) -> HostLayer {
        let (h, heads, hd) = (cfg.hidden, cfg.heads, cfg.head_dim);
        let pad = |w: &[f32], inp: usize| -> Vec<f32> {
            let third = w.len() / 3;
            (0..3)
                .flat_map(|part| {
                    pad_head_rows(&w[part * third..(part + 1) * third], inp, heads, hd, kd)
                })
                .collect()
        };
        let (ls1, ls2) = (l.ls1.to_f32_vec(), l.ls2.to_f32_vec());
        HostLayer {
            qkv: (kd != hd).then(|| pad(&l.qkv_w.to_f32_vec(), h)),
            qkv_b: pad(&l.qkv_b.to_f32_vec(), 1),
            out: (kd != hd).then(|| {
                let scaled = scale_rows(&l.out_w.to_f32_vec(), &ls1, h);
                pad_head_cols(&scaled, h, heads, hd, kd)
            }),
            out_b: hadamard(&l.out_b.to_f32_vec(), &ls1),
            fc2_b: hadamard(&l.fc2_b.to_f32_vec(), &ls2),
            ls1,
            ls2,
        }
    }
}

/// Rows `cols` wide, each multiplied by its LayerScale entry in f32 as it is read (the fold
/// `λ ⊙ W` without a host copy of `W`; the same f32 products, rounded once, as [`scale_rows`]).
struct ScaledRows<'a> {
    src: &'a dyn HostSource,
    scale: &'a [f32],
    cols: usize,
}

impl HostSource for ScaledRows<'_> {
    fn len(&self) -> usize {
        self.src.len()
    }
    fn read_f32(&self, start: usize, out: &mut [f32]) {
        self.src.read_f32(start, out);
        for (i, v) in out.iter_mut().enumerate() {
            *v *= self.scale[(start + i) / self.cols];
        }
    }
}

/// The patch GEMM's inner width: `3·p²` rounded up to a multiple of 8 (588 → 592 at p = 14), so
/// every bf16 row starts 16-byte aligned; the extra columns are zeros in both operands.
fn patch_k(c: &StepConfig) -> usize {
    c.patch_dim().next_multiple_of(8)
}

/// Rows of width `cols` spread to width `cols.next_multiple_of(8)` with zero columns.
fn pad_cols(w: &[f32], cols: usize) -> Vec<f32> {
    let k = cols.next_multiple_of(8);
    if k == cols {
        return w.to_vec();
    }
    let mut out = vec![0.0f32; w.len() / cols * k];
    out.par_chunks_mut(k)
        .zip(w.par_chunks(cols))
        .for_each(|(dst, src)| dst[..cols].copy_from_slice(src));
    out
}

/// The patch rows of the views `order` picks from `grids`, each `k ≥ 3·p²` values wide (zero past
/// the patch) and converted by `conv`: patchify ([`patchify`]'s (c, ky, kx) order), the GEMM's
/// column padding and its precision in one pass, parallel over rows (it was three passes over the
/// batch, two of them serial).
fn patch_rows<T: Copy + Default + Send + Sync>(
    grids: &[Grid<'_>],
    order: &[usize],
    p: usize,
    k: usize,
    conv: impl Fn(f32) -> T + Sync,
) -> Vec<T> {
    // Each view of `order` with its first row.
    let mut starts = Vec::with_capacity(order.len());
    let mut rows = 0;
    for &i in order {
        starts.push((i, rows));
        rows += grids[i].gh * grids[i].gw;
    }
    let mut out = vec![T::default(); rows * k];
    out.par_chunks_mut(k).enumerate().for_each(|(row, dst)| {
        let (gi, first) = starts[starts.partition_point(|&(_, s)| s <= row) - 1];
        let g = &grids[gi];
        let (r, col) = ((row - first) / g.gw, (row - first) % g.gw);
        let (h, w) = (g.view.height, g.view.width);
        let mut at = 0;
        for c in 0..NUM_CHANNELS {
            for ky in 0..p {
                let start = c * h * w + (r * p + ky) * w + col * p;
                for (d, &x) in dst[at..at + p]
                    .iter_mut()
                    .zip(&g.view.pixels[start..start + p])
                {
                    *d = conv(x);
                }
                at += p;
            }
        }
    });
    out
}

/// `[rows, cols]` with row `r` scaled by `s[r]` (a LayerScale folded into the linear before it).
fn scale_rows(w: &[f32], s: &[f32], cols: usize) -> Vec<f32> {
    let mut out = w.to_vec();
    out.par_chunks_mut(cols)
        .zip(s.par_iter())
        .for_each(|(row, &g)| row.iter_mut().for_each(|v| *v *= g));
    out
}

fn hadamard(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x * y).collect()
}

/// A Conv2d weight `[O, C·taps]` with columns (c, t) as `[O, taps·C]` with columns (t, c).
fn taps_major(w: &[f32], c: usize, taps: usize) -> Vec<f32> {
    let inp = c * taps;
    let mut out = vec![0.0f32; w.len()];
    out.par_chunks_mut(inp)
        .zip(w.par_chunks(inp))
        .for_each(|(dst, src)| {
            for ch in 0..c {
                for t in 0..taps {
                    dst[t * c + ch] = src[ch * taps + t];
                }
            }
        });
    out
}

/// One strided copy of the f32 im2col: `rows` runs of `c` values, destination row stride
/// `9c`; the source is `Some((offset, row stride))` or `None` for zeros (a padding tap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ColCopy {
    rows: usize,
    src: Option<(usize, usize)>,
    dst: usize,
}

/// The copies that build the 3×3 stride-2 pad-1 im2col of `views` `[gh, gw, c]` grids (starting
/// at token `tok` of the source) as `[views·oh·ow, 9c]` rows with columns (ky, kx, c); every
/// element of those rows is written (padding taps from zeros). Rows of one copy are consecutive
/// output columns `ox`, whose source pixels are two tokens apart.
fn im2col_plan(views: usize, gh: usize, gw: usize, c: usize, tok: usize) -> Vec<ColCopy> {
    let (oh, ow) = (conv3x3s2_out(gh), conv3x3s2_out(gw));
    let mut plan = Vec::new();
    let row_w = CONV_TAPS * c;
    for v in 0..views {
        for oy in 0..oh {
            let out_row = (v * oh + oy) * ow;
            for ky in 0..3 {
                let iy = (2 * oy + ky).checked_sub(1).filter(|&iy| iy < gh);
                for kx in 0..3 {
                    let at = |ox: usize| (out_row + ox) * row_w + (ky * 3 + kx) * c;
                    // valid ox: 0 ≤ 2·ox + kx − 1 < gw
                    let lo = usize::from(kx == 0);
                    let hi = ((gw + 1).saturating_sub(kx)).div_ceil(2).min(ow);
                    let Some(iy) = iy.filter(|_| lo < hi) else {
                        plan.push(ColCopy {
                            rows: ow,
                            src: None,
                            dst: at(0),
                        });
                        continue;
                    };
                    if lo > 0 {
                        plan.push(ColCopy {
                            rows: lo,
                            src: None,
                            dst: at(0),
                        });
                    }
                    let src_tok = tok + v * gh * gw + iy * gw + 2 * lo + kx - 1;
                    plan.push(ColCopy {
                        rows: hi - lo,
                        src: Some((src_tok * c, 2 * c)),
                        dst: at(lo),
                    });
                    if hi < ow {
                        plan.push(ColCopy {
                            rows: ow - hi,
                            src: None,
                            dst: at(hi),
                        });
                    }
                }
            }
        }
    }
    plan
}

impl StepCuda {
    /// Uploads `w` once (see the module docs for the layout). Tensors the layout keeps as the
    /// file has them go from their store (host f32, or the memory-mapped file's bytes) straight
    /// into page-locked staging in the GEMM precision, chunk by chunk; the ones it transforms
    /// (LayerScale folds, head padding, conv columns) are built in f32 one at a time.
    pub fn new<T: TensorStore>(
        dev: Arc<Device>,
        cfg: &StepConfig,
        w: &StepWeights<T>,
        precision: CudaPrecision,
    ) -> CudaResult<StepCuda> {
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let kd = precision
            .attention_head_dim(hd)
            .map_err(|e| CudaError::Unsupported(e.to_string()))?;
        if w.layers.len() != cfg.layers {
            return Err(CudaError::Unsupported(format!(
                "{} layers for a config of {}",
                w.layers.len(),
                cfg.layers
            )));
        }
        let p = precision;
        let d = &*dev;
        let mut st = Stager::new(d)?;
        let small = |t: &T| -> CudaResult<DeviceBuffer<f32>> { Ok(d.upload(&t.to_f32_vec())?) };
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let hl = HostLayer::new(cfg, l, kd);
            let qkv = match &hl.qkv {
                Some(padded) => st.upload_gemm(d, p, padded)?,
                None => st.upload_gemm(d, p, &l.qkv_w)?,
            };
            layers.push(DevLayer {
                ln1_w: small(&l.ln1_w)?,
                ln1_b: small(&l.ln1_b)?,
                qkv,
                qkv_b: st.upload_gemm(d, p, &hl.qkv_b)?,
                out: match &hl.out {
                    Some(padded) => st.upload_gemm(d, p, padded)?,
                    None => {
                        let src = ScaledRows {
                            src: &l.out_w,
                            scale: &hl.ls1,
                            cols: h,
                        };
                        st.upload_gemm(d, p, &src)?
                    }
                },
                out_b: d.upload(&hl.out_b)?,
                ln2_w: small(&l.ln2_w)?,
                ln2_b: small(&l.ln2_b)?,
                fc1: st.upload_gemm(d, p, &l.fc1_w)?,
                fc1_b: st.upload_gemm(d, p, &l.fc1_b)?,
                fc2: st.upload_gemm(
                    d,
                    p,
                    &ScaledRows {
                        src: &l.fc2_w,
                        scale: &hl.ls2,
                        cols: cfg.intermediate,
                    },
                )?,
                fc2_b: d.upload(&hl.fc2_b)?,
            });
        }
        let mut conv = |wt: &T, c: usize| -> CudaResult<GemmBuffer> {
            Ok(match p {
                CudaPrecision::Bf16 => st.upload_gemm(d, p, wt)?,
                CudaPrecision::F32 => {
                    st.upload_gemm(d, p, &taps_major(&wt.to_f32_vec(), c, CONV_TAPS))?
                }
            })
        };
        let (down1, down2) = (conv(&w.down1_w, h)?, conv(&w.down2_w, 2 * h)?);
        let mut t = StepCuda {
            cfg: cfg.clone(),
            precision,
            kd,
            head_groups: head_groups(cfg.heads, hd, kd),
            rope: w.layout.rope(),
            patch: st.upload_gemm(d, p, &pad_cols(&w.patch.to_f32_vec(), cfg.patch_dim()))?,
            pos: small(&w.pos)?,
            tables: Vec::new(),
            ln_pre_w: small(&w.ln_pre_w)?,
            ln_pre_b: small(&w.ln_pre_b)?,
            layers,
            down1,
            down1_b: st.upload_gemm(d, p, &w.down1_b)?,
            down2,
            down2_b: st.upload_gemm(d, p, &w.down2_b)?,
            proj: st.upload_gemm(d, p, &w.proj)?,
            proj_b: w.proj_b.as_ref().map(small).transpose()?,
            inv_freq: d.upload(&rope_inv_freq(hd, cfg.rope_theta))?,
            weight_bytes: 0,
            ws: None,
            graphs: Graphs::default(),
            uploader: None,
            dev: dev.clone(),
        };
        t.weight_bytes = t.count_weight_bytes();
        t.dev.synchronize()?;
        drop(st);
        Ok(t)
    }

    /// Loads the tower from `ck` as views of the memory-mapped file and uploads it in
    /// `precision`: the model is never held in f32 on the host ([`crate::load_mapped`]).
    pub fn from_checkpoint(
        dev: Arc<Device>,
        ck: &st_reader::Checkpoint,
        precision: CudaPrecision,
    ) -> CudaResult<StepCuda> {
        let config = ck
            .config()
            .ok_or_else(|| StepError::Config("the checkpoint has no config.json".into()))?;
        let (cfg, w) = crate::load_mapped(ck, config)?;
        StepCuda::new(dev, &cfg, &w, precision)
    }

    fn count_weight_bytes(&self) -> usize {
        let f = |b: &DeviceBuffer<f32>| 4 * b.len();
        let mut n = self.patch.bytes() + f(&self.pos) + f(&self.ln_pre_w) + f(&self.ln_pre_b);
        n += self.down1.bytes() + self.down1_b.bytes() + self.down2.bytes();
        n += self.down2_b.bytes() + self.proj.bytes() + self.proj_b.as_ref().map_or(0, f);
        n += f(&self.inv_freq);
        for l in &self.layers {
            n += f(&l.ln1_w) + f(&l.ln1_b) + f(&l.ln2_w) + f(&l.ln2_b);
            n += l.qkv.bytes() + l.qkv_b.bytes() + l.out.bytes() + f(&l.out_b);
            n += l.fc1.bytes() + l.fc1_b.bytes() + l.fc2.bytes() + f(&l.fc2_b);
        }
        n
    }

    /// Bytes of the model's tensors on the device (without the resized tables and workspace).
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The device this tower runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The precision the weights were uploaded in.
    pub fn precision(&self) -> CudaPrecision {
        self.precision
    }

    /// Dimensions and laws.
    pub fn config(&self) -> &StepConfig {
        &self.cfg
    }

    /// Validates `images` (the host path's checks) and uploads every view's patch rows, rope
    /// positions and attention segment, views grouped by grid size (see the module docs).
    pub fn prepare(&self, images: &[StepImage<'_>]) -> CudaResult<StepBatch> {
        let host = StepCuda::prepare_host(&self.cfg, self.precision, images)?;
        Ok(StepBatch {
            inputs: self.dev.upload_inputs(&host.inputs)?,
            meta: host.meta,
        })
    }

    /// The host half of [`StepCuda::prepare`] for a tower of `cfg` in `precision`: validation,
    /// patch rows (in the GEMM precision), positions and segments, with no device involved.
    pub fn prepare_host(
        cfg: &StepConfig,
        precision: CudaPrecision,
        images: &[StepImage<'_>],
    ) -> CudaResult<StepHostBatch> {
        let grids = validate_images(cfg, images)?;
        if grids.is_empty() {
            return Err(StepError::Input("no images".into()).into());
        }
        let plan = ViewPlan::new(&grids)?;
        let mut pos = Vec::new();
        for &i in &plan.order {
            pos.extend(grid_positions(grids[i].gh, grids[i].gw));
        }
        let k = cfg.patch_dim().next_multiple_of(8);
        let rows = match precision {
            CudaPrecision::Bf16 => HostGemm::Bf16(patch_rows(
                &grids,
                &plan.order,
                cfg.patch,
                k,
                bf16::from_f32,
            )),
            CudaPrecision::F32 => {
                HostGemm::F32(patch_rows(&grids, &plan.order, cfg.patch, k, |x| x))
            }
        };
        let cu = plan.cu_seqlens();
        let key = GraphKey {
            precision,
            layout: plan.views.iter().flat_map(|v| [v.gh, v.gw]).collect(),
        };
        Ok(StepHostBatch {
            inputs: HostInputs {
                rows,
                pos,
                cu: cu.clone(),
            },
            meta: BatchMeta {
                cu,
                plan,
                masks: images.iter().map(|i| i.newline_mask.clone()).collect(),
                key,
            },
        })
    }

    /// Queues the upload of a host-prepared batch from page-locked memory on a copy stream of
    /// its own and returns at once: the copy overlaps whatever the device is running. The batch
    /// stays valid until two more are staged ([`gpu_core::UPLOAD_SLOTS`]).
    pub fn stage(&mut self, host: StepHostBatch) -> CudaResult<StepBatch> {
        Ok(StepBatch {
            inputs: Uploader::stage_into(
                &mut self.uploader,
                &self.dev,
                self.precision,
                &host.inputs,
            )?,
            meta: host.meta,
        })
    }

    /// Turns CUDA graphs of the bf16 forward on (the default) or off (every forward eager).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set_enabled(on);
    }

    /// Whether CUDA graphs are used and, if a capture failed, why not.
    pub fn graph_status(&self) -> &GraphStatus {
        self.graphs.status()
    }

    /// What the graph cache did so far (captures, replays, eager forwards).
    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.stats()
    }

    /// Resizes the position table to every grid of `batch` not seen before (once per size).
    fn ensure_tables(&mut self, batch: &StepBatch) -> CudaResult<()> {
        let (t, h) = (self.cfg.pos_side, self.cfg.hidden);
        for r in &batch.meta.plan.runs {
            let key = (r.gh, r.gw);
            if key == (t, t) || self.tables.iter().any(|(k, _)| *k == key) {
                continue;
            }
            let mut out = self.dev.alloc::<f32>(r.gh * r.gw * h)?;
            self.dev
                .bilinear_resize(&self.pos, t, t, &mut out, r.gh, r.gw, h)?;
            self.tables.push((key, out));
        }
        Ok(())
    }

    fn table(&self, gh: usize, gw: usize) -> CudaResult<&DeviceBuffer<f32>> {
        let t = self.cfg.pos_side;
        if (gh, gw) == (t, t) {
            return Ok(&self.pos);
        }
        self.tables
            .iter()
            .find(|(k, _)| *k == (gh, gw))
            .map(|(_, b)| b)
            .ok_or_else(|| CudaError::Unsupported(format!("no position table for {gh}×{gw}")))
    }

    fn ensure_workspace(&mut self, b: &ViewPlan) -> CudaResult<()> {
        let capw = b
            .views
            .iter()
            .map(|v| conv3x3s2_out(v.gw))
            .max()
            .unwrap_or(1);
        if let Some(ws) = &self.ws {
            if ws.cap >= b.n && ws.cap1 >= b.n1 && ws.cap2 >= b.n2 && ws.capw >= capw {
                return Ok(());
            }
        }
        let (cap, cap1, cap2, capw) = match &self.ws {
            Some(ws) => (
                ws.cap.max(b.n),
                ws.cap1.max(b.n1),
                ws.cap2.max(b.n2),
                ws.capw.max(capw),
            ),
            None => (b.n, b.n1, b.n2, capw),
        };
        self.ws = None; // free the old one first
        self.graphs.invalidate(); // the graphs address the old buffers
        let c = &self.cfg;
        let (h, wp, i) = (c.hidden, c.heads * self.kd, c.intermediate);
        let d = &*self.dev;
        let p = self.precision;
        self.ws = Some(Workspace {
            inp: InputBuffers::alloc(d, p, cap * patch_k(c), 2 * cap, cap + 1)?,
            cap,
            cap1,
            cap2,
            capw,
            x: d.alloc(cap * h)?,
            y: d.alloc(cap * h)?,
            hn: GemmBuffer::alloc(d, p, cap * h)?,
            qkv: GemmBuffer::alloc(d, p, cap * 3 * wp)?,
            attn: GemmBuffer::alloc(d, p, cap * wp)?,
            f: GemmBuffer::alloc(d, p, cap * i)?,
            col1: GemmBuffer::alloc(d, p, cap1 * CONV_TAPS * h)?,
            d1: GemmBuffer::alloc(d, p, cap1 * 2 * h)?,
            col2: GemmBuffer::alloc(d, p, cap2 * CONV_TAPS * 2 * h)?,
            d2: GemmBuffer::alloc(d, p, cap2 * c.out_width())?,
            rows: d.alloc(cap2 * c.text_hidden)?,
            zeros: match p {
                CudaPrecision::F32 => Some(d.alloc_zeros(capw * 2 * h)?),
                CudaPrecision::Bf16 => None,
            },
        });
        Ok(())
    }

    /// Runs the whole forward on `batch` on the device; the rows stay there ([`StepCuda::rows`]).
    /// With `keep_stages` the stage activations are downloaded as they are produced.
    ///
    /// The inputs are first copied into fixed device buffers (a staged batch's after its upload
    /// finished, on the device); then in bf16 mode without stages the forward goes through the
    /// CUDA graph cache ([`gpu_core::Graphs`]: eager the first time a layout is seen, captured
    /// the second, replayed after), else it runs eagerly.
    pub fn run(&mut self, batch: &StepBatch, keep_stages: bool) -> CudaResult<Option<StepStages>> {
        self.run_graphed(batch, keep_stages).map(|(s, _)| s)
    }

    /// [`StepCuda::run`], also saying how the forward ran.
    pub fn run_graphed(
        &mut self,
        batch: &StepBatch,
        keep_stages: bool,
    ) -> CudaResult<(Option<StepStages>, Ran)> {
        self.with_workspace(batch, |t, ws| t.run_ws(ws, batch, keep_stages, None))
    }

    /// Runs the forward on `batch` and writes its rows, `[n2, text_hidden]` image after image
    /// (each image's crops, then its global view: upstream order), into `out` (a caller's or
    /// library-owned buffer, f32 or bf16) instead of the workspace: the projector writes there
    /// directly, after the (graphed) rest of the tower. Queued on the device's stream; returns
    /// how the tower ran.
    pub fn run_into(&mut self, batch: &StepBatch, out: RowsTarget<'_>) -> CudaResult<Ran> {
        let need = batch.meta.plan.n2 * self.cfg.text_hidden;
        if out.len() != need {
            return Err(CudaError::Unsupported(format!(
                "a rows target of {} elements for {} rows of {}",
                out.len(),
                batch.meta.plan.n2,
                self.cfg.text_hidden
            )));
        }
        self.with_workspace(batch, |t, ws| t.run_ws(ws, batch, false, Some(out)))
            .map(|(_, ran)| ran)
    }

    /// Calls `f` with the position tables and the workspace grown for `batch` first.
    fn with_workspace<R>(
        &mut self,
        batch: &StepBatch,
        f: impl FnOnce(&mut Self, &mut Workspace) -> CudaResult<R>,
    ) -> CudaResult<R> {
        self.ensure_tables(batch)?;
        self.ensure_workspace(&batch.meta.plan)?;
        let mut ws = self
            .ws
            .take()
            .ok_or_else(|| CudaError::Unsupported("workspace missing after allocation".into()))?;
        let r = f(self, &mut ws);
        self.ws = Some(ws);
        r
    }

    /// The forward on `ws`: everything up to the projector (graphed in bf16 without stages),
    /// then the projector into `out` (the workspace's rows when `None`), outside any graph since
    /// `out` changes from call to call.
    fn run_ws(
        &mut self,
        ws: &mut Workspace,
        batch: &StepBatch,
        keep: bool,
        out: Option<RowsTarget<'_>>,
    ) -> CudaResult<(Option<StepStages>, Ran)> {
        self.dev
            .load_inputs(&batch.inputs, self.uploader.as_ref(), &mut ws.inp)?;
        let (host, ran) = if keep || self.precision != CudaPrecision::Bf16 {
            (self.run_in(ws, batch, keep)?, Ran::Eager)
        } else {
            let mut graphs = std::mem::take(&mut self.graphs);
            let dev = self.dev.clone();
            let r = graphs.run(&*dev, &batch.meta.key, || {
                self.run_in(ws, batch, false).map(|_| ())
            });
            self.graphs = graphs;
            (None, r?)
        };
        self.project(ws, &batch.meta.plan, out)?;
        let Some(s) = host else {
            return Ok((None, ran));
        };
        let rows = self
            .dev
            .download_prefix(&ws.rows, batch.meta.plan.n2 * self.cfg.text_hidden)?;
        let h = self.cfg.hidden;
        Ok((Some(s.assemble(&batch.meta.plan, h, rows)), ran))
    }

    /// The projector (modeling_step3p7.py:958-960) from the device-order downsampler rows to
    /// the LM width, written in upstream order (per image: crops, then global) into `out` or
    /// the workspace's rows: one GEMM per piece of views contiguous on both sides.
    fn project(
        &self,
        ws: &mut Workspace,
        plan: &ViewPlan,
        mut out: Option<RowsTarget<'_>>,
    ) -> CudaResult<()> {
        let c = &self.cfg;
        let (t, w) = (c.text_hidden, c.out_width());
        for (src, rows, dst) in plan.out_pieces() {
            let y = match out.as_mut() {
                Some(target) => GemmOutput::Rows(target.reborrow()),
                None => GemmOutput::F32(&mut ws.rows),
            };
            self.dev.gemm(
                GemmBuffer::inputs(&ws.d2, &self.proj)?,
                self.proj_b.as_ref().map(GemmBias::F32),
                y,
                GemmShape {
                    x_offset: src * w,
                    y_offset: dst * t,
                    ..GemmShape::dense(rows, t, w)
                },
                Epilogue::None,
            )?;
        }
        Ok(())
    }

    /// Downloads the rows of the last [`StepCuda::run`] on `batch`: per image its crops' rows in
    /// crop order, then the global view's (upstream order), with the newline mask.
    pub fn rows(&self, batch: &StepBatch) -> CudaResult<Vec<StepRows>> {
        let ws = self
            .ws
            .as_ref()
            .ok_or_else(|| CudaError::Unsupported("rows() before run()".into()))?;
        let t = self.cfg.text_hidden;
        let all = self.dev.download_prefix(&ws.rows, batch.meta.plan.n2 * t)?;
        Ok(batch.meta.plan.split_rows(&all, t, &batch.meta.masks))
    }

    /// [`StepCuda::prepare`], [`StepCuda::run`] and [`StepCuda::rows`] in one call.
    pub fn encode(
        &mut self,
        images: &[StepImage<'_>],
        keep_stages: bool,
    ) -> CudaResult<(Vec<StepRows>, Option<StepStages>)> {
        let batch = self.prepare(images)?;
        let stages = self.run(&batch, keep_stages)?;
        Ok((self.rows(&batch)?, stages))
    }

    fn run_in(
        &self,
        ws: &mut Workspace,
        batch: &StepBatch,
        keep: bool,
    ) -> CudaResult<Option<HostStages>> {
        let (c, b) = (&self.cfg, &batch.meta.plan);
        let d = &*self.dev;
        let (n, h, wp, inner) = (b.n, c.hidden, c.heads * self.kd, c.intermediate);
        let eps = c.eps as f32;
        let hm = Mat::dense(n, h);
        let acc = |m, nn, k| GemmShape {
            accumulate: true,
            ..GemmShape::dense(m, nn, k)
        };
        let mut host = keep.then(HostStages::default);

        // Each view's position table (as is, or bilinear to its grid), then the patch conv (no
        // bias) accumulated onto it: embeddings + pos (modeling_step3p7.py:329-339).
        for v in &b.views {
            let rows = v.tokens();
            d.act(
                &mut ws.y,
                Mat::strided(rows, h, h, v.tok * h),
                self.table(v.gh, v.gw)?,
                Mat::dense(rows, h),
                Activation::Identity,
                Clamp::NONE,
                Clamp::NONE,
            )?;
        }
        d.gemm(
            GemmBuffer::inputs(&ws.inp.rows, &self.patch)?,
            None,
            GemmOutput::F32(&mut ws.y),
            acc(n, h, patch_k(c)),
            Epilogue::None,
        )?;
        if let Some(s) = host.as_mut() {
            s.patch_embed = self.dev.download_prefix(&ws.y, n * h)?;
        }
        d.layer_norm(
            &ws.y,
            hm,
            Some(&self.ln_pre_w),
            Some(&self.ln_pre_b),
            &mut ws.x,
            hm,
            eps,
        )?;
        if let Some(s) = host.as_mut() {
            s.pre_ln = self.dev.download_prefix(&ws.x, n * h)?;
        }

        let rope = RopeSpec {
            layout: self.rope,
            pos: &ws.inp.pos,
            inv_freq: &self.inv_freq,
        };
        for (li, l) in self.layers.iter().enumerate() {
            // x += λ1 ⊙ out_proj(attn(LN1(x)))   (λ1 folded into out_proj)
            d.layer_norm_mixed(
                &ws.x,
                hm,
                Some(&l.ln1_w),
                Some(&l.ln1_b),
                &mut ws.hn,
                hm,
                eps,
            )?;
            d.gemm(
                GemmBuffer::inputs(&ws.hn, &l.qkv)?,
                Some(l.qkv_b.bias()),
                ws.qkv.out(),
                GemmShape::dense(n, 3 * wp, h),
                Epilogue::None,
            )?;
            match (&mut ws.qkv, &mut ws.attn) {
                (GemmBuffer::Bf16(qkv), GemmBuffer::Bf16(attn)) => {
                    self.attention_core(qkv, attn, (&ws.inp.cu, &batch.meta.cu), &rope)?
                }
                (GemmBuffer::F32(qkv), GemmBuffer::F32(attn)) => {
                    self.attention_core(qkv, attn, (&ws.inp.cu, &batch.meta.cu), &rope)?
                }
                _ => return Err(CudaError::Unsupported("mixed-precision workspace".into())),
            }
            d.gemm(
                GemmBuffer::inputs(&ws.attn, &l.out)?,
                Some(GemmBias::F32(&l.out_b)),
                GemmOutput::F32(&mut ws.x),
                acc(n, h, wp),
                Epilogue::None,
            )?;
            // x += λ2 ⊙ fc2(quick_gelu(fc1(LN2(x))))   (λ2 folded into fc2)
            d.layer_norm_mixed(
                &ws.x,
                hm,
                Some(&l.ln2_w),
                Some(&l.ln2_b),
                &mut ws.hn,
                hm,
                eps,
            )?;
            d.gemm(
                GemmBuffer::inputs(&ws.hn, &l.fc1)?,
                Some(l.fc1_b.bias()),
                ws.f.out(),
                GemmShape::dense(n, inner, h),
                Epilogue::None,
            )?;
            d.act_in_place_mixed(
                &mut ws.f,
                Mat::dense(n, inner),
                c.activation,
                Clamp::NONE,
                Clamp::NONE,
            )?;
            d.gemm(
                GemmBuffer::inputs(&ws.f, &l.fc2)?,
                Some(GemmBias::F32(&l.fc2_b)),
                GemmOutput::F32(&mut ws.x),
                acc(n, h, inner),
                Epilogue::None,
            )?;
            if let (Some(s), 0) = (host.as_mut(), li) {
                s.block_0 = self.dev.download_prefix(&ws.x, n * h)?;
            }
        }
        if let Some(s) = host.as_mut() {
            s.blocks_out = self.dev.download_prefix(&ws.x, n * h)?;
            s.d1 = vec![0.0; b.n1 * 2 * h];
        }

        // No post-LN; per grid size the two 3×3 stride-2 pad-1 convs with bias as im2col + GEMM
        // (modeling_step3p7.py:430-434), then the projector over every view (:958-960).
        if let GemmBuffer::Bf16(xb) = &mut ws.hn {
            d.cast_f32_bf16(&ws.x, xb)?;
        }
        for r in &b.runs {
            let v0 = b.views[r.first];
            let (h1, w1) = (conv3x3s2_out(r.gh), conv3x3s2_out(r.gw));
            let (h2, w2) = (conv3x3s2_out(h1), conv3x3s2_out(w1));
            let (m1, m2) = (r.views * h1 * w1, r.views * h2 * w2);
            match (&mut ws.hn, &mut ws.attn, &mut ws.col1) {
                (GemmBuffer::Bf16(xb), GemmBuffer::Bf16(moved), GemmBuffer::Bf16(col)) => {
                    let rows = r.views * r.gh * r.gw;
                    let src = if v0.tok == 0 {
                        &*xb
                    } else {
                        d.act(
                            moved,
                            Mat::dense(rows, h),
                            xb,
                            Mat::strided(rows, h, h, v0.tok * h),
                            Activation::Identity,
                            Clamp::NONE,
                            Clamp::NONE,
                        )?;
                        &*moved
                    };
                    d.im2col_3x3s2(src, r.views, r.gh, r.gw, h, col)?;
                }
                (_, _, GemmBuffer::F32(col)) => {
                    let plan = im2col_plan(r.views, r.gh, r.gw, h, v0.tok);
                    self.im2col_f32(&ws.x, col, ws.zeros.as_ref(), h, &plan)?;
                }
                _ => return Err(CudaError::Unsupported("mixed-precision workspace".into())),
            }
            d.gemm(
                GemmBuffer::inputs(&ws.col1, &self.down1)?,
                Some(self.down1_b.bias()),
                ws.d1.out(),
                GemmShape::dense(m1, 2 * h, CONV_TAPS * h),
                Epilogue::None,
            )?;
            if let Some(s) = host.as_mut() {
                let (a, z) = (v0.r1 * 2 * h, (v0.r1 + m1) * 2 * h);
                s.d1[a..z].copy_from_slice(&ws.d1.download_f32(d, z - a)?);
            }
            match (&ws.d1, &mut ws.col2) {
                (GemmBuffer::Bf16(d1), GemmBuffer::Bf16(col)) => {
                    d.im2col_3x3s2(d1, r.views, h1, w1, 2 * h, col)?
                }
                (GemmBuffer::F32(d1), GemmBuffer::F32(col)) => {
                    let plan = im2col_plan(r.views, h1, w1, 2 * h, 0);
                    self.im2col_f32(d1, col, ws.zeros.as_ref(), 2 * h, &plan)?;
                }
                _ => return Err(CudaError::Unsupported("mixed-precision workspace".into())),
            }
            d.gemm(
                GemmBuffer::inputs(&ws.col2, &self.down2)?,
                Some(self.down2_b.bias()),
                ws.d2.out(),
                GemmShape {
                    y_offset: v0.r2 * c.out_width(),
                    ..GemmShape::dense(m2, c.out_width(), CONV_TAPS * 2 * h)
                },
                Epilogue::None,
            )?;
        }
        // The projector follows in `project`.
        let Some(mut s) = host else {
            return Ok(None);
        };
        s.d2 = ws.d2.download_f32(d, b.n2 * c.out_width())?;
        Ok(Some(s))
    }

    /// The f32 im2col of `plan` from `src` into `col` (strided copies; padding from `zeros`).
    fn im2col_f32(
        &self,
        src: &DeviceBuffer<f32>,
        col: &mut DeviceBuffer<f32>,
        zeros: Option<&DeviceBuffer<f32>>,
        c: usize,
        plan: &[ColCopy],
    ) -> CudaResult<()> {
        let zeros =
            zeros.ok_or_else(|| CudaError::Unsupported("f32 im2col without zeros".into()))?;
        for p in plan {
            let dst = Mat::strided(p.rows, c, CONV_TAPS * c, p.dst);
            let (buf, m) = match p.src {
                Some((off, ld)) => (src, Mat::strided(p.rows, c, ld, off)),
                None => (zeros, Mat::dense(p.rows, c)),
            };
            self.dev.act(
                col,
                dst,
                buf,
                m,
                Activation::Identity,
                Clamp::NONE,
                Clamp::NONE,
            )?;
        }
        Ok(())
    }

    /// Rope of q and k (the layout matching the weights: vendor interleaved or HF NeoX pairs) on
    /// the fused qkv GEMM output in place, then attention (scale hd^−½, one segment per view).
    fn attention_core<T: ActElem>(
        &self,
        qkv: &mut DeviceBuffer<T>,
        attn: &mut DeviceBuffer<T>,
        (cu_dev, cu): (&DeviceBuffer<i32>, &[i32]),
        rope: &RopeSpec<'_>,
    ) -> CudaResult<()> {
        let (c, d) = (&self.cfg, &*self.dev);
        let n = cu.last().map_or(0, |&t| t as usize);
        let (heads, hd, kd) = (c.heads, c.head_dim, self.kd);
        let wp = heads * kd;
        for &(off, nh) in &self.head_groups {
            let spec = QkvSpec {
                tokens: n,
                heads: nh,
                head_dim: hd,
                ld: 3 * wp,
                offsets: [off, wp + off, 2 * wp + off],
                q_weight: None,
                k_weight: None,
                norm: [false; 3],
                eps: c.eps as f32,
                clamps: [Clamp::NONE; 3],
            };
            d.qk_norm_rope(qkv, &spec, Some(rope))?;
        }
        let args = AttnArgs {
            q: (&*qkv, Mat::strided(n, wp, 3 * wp, 0)),
            k: (&*qkv, Mat::strided(n, wp, 3 * wp, wp)),
            v: (&*qkv, Mat::strided(n, wp, 3 * wp, 2 * wp)),
            heads,
            head_dim: kd,
            cu_seqlens: cu_dev,
            cu_seqlens_host: cu,
            scale: attention_scale(hd),
            variant: None,
        };
        d.flash_attn(&args, attn, Mat::dense(n, wp))?;
        Ok(())
    }
}

/// Stage activations downloaded in device order, before they are split per view.
#[derive(Debug, Default)]
struct HostStages {
    patch_embed: Vec<f32>,
    pre_ln: Vec<f32>,
    block_0: Vec<f32>,
    blocks_out: Vec<f32>,
    d1: Vec<f32>,
    d2: Vec<f32>,
}

impl HostStages {
    /// The stages as the host path reports them: global views and crop tiles apart, each in
    /// batch order.
    fn assemble(self, b: &ViewPlan, h: usize, rows: Vec<f32>) -> StepStages {
        let mut out = StepStages {
            rows,
            ..StepStages::default()
        };
        for &slot in &b.upstream {
            let v = &b.views[slot];
            let dst: &mut ViewStages = if v.local {
                &mut out.local
            } else {
                &mut out.global
            };
            let tok = v.tok * h..(v.tok + v.tokens()) * h;
            dst.patch_embed
                .extend_from_slice(&self.patch_embed[tok.clone()]);
            dst.pre_ln.extend_from_slice(&self.pre_ln[tok.clone()]);
            dst.block_0.extend_from_slice(&self.block_0[tok.clone()]);
            dst.blocks_out.extend_from_slice(&self.blocks_out[tok]);
            dst.downsample1
                .extend_from_slice(&self.d1[v.r1 * 2 * h..(v.r1 + v.n1()) * 2 * h]);
            dst.downsample2
                .extend_from_slice(&self.d2[v.r2 * 4 * h..(v.r2 + v.n2()) * 4 * h]);
        }
        out
    }
}

impl gpu_core::DeviceTower for StepCuda {
    type Config = StepConfig;
    type Image<'a> = StepImage<'a>;
    type HostBatch = StepHostBatch;
    type Batch = StepBatch;
    type Error = CudaError;

    fn prepare_host(
        config: &StepConfig,
        precision: CudaPrecision,
        images: &[StepImage<'_>],
    ) -> CudaResult<StepHostBatch> {
        StepCuda::prepare_host(config, precision, images)
    }

    fn rows_per_image(batch: &StepHostBatch) -> Vec<usize> {
        batch.meta.plan.rows_per_image(batch.meta.masks.len())
    }

    fn stage(&mut self, host: StepHostBatch) -> CudaResult<StepBatch> {
        StepCuda::stage(self, host)
    }

    fn run_into(&mut self, batch: &StepBatch, out: RowsTarget<'_>) -> CudaResult<Ran> {
        StepCuda::run_into(self, batch, out)
    }

    fn width(&self) -> usize {
        self.cfg.text_hidden
    }

    fn device(&self) -> &Arc<Device> {
        &self.dev
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::{patchify, StepView};
    use gpu_core::host;
    use std::borrow::Cow;

    /// A downsampler weight `[O, C·9]` in the layout the precision's im2col produces: bf16 as the
    /// checkpoint has it (gpu-core's im2col, columns (c, ky, kx)); f32 columns (ky, kx, c)
    /// ([`im2col_plan`]).
    fn conv_layout(p: CudaPrecision, w: &[f32], c: usize) -> Cow<'_, [f32]> {
        match p {
            CudaPrecision::Bf16 => Cow::Borrowed(w),
            CudaPrecision::F32 => Cow::Owned(taps_major(w, c, CONV_TAPS)),
        }
    }

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
            })
            .collect()
    }

    /// The one-pass patch rows equal patchify, then the column padding, then the precision, for
    /// views of several grids in a permuted order, in both precisions.
    #[test]
    fn patch_rows_equal_patchify_then_pad() {
        let p = 3;
        let sizes = [(4, 5), (2, 2), (6, 3), (4, 5)];
        let planes: Vec<Vec<f32>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &(gh, gw))| vals(NUM_CHANNELS * gh * p * gw * p, 7 + i as u32))
            .collect();
        let grids: Vec<Grid<'_>> = sizes
            .iter()
            .zip(&planes)
            .map(|(&(gh, gw), px)| Grid {
                view: StepView {
                    pixels: px,
                    height: gh * p,
                    width: gw * p,
                },
                image: 0,
                local: true,
                gh,
                gw,
            })
            .collect();
        let order = [2, 0, 3, 1];
        let mut flat = Vec::new();
        for &i in &order {
            patchify(&grids[i], p, &mut flat);
        }
        let pd = NUM_CHANNELS * p * p;
        let want = pad_cols(&flat, pd);
        let k = pd.next_multiple_of(8);
        assert!(k > pd, "the case pads");
        assert_eq!(patch_rows(&grids, &order, p, k, |x| x), want);
        let want_bf16: Vec<bf16> = want.iter().map(|&x| bf16::from_f32(x)).collect();
        assert_eq!(patch_rows(&grids, &order, p, k, bf16::from_f32), want_bf16);
    }

    /// The f32 im2col plan with the (ky, kx, c) weight gives the host twin's im2col with the
    /// checkpoint's (c, ky, kx) weight, and writes every element (the output starts as NaN).
    #[test]
    fn im2col_plan_matches_the_host_twin() {
        for (views, gh, gw, c) in [
            (1, 12, 12, 5),
            (2, 8, 8, 3),
            (3, 6, 6, 4),
            (2, 5, 7, 2),
            (1, 3, 3, 3),
            (2, 1, 1, 2),
            (1, 2, 1, 3),
            (1, 1, 4, 2),
        ] {
            let lead = 3; // tokens before the run in the source buffer
            let src = vals((lead + views * gh * gw) * c, 11);
            let (oh, ow) = (conv3x3s2_out(gh), conv3x3s2_out(gw));
            let m = views * oh * ow;
            let mut col = vec![f32::NAN; m * CONV_TAPS * c];
            for p in im2col_plan(views, gh, gw, c, lead) {
                for r in 0..p.rows {
                    let dst = p.dst + r * CONV_TAPS * c;
                    match p.src {
                        Some((off, ld)) => {
                            col[dst..dst + c].copy_from_slice(&src[off + r * ld..off + r * ld + c])
                        }
                        None => col[dst..dst + c].fill(0.0),
                    }
                }
            }
            assert!(
                col.iter().all(|v| v.is_finite()),
                "{views}×{gh}×{gw}: unwritten"
            );
            let want_col = host::im2col_3x3s2(&src[lead * c..], views, gh, gw, c);
            let o = 4;
            let w = vals(o * CONV_TAPS * c, 5);
            let want = host::gemm(&want_col, &w, None, m, o, CONV_TAPS * c);
            let got = host::gemm(
                &col,
                &taps_major(&w, c, CONV_TAPS),
                None,
                m,
                o,
                CONV_TAPS * c,
            );
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{views}×{gh}×{gw}×{c}: {a} vs {b}"
                );
            }
        }
    }

    fn fixture_tower() -> crate::StepTower {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/step3p7");
        let ck = st_reader::Checkpoint::open(dir).expect("fixture checkpoint");
        crate::StepTower::from_checkpoint(&ck).expect("fixture tower")
    }

    /// `run_in`'s op sequence on the host twins, with the device layouts of `precision` (padded
    /// heads and the checkpoint's conv columns for bf16; permuted conv columns and the im2col
    /// plan for f32) and the batch's device order, views split back as `run_in` does.
    fn emulate(
        t: &crate::StepTower,
        images: &[StepImage<'_>],
        p: CudaPrecision,
    ) -> (Vec<StepRows>, StepStages) {
        let (c, w) = (&t.config, &t.weights);
        let (h, heads, hd, inner) = (c.hidden, c.heads, c.head_dim, c.intermediate);
        let kd = p.attention_head_dim(hd).unwrap();
        let wp = heads * kd;
        let eps = c.eps as f32;
        let grids = validate_images(c, images).unwrap();
        let plan = ViewPlan::new(&grids).unwrap();
        let (mut pixels, mut pos) = (Vec::new(), Vec::new());
        for &i in &plan.order {
            patchify(&grids[i], c.patch, &mut pixels);
            pos.extend(grid_positions(grids[i].gh, grids[i].gw));
        }
        let cu = plan.cu_seqlens();
        let n = plan.n;
        let ts = c.pos_side;
        let mut y = vec![0.0f32; n * h];
        for v in &plan.views {
            let table = if (v.gh, v.gw) == (ts, ts) {
                w.pos.clone()
            } else {
                host::bilinear_resize(&w.pos, ts, ts, v.gh, v.gw, h)
            };
            y[v.tok * h..(v.tok + v.tokens()) * h].copy_from_slice(&table);
        }
        let pk = patch_k(c);
        let pixels = pad_cols(&pixels, c.patch_dim());
        let pe = host::gemm(&pixels, &pad_cols(&w.patch, c.patch_dim()), None, n, h, pk);
        y.iter_mut().zip(&pe).for_each(|(a, b)| *a += b);
        let mut st = HostStages {
            patch_embed: y.clone(),
            ..HostStages::default()
        };
        let mut x = host::layer_norm(&y, h, Some(&w.ln_pre_w), Some(&w.ln_pre_b), eps);
        st.pre_ln = x.clone();
        let inv = rope_inv_freq(hd, c.rope_theta);
        let add = |x: &mut Vec<f32>, y: Vec<f32>| x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        for (li, l) in w.layers.iter().enumerate() {
            let hl = HostLayer::new(c, l, kd);
            let hn = host::layer_norm(&x, h, Some(&l.ln1_w), Some(&l.ln1_b), eps);
            let qkv_w = hl.qkv.clone().unwrap_or_else(|| l.qkv_w.clone());
            let mut qkv = host::gemm(&hn, &qkv_w, Some(&hl.qkv_b), n, 3 * wp, h);
            for (off, nh) in head_groups(heads, hd, kd) {
                host::qk_norm_rope(
                    &mut qkv,
                    n,
                    nh,
                    hd,
                    3 * wp,
                    [off, wp + off, 2 * wp + off],
                    [None, None],
                    [false; 3],
                    eps,
                    [Clamp::NONE; 3],
                    Some((w.layout.rope(), &pos, &inv)),
                );
            }
            let a = host::attention(
                &qkv,
                &qkv,
                &qkv,
                3 * wp,
                [0, wp, 2 * wp],
                heads,
                kd,
                &cu,
                attention_scale(hd),
            );
            let out_w = hl.out.clone().unwrap_or_else(|| {
                ScaledRows {
                    src: &l.out_w,
                    scale: &hl.ls1,
                    cols: h,
                }
                .to_f32_vec()
            });
            add(&mut x, host::gemm(&a, &out_w, Some(&hl.out_b), n, h, wp));
            let hn = host::layer_norm(&x, h, Some(&l.ln2_w), Some(&l.ln2_b), eps);
            let f = host::gemm(&hn, &l.fc1_w, Some(&l.fc1_b), n, inner, h);
            let f = host::act(&f, c.activation, Clamp::NONE, Clamp::NONE);
            let fc2_w = ScaledRows {
                src: &l.fc2_w,
                scale: &hl.ls2,
                cols: inner,
            }
            .to_f32_vec();
            add(&mut x, host::gemm(&f, &fc2_w, Some(&hl.fc2_b), n, h, inner));
            if li == 0 {
                st.block_0 = x.clone();
            }
        }
        st.blocks_out = x.clone();
        let (dw1, dw2) = (
            conv_layout(p, &w.down1_w, h),
            conv_layout(p, &w.down2_w, 2 * h),
        );
        let im2col = |src: &[f32], views, gh, gw, ch, tok| -> Vec<f32> {
            match p {
                CudaPrecision::Bf16 => host::im2col_3x3s2(&src[tok * ch..], views, gh, gw, ch),
                CudaPrecision::F32 => {
                    let m = views * conv3x3s2_out(gh) * conv3x3s2_out(gw);
                    let mut col = vec![f32::NAN; m * CONV_TAPS * ch];
                    for q in im2col_plan(views, gh, gw, ch, tok) {
                        for r in 0..q.rows {
                            let dst = q.dst + r * CONV_TAPS * ch;
                            match q.src {
                                Some((o, ld)) => col[dst..dst + ch]
                                    .copy_from_slice(&src[o + r * ld..o + r * ld + ch]),
                                None => col[dst..dst + ch].fill(0.0),
                            }
                        }
                    }
                    col
                }
            }
        };
        st.d1 = vec![0.0; plan.n1 * 2 * h];
        st.d2 = vec![0.0; plan.n2 * 4 * h];
        for r in &plan.runs {
            let v0 = plan.views[r.first];
            let (h1, w1) = (conv3x3s2_out(r.gh), conv3x3s2_out(r.gw));
            let (h2, w2) = (conv3x3s2_out(h1), conv3x3s2_out(w1));
            let (m1, m2) = (r.views * h1 * w1, r.views * h2 * w2);
            let col = im2col(&x, r.views, r.gh, r.gw, h, v0.tok);
            let d1 = host::gemm(&col, &dw1, Some(&w.down1_b), m1, 2 * h, 9 * h);
            st.d1[v0.r1 * 2 * h..(v0.r1 + m1) * 2 * h].copy_from_slice(&d1);
            let col = im2col(&d1, r.views, h1, w1, 2 * h, 0);
            let d2 = host::gemm(&col, &dw2, Some(&w.down2_b), m2, 4 * h, 18 * h);
            st.d2[v0.r2 * 4 * h..(v0.r2 + m2) * 4 * h].copy_from_slice(&d2);
        }
        let device_order = host::gemm(
            &st.d2,
            &w.proj,
            w.proj_b.as_deref(),
            plan.n2,
            c.text_hidden,
            4 * h,
        );
        // The projection writes upstream order, piece by piece (`run_into`).
        let t = c.text_hidden;
        let mut all = vec![0.0f32; plan.n2 * t];
        for (src, rows, dst) in plan.out_pieces() {
            all[dst * t..(dst + rows) * t]
                .copy_from_slice(&device_order[src * t..(src + rows) * t]);
        }
        let masks: Vec<Vec<bool>> = images.iter().map(|i| i.newline_mask.clone()).collect();
        let rows = plan.split_rows(&all, c.text_hidden, &masks);
        let flat = rows.iter().flat_map(|r| r.rows.iter().copied()).collect();
        (rows, st.assemble(&plan, h, flat))
    }

    /// The device op sequence (run on the host twins with the device layouts and order) gives
    /// the host reference's rows and stages, in both precisions' layouts, on a batch whose views
    /// must be regrouped (crops of two images around a global-only image of another grid).
    #[test]
    fn device_sequence_matches_the_host_reference() {
        let t = fixture_tower();
        let px = |n: usize, seed: u32| vals(n, seed).iter().map(|v| 2.0 * v).collect::<Vec<f32>>();
        let crops: Vec<Vec<f32>> = (0..5).map(|i| px(3 * 112 * 112, 20 + i)).collect();
        let (g0, g1, g2) = (
            px(3 * 168 * 168, 1),
            px(3 * 140 * 126, 2),
            px(3 * 168 * 168, 3),
        );
        fn view(p: &[f32], height: usize, width: usize) -> crate::StepView<'_> {
            crate::StepView {
                pixels: p,
                height,
                width,
            }
        }
        let images = vec![
            StepImage {
                crops: crops[..3].iter().map(|p| view(p, 112, 112)).collect(),
                global: view(&g0, 168, 168),
                newline_mask: vec![false, false, true],
            },
            StepImage {
                crops: vec![],
                global: view(&g1, 140, 126),
                newline_mask: vec![],
            },
            StepImage {
                crops: crops[3..].iter().map(|p| view(p, 112, 112)).collect(),
                global: view(&g2, 168, 168),
                newline_mask: vec![true, false],
            },
        ];
        let (want, ws) = t.forward_host(&images, true).unwrap();
        let ws = ws.unwrap();
        for p in [CudaPrecision::Bf16, CudaPrecision::F32] {
            let (got, gs) = emulate(&t, &images, p);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(
                    (&g.crop_rows, g.global_rows, &g.newline_mask),
                    (&w.crop_rows, w.global_rows, &w.newline_mask)
                );
                let r = host::rel_l2(&g.rows, &w.rows);
                assert!(r < 1e-5, "{p:?} rows rel-L2 {r}");
            }
            for (kind, a, b) in [
                ("global", &gs.global, &ws.global),
                ("local", &gs.local, &ws.local),
            ] {
                for ((name, x), (_, y)) in a.named().iter().zip(b.named()) {
                    assert_eq!(x.len(), y.len(), "{p:?} {kind}/{name} length");
                    let r = host::rel_l2(x, y);
                    assert!(r < 1e-5, "{p:?} {kind}/{name} rel-L2 {r}");
                }
            }
            assert!(host::rel_l2(&gs.rows, &ws.rows) < 1e-5);
        }
    }

    /// Scaling rows as they are read gives the f32 products of `scale_rows`, and rounds them
    /// to the same bf16, on ranges that straddle rows.
    #[test]
    fn scaled_rows_read_what_scale_rows_computes() {
        let (rows, cols) = (7, 13);
        let w = vals(rows * cols, 8);
        let ls = vals(rows, 9);
        let want = scale_rows(&w, &ls, cols);
        let s = ScaledRows {
            src: &w,
            scale: &ls,
            cols,
        };
        assert_eq!(s.to_f32_vec(), want);
        for (start, n) in [(0, rows * cols), (5, 30), (12, 1), (13, 13), (40, 51)] {
            let mut b = vec![gpu_core::bf16::ZERO; n];
            s.read_bf16(start, &mut b);
            let wb: Vec<_> = want[start..start + n]
                .iter()
                .map(|&v| gpu_core::bf16::from_f32(v))
                .collect();
            assert_eq!(b, wb, "{start}+{n}");
        }
    }

    /// `λ ⊙ (a·Wᵀ + b)` = `a·(λ ⊙ W)ᵀ + λ ⊙ b`: the LayerScale fold.
    #[test]
    fn layer_scale_folds_into_the_linear() {
        let (n, inp, out) = (5, 7, 6);
        let a = vals(n * inp, 1);
        let w = vals(out * inp, 2);
        let bias = vals(out, 3);
        let ls = vals(out, 4);
        let y = host::gemm(&a, &w, Some(&bias), n, out, inp);
        let folded = host::gemm(
            &a,
            &scale_rows(&w, &ls, inp),
            Some(&hadamard(&bias, &ls)),
            n,
            out,
            inp,
        );
        for t in 0..n {
            for o in 0..out {
                let want = ls[o] * y[t * out + o];
                let got = folded[t * out + o];
                assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0));
            }
        }
    }
}
