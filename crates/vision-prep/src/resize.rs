//! Bit-exact twin of PyTorch's antialiased uint8 resize on CPU, the resampler that
//! `torchvision.transforms.v2.functional.resize(uint8, BICUBIC|BILINEAR, antialias=True)` calls.
//!
//! Law (aten/src/ATen/native/cpu/UpSampleKernel.cpp `_compute_indices_min_size_weights_aa`,
//! `_compute_index_ranges_int16_weights`; UpSampleKernelAVXAntialias.h, Pillow-SIMD derived):
//! - per axis, `scale = in/out` (f64); `support = (interp/2)·scale` when `scale ≥ 1` else `interp/2`
//!   (interp = 2 bilinear, 4 bicubic); taps at most `ceilf(support)·2 + 1`;
//! - output `i`: `center = scale·(i+0.5)`, `xmin = max(trunc(center − support + 0.5), 0)`,
//!   `xsize = min(trunc(center + support + 0.5), in) − xmin`, weights
//!   `w_j = filter((j + xmin − center + 0.5)·invscale)` in f64 normalised by their sum;
//! - bicubic filter is Keys with `a = −0.5` (not the −0.75 of the non-antialiased path);
//! - weights quantised to i16 with a precision `p` (the largest `p < 22` with
//!   `round(wmax·2^(p+1)) < 2^15`, `wmax` over the whole axis), rounding half away from zero;
//! - accumulate in i32 from `2^(p−1)`, arithmetic shift right by `p`, clamp to 0..=255;
//! - horizontal pass first into a u8 buffer, then the vertical pass; an axis whose size does not change is
//!   skipped (its weights would be the identity anyway).

use rayon::prelude::*;

use crate::pages::Scratch;
use crate::{PrepError, Result};

/// Resampling filter of the vendor processors (PIL codes 3 and 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Keys cubic, `a = −0.5`, support 2 (PIL `BICUBIC` = 3).
    Bicubic,
    /// Triangle, support 1 (PIL `BILINEAR` = 2).
    Bilinear,
}

impl Filter {
    /// Half of torch's `interp_size` (2 for bilinear, 4 for bicubic).
    fn half_support(self) -> f64 {
        match self {
            Filter::Bicubic => 2.0,
            Filter::Bilinear => 1.0,
        }
    }

    /// torch `aa_filter` for this mode.
    fn eval(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Bicubic => {
                // torch antialias bicubic: Keys kernel with a = -0.5 (Pillow's value).
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
                } else {
                    0.0
                }
            }
        }
    }

    /// Map a PIL resample code as found in `preprocessor_config.json` (`"resample": 3`).
    pub fn from_pil_code(code: i64) -> Option<Filter> {
        match code {
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            _ => None,
        }
    }
}

/// Quantised weights for one axis.
#[derive(Debug, Clone)]
pub(crate) struct AxisWeights {
    /// First source index per output index.
    pub start: Vec<usize>,
    /// Number of taps per output index.
    pub len: Vec<usize>,
    /// `stride` weights per output index, zero past `len`.
    pub weights: Vec<i16>,
    /// Row stride of `weights`: torch's tap bound rounded up to a multiple of 4, so the SIMD loops
    /// may read whole groups of 4 taps (the padding weighs 0).
    pub stride: usize,
    /// Fixed-point precision bits.
    pub precision: u32,
    /// Groups of 4 taps that cover the longest output (`max len / 4`, rounded up).
    pub groups: usize,
}

impl AxisWeights {
    pub(crate) fn new(input: usize, output: usize, filter: Filter) -> AxisWeights {
        let scale = input as f64 / output as f64;
        let support = if scale >= 1.0 {
            filter.half_support() * scale
        } else {
            filter.half_support()
        };
        // torch: `(int) ceilf(support) * 2 + 1` (ceilf on the float-rounded support).
        let taps = ((support as f32).ceil() as usize) * 2 + 1;
        let stride = taps.div_ceil(4) * 4;
        let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
        let mut wf = vec![0.0f64; output * stride];
        let mut start = Vec::with_capacity(output);
        let mut len = Vec::with_capacity(output);
        let mut wmax = 0.0f64;
        for i in 0..output {
            let center = scale * (i as f64 + 0.5);
            // `static_cast<int64_t>` truncates toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xsize =
                (((center + support + 0.5) as i64).min(input as i64) - xmin).clamp(0, taps as i64);
            let row = &mut wf[i * stride..(i + 1) * stride];
            let mut total = 0.0f64;
            for (j, w) in row.iter_mut().enumerate().take(xsize as usize) {
                let v = filter.eval((j as f64 + xmin as f64 - center + 0.5) * invscale);
                *w = v;
                total += v;
            }
            if total != 0.0 {
                for w in row.iter_mut().take(xsize as usize) {
                    *w /= total;
                    wmax = wmax.max(*w);
                }
            }
            start.push(xmin as usize);
            len.push(xsize as usize);
        }
        let mut precision = 0u32;
        while precision < 22 {
            let next = (0.5 + wmax * f64::from(1u32 << (precision + 1))) as i32;
            if next >= (1 << 15) {
                break;
            }
            precision += 1;
        }
        let one = f64::from(1u32 << precision);
        let weights = wf
            .iter()
            .map(|&w| {
                let v = w * one;
                (if v < 0.0 { v - 0.5 } else { v + 0.5 }) as i16
            })
            .collect();
        let groups = len.iter().copied().max().unwrap_or(0).div_ceil(4);
        AxisWeights {
            start,
            len,
            weights,
            stride,
            precision,
            groups,
        }
    }

    /// The `len` weights of output `i`.
    #[inline(always)]
    fn taps(&self, i: usize) -> &[i16] {
        &self.weights[i * self.stride..i * self.stride + self.len[i]]
    }
}

#[inline]
fn finish(acc: i32, precision: u32) -> u8 {
    (acc >> precision).clamp(0, 255) as u8
}

/// One output row of the horizontal pass, portable (any channel count).
#[inline(always)]
fn horizontal_row<const C: usize>(srow: &[u8], aw: &AxisWeights, drow: &mut [u8]) {
    let round = 1i32 << (aw.precision - 1);
    for (ox, out) in drow.chunks_exact_mut(C).enumerate() {
        let s = aw.start[ox];
        let w = aw.taps(ox);
        let px = &srow[s * C..(s + w.len()) * C];
        let mut acc = [round; C];
        for (p, &wk) in px.chunks_exact(C).zip(w) {
            let wk = i32::from(wk);
            for c in 0..C {
                acc[c] += i32::from(p[c]) * wk;
            }
        }
        for c in 0..C {
            out[c] = finish(acc[c], aw.precision);
        }
    }
}

/// One output row of the horizontal pass for RGB expanded to RGBX (the portable path: 4 lanes
/// auto-vectorise; the fourth is 0).
#[inline(always)]
fn horizontal_row_rgbx(srow4: &[u8], aw: &AxisWeights, drow: &mut [u8]) {
    let round = 1i32 << (aw.precision - 1);
    for (ox, out) in drow.chunks_exact_mut(3).enumerate() {
        let s = aw.start[ox];
        let w = aw.taps(ox);
        let n = w.len();
        let px = &srow4[s * 4..(s + n) * 4];
        let mut acc = [round; 4];
        // Taps in pairs: a·w0 + b·w1 per lane (the pmaddwd shape); the odd tap last.
        let mut pairs = px.chunks_exact(8).zip(w.chunks_exact(2));
        for (p, wk) in &mut pairs {
            let (w0, w1) = (i32::from(wk[0]), i32::from(wk[1]));
            for c in 0..4 {
                acc[c] += i32::from(p[c]) * w0 + i32::from(p[4 + c]) * w1;
            }
        }
        if n % 2 == 1 {
            let wk = i32::from(w[n - 1]);
            let p = &px[(n - 1) * 4..n * 4];
            for c in 0..4 {
                acc[c] += i32::from(p[c]) * wk;
            }
        }
        for c in 0..3 {
            out[c] = finish(acc[c], aw.precision);
        }
    }
}

fn expand_rgbx(src: &[u8], dst: &mut Vec<u8>) {
    dst.clear();
    dst.extend(src.chunks_exact(3).flat_map(|p| [p[0], p[1], p[2], 0]));
}

/// One output row of the vertical pass, portable: `src` holds rows from `row0` on, `row_len`
/// bytes each.
#[inline(always)]
fn vertical_row(
    src: &[u8],
    row0: usize,
    row_len: usize,
    aw: &AxisWeights,
    oy: usize,
    drow: &mut [u8],
) {
    vertical_cols(
        src,
        aw.start[oy] - row0,
        row_len,
        aw.taps(oy),
        aw.precision,
        0,
        drow,
    );
}

/// Columns `x0..drow.len()` of one vertical output row (shared by the portable path and the
/// AVX2 path's tail).
#[inline(always)]
fn vertical_cols(
    src: &[u8],
    s: usize,
    row_len: usize,
    w: &[i16],
    precision: u32,
    x0: usize,
    drow: &mut [u8],
) {
    let round = 1i32 << (precision - 1);
    // Column blocks keep the accumulators in L1/registers.
    const BLOCK: usize = 512;
    let mut acc = [0i32; BLOCK];
    let mut x0 = x0;
    while x0 < drow.len() {
        let len = BLOCK.min(drow.len() - x0);
        let acc = &mut acc[..len];
        acc.fill(round);
        for (k, &wk) in w.iter().enumerate() {
            let wk = i32::from(wk);
            let srow = &src[(s + k) * row_len + x0..(s + k) * row_len + x0 + len];
            for (a, &v) in acc.iter_mut().zip(srow) {
                *a += i32::from(v) * wk;
            }
        }
        for (d, &a) in drow[x0..x0 + len].iter_mut().zip(acc.iter()) {
            *d = finish(a, precision);
        }
        x0 += len;
    }
}

/// AVX2 twins of the row kernels (`resize/avx2.rs`).
#[cfg(target_arch = "x86_64")]
mod avx2;

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Which row kernels a pass uses: AVX2 when the CPU has it (and the caller allows it), else portable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernels {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernels {
    fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            return Kernels::Avx2;
        }
        Kernels::Portable
    }
}

/// [`avx2::horizontal_rows_rgb`] with the group count as a constant when it is small.
///
/// # Safety
/// As [`avx2::horizontal_rows_rgb`].
#[cfg(target_arch = "x86_64")]
unsafe fn h_rows_avx2<const R: usize>(
    src: &[u8],
    offs: [usize; R],
    aw: &AxisWeights,
    drows: [&mut [u8]; R],
) {
    // SAFETY: forwarded contract.
    unsafe {
        match aw.groups {
            1 => avx2::horizontal_rows_rgb::<R, 1>(src, offs, aw, drows),
            2 => avx2::horizontal_rows_rgb::<R, 2>(src, offs, aw, drows),
            3 => avx2::horizontal_rows_rgb::<R, 3>(src, offs, aw, drows),
            4 => avx2::horizontal_rows_rgb::<R, 4>(src, offs, aw, drows),
            _ => avx2::horizontal_rows_rgb::<R, 0>(src, offs, aw, drows),
        }
    }
}

/// The AVX2 row kernel of an RGB axis: the quad plan where it applies, else the per-pixel one.
#[cfg(target_arch = "x86_64")]
enum RgbRows {
    Quads(avx2::QuadPlan),
    Pixels,
}

#[cfg(target_arch = "x86_64")]
impl RgbRows {
    fn for_axis(aw: &AxisWeights) -> RgbRows {
        avx2::QuadPlan::new(aw).map_or(RgbRows::Pixels, RgbRows::Quads)
    }

    /// Bytes past a row's start the kernel may read.
    fn reach(&self, aw: &AxisWeights) -> usize {
        match self {
            RgbRows::Quads(plan) => plan.reach(),
            RgbRows::Pixels => avx2::reach(aw),
        }
    }

    /// `R` output rows from the source rows at `offs`.
    ///
    /// # Safety
    /// The CPU must support AVX2; every `drows[r]` is `3·out_w` bytes; for every row
    /// `offs[r] + self.reach(aw) ≤ src.len()`.
    unsafe fn run<const R: usize>(
        &self,
        src: &[u8],
        offs: [usize; R],
        aw: &AxisWeights,
        drows: [&mut [u8]; R],
    ) {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                RgbRows::Quads(plan) => {
                    avx2::horizontal_rows_quads::<R>(src, offs, aw, plan, drows)
                }
                RgbRows::Pixels => h_rows_avx2::<R>(src, offs, aw, drows),
            }
        }
    }
}

/// Horizontal pass over rows `rows` of an interleaved `C`-channel image.
#[allow(clippy::too_many_arguments)]
fn horizontal<const C: usize>(
    kernels: Kernels,
    src: &[u8],
    src_w: usize,
    rows: std::ops::Range<usize>,
    aw: &AxisWeights,
    out_w: usize,
    dst: &mut [u8],
    parallel: bool,
) {
    let row_bytes = src_w * C;
    // The AVX2 kernels write whole `3·out_w`-byte rows by raw pointer: only into whole rows.
    #[cfg(target_arch = "x86_64")]
    if C == 3 && kernels == Kernels::Avx2 && dst.len() == rows.len() * out_w * C {
        let kernel = RgbRows::for_axis(aw);
        let reach = kernel.reach(aw);
        // Rows in pairs: each pixel's (or quad's) weights are loaded once for both.
        let body = |(i, pair): (usize, &mut [u8])| {
            let r0 = rows.start + 2 * i;
            let (o0, o1) = (r0 * row_bytes, (r0 + 1) * row_bytes);
            let two = pair.len() == 2 * out_w * C;
            if two && o1 + reach <= src.len() {
                let (a, b) = pair.split_at_mut(out_w * C);
                // SAFETY: AVX2 was detected; both rows pass the reach check; each output row is
                // `3·out_w` bytes.
                unsafe { kernel.run::<2>(src, [o0, o1], aw, [a, b]) };
                return;
            }
            for (k, drow) in pair.chunks_mut(out_w * C).enumerate() {
                let o = o0 + k * row_bytes;
                if o + reach <= src.len() {
                    // SAFETY: as above, for one row.
                    unsafe { kernel.run::<1>(src, [o], aw, [drow]) };
                } else if o + row_bytes <= src.len() {
                    // The source's last row: the kernel on a zero-padded copy (its loads past
                    // the row meet weights of 0), not the portable arithmetic, since a caller
                    // that resizes a few rows at a time (`RgbWidthResize`) has one such row
                    // per call.
                    let mut padded = vec![0u8; row_bytes.max(reach)];
                    padded[..row_bytes].copy_from_slice(&src[o..o + row_bytes]);
                    // SAFETY: as above, for one row: `0 + reach ≤ padded.len()`.
                    unsafe { kernel.run::<1>(&padded, [0], aw, [drow]) };
                } else {
                    avx2::row_tail(src, o, aw, drow);
                }
            }
        };
        if parallel {
            dst.par_chunks_mut(2 * out_w * C).enumerate().for_each(body);
        } else {
            dst.chunks_mut(2 * out_w * C).enumerate().for_each(body);
        }
        return;
    }
    let _ = kernels;
    let srow_of = |r: usize| &src[(rows.start + r) * row_bytes..(rows.start + r + 1) * row_bytes];
    if C == 3 {
        let body = |buf: &mut Vec<u8>, (r, drow): (usize, &mut [u8])| {
            expand_rgbx(srow_of(r), buf);
            horizontal_row_rgbx(buf, aw, drow);
        };
        if parallel {
            dst.par_chunks_mut(out_w * C)
                .enumerate()
                .for_each_init(|| Vec::with_capacity(src_w * 4), body);
        } else {
            let mut buf = Vec::with_capacity(src_w * 4);
            dst.chunks_mut(out_w * C)
                .enumerate()
                .for_each(|x| body(&mut buf, x));
        }
        return;
    }
    let body = |(r, drow): (usize, &mut [u8])| horizontal_row::<C>(srow_of(r), aw, drow);
    if parallel {
        dst.par_chunks_mut(out_w * C).enumerate().for_each(body);
    } else {
        dst.chunks_mut(out_w * C).enumerate().for_each(body);
    }
}

/// Whether every row output `oy < out rows` of `aw` reads lies inside `src` (rows from `row0` on,
/// `row_len` bytes each) and `dst` is whole rows: what the AVX2 vertical kernel needs.
fn vertical_fits(src: &[u8], row0: usize, row_len: usize, aw: &AxisWeights, dst: &[u8]) -> bool {
    let rows = src.len() / row_len.max(1);
    row_len > 0
        && dst.len() == aw.start.len() * row_len
        && aw
            .start
            .iter()
            .zip(&aw.len)
            .all(|(&s, &l)| s >= row0 && (s - row0).checked_add(l).is_some_and(|e| e <= rows))
}

/// Vertical pass: `src` holds rows `[row0, row0 + src rows)` of width `row_len` bytes.
fn vertical(
    kernels: Kernels,
    src: &[u8],
    row0: usize,
    row_len: usize,
    aw: &AxisWeights,
    dst: &mut [u8],
    parallel: bool,
) {
    // The AVX2 kernel reads by raw pointer: only where every row it reads is checked to be inside
    // `src` (always, for the callers in this file; the portable kernel's indexing is checked).
    let kernels = if vertical_fits(src, row0, row_len, aw, dst) {
        kernels
    } else {
        Kernels::Portable
    };
    let body = |(oy, drow): (usize, &mut [u8])| match kernels {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 was detected; `vertical_fits` checked above that every output's rows
        // `start[oy] − row0 .. + len[oy]` lie inside `src` and that each `drow` is `row_len` bytes.
        Kernels::Avx2 => unsafe { avx2::vertical_row(src, row0, row_len, aw, oy, drow) },
        Kernels::Portable => vertical_row(src, row0, row_len, aw, oy, drow),
    };
    if parallel {
        dst.par_chunks_mut(row_len).enumerate().for_each(body);
    } else {
        dst.chunks_mut(row_len).enumerate().for_each(body);
    }
}

/// Resize an interleaved 3-channel (RGB) u8 image, torchvision-exact.
///
/// `src` must hold exactly `src_w·src_h·3` bytes and every size must be at least 1; otherwise
/// this is [`PrepError::BadSetting`] and nothing is read. `parallel` splits rows over the rayon
/// pool; the arithmetic is identical either way.
pub fn resize_rgb(
    src: &[u8],
    src_w: usize,
    src_h: usize,
    out_w: usize,
    out_h: usize,
    filter: Filter,
    parallel: bool,
) -> Result<Vec<u8>> {
    if src_w == 0 || src_h == 0 || out_w == 0 || out_h == 0 {
        return Err(PrepError::BadSetting(format!(
            "resize_rgb: {src_w}x{src_h} to {out_w}x{out_h}: every size must be at least 1"
        )));
    }
    let bytes = |w: usize, h: usize| w.checked_mul(h).and_then(|p| p.checked_mul(3));
    if bytes(src_w, src_h) != Some(src.len()) {
        return Err(PrepError::BadSetting(format!(
            "resize_rgb: RGB buffer of {} bytes for {src_w}x{src_h}",
            src.len()
        )));
    }
    if bytes(out_w, out_h).is_none_or(|b| b > isize::MAX as usize) {
        return Err(PrepError::BadSetting(format!(
            "resize_rgb: output {out_w}x{out_h} overflows"
        )));
    }
    Ok(resize_rgb_in(
        src,
        src_w,
        src_h,
        out_w,
        out_h,
        filter,
        parallel,
        Scratch::none(),
    ))
}

/// [`resize_rgb`] with the intermediate and the result taken from `scratch` (the intermediate
/// goes back to it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn resize_rgb_in(
    src: &[u8],
    src_w: usize,
    src_h: usize,
    out_w: usize,
    out_h: usize,
    filter: Filter,
    parallel: bool,
    scratch: &Scratch,
) -> Vec<u8> {
    resize_c::<3>(
        Kernels::detect(),
        src,
        src_w,
        src_h,
        out_w,
        out_h,
        filter,
        parallel,
        scratch,
    )
}

/// Resize one RGB image to `out_w` wide and each of `heights` high, computing the horizontal pass
/// once: the law's horizontal pass does not depend on the target height, so every result equals
/// [`resize_rgb`] to that size. An unchanged size borrows `src`; buffers come from `scratch`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn resize_rgb_heights<'a>(
    src: &'a [u8],
    src_w: usize,
    src_h: usize,
    out_w: usize,
    heights: &[usize],
    filter: Filter,
    parallel: bool,
    scratch: &Scratch,
) -> Vec<std::borrow::Cow<'a, [u8]>> {
    use std::borrow::Cow;
    let kernels = Kernels::detect();
    let verticals: Vec<Option<AxisWeights>> = heights
        .iter()
        .map(|&h| (h != src_h).then(|| AxisWeights::new(src_h, h, filter)))
        .collect();
    let row_len = out_w * 3;
    if out_w == src_w {
        return heights
            .iter()
            .zip(&verticals)
            .map(|(&h, av)| match av {
                None => Cow::Borrowed(src),
                Some(av) => {
                    let mut dst = scratch.take(row_len * h);
                    vertical(kernels, src, 0, row_len, av, &mut dst, parallel);
                    Cow::Owned(dst)
                }
            })
            .collect();
    }
    let aw = AxisWeights::new(src_w, out_w, filter);
    // The union of the rows every vertical pass reads (all rows for an unchanged height).
    let (mut row0, mut row1) = (src_h, 0);
    for av in &verticals {
        let (a, b) = match av {
            None => (0, src_h),
            Some(av) => vertical_rows(av, src_h),
        };
        row0 = row0.min(a);
        row1 = row1.max(b);
    }
    let mut tmp = scratch.take(row_len * row1.saturating_sub(row0));
    horizontal::<3>(
        kernels,
        src,
        src_w,
        row0..row1,
        &aw,
        out_w,
        &mut tmp,
        parallel,
    );
    let out = heights
        .iter()
        .zip(&verticals)
        .map(|(&h, av)| {
            let mut dst = scratch.take(row_len * h);
            match av {
                None => dst.copy_from_slice(&tmp),
                Some(av) => vertical(kernels, &tmp, row0, row_len, av, &mut dst, parallel),
            }
            Cow::Owned(dst)
        })
        .collect();
    scratch.give(tmp);
    out
}

/// One RGB resize whose width changes, split into its two passes for a caller that runs the
/// horizontal pass itself, a few source rows at a time as they arrive (the JPEG decode that
/// resizes its bands while it decodes, `jpeg::decode_resized`). The weights are built once; the
/// passes are this file's `horizontal` and `vertical`, so the bytes are [`resize_rgb_in`]'s.
pub(crate) struct RgbWidthResize {
    kernels: Kernels,
    src_w: usize,
    out_w: usize,
    out_h: usize,
    /// The horizontal axis.
    aw: AxisWeights,
    /// The vertical axis, `None` when the height does not change (the intermediate is then the
    /// result).
    av: Option<AxisWeights>,
    /// The source rows the vertical pass reads: the intermediate's rows.
    rows: std::ops::Range<usize>,
}

impl RgbWidthResize {
    /// The passes of resizing `src_w × src_h` to `out_w × out_h`; `None` when the width does not
    /// change (there is no horizontal pass to run) or a size is 0.
    pub(crate) fn new(
        src_w: usize,
        src_h: usize,
        out_w: usize,
        out_h: usize,
        filter: Filter,
    ) -> Option<RgbWidthResize> {
        if out_w == src_w || [src_w, src_h, out_w, out_h].contains(&0) {
            return None;
        }
        let av = (out_h != src_h).then(|| AxisWeights::new(src_h, out_h, filter));
        let rows = match &av {
            Some(av) => {
                let (row0, row1) = vertical_rows(av, src_h);
                row0..row1
            }
            None => 0..src_h,
        };
        Some(RgbWidthResize {
            kernels: Kernels::detect(),
            src_w,
            out_w,
            out_h,
            aw: AxisWeights::new(src_w, out_w, filter),
            av,
            rows,
        })
    }

    /// The source rows whose horizontal pass the result needs (the intermediate holds these,
    /// `3·out_w` bytes each, in order).
    pub(crate) fn rows(&self) -> std::ops::Range<usize> {
        self.rows.clone()
    }

    /// Bytes of one intermediate row.
    pub(crate) fn row_bytes(&self) -> usize {
        self.out_w * 3
    }

    /// The horizontal pass of `rows` (indices into `src`, which holds whole source rows) into
    /// `dst` (`rows.len()` intermediate rows), on this thread.
    pub(crate) fn horizontal(&self, src: &[u8], rows: std::ops::Range<usize>, dst: &mut [u8]) {
        horizontal::<3>(
            self.kernels,
            src,
            self.src_w,
            rows,
            &self.aw,
            self.out_w,
            dst,
            false,
        );
    }

    /// The result from the whole intermediate `tmp` (every row of [`RgbWidthResize::rows`]),
    /// the vertical pass's buffer from `scratch` (`tmp` goes back to it), or `tmp` itself when
    /// the height does not change.
    pub(crate) fn finish(&self, tmp: Vec<u8>, parallel: bool, scratch: &Scratch) -> Vec<u8> {
        let Some(av) = &self.av else {
            return tmp;
        };
        let row_len = self.row_bytes();
        let mut dst = scratch.take(row_len * self.out_h);
        vertical(
            self.kernels,
            &tmp,
            self.rows.start,
            row_len,
            av,
            &mut dst,
            parallel,
        );
        scratch.give(tmp);
        dst
    }
}

/// The source rows `[row0, row1)` a vertical pass reads.
fn vertical_rows(av: &AxisWeights, src_h: usize) -> (usize, usize) {
    let row0 = av.start.first().copied().unwrap_or(0);
    let row1 = av
        .start
        .iter()
        .zip(&av.len)
        .map(|(s, l)| s + l)
        .max()
        .unwrap_or(src_h)
        .min(src_h);
    (row0, row1)
}

#[allow(clippy::too_many_arguments)]
fn resize_c<const C: usize>(
    kernels: Kernels,
    src: &[u8],
    src_w: usize,
    src_h: usize,
    out_w: usize,
    out_h: usize,
    filter: Filter,
    parallel: bool,
    scratch: &Scratch,
) -> Vec<u8> {
    let need_h = out_w != src_w;
    let need_v = out_h != src_h;
    match (need_h, need_v) {
        (false, false) => {
            // A kept buffer: a fresh copy of a large image faults its pages in on every call
            // (1 500 faults per glm5_next prepare at 1920×1080 on the development VM).
            let mut dst = scratch.take(src.len());
            dst.copy_from_slice(src);
            dst
        }
        (true, false) => {
            let aw = AxisWeights::new(src_w, out_w, filter);
            let mut dst = scratch.take(out_w * out_h * C);
            horizontal::<C>(
                kernels,
                src,
                src_w,
                0..src_h,
                &aw,
                out_w,
                &mut dst,
                parallel,
            );
            dst
        }
        (false, true) => {
            let av = AxisWeights::new(src_h, out_h, filter);
            let mut dst = scratch.take(out_w * out_h * C);
            vertical(kernels, src, 0, src_w * C, &av, &mut dst, parallel);
            dst
        }
        (true, true) => {
            let aw = AxisWeights::new(src_w, out_w, filter);
            let av = AxisWeights::new(src_h, out_h, filter);
            // Only the source rows the vertical pass reads.
            let (row0, row1) = vertical_rows(&av, src_h);
            let mut tmp = scratch.take(out_w * (row1 - row0) * C);
            horizontal::<C>(
                kernels,
                src,
                src_w,
                row0..row1,
                &aw,
                out_w,
                &mut tmp,
                parallel,
            );
            let mut dst = scratch.take(out_w * out_h * C);
            vertical(kernels, &tmp, row0, out_w * C, &av, &mut dst, parallel);
            scratch.give(tmp);
            dst
        }
    }
}

#[cfg(test)]
mod tests;
