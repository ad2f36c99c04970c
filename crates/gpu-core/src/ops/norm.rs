//! Launchers of `kernels/norm.cu`: RMSNorm, LayerNorm and the residual fusions, one row per
//! warp group.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::common::{all_aligned, need_len, off, Clamp, Mat};
use crate::device::{grid_stride, opt_addr, DeviceBuffer, Elem};
use crate::kernels::Kernel;
use crate::{Device, GpuError, Result};

/// Output element types of the norm kernels (f32, bf16 or f16).
pub trait NormOut: Elem {
    /// RMSNorm: the generic entry, then the one-warp entries for 9 and 12 chunks per lane.
    #[doc(hidden)]
    const RMS: RowKernels;
    /// LayerNorm, as [`NormOut::RMS`].
    #[doc(hidden)]
    const LN: RowKernels;
    /// [`Device::residual_rms_add`]'s next pre-norm in this type (`None`: f32, no such kernel).
    #[doc(hidden)]
    const RESIDUAL_RMS_NEXT: Option<RowKernels>;
}
impl NormOut for f32 {
    const RMS: RowKernels = RowKernels {
        generic: Kernel::RmsNormF32,
        w9: Kernel::RmsNormF32W9,
        w12: Kernel::RmsNormF32W12,
    };
    const LN: RowKernels = RowKernels {
        generic: Kernel::LayerNormF32,
        w9: Kernel::LayerNormF32W9,
        w12: Kernel::LayerNormF32W12,
    };
    const RESIDUAL_RMS_NEXT: Option<RowKernels> = None;
}
impl NormOut for bf16 {
    const RMS: RowKernels = RowKernels {
        generic: Kernel::RmsNormBf16,
        w9: Kernel::RmsNormBf16W9,
        w12: Kernel::RmsNormBf16W12,
    };
    const LN: RowKernels = RowKernels {
        generic: Kernel::LayerNormBf16,
        w9: Kernel::LayerNormBf16W9,
        w12: Kernel::LayerNormBf16W12,
    };
    const RESIDUAL_RMS_NEXT: Option<RowKernels> = Some(RowKernels {
        generic: Kernel::ResidualRmsAddF32,
        w9: Kernel::ResidualRmsAddF32W9,
        w12: Kernel::ResidualRmsAddF32W12,
    });
}
impl NormOut for f16 {
    const RMS: RowKernels = RowKernels {
        generic: Kernel::RmsNormF16,
        w9: Kernel::RmsNormF16W9,
        w12: Kernel::RmsNormF16W12,
    };
    const LN: RowKernels = RowKernels {
        generic: Kernel::LayerNormF16,
        w9: Kernel::LayerNormF16W9,
        w12: Kernel::LayerNormF16W12,
    };
    const RESIDUAL_RMS_NEXT: Option<RowKernels> = Some(RowKernels {
        generic: Kernel::ResidualRmsAddF32F16,
        w9: Kernel::ResidualRmsAddF32F16W9,
        w12: Kernel::ResidualRmsAddF32F16W12,
    });
}

/// The entries of one row kernel (kernels/norm.cu): `generic` takes any width, layout and `rw`;
/// `w9` and `w12` are its vector path for one warp per row with 9 or 12 four-column chunks per lane
/// (h ≤ 1152 or ≤ 1536), in the registers those chunks need and no more.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct RowKernels {
    generic: Kernel,
    w9: Kernel,
    w12: Kernel,
}

const NORM_THREADS: u32 = 256;
/// Rows per block of the one-warp entries (`NORM_ONE_WARP_THREADS` / 32, kernels/norm.cu): one, so
/// the registers alone bound the rows resident per SM.
const NORM_ONE_WARP_ROWS: usize = 1;
/// Columns one chunk per lane covers across a warp (4-column chunks, kernels/norm.cu).
const NORM_CHUNK_COLS: usize = 4 * 32;
/// Columns one warp of the row kernels holds in registers (`NORM_NV` chunks per lane, kernels/norm.cu).
const NORM_WARP_COLS: usize = 12 * NORM_CHUNK_COLS;
/// Rows up to this width fit the norm kernels' registers (8 warps per row).
pub const MAX_NORM_WIDTH: usize = 12 * 1024;

/// Launch of the row kernels (rms_norm, layer_norm, residual_rms_add): `rw` warps per row, the fewest
/// of 1, 2, 4, 8 whose registers hold `h` columns; blocks of max(64, 32·rw) threads (at most
/// `NORM_THREADS`), so 2 rows per block for rw = 1, else 1: small blocks let the register-heavy row
/// kernels fill each SM to its register limit and free a block's slots as soon as its rows finish.
/// With `vec` and one warp per row, the one-warp entry for the chunks the row needs instead
/// ([`row_kernel`]). Returns the kernel, the launch and `rw`.
fn row_launch(k: RowKernels, rows: usize, h: usize, vec: bool) -> (Kernel, LaunchConfig, i32) {
    let mut rw = 1;
    while rw * NORM_WARP_COLS < h {
        rw *= 2;
    }
    if let (true, Some(kernel)) = (vec, row_kernel(k, h)) {
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(NORM_ONE_WARP_ROWS) as u32, 1, 1),
            block_dim: (32 * NORM_ONE_WARP_ROWS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        return (kernel, cfg, 1);
    }
    let threads = (32 * rw).max(64).min(NORM_THREADS as usize);
    let rows_per_block = threads / 32 / rw;
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(rows_per_block) as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    (k.generic, cfg, rw as i32)
}

/// The one-warp entry whose chunks per lane hold `h` columns (9: h ≤ 1152, gemma4's width; 12: h ≤
/// 1536, glm5_next's and step3p7's), `None` above one warp's 1536. Fewer chunks, fewer registers,
/// more rows per SM: gemma4's residual_rms_add at 1152 columns holds 104 registers in `w9` against
/// 182 in the generic entry (kernels/norm.cu).
fn row_kernel(k: RowKernels, h: usize) -> Option<Kernel> {
    match h.div_ceil(NORM_CHUNK_COLS) {
        0..=9 => Some(k.w9),
        10..=12 => Some(k.w12),
        _ => None,
    }
}

/// Vector path flag of rms_norm / layer_norm: 16-byte loads of x (and of the weight / bias) and
/// 16-byte (f32) or 8-byte (bf16, f16) stores of y; needs widths, strides and offsets multiples of 4.
fn norm_vec<O: Elem>(xm: Mat, ym: Mat, in_addrs: &[u64], ya: u64) -> i32 {
    (xm.cols.is_multiple_of(4)
        && xm.ld.is_multiple_of(4)
        && ym.ld.is_multiple_of(4)
        && all_aligned(in_addrs, 16)
        && all_aligned(&[ya], 4 * std::mem::size_of::<O>() as u64)) as i32
}

fn check_width(op: &'static str, h: usize, rows: usize) -> Result<()> {
    if h == 0 || h > MAX_NORM_WIDTH {
        return Err(GpuError::shape(
            op,
            format!("row width {h} outside 1..={MAX_NORM_WIDTH}"),
        ));
    }
    if rows == 0 || rows > i32::MAX as usize {
        return Err(GpuError::shape(op, format!("{rows} rows")));
    }
    Ok(())
}

impl Device {
    /// RMSNorm of `x` rows (f32) into `y` (f32, bf16 or f16): `y = clamp(x·rsqrt(mean(x²)+eps)·w)`; `w = None` is weightless.
    pub fn rms_norm<O: NormOut>(
        &self,
        x: &DeviceBuffer<f32>,
        xm: Mat,
        w: Option<&DeviceBuffer<f32>>,
        y: &mut DeviceBuffer<O>,
        ym: Mat,
        eps: f32,
        clamp: Clamp,
    ) -> Result<()> {
        const OP: &str = "rms_norm";
        xm.check(OP, "x", x)?;
        ym.check(OP, "y", y)?;
        if (xm.rows, xm.cols) != (ym.rows, ym.cols) {
            return Err(GpuError::shape(
                OP,
                format!("x {}×{} vs y {}×{}", xm.rows, xm.cols, ym.rows, ym.cols),
            ));
        }
        check_width(OP, xm.cols, xm.rows)?;
        if let Some(w) = w {
            need_len(OP, "w", w, xm.cols)?;
        }
        let (xa, wa, ya) = (off(x, xm.offset), opt_addr(w), off(y, ym.offset));
        let vec = norm_vec::<O>(xm, ym, &[xa, wa], ya);
        let (kernel, cfg, rw) = row_launch(O::RMS, xm.rows, xm.cols, vec == 1);
        let (rows, h, ldx, ldy) = (xm.rows as i32, xm.cols as i32, xm.ld as i64, ym.ld as i64);
        self.launch(kernel, cfg, |b| {
            b.arg(&xa)
                .arg(&wa)
                .arg(&ya)
                .arg(&rows)
                .arg(&h)
                .arg(&ldx)
                .arg(&ldy)
                .arg(&eps)
                .arg(&clamp.lo)
                .arg(&clamp.hi)
                .arg(&rw)
                .arg(&vec);
        })
    }

    /// LayerNorm (two-pass, biased variance) of `x` rows into `y`: `(x − μ)/√(σ² + eps)·w + b`.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm<O: NormOut>(
        &self,
        x: &DeviceBuffer<f32>,
        xm: Mat,
        w: Option<&DeviceBuffer<f32>>,
        b: Option<&DeviceBuffer<f32>>,
        y: &mut DeviceBuffer<O>,
        ym: Mat,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layer_norm";
        xm.check(OP, "x", x)?;
        ym.check(OP, "y", y)?;
        if (xm.rows, xm.cols) != (ym.rows, ym.cols) {
            return Err(GpuError::shape(
                OP,
                format!("x {}×{} vs y {}×{}", xm.rows, xm.cols, ym.rows, ym.cols),
            ));
        }
        check_width(OP, xm.cols, xm.rows)?;
        for (name, v) in [("w", w), ("b", b)] {
            if let Some(v) = v {
                need_len(OP, name, v, xm.cols)?;
            }
        }
        let (xa, wa, ba, ya) = (
            off(x, xm.offset),
            opt_addr(w),
            opt_addr(b),
            off(y, ym.offset),
        );
        let vec = norm_vec::<O>(xm, ym, &[xa, wa, ba], ya);
        let (kernel, cfg, rw) = row_launch(O::LN, xm.rows, xm.cols, vec == 1);
        let (rows, h, ldx, ldy) = (xm.rows as i32, xm.cols as i32, xm.ld as i64, ym.ld as i64);
        self.launch(kernel, cfg, |bld| {
            bld.arg(&xa)
                .arg(&wa)
                .arg(&ba)
                .arg(&ya)
                .arg(&rows)
                .arg(&h)
                .arg(&ldx)
                .arg(&ldy)
                .arg(&eps)
                .arg(&rw)
                .arg(&vec);
        })
    }

    /// `x += scale ⊙ clamp(y)` over dense `x [rows, h]` (f32 residual stream); `scale = None` is 1
    /// (plain residual), `Some` is step3p7's LayerScale. `h % 4 == 0`.
    pub fn residual_add(
        &self,
        x: &mut DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        ym: Mat,
        scale: Option<&DeviceBuffer<f32>>,
        clamp: Clamp,
    ) -> Result<()> {
        const OP: &str = "residual_add";
        ym.check(OP, "y", y)?;
        Mat::dense(ym.rows, ym.cols).check(OP, "x", x)?;
        if !ym.cols.is_multiple_of(4) || !ym.offset.is_multiple_of(4) || !ym.ld.is_multiple_of(4) {
            return Err(GpuError::shape(
                OP,
                format!(
                    "width {}, y stride {} and offset {} must be multiples of 4",
                    ym.cols, ym.ld, ym.offset
                ),
            ));
        }
        if let Some(s) = scale {
            need_len(OP, "scale", s, ym.cols)?;
        }
        let (xa, ya, sa) = (x.addr(), off(y, ym.offset), opt_addr(scale));
        let (rows, h, ldy) = (ym.rows as i64, ym.cols as i32, ym.ld as i64);
        self.launch(
            Kernel::ResidualAddF32,
            grid_stride(ym.rows * ym.cols / 4),
            |b| {
                b.arg(&xa)
                    .arg(&ya)
                    .arg(&sa)
                    .arg(&rows)
                    .arg(&h)
                    .arg(&ldy)
                    .arg(&clamp.lo)
                    .arg(&clamp.hi);
            },
        )
    }

    /// gemma4 sandwich: `x += RMS(clamp(y))·w_post`; then, with `next = Some((w, out, eps))`, also
    /// `out = RMS(x)·w` (bf16, dense) — the next block's pre-norm in the same pass.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_rms_add(
        &self,
        x: &mut DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        ym: Mat,
        w_post: Option<&DeviceBuffer<f32>>,
        eps: f32,
        clamp: Clamp,
        next: Option<(Option<&DeviceBuffer<f32>>, &mut DeviceBuffer<bf16>, f32)>,
    ) -> Result<()> {
        self.residual_rms_add_next(x, y, ym, w_post, eps, clamp, next)
    }

    /// [`Device::residual_rms_add`] with the next pre-norm in f16 (the f16 product mode).
    #[allow(clippy::too_many_arguments)]
    pub fn residual_rms_add_f16(
        &self,
        x: &mut DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        ym: Mat,
        w_post: Option<&DeviceBuffer<f32>>,
        eps: f32,
        clamp: Clamp,
        next: Option<(Option<&DeviceBuffer<f32>>, &mut DeviceBuffer<f16>, f32)>,
    ) -> Result<()> {
        self.residual_rms_add_next(x, y, ym, w_post, eps, clamp, next)
    }

    /// [`Device::residual_rms_add`] with the next pre-norm in `N` (bf16 or f16).
    #[allow(clippy::too_many_arguments)]
    fn residual_rms_add_next<N: NormOut>(
        &self,
        x: &mut DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        ym: Mat,
        w_post: Option<&DeviceBuffer<f32>>,
        eps: f32,
        clamp: Clamp,
        next: Option<(Option<&DeviceBuffer<f32>>, &mut DeviceBuffer<N>, f32)>,
    ) -> Result<()> {
        const OP: &str = "residual_rms_add";
        let Some(kernels) = N::RESIDUAL_RMS_NEXT else {
            return Err(GpuError::shape(
                OP,
                format!("no kernel writes the next pre-norm in {}", N::NAME),
            ));
        };
        ym.check(OP, "y", y)?;
        let dense = Mat::dense(ym.rows, ym.cols);
        dense.check(OP, "x", x)?;
        check_width(OP, ym.cols, ym.rows)?;
        if let Some(w) = w_post {
            need_len(OP, "w_post", w, ym.cols)?;
        }
        let (nw, no, neps) = match next {
            Some((w, out, e)) => {
                dense.check(OP, "next_out", out)?;
                if let Some(w) = w {
                    need_len(OP, "next_w", w, ym.cols)?;
                }
                (opt_addr(w), out.addr(), e)
            }
            None => (0, 0, 0.0),
        };
        let (xa, ya, wa) = (x.addr(), off(y, ym.offset), opt_addr(w_post));
        // vector path: float4 rows of y and x (x dense), 8-byte bf16 / f16 stores into next_out
        let vec = (ym.cols.is_multiple_of(4)
            && ym.ld.is_multiple_of(4)
            && all_aligned(&[xa, ya, wa, nw], 16)
            && all_aligned(&[no], 8)) as i32;
        let (kernel, cfg, rw) = row_launch(kernels, ym.rows, ym.cols, vec == 1);
        let (rows, h, ldy) = (ym.rows as i32, ym.cols as i32, ym.ld as i64);
        self.launch(kernel, cfg, |b| {
            b.arg(&xa)
                .arg(&ya)
                .arg(&wa)
                .arg(&rows)
                .arg(&h)
                .arg(&ldy)
                .arg(&eps)
                .arg(&clamp.lo)
                .arg(&clamp.hi)
                .arg(&nw)
                .arg(&no)
                .arg(&neps)
                .arg(&rw)
                .arg(&vec);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which entry and launch each width gets: the one-warp entries (one row per 32-thread block)
    /// where the vector path holds and one warp's 12 chunks cover the row, the generic entry
    /// otherwise, with the warps per row it needs.
    #[test]
    fn row_launch_picks_the_entry_the_width_needs() {
        let k = <bf16 as NormOut>::RMS;
        // (h, vec) -> (kernel, threads per block, rw)
        let table = [
            ((72, true), (Kernel::RmsNormBf16W9, 32, 1)),
            ((1152, true), (Kernel::RmsNormBf16W9, 32, 1)),
            ((1153, true), (Kernel::RmsNormBf16W12, 32, 1)),
            ((1536, true), (Kernel::RmsNormBf16W12, 32, 1)),
            ((1537, true), (Kernel::RmsNormBf16, 64, 2)),
            ((4096, true), (Kernel::RmsNormBf16, 128, 4)),
            ((1152, false), (Kernel::RmsNormBf16, 64, 1)),
            ((MAX_NORM_WIDTH, true), (Kernel::RmsNormBf16, 256, 8)),
        ];
        for ((h, vec), (want, threads, rw)) in table {
            let (got, cfg, r) = row_launch(k, 2394, h, vec);
            assert_eq!(
                (got, cfg.block_dim.0, r),
                (want, threads, rw),
                "h {h} vec {vec}"
            );
            let rows_per_block = (threads / 32) as usize / rw as usize;
            assert_eq!(
                cfg.grid_dim.0 as usize,
                2394usize.div_ceil(rows_per_block),
                "h {h}"
            );
        }
        let r = <f16 as NormOut>::RESIDUAL_RMS_NEXT.map(|k| row_launch(k, 7, 1152, true).0);
        assert_eq!(r, Some(Kernel::ResidualRmsAddF32F16W9));
    }
}
