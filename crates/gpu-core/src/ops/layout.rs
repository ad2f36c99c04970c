//! Launchers of `kernels/layout.cu`: position tables, bilinear resize, pooling, the 2×2 merge
//! gather and the 3×3 stride-2 im2col.

use cudarc::driver::PushKernelArg;

use super::act::HalfElem;
use super::common::{need_len, product, to_i32, Mat};
use crate::device::{grid_stride, DeviceBuffer};
use crate::kernels::Kernel;
use crate::{Device, GpuError, Result};

impl Device {
    /// gemma4 position tables: `x[r] += T[0, px] + T[1, py]` (pad rows with a negative position get nothing).
    /// `table` is `[2, t_rows, h]`, `pos` `[rows, 2]` (x, y).
    pub fn pos_add_xy(
        &self,
        x: &mut DeviceBuffer<f32>,
        rows: usize,
        h: usize,
        table: &DeviceBuffer<f32>,
        t_rows: usize,
        pos: &DeviceBuffer<i32>,
    ) -> Result<()> {
        const OP: &str = "pos_add_xy";
        Mat::dense(rows, h).check(OP, "x", x)?;
        need_len(OP, "table", table, product(OP, "table", &[2, t_rows, h])?)?;
        need_len(OP, "pos", pos, product(OP, "pos", &[2, rows])?)?;
        let (xa, ta, pa, n, hh, tr) = (
            x.addr(),
            table.addr(),
            pos.addr(),
            rows as i64,
            to_i32(OP, "h", h)?,
            t_rows as i64,
        );
        // Positions ≥ t_rows would read past the table: the kernel trusts them, so the caller's
        // positions come from the grid (< t_rows by construction); we check on the host side cheaply
        // only via the table length above.
        self.launch(Kernel::PosAddXyF32, grid_stride(rows * h), |b| {
            b.arg(&xa).arg(&ta).arg(&pa).arg(&n).arg(&hh).arg(&tr);
        })
    }

    /// Bilinear resize (align_corners = false) of a `[ih, iw, h]` table to `[oh, ow, h]`.
    #[allow(clippy::too_many_arguments)]
    pub fn bilinear_resize(
        &self,
        input: &DeviceBuffer<f32>,
        ih: usize,
        iw: usize,
        out: &mut DeviceBuffer<f32>,
        oh: usize,
        ow: usize,
        h: usize,
    ) -> Result<()> {
        const OP: &str = "bilinear_resize";
        if [ih, iw, oh, ow, h].contains(&0) {
            return Err(GpuError::shape(OP, "empty grid"));
        }
        need_len(OP, "input", input, product(OP, "input", &[ih, iw, h])?)?;
        let n_out = product(OP, "out", &[oh, ow, h])?;
        need_len(OP, "out", out, n_out)?;
        let (oa, ia) = (out.addr(), input.addr());
        let (a, bb, c, d, e) = (
            to_i32(OP, "ih", ih)?,
            to_i32(OP, "iw", iw)?,
            to_i32(OP, "oh", oh)?,
            to_i32(OP, "ow", ow)?,
            to_i32(OP, "h", h)?,
        );
        self.launch(Kernel::BilinearResizeF32, grid_stride(n_out), |b| {
            b.arg(&oa).arg(&ia).arg(&a).arg(&bb).arg(&c).arg(&d).arg(&e);
        })
    }

    /// k×k average pool of a `[gh, gw, h]` grid to `[gh/k, gw/k, h]`, times `scale`.
    #[allow(clippy::too_many_arguments)]
    pub fn avg_pool(
        &self,
        input: &DeviceBuffer<f32>,
        gh: usize,
        gw: usize,
        k: usize,
        h: usize,
        scale: f32,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        const OP: &str = "avg_pool";
        if k == 0 || !gh.is_multiple_of(k) || !gw.is_multiple_of(k) || h == 0 {
            return Err(GpuError::shape(
                OP,
                format!("grid {gh}×{gw} not divisible by k = {k}"),
            ));
        }
        need_len(OP, "input", input, product(OP, "input", &[gh, gw, h])?)?;
        let n_out = product(OP, "out", &[gh / k, gw / k, h])?;
        need_len(OP, "out", out, n_out)?;
        let (oa, ia) = (out.addr(), input.addr());
        let (a, bb, c, d) = (
            to_i32(OP, "gh", gh)?,
            to_i32(OP, "gw", gw)?,
            to_i32(OP, "k", k)?,
            to_i32(OP, "h", h)?,
        );
        self.launch(Kernel::AvgPoolF32, grid_stride(n_out), |b| {
            b.arg(&oa)
                .arg(&ia)
                .arg(&a)
                .arg(&bb)
                .arg(&c)
                .arg(&d)
                .arg(&scale);
        })
    }

    /// 2×2 merge gather into `[blocks, 4h]` rows ordered (c, ky, kx), bf16 or f16. `grid_w = None`:
    /// tokens are block-major (4 consecutive tokens per block, glm); `Some(gw)`: a raster grid of width gw.
    pub fn block_gather_2x2<T: HalfElem>(
        &self,
        input: &DeviceBuffer<T>,
        tokens: usize,
        h: usize,
        grid_w: Option<usize>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        const OP: &str = "block_gather_2x2";
        if !tokens.is_multiple_of(4) || h == 0 {
            return Err(GpuError::shape(
                OP,
                format!("{tokens} tokens is not a multiple of 4"),
            ));
        }
        if let Some(gw) = grid_w {
            if gw == 0 || gw % 2 != 0 || !tokens.is_multiple_of(2 * gw) {
                return Err(GpuError::shape(
                    OP,
                    format!("{tokens} tokens is not a grid of even width {gw} and even height"),
                ));
            }
        }
        let n = product(OP, "tokens × h", &[tokens, h])?;
        need_len(OP, "input", input, n)?;
        need_len(OP, "out", out, n)?;
        let (oa, ia, nb, hh, gw) = (
            out.addr(),
            input.addr(),
            (tokens / 4) as i64,
            to_i32(OP, "h", h)?,
            to_i32(OP, "grid_w", grid_w.unwrap_or(0))?,
        );
        self.launch(T::BLOCK_GATHER_2X2, grid_stride(n), |b| {
            b.arg(&oa).arg(&ia).arg(&nb).arg(&hh).arg(&gw);
        })
    }

    /// 3×3 stride-2 pad-1 im2col of `batch` `[gh, gw, c]` grids into `[batch·oh·ow, 9c]` rows (c, ky, kx),
    /// bf16 or f16.
    pub fn im2col_3x3s2<T: HalfElem>(
        &self,
        input: &DeviceBuffer<T>,
        batch: usize,
        gh: usize,
        gw: usize,
        c: usize,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        const OP: &str = "im2col_3x3s2";
        let (oh, ow) = ((gh.max(1) - 1) / 2 + 1, (gw.max(1) - 1) / 2 + 1);
        if [batch, gh, gw, c].contains(&0) {
            return Err(GpuError::shape(OP, "empty input"));
        }
        need_len(
            OP,
            "input",
            input,
            product(OP, "input", &[batch, gh, gw, c])?,
        )?;
        let n_out = product(OP, "out", &[batch, oh, ow, 9, c])?;
        need_len(OP, "out", out, n_out)?;
        // the kernel keeps an image's output position (< oh·ow) in an int
        to_i32(OP, "oh × ow", product(OP, "oh × ow", &[oh, ow])?)?;
        let (oa, ia) = (out.addr(), input.addr());
        let (bt, a, bb, cc) = (
            to_i32(OP, "batch", batch)?,
            to_i32(OP, "gh", gh)?,
            to_i32(OP, "gw", gw)?,
            to_i32(OP, "c", c)?,
        );
        self.launch(T::IM2COL_3X3S2, grid_stride(n_out), |b| {
            b.arg(&oa).arg(&ia).arg(&bt).arg(&a).arg(&bb).arg(&cc);
        })
    }
}

/// Output rows of a 3×3 stride-2 pad-1 convolution over `g` rows: `(g − 1)/2 + 1`.
pub fn conv3x3s2_out(g: usize) -> usize {
    (g.max(1) - 1) / 2 + 1
}
