//! What every launcher of `ops` shares: the strided matrix view [`Mat`] with its extent check,
//! checked sizes, and the alignment test of the vector paths.

use crate::device::{DeviceBuffer, Elem};
use crate::{GpuError, Result};

/// A row-major matrix inside a buffer: `rows × cols`, row stride `ld`, starting at `offset` (elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mat {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Row stride (≥ cols).
    pub ld: usize,
    /// Offset of element (0, 0).
    pub offset: usize,
}

impl Mat {
    /// Dense `rows × cols` at offset 0.
    pub fn dense(rows: usize, cols: usize) -> Self {
        Mat {
            rows,
            cols,
            ld: cols,
            offset: 0,
        }
    }
    /// The same with another row stride and offset.
    pub fn strided(rows: usize, cols: usize, ld: usize, offset: usize) -> Self {
        Mat {
            rows,
            cols,
            ld,
            offset,
        }
    }
    pub(super) fn check<T: Elem>(
        &self,
        op: &'static str,
        what: &str,
        b: &DeviceBuffer<T>,
    ) -> Result<()> {
        self.check_len(op, what, T::NAME, b.len())
    }

    /// The matrix's extent against a buffer of `len` elements of type `elem`, in checked
    /// arithmetic: every launch's SAFETY argument rests on this, so a sum or product that would
    /// wrap (in a release build) is an error, never a small number that fits. The kernels take
    /// the column count as an i32.
    pub(crate) fn check_len(
        &self,
        op: &'static str,
        what: &str,
        elem: &str,
        len: usize,
    ) -> Result<()> {
        if self.rows == 0 || self.cols == 0 {
            return Err(GpuError::shape(
                op,
                format!("{what}: empty {}×{}", self.rows, self.cols),
            ));
        }
        if self.ld < self.cols {
            return Err(GpuError::shape(
                op,
                format!("{what}: row stride {} < {} columns", self.ld, self.cols),
            ));
        }
        if self.cols > i32::MAX as usize {
            return Err(GpuError::shape(
                op,
                format!("{what}: {} columns exceed i32", self.cols),
            ));
        }
        let need = (self.rows - 1)
            .checked_mul(self.ld)
            .and_then(|n| n.checked_add(self.offset))
            .and_then(|n| n.checked_add(self.cols));
        let Some(need) = need.filter(|&n| n <= len) else {
            return Err(GpuError::shape(
                op,
                format!(
                    "{what}: {}×{} {elem} (stride {}, offset {}) needs {} elements, buffer has {len}",
                    self.rows,
                    self.cols,
                    self.ld,
                    self.offset,
                    need.map_or("more than usize::MAX".to_string(), |n| n.to_string()),
                ),
            ));
        };
        debug_assert!(need <= len);
        Ok(())
    }
}

/// `dims` multiplied in checked arithmetic: a product that would wrap is an error naming the
/// operand, not a small number that passes a length check.
pub(crate) fn product(op: &'static str, what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| GpuError::shape(op, format!("{what}: {dims:?} elements overflow usize")))
}

/// A size the kernels take as an i32, converted, or an error naming it.
pub(crate) fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| GpuError::shape(op, format!("{what} = {v} exceeds i32")))
}

pub(super) fn need_len<T: Elem>(
    op: &'static str,
    what: &str,
    b: &DeviceBuffer<T>,
    need: usize,
) -> Result<()> {
    if b.len() < need {
        return Err(GpuError::shape(
            op,
            format!(
                "{what}: needs {need} {} elements, buffer has {}",
                T::NAME,
                b.len()
            ),
        ));
    }
    Ok(())
}

pub(super) fn off<T: Elem>(b: &DeviceBuffer<T>, offset: usize) -> u64 {
    b.addr() + (offset * std::mem::size_of::<T>()) as u64
}

/// Whether every device address is a multiple of `bytes` (null counts as aligned).
pub(super) fn all_aligned(addrs: &[u64], bytes: u64) -> bool {
    addrs.iter().all(|a| a % bytes == 0)
}

/// A closed interval `[lo, hi]`; [`Clamp::NONE`] is (−∞, ∞). gemma4's clipped linears, glm's SwiGLU limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clamp {
    /// Lower bound.
    pub lo: f32,
    /// Upper bound.
    pub hi: f32,
}

impl Clamp {
    /// No clamping.
    pub const NONE: Clamp = Clamp {
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
    };
    /// `[lo, hi]`.
    pub fn new(lo: f32, hi: f32) -> Self {
        Clamp { lo, hi }
    }
    /// `x` clamped to `[lo, hi]` by torch.clamp's law, the oracle's and the kernels' `clampf`: a
    /// NaN stays NaN (`f32::max`/`min` alone would return the bound and hide it from every
    /// finiteness check downstream).
    pub fn apply(self, x: f32) -> f32 {
        if x.is_nan() {
            x
        } else {
            x.max(self.lo).min(self.hi)
        }
    }
}

impl Default for Clamp {
    fn default() -> Self {
        Clamp::NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torch.clamp keeps a NaN (torch 2.11: `torch.tensor([nan]).clamp(-1, 1)` is `[nan]`); bounds
    /// and infinities clamp as usual.
    #[test]
    fn clamp_keeps_nan_as_torch_does() {
        let c = Clamp::new(-1.0, 2.0);
        assert!(c.apply(f32::NAN).is_nan());
        assert_eq!(c.apply(f32::INFINITY), 2.0);
        assert_eq!(c.apply(f32::NEG_INFINITY), -1.0);
        assert_eq!(c.apply(0.5), 0.5);
        assert!(Clamp::NONE.apply(f32::NAN).is_nan());
    }

    /// The extent check every Mat-based launch rests on, on the host: sums and products that
    /// would wrap in a release build (offsets and strides near usize::MAX) are errors, as are
    /// the plain misfits; exact fits pass.
    #[test]
    fn mat_extent_check_never_wraps() {
        let ok = |m: Mat, len: usize| m.check_len("op", "x", "f32", len).is_ok();
        assert!(ok(Mat::dense(3, 4), 12));
        assert!(!ok(Mat::dense(3, 4), 11));
        assert!(ok(Mat::strided(3, 4, 10, 2), 2 + 2 * 10 + 4));
        assert!(!ok(Mat::strided(3, 4, 10, 2), 2 + 2 * 10 + 3));
        assert!(!ok(Mat::dense(0, 4), 100));
        assert!(!ok(Mat::strided(2, 4, 3, 0), 100), "ld < cols");
        // offset + cols wraps to 3
        assert!(!ok(Mat::strided(1, 4, 4, usize::MAX), 16));
        // (rows − 1)·ld wraps to 0: 3 rows of stride 2⁶³ (on 64-bit) would "need" 4 elements
        let half = 1usize << (usize::BITS - 1);
        assert!(!ok(Mat::strided(3, 4, half, 0), 16));
        assert!(
            !ok(Mat::strided(2, 4, half, 0), 16),
            "no wrap, just too large"
        );
        // (rows − 1)·ld + offset wraps
        assert!(!ok(Mat::strided(3, 4, half / 2, half), 16));
        assert!(!ok(Mat::strided(usize::MAX, 1, 1, 1), usize::MAX));
        // the kernels take the column count as an i32
        let wide = i32::MAX as usize + 1;
        assert!(!ok(Mat::dense(1, wide), wide));
        assert!(ok(Mat::dense(1, wide - 1), wide));
        let e = Mat::strided(3, 4, half, 0)
            .check_len("rms_norm", "x", "f32", 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than usize::MAX"), "{e}");
    }

    /// The element counts of the non-Mat launches: products that would wrap are errors.
    #[test]
    fn element_counts_never_wrap() {
        assert_eq!(product("op", "x", &[2, 3, 4]).ok(), Some(24));
        assert_eq!(product("op", "x", &[]).ok(), Some(1));
        assert!(product("op", "x", &[1 << 40, 1 << 30]).is_err());
        assert!(product("op", "x", &[usize::MAX, 2]).is_err());
        // im2col's 9·c·oh·ow·batch, a wrapping product of small-looking factors
        assert!(product("im2col_3x3s2", "out", &[1 << 21, 1 << 21, 1 << 21, 9, 1]).is_err());
        assert_eq!(to_i32("op", "h", 7).ok(), Some(7));
        assert!(to_i32("op", "h", i32::MAX as usize + 1).is_err());
    }
}
