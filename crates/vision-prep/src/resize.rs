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
    /// `taps` weights per output index (zero padded).
    pub weights: Vec<i16>,
    /// Row stride of `weights`.
    pub taps: usize,
    /// Fixed-point precision bits.
    pub precision: u32,
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
        let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
        let mut wf = vec![0.0f64; output * taps];
        let mut start = Vec::with_capacity(output);
        let mut len = Vec::with_capacity(output);
        let mut wmax = 0.0f64;
        for i in 0..output {
            let center = scale * (i as f64 + 0.5);
            // `static_cast<int64_t>` truncates toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xsize =
                (((center + support + 0.5) as i64).min(input as i64) - xmin).clamp(0, taps as i64);
            let row = &mut wf[i * taps..(i + 1) * taps];
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
        AxisWeights {
            start,
            len,
            weights,
            taps,
            precision,
        }
    }
}

#[inline]
fn finish(acc: i32, precision: u32) -> u8 {
    (acc >> precision).clamp(0, 255) as u8
}

/// One output row of the horizontal pass (hot loop; inlined into the AVX2 and baseline twins).
#[inline(always)]
fn horizontal_row<const C: usize>(srow: &[u8], aw: &AxisWeights, drow: &mut [u8]) {
    let round = 1i32 << (aw.precision - 1);
    for (ox, out) in drow.chunks_exact_mut(C).enumerate() {
        let s = aw.start[ox];
        let n = aw.len[ox];
        let w = &aw.weights[ox * aw.taps..ox * aw.taps + n];
        let px = &srow[s * C..(s + n) * C];
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

/// One output row of the horizontal pass for RGB expanded to RGBX (4 lanes vectorise; the fourth is 0).
#[inline(always)]
fn horizontal_row_rgbx(srow4: &[u8], aw: &AxisWeights, drow: &mut [u8]) {
    let round = 1i32 << (aw.precision - 1);
    for (ox, out) in drow.chunks_exact_mut(3).enumerate() {
        let s = aw.start[ox];
        let n = aw.len[ox];
        let w = &aw.weights[ox * aw.taps..ox * aw.taps + n];
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn horizontal_row_rgbx_avx2(srow4: &[u8], aw: &AxisWeights, drow: &mut [u8]) {
    horizontal_row_rgbx(srow4, aw, drow)
}

fn h_row_rgbx(avx2: bool, srow4: &[u8], aw: &AxisWeights, drow: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when AVX2 was detected at run time (see `h_row`).
        unsafe { horizontal_row_rgbx_avx2(srow4, aw, drow) };
        return;
    }
    let _ = avx2;
    horizontal_row_rgbx(srow4, aw, drow)
}

fn expand_rgbx(src: &[u8], dst: &mut Vec<u8>) {
    dst.clear();
    dst.extend(src.chunks_exact(3).flat_map(|p| [p[0], p[1], p[2], 0]));
}

/// One output row of the vertical pass.
#[inline(always)]
fn vertical_row(
    src: &[u8],
    row0: usize,
    row_len: usize,
    aw: &AxisWeights,
    oy: usize,
    drow: &mut [u8],
) {
    let round = 1i32 << (aw.precision - 1);
    let s = aw.start[oy] - row0;
    let n = aw.len[oy];
    let w = &aw.weights[oy * aw.taps..oy * aw.taps + n];
    // Column blocks keep the accumulators in L1/registers.
    const BLOCK: usize = 512;
    let mut acc = [0i32; BLOCK];
    let mut x0 = 0;
    while x0 < row_len {
        let len = BLOCK.min(row_len - x0);
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
            *d = finish(a, aw.precision);
        }
        x0 += len;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn horizontal_row_avx2<const C: usize>(srow: &[u8], aw: &AxisWeights, drow: &mut [u8]) {
    horizontal_row::<C>(srow, aw, drow)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn vertical_row_avx2(
    src: &[u8],
    row0: usize,
    row_len: usize,
    aw: &AxisWeights,
    oy: usize,
    drow: &mut [u8],
) {
    vertical_row(src, row0, row_len, aw, oy, drow)
}

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

fn h_row<const C: usize>(avx2: bool, srow: &[u8], aw: &AxisWeights, drow: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when `is_x86_feature_detected!("avx2")` said the CPU has AVX2;
        // the function body is safe code compiled with that feature enabled.
        unsafe { horizontal_row_avx2::<C>(srow, aw, drow) };
        return;
    }
    let _ = avx2;
    horizontal_row::<C>(srow, aw, drow)
}

fn v_row(
    avx2: bool,
    src: &[u8],
    row0: usize,
    row_len: usize,
    aw: &AxisWeights,
    oy: usize,
    drow: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: as in `h_row`: AVX2 was detected at run time.
        unsafe { vertical_row_avx2(src, row0, row_len, aw, oy, drow) };
        return;
    }
    let _ = avx2;
    vertical_row(src, row0, row_len, aw, oy, drow)
}

/// Horizontal pass over rows `rows` of an interleaved `C`-channel image.
fn horizontal<const C: usize>(
    src: &[u8],
    src_w: usize,
    rows: std::ops::Range<usize>,
    aw: &AxisWeights,
    out_w: usize,
    dst: &mut [u8],
    parallel: bool,
) {
    let avx2 = has_avx2();
    let srow_of = |r: usize| &src[(rows.start + r) * src_w * C..(rows.start + r + 1) * src_w * C];
    if C == 3 {
        let body = |buf: &mut Vec<u8>, (r, drow): (usize, &mut [u8])| {
            expand_rgbx(srow_of(r), buf);
            h_row_rgbx(avx2, buf, aw, drow);
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
    let body = |(r, drow): (usize, &mut [u8])| h_row::<C>(avx2, srow_of(r), aw, drow);
    if parallel {
        dst.par_chunks_mut(out_w * C).enumerate().for_each(body);
    } else {
        dst.chunks_mut(out_w * C).enumerate().for_each(body);
    }
}

/// Vertical pass: `src` holds rows `[row0, row0 + src rows)` of width `row_len` bytes.
fn vertical(
    src: &[u8],
    row0: usize,
    row_len: usize,
    aw: &AxisWeights,
    dst: &mut [u8],
    parallel: bool,
) {
    let avx2 = has_avx2();
    let body = |(oy, drow): (usize, &mut [u8])| v_row(avx2, src, row0, row_len, aw, oy, drow);
    if parallel {
        dst.par_chunks_mut(row_len).enumerate().for_each(body);
    } else {
        dst.chunks_mut(row_len).enumerate().for_each(body);
    }
}

/// Resize an interleaved 3-channel (RGB) u8 image, torchvision-exact.
///
/// `src.len()` must be `src_w·src_h·3`; all sizes must be ≥ 1 (callers guarantee both).
/// `parallel` splits rows over the rayon pool; the arithmetic is identical either way.
pub fn resize_rgb(
    src: &[u8],
    src_w: usize,
    src_h: usize,
    out_w: usize,
    out_h: usize,
    filter: Filter,
    parallel: bool,
) -> Vec<u8> {
    resize_c::<3>(src, src_w, src_h, out_w, out_h, filter, parallel)
}

fn resize_c<const C: usize>(
    src: &[u8],
    src_w: usize,
    src_h: usize,
    out_w: usize,
    out_h: usize,
    filter: Filter,
    parallel: bool,
) -> Vec<u8> {
    let need_h = out_w != src_w;
    let need_v = out_h != src_h;
    match (need_h, need_v) {
        (false, false) => src.to_vec(),
        (true, false) => {
            let aw = AxisWeights::new(src_w, out_w, filter);
            let mut dst = vec![0u8; out_w * out_h * C];
            horizontal::<C>(src, src_w, 0..src_h, &aw, out_w, &mut dst, parallel);
            dst
        }
        (false, true) => {
            let av = AxisWeights::new(src_h, out_h, filter);
            let mut dst = vec![0u8; out_w * out_h * C];
            vertical(src, 0, src_w * C, &av, &mut dst, parallel);
            dst
        }
        (true, true) => {
            let aw = AxisWeights::new(src_w, out_w, filter);
            let av = AxisWeights::new(src_h, out_h, filter);
            // Only the source rows the vertical pass reads.
            let row0 = av.start.first().copied().unwrap_or(0);
            let row1 = av
                .start
                .iter()
                .zip(&av.len)
                .map(|(s, l)| s + l)
                .max()
                .unwrap_or(src_h)
                .min(src_h);
            let mut tmp = vec![0u8; out_w * (row1 - row0) * C];
            horizontal::<C>(src, src_w, row0..row1, &aw, out_w, &mut tmp, parallel);
            let mut dst = vec![0u8; out_w * out_h * C];
            vertical(&tmp, row0, out_w * C, &av, &mut dst, parallel);
            dst
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_when_same_size() {
        let src: Vec<u8> = (0..5 * 4 * 3).map(|i| (i * 7 % 256) as u8).collect();
        assert_eq!(resize_rgb(&src, 5, 4, 5, 4, Filter::Bicubic, false), src);
    }

    fn fixture_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prep/resize")
    }

    fn load_png(path: &std::path::Path) -> (usize, usize, Vec<u8>) {
        let img = image::open(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .to_rgb8();
        (img.width() as usize, img.height() as usize, img.into_raw())
    }

    /// `prep_resize.py` checksum: Σ byte_i·(i mod 65521 + 1), wrapping u64.
    fn checksum(data: &[u8]) -> u64 {
        data.iter().enumerate().fold(0u64, |acc, (i, &v)| {
            acc.wrapping_add(u64::from(v).wrapping_mul((i % 65521) as u64 + 1))
        })
    }

    /// `prep_resize.py` formula source image.
    pub(crate) fn formula_image(w: usize, h: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(w * h * 3);
        for y in 0..h as i64 {
            for x in 0..w as i64 {
                for c in 0..3i64 {
                    out.push(
                        ((x * 7 + y * 13 + c * 50 + ((x * y) >> 5) + ((x ^ y) & 31)) & 255) as u8,
                    );
                }
            }
        }
        out
    }

    /// Bound: EXACT (max diff 0 on every pixel) against torchvision 0.29.2 / torch 2.15 CPU
    /// `resize(uint8, antialias=True)`, bicubic and bilinear, up and down, extreme ratios.
    #[test]
    fn bit_exact_against_torchvision() {
        let dir = fixture_dir();
        let text = std::fs::read_to_string(dir.join("cases.json")).expect("cases.json");
        let table: serde_json::Value = serde_json::from_str(&text).expect("json");
        let mut total = 0usize;
        let mut exact = 0usize;
        let mut max_diff = 0u8;
        let mut bad = Vec::new();
        for case in table["cases"].as_array().expect("cases") {
            let (sw, sh, src) = load_png(&dir.join(case["src"].as_str().expect("src")));
            let (ew, eh, expected) = load_png(&dir.join(case["out"].as_str().expect("out")));
            let filter = if case["mode"] == "bicubic" {
                Filter::Bicubic
            } else {
                Filter::Bilinear
            };
            let got = resize_rgb(&src, sw, sh, ew, eh, filter, false);
            let d = got
                .iter()
                .zip(&expected)
                .map(|(a, b)| a.abs_diff(*b))
                .max()
                .unwrap_or(0);
            total += got.len();
            exact += got.iter().zip(&expected).filter(|(a, b)| a == b).count();
            max_diff = max_diff.max(d);
            if d > 0 {
                bad.push(format!(
                    "{} -> {}x{} {}: max diff {d}",
                    case["src"], ew, eh, case["mode"]
                ));
            }
        }
        for case in table["formula_cases"].as_array().expect("formula") {
            let g = |k: &str| case[k].as_u64().expect("size") as usize;
            let src = formula_image(g("src_width"), g("src_height"));
            let filter = if case["mode"] == "bicubic" {
                Filter::Bicubic
            } else {
                Filter::Bilinear
            };
            let got = resize_rgb(
                &src,
                g("src_width"),
                g("src_height"),
                g("width"),
                g("height"),
                filter,
                true,
            );
            let want: u64 = case["checksum"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .expect("checksum");
            if checksum(&got) != want {
                bad.push(format!(
                    "formula {}x{} -> {}x{} {}: checksum differs",
                    g("src_width"),
                    g("src_height"),
                    g("width"),
                    g("height"),
                    case["mode"]
                ));
            }
        }
        eprintln!("resize: {exact}/{total} bytes exact, max diff {max_diff}");
        assert!(bad.is_empty(), "{} cases differ: {:#?}", bad.len(), bad);
    }
}
