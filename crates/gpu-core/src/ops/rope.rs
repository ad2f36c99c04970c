//! Launchers of `kernels/rope.cu`: per-head q/k norms fused with the 2-D ropes of each family
//! ([`RopeLayout`]), and the inverse-frequency law.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::act::ActElem;
use super::common::Clamp;
use super::common::{need_len, product, to_i32, Mat};
use crate::device::{opt_addr, DeviceBuffer};
use crate::{Device, GpuError, Result};

/// Chunks per thread of the staged qk_norm_rope kernel (`QKR_MAXC`, kernels/rope.cu).
const QKR_MAXC: usize = 4;
/// Dynamic shared memory the staged kernel may use per block (the default limit, no opt-in).
const QKR_SMEM_BYTES: usize = 48 * 1024;

/// Shared floats per (token, part) unit of `qk_norm_rope_staged_*` (layout in kernels/rope.cu):
/// A, B, P `[hd]`, cos and sin `[hd/2]`, inv `[heads]`, psum `[heads·hd/vw]`, vals
/// `[heads·(hd + hd/8 + 1)]`, rounded up to a multiple of 4.
fn qkr_unit_floats(heads: usize, hd: usize, vw: usize) -> usize {
    (3 * hd + hd + heads + heads * (hd / vw) + heads * (hd + hd / 8 + 1)).next_multiple_of(4)
}

/// Rope pair layouts (see `kernels/README.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// gemma4: two halves, NeoX pairs `(d, d + hd/4)` inside each; first half by x (column), second by y.
    Gemma4,
    /// glm5_next / glm_ocr: NeoX over the full head, pairs `(d, d + hd/2)`; cos `[h, w, h, w]`
    /// (the first quarter's angles from the row y, the second's from the column x).
    Glm,
    /// step3p7, HF (permuted q/k weights): NeoX over the full head with cos `[col, row, col, row]`.
    Step3p7Hf,
    /// step3p7, vendor weights (`attn.in_proj_weight`): interleaved pairs `(2i, 2i+1)`, first hd/2 dims by column.
    Step3p7Vendor,
}

impl RopeLayout {
    pub(crate) fn codes(self) -> (i32, i32) {
        // (layout, first_axis: 0 = x first, 1 = y first)
        match self {
            RopeLayout::Gemma4 => (1, 0),
            RopeLayout::Glm => (0, 1),
            RopeLayout::Step3p7Hf => (0, 0),
            RopeLayout::Step3p7Vendor => (2, 0),
        }
    }
}

/// Rope inverse frequencies `θ^(−2i/(hd/2))`, i < hd/4, computed in f64 and rounded to f32.
pub fn rope_inv_freq(head_dim: usize, theta: f64) -> Vec<f32> {
    let half = (head_dim / 2) as f64;
    (0..head_dim / 4)
        .map(|i| (1.0 / theta.powf(2.0 * i as f64 / half)) as f32)
        .collect()
}

/// Where q, k and v live in the fused qkv buffer and what to do to each (per head).
#[derive(Debug, Clone, Copy)]
pub struct QkvSpec<'a> {
    /// Tokens.
    pub tokens: usize,
    /// Heads (same for q, k, v).
    pub heads: usize,
    /// Head dimension (multiple of 4, ≤ 256).
    pub head_dim: usize,
    /// Row stride of the qkv buffer (elements), e.g. 3·heads·head_dim.
    pub ld: usize,
    /// Column offsets of q, k and v inside a row.
    pub offsets: [usize; 3],
    /// Per-head RMSNorm weights for q and k (`None` = weightless); only used where `norm` says so.
    pub q_weight: Option<&'a DeviceBuffer<f32>>,
    /// See `q_weight`.
    pub k_weight: Option<&'a DeviceBuffer<f32>>,
    /// Which of q, k, v get a per-head RMSNorm (gemma4: all three, v weightless; glm: q and k).
    pub norm: [bool; 3],
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Clamps applied to q, k, v on read (gemma4 clipped q/k/v output clamps).
    pub clamps: [Clamp; 3],
}

/// Rope of q and k (positions are `[tokens, 2]` i32 as (x = column, y = row)).
#[derive(Debug, Clone, Copy)]
pub struct RopeSpec<'a> {
    /// Pair layout.
    pub layout: RopeLayout,
    /// Positions `[tokens, 2]` (x, y).
    pub pos: &'a DeviceBuffer<i32>,
    /// `rope_inv_freq(head_dim, θ)`, `[head_dim/4]`.
    pub inv_freq: &'a DeviceBuffer<f32>,
}

impl Device {
    /// Per-head RMSNorm of q/k (and v) fused with 2-D rope of q and k, in place on the qkv buffer
    /// (f32 or bf16; math in f32).
    pub fn qk_norm_rope<T: ActElem>(
        &self,
        qkv: &mut DeviceBuffer<T>,
        spec: &QkvSpec<'_>,
        rope: Option<&RopeSpec<'_>>,
    ) -> Result<()> {
        const OP: &str = "qk_norm_rope";
        let s = spec;
        if s.head_dim == 0 || !s.head_dim.is_multiple_of(4) || s.head_dim > 256 {
            return Err(GpuError::shape(
                OP,
                format!("head_dim {} must be a multiple of 4 in 4..=256", s.head_dim),
            ));
        }
        let width = product(OP, "heads × head_dim", &[s.heads, s.head_dim])?;
        to_i32(OP, "heads", s.heads)?;
        for (i, o) in s.offsets.iter().enumerate() {
            Mat::strided(s.tokens, width, s.ld, *o).check(OP, ["q", "k", "v"][i], qkv)?;
        }
        for (name, w, on) in [
            ("q_weight", s.q_weight, s.norm[0]),
            ("k_weight", s.k_weight, s.norm[1]),
        ] {
            if let (Some(w), true) = (w, on) {
                need_len(OP, name, w, s.head_dim)?;
            }
        }
        let mut flags = (s.norm[0] as i32) | (s.norm[1] as i32) << 1 | (s.norm[2] as i32) << 2;
        let (pos, inv, layout, first_axis) = match rope {
            Some(r) => {
                need_len(OP, "pos", r.pos, product(OP, "pos", &[2, s.tokens])?)?;
                need_len(OP, "inv_freq", r.inv_freq, s.head_dim / 4)?;
                flags |= 8;
                let (l, a) = r.layout.codes();
                (r.pos.addr(), r.inv_freq.addr(), l, a)
            }
            None => (0, 0, 0, 0),
        };
        let qw = if s.norm[0] { opt_addr(s.q_weight) } else { 0 };
        let kw = if s.norm[1] { opt_addr(s.k_weight) } else { 0 };
        // parts with work (norm, rope or a clamp); the others are neither read nor written
        let active: Vec<usize> = (0..3)
            .filter(|&w| s.norm[w] || (rope.is_some() && w < 2) || s.clamps[w] != Clamp::NONE)
            .collect();
        if active.is_empty() {
            return Ok(());
        }
        let (qa, n, heads, hd, ld) = (
            qkv.addr(),
            s.tokens as i64,
            s.heads as i32,
            s.head_dim as i32,
            s.ld as i64,
        );
        let [qo, ko, vo] = s.offsets.map(|o| o as i64);
        let c = s.clamps;
        // Staged kernel (kernels/rope.cu): 16-byte chunks of vw elements that never straddle a head,
        // so head_dim, the row stride and the active parts' offsets must be multiples of vw; TX =
        // ceil(heads / QKR_MAXC) heads × hd/vw chunks per unit row, TY units per block within 256
        // threads and the default 48 KB of shared memory.
        let vw = 16 / std::mem::size_of::<T>();
        let staged = if s.head_dim.is_multiple_of(vw)
            && s.ld.is_multiple_of(vw)
            && active.iter().all(|&w| s.offsets[w].is_multiple_of(vw))
            && qa.is_multiple_of(16)
        {
            let tx = s.heads.div_ceil(QKR_MAXC) * (s.head_dim / vw);
            let unit = qkr_unit_floats(s.heads, s.head_dim, vw);
            let ty = (256 / tx.max(1)).min(QKR_SMEM_BYTES / (unit * 4));
            let blocks = s.tokens.div_ceil(ty.max(1));
            (tx <= 256 && ty >= 1 && blocks <= i32::MAX as usize).then_some((tx, ty, unit, blocks))
        } else {
            None
        };
        // the staged kernel takes the same arguments plus the active-part mask and its unit
        let (kernel, cfg, staged_args) = match staged {
            None => (
                T::QK_NORM_ROPE,
                LaunchConfig {
                    grid_dim: ((s.tokens * s.heads * 3).div_ceil(8) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                },
                None,
            ),
            Some((tx, ty, unit, blocks)) => (
                T::QK_NORM_ROPE_STAGED,
                LaunchConfig {
                    grid_dim: (blocks as u32, active.len() as u32, 1),
                    block_dim: (tx as u32, ty as u32, 1),
                    shared_mem_bytes: (ty * unit * 4) as u32,
                },
                Some((active.iter().fold(0i32, |m, &w| m | 1 << w), unit as i32)),
            ),
        };
        self.launch(kernel, cfg, |b| {
            b.arg(&qa)
                .arg(&n)
                .arg(&heads)
                .arg(&hd)
                .arg(&ld)
                .arg(&qo)
                .arg(&ko)
                .arg(&vo)
                .arg(&pos)
                .arg(&inv);
            b.arg(&layout)
                .arg(&first_axis)
                .arg(&flags)
                .arg(&qw)
                .arg(&kw)
                .arg(&s.eps);
            b.arg(&c[0].lo)
                .arg(&c[0].hi)
                .arg(&c[1].lo)
                .arg(&c[1].hi)
                .arg(&c[2].lo)
                .arg(&c[2].hi);
            if let Some((mask, unit)) = &staged_args {
                b.arg(mask).arg(unit);
            }
        })
    }
}
