//! Host-side planning of a batch: where every view sits on the device (views grouped by grid
//! size), the patch rows in the GEMM's layout, the f32 im2col copies, and the stage activations
//! put back in per-view order.

use std::sync::atomic::{AtomicBool, Ordering};

use gpu_core::conv3x3s2_out;
use rayon::prelude::*;

use super::{CudaResult, CONV_TAPS};
use crate::config::{StepConfig, NUM_CHANNELS};
use crate::error::StepError;
use crate::forward::{Grid, StepRows, StepStages, ViewStages};

/// One view of a batch, in the batch's device order.
#[derive(Debug, Clone, Copy)]
pub(super) struct DevView {
    pub(super) image: usize,
    pub(super) local: bool,
    pub(super) gh: usize,
    pub(super) gw: usize,
    /// First token.
    pub(super) tok: usize,
    /// First row of the first downsampler's output (`[Σ h1·w1, 2H]`).
    pub(super) r1: usize,
    /// First row of the second downsampler's output and of the rows (`[Σ h2·w2, ·]`).
    pub(super) r2: usize,
}

impl DevView {
    pub(super) fn tokens(&self) -> usize {
        self.gh * self.gw
    }
    pub(super) fn n1(&self) -> usize {
        conv3x3s2_out(self.gh) * conv3x3s2_out(self.gw)
    }
    pub(super) fn n2(&self) -> usize {
        conv3x3s2_out(conv3x3s2_out(self.gh)) * conv3x3s2_out(conv3x3s2_out(self.gw))
    }
}

/// Consecutive views (device order) of one grid size.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) first: usize,
    pub(super) views: usize,
    pub(super) gh: usize,
    pub(super) gw: usize,
}

/// Where every view of a batch sits on the device: views grouped by grid size (stable, first
/// appearance first), so each grid size is one run of consecutive views.
#[derive(Debug, Clone)]
pub(super) struct ViewPlan {
    /// Views in device order.
    pub(super) views: Vec<DevView>,
    /// Index into the validated (upstream-order) views of each device slot.
    pub(super) order: Vec<usize>,
    pub(super) runs: Vec<Run>,
    /// Device slot of each view in upstream order (per image: crops, then the global view).
    pub(super) upstream: Vec<usize>,
    /// Tokens, first- and second-downsampler rows of the whole batch.
    pub(super) n: usize,
    pub(super) n1: usize,
    pub(super) n2: usize,
}

impl ViewPlan {
    pub(super) fn new(grids: &[Grid<'_>]) -> CudaResult<ViewPlan> {
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
    pub(super) fn cu_seqlens(&self) -> Vec<i32> {
        let mut cu = vec![0i32];
        // ViewPlan::new checked that the token count fits an i32.
        cu.extend(self.views.iter().map(|v| (v.tok + v.tokens()) as i32));
        cu
    }

    /// Rows `[n2, t]` in upstream order (as the projection writes them) split per image: its
    /// crops' rows, then the global view's.
    pub(super) fn split_rows(&self, all: &[f32], t: usize, masks: &[Vec<bool>]) -> Vec<StepRows> {
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
    pub(super) fn out_pieces(&self) -> Vec<(usize, usize, usize)> {
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
    pub(super) fn rows_per_image(&self, images: usize) -> Vec<usize> {
        let mut rows = vec![0; images];
        for v in &self.views {
            if let Some(r) = rows.get_mut(v.image) {
                *r += v.n2();
            }
        }
        rows
    }
}

/// What a Step-3.7 batch is, apart from its input values, its graph key and its rows: where
/// every view sits on the device, the attention segments and each image's newline mask.
#[derive(Debug, Clone)]
pub struct StepMeta {
    pub(super) plan: ViewPlan,
    pub(super) cu: Vec<i32>,
    /// Each image's newline mask, returned with its rows.
    pub(super) masks: Vec<Vec<bool>>,
}

impl StepMeta {
    /// Patches (tokens) in the batch.
    pub fn tokens(&self) -> usize {
        self.plan.n
    }
    /// Views (crop tiles and global views) in the batch.
    pub fn views(&self) -> usize {
        self.plan.views.len()
    }
    /// Images (requests) in the batch.
    pub fn images(&self) -> usize {
        self.masks.len()
    }
    /// The attention segments (one per view, device order), `[views + 1]`.
    pub fn cu_seqlens(&self) -> &[i32] {
        &self.cu
    }
}

/// The patch GEMM's inner width: `3·p²` rounded up to a multiple of 8 (588 → 592 at p = 14), so
/// every bf16 row starts 16-byte aligned; the extra columns are zeros in both operands.
pub(super) fn patch_k(c: &StepConfig) -> usize {
    c.patch_dim().next_multiple_of(8)
}

/// Rows of width `cols` spread to width `cols.next_multiple_of(8)` with zero columns.
pub(super) fn pad_cols(w: &[f32], cols: usize) -> Vec<f32> {
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
/// batch, two of them serial). `alloc(n)` gives the output buffer of `n` values, whatever they
/// hold: every one is written, the padding columns with zeros. Also returns the first of `grids`
/// (by index, upstream order) with a NaN or an infinity among the values read, if any (every row
/// is written either way).
pub(super) fn patch_rows<T: Copy + Default + Send + Sync>(
    grids: &[Grid<'_>],
    order: &[usize],
    p: usize,
    k: usize,
    conv: impl Fn(f32) -> T + Sync,
    alloc: impl FnOnce(usize) -> Vec<T>,
) -> (Vec<T>, Option<usize>) {
    // Each view of `order` with its first row.
    let mut starts = Vec::with_capacity(order.len());
    let mut rows = 0;
    for &i in order {
        starts.push((i, rows));
        rows += grids[i].gh * grids[i].gw;
    }
    let mut out = alloc(rows * k);
    let non_finite: Vec<AtomicBool> = grids.iter().map(|_| AtomicBool::new(false)).collect();
    out.par_chunks_mut(k).enumerate().for_each(|(row, dst)| {
        let (gi, first) = starts[starts.partition_point(|&(_, s)| s <= row) - 1];
        let g = &grids[gi];
        let (r, col) = ((row - first) / g.gw, (row - first) % g.gw);
        let (h, w) = (g.view.height, g.view.width);
        let mut at = 0;
        let mut bad = false;
        for c in 0..NUM_CHANNELS {
            for ky in 0..p {
                let start = c * h * w + (r * p + ky) * w + col * p;
                for (d, &x) in dst[at..at + p]
                    .iter_mut()
                    .zip(&g.view.pixels[start..start + p])
                {
                    bad |= !x.is_finite();
                    *d = conv(x);
                }
                at += p;
            }
        }
        dst[at..].fill(T::default());
        if bad {
            non_finite[gi].store(true, Ordering::Relaxed);
        }
    });
    let first_bad = non_finite.iter().position(|b| b.load(Ordering::Relaxed));
    (out, first_bad)
}

/// One strided copy of the f32 im2col: `rows` runs of `c` values, destination row stride
/// `9c`; the source is `Some((offset, row stride))` or `None` for zeros (a padding tap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ColCopy {
    pub(super) rows: usize,
    pub(super) src: Option<(usize, usize)>,
    pub(super) dst: usize,
}

/// The copies that build the 3×3 stride-2 pad-1 im2col of `views` `[gh, gw, c]` grids (starting
/// at token `tok` of the source) as `[views·oh·ow, 9c]` rows with columns (ky, kx, c); every
/// element of those rows is written (padding taps from zeros). Rows of one copy are consecutive
/// output columns `ox`, whose source pixels are two tokens apart.
pub(super) fn im2col_plan(
    views: usize,
    gh: usize,
    gw: usize,
    c: usize,
    tok: usize,
) -> Vec<ColCopy> {
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

/// Stage activations downloaded in device order, before they are split per view.
#[derive(Debug, Default)]
pub struct HostStages {
    pub(super) patch_embed: Vec<f32>,
    pub(super) pre_ln: Vec<f32>,
    pub(super) block_0: Vec<f32>,
    pub(super) blocks_out: Vec<f32>,
    pub(super) d1: Vec<f32>,
    pub(super) d2: Vec<f32>,
}

impl HostStages {
    /// The stages as the host path reports them: global views and crop tiles apart, each in
    /// batch order.
    pub(super) fn assemble(self, b: &ViewPlan, h: usize, rows: Vec<f32>) -> StepStages {
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
