//! The weight transforms done once at upload: LayerScale folded into the linears before it, the
//! f32 convolution weights permuted to the im2col's column order.

use gpu_core::{pad_head_cols, pad_head_rows, HostSource, TensorStore};
use rayon::prelude::*;

use crate::config::StepConfig;
use crate::weights::Layer;

/// One layer's transformed tensors in host f32, as [`StepCuda::new`] uploads them; everything
/// else of the layer goes to the device straight from its store (the file's bytes).
pub(super) struct HostLayer {
    /// q | k | v `[3·heads·kd, H]`, each third's rows padded per head; `None` when nothing is
    /// padded (the fused tensor is uploaded as the file has it).
    pub(super) qkv: Option<Vec<f32>>,
    pub(super) qkv_b: Vec<f32>,
    /// `λ1 ⊙ out_proj` with columns padded per head; `None` when nothing is padded (then it is
    /// uploaded as [`ScaledRows`] of the store).
    pub(super) out: Option<Vec<f32>>,
    pub(super) out_b: Vec<f32>,
    pub(super) fc2_b: Vec<f32>,
    /// LayerScale of the attention and MLP branches.
    pub(super) ls1: Vec<f32>,
    pub(super) ls2: Vec<f32>,
}

impl HostLayer {
    pub(super) fn new<T: TensorStore>(cfg: &StepConfig, l: &Layer<T>, kd: usize) -> HostLayer {
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
pub(super) struct ScaledRows<'a> {
    pub(super) src: &'a dyn HostSource,
    pub(super) scale: &'a [f32],
    pub(super) cols: usize,
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

/// `[rows, cols]` with row `r` scaled by `s[r]` (a LayerScale folded into the linear before it).
pub(super) fn scale_rows(w: &[f32], s: &[f32], cols: usize) -> Vec<f32> {
    let mut out = w.to_vec();
    out.par_chunks_mut(cols)
        .zip(s.par_iter())
        .for_each(|(row, &g)| row.iter_mut().for_each(|v| *v *= g));
    out
}

pub(super) fn hadamard(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x * y).collect()
}

/// A Conv2d weight `[O, C·taps]` with columns (c, t) as `[O, taps·C]` with columns (t, c).
pub(super) fn taps_major(w: &[f32], c: usize, taps: usize) -> Vec<f32> {
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
