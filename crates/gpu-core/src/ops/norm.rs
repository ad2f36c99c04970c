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
    #[doc(hidden)]
    const RMS: Kernel;
    #[doc(hidden)]
    const LN: Kernel;
    /// [`Device::residual_rms_add`]'s next pre-norm in this type (`None`: f32, no such kernel).
    #[doc(hidden)]
    const RESIDUAL_RMS_NEXT: Option<Kernel>;
}
impl NormOut for f32 {
    const RMS: Kernel = Kernel::RmsNormF32;
    const LN: Kernel = Kernel::LayerNormF32;
    const RESIDUAL_RMS_NEXT: Option<Kernel> = None;
}
impl NormOut for bf16 {
    const RMS: Kernel = Kernel::RmsNormBf16;
    const LN: Kernel = Kernel::LayerNormBf16;
    const RESIDUAL_RMS_NEXT: Option<Kernel> = Some(Kernel::ResidualRmsAddF32);
}
impl NormOut for f16 {
    const RMS: Kernel = Kernel::RmsNormF16;
    const LN: Kernel = Kernel::LayerNormF16;
    const RESIDUAL_RMS_NEXT: Option<Kernel> = Some(Kernel::ResidualRmsAddF32F16);
}

const NORM_THREADS: u32 = 256;
/// Columns one warp of the row kernels holds in registers (`NORM_NV`·4 per lane, kernels/norm.cu).
const NORM_WARP_COLS: usize = 12 * 4 * 32;
/// Rows up to this width fit the norm kernels' registers (8 warps per row).
pub const MAX_NORM_WIDTH: usize = 12 * 1024;

/// Launch of the row kernels (rms_norm, layer_norm, residual_rms_add): `rw` warps per row, the fewest
/// of 1, 2, 4, 8 whose registers hold `h` columns; blocks of max(64, 32·rw) threads (at most
/// `NORM_THREADS`), so 2 rows per block for rw = 1, else 1: small blocks let the register-heavy row
/// kernels fill each SM to its register limit and free a block's slots as soon as its rows finish.
/// Returns `rw`.
fn row_cfg(rows: usize, h: usize) -> (LaunchConfig, i32) {
    let mut rw = 1;
    while rw * NORM_WARP_COLS < h {
        rw *= 2;
    }
    let threads = (32 * rw).max(64).min(NORM_THREADS as usize);
    let rows_per_block = threads / 32 / rw;
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(rows_per_block) as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    (cfg, rw as i32)
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
        let (cfg, rw) = row_cfg(xm.rows, xm.cols);
        let vec = norm_vec::<O>(xm, ym, &[xa, wa], ya);
        let (rows, h, ldx, ldy) = (xm.rows as i32, xm.cols as i32, xm.ld as i64, ym.ld as i64);
        self.launch(O::RMS, cfg, |b| {
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
        let (cfg, rw) = row_cfg(xm.rows, xm.cols);
        let vec = norm_vec::<O>(xm, ym, &[xa, wa, ba], ya);
        let (rows, h, ldx, ldy) = (xm.rows as i32, xm.cols as i32, xm.ld as i64, ym.ld as i64);
        self.launch(O::LN, cfg, |bld| {
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
        let Some(kernel) = N::RESIDUAL_RMS_NEXT else {
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
        let (cfg, rw) = row_cfg(ym.rows, ym.cols);
        // vector path: float4 rows of y and x (x dense), 8-byte bf16 / f16 stores into next_out
        let vec = (ym.cols.is_multiple_of(4)
            && ym.ld.is_multiple_of(4)
            && all_aligned(&[xa, ya, wa, nw], 16)
            && all_aligned(&[no], 8)) as i32;
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
