//! AVX2 twins of the RGB horizontal row and the vertical row: the same i16 × u8 products summed in
//! i32 (`pmaddwd` adds pairs of them, exactly), so the bytes equal the portable path's and torch's.

use std::arch::x86_64::*;

use super::AxisWeights;

/// Taps of one output pixel (source bytes from `base` in each of the `R` rows at `offs`),
/// `groups` groups of 4 taps: 12 bytes (4 pixels) shuffled to
/// `[r0 r1 g0 g1 b0 b1 0 0 | r2 r3 g2 g3 b2 b3 0 0]`, widened to i16 and `pmaddwd`ed with
/// `[w0 w1]×4 | [w2 w3]×4`; each weight group is loaded once for all rows.
#[inline(always)]
unsafe fn pixel_acc<const R: usize>(
    sp: *const u8,
    offs: &[usize; R],
    base: usize,
    w: *const i16,
    groups: usize,
    shuf: __m128i,
    idx: __m256i,
) -> [__m256i; R] {
    let mut acc = [_mm256_setzero_si256(); R];
    for g in 0..groups {
        let wq = _mm_loadl_epi64(w.add(4 * g) as *const __m128i);
        let wv = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(wq), idx);
        for r in 0..R {
            let p = _mm_loadu_si128(sp.add(offs[r] + base + 12 * g) as *const __m128i);
            let x = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(p, shuf));
            acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(x, wv));
        }
    }
    acc
}

/// Four pixels' accumulators (two halves of `[R G B 0]` each) to 12 RGB bytes, as `finish`.
#[inline(always)]
unsafe fn finish_quad(q: [__m256i; 4], round: __m256i, shift: __m128i) -> [u8; 16] {
    let lo = _mm256_permute2x128_si256::<0x20>(q[0], q[1]);
    let hi = _mm256_permute2x128_si256::<0x31>(q[0], q[1]);
    let ab = _mm256_sra_epi32(_mm256_add_epi32(_mm256_add_epi32(lo, hi), round), shift);
    let lo = _mm256_permute2x128_si256::<0x20>(q[2], q[3]);
    let hi = _mm256_permute2x128_si256::<0x31>(q[2], q[3]);
    let cd = _mm256_sra_epi32(_mm256_add_epi32(_mm256_add_epi32(lo, hi), round), shift);
    // i16 lanes [A C | B D], then bytes; clamp to 0..=255 by the two saturations.
    let b = _mm256_packus_epi16(_mm256_packs_epi32(ab, cd), _mm256_setzero_si256());
    let abcd = _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
    let rgb = _mm_shuffle_epi8(
        abcd,
        _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1),
    );
    let mut out = [0u8; 16];
    _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, rgb);
    out
}

/// `R` RGB output rows of the horizontal pass; source row `r` starts at byte `offs[r]` of `src`.
/// `G` is the axis' group count when it is small (the loop unrolls), 0 to use `aw.groups`.
///
/// # Safety
/// The CPU must support AVX2; every `drows[r]` is `3·out_w` bytes; for every row
/// `offs[r] + reach(aw) ≤ src.len()` (see [`reach`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn horizontal_rows_rgb<const R: usize, const G: usize>(
    src: &[u8],
    offs: [usize; R],
    aw: &AxisWeights,
    drows: [&mut [u8]; R],
) {
    let groups = if G == 0 { aw.groups } else { G };
    let shuf = _mm_setr_epi8(0, 3, 1, 4, 2, 5, -1, -1, 6, 9, 7, 10, 8, 11, -1, -1);
    let idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    let round = _mm256_set1_epi32(1 << (aw.precision - 1));
    let shift = _mm_cvtsi32_si128(aw.precision as i32);
    let (sp, wp, stride) = (src.as_ptr(), aw.weights.as_ptr(), aw.stride);
    let out_w = aw.start.len();
    let mut drows = drows;
    let mut ox = 0;
    // SAFETY (loads): every pixel reads `groups` 16-byte loads from `offs[r] + 3·start` on,
    // inside `src` by the caller's `reach` check; weight groups lie inside the pixel's stride
    // (stride ≥ 4·groups), and taps past `len` weigh 0.
    while ox + 4 <= out_w {
        let mut q = [[_mm256_setzero_si256(); R]; 4];
        for (j, qj) in q.iter_mut().enumerate() {
            let x = ox + j;
            *qj = pixel_acc::<R>(
                sp,
                &offs,
                3 * aw.start[x],
                wp.add(x * stride),
                groups,
                shuf,
                idx,
            );
        }
        for (r, drow) in drows.iter_mut().enumerate() {
            let b = finish_quad([q[0][r], q[1][r], q[2][r], q[3][r]], round, shift);
            drow[3 * ox..3 * ox + 12].copy_from_slice(&b[..12]);
        }
        ox += 4;
    }
    while ox < out_w {
        let acc = pixel_acc::<R>(
            sp,
            &offs,
            3 * aw.start[ox],
            wp.add(ox * stride),
            groups,
            shuf,
            idx,
        );
        for (r, drow) in drows.iter_mut().enumerate() {
            let b = finish_quad([acc[r]; 4], round, shift);
            drow[3 * ox..3 * ox + 3].copy_from_slice(&b[..3]);
        }
        ox += 1;
    }
}

/// The horizontal pass of an axis whose outputs each take at most 2 taps and whose every 4
/// consecutive outputs read at most 5 source pixels (the triangle filter upscaling: starts
/// step by 0 or 1), planned per quad of outputs: one 16-byte load of the quad's 5 pixels,
/// two `pshufb` to the 12 (tap 0, tap 1) byte pairs of its 4 RGB pixels in output order, and
/// two `pmaddwd` with their weight pairs give the 12 channel sums at once (the per-pixel
/// kernel spends a 4-tap group, half of it zero weights, on each pixel).
pub(crate) struct QuadPlan {
    /// First source pixel read by each quad.
    base: Vec<usize>,
    /// Per quad: `pshufb` masks for channel sums 0..8 (bytes 0..16) and 8..12 (16..24).
    masks: Vec<[i8; 32]>,
    /// Per quad: the weight pairs of channel sums 0..8 (lanes 0..16) and 8..12 (16..24).
    weights: Vec<[i16; 24]>,
    /// Outputs covered by whole quads (`4·quads`); the rest go through the scalar tail.
    pub(super) covered: usize,
}

impl QuadPlan {
    /// The plan for `aw`, or `None` when some output takes more than 2 taps or a quad spans
    /// more than 5 source pixels.
    pub(crate) fn new(aw: &AxisWeights) -> Option<QuadPlan> {
        let quads = aw.start.len() / 4;
        if aw.len.iter().any(|&l| l > 2) || quads == 0 {
            return None;
        }
        let mut plan = QuadPlan {
            base: Vec::with_capacity(quads),
            masks: Vec::with_capacity(quads),
            weights: Vec::with_capacity(quads),
            covered: 4 * quads,
        };
        for q in 0..quads {
            let base = aw.start[4 * q];
            let (mut mask, mut w) = ([-1i8; 32], [0i16; 24]);
            for j in 0..4 {
                let x = 4 * q + j;
                let rel = aw.start[x].checked_sub(base)?;
                if rel + 1 > 4 {
                    return None;
                }
                let taps = aw.taps(x);
                for c in 0..3 {
                    let lane = 3 * j + c;
                    // Byte slot of this pair: sums 0..8 in mask bytes 0..16, 8..12 in 16..24.
                    let slot = if lane < 8 {
                        2 * lane
                    } else {
                        16 + 2 * (lane - 8)
                    };
                    let b0 = (3 * rel + c) as i8;
                    // A missing second tap reads the first byte again, with weight 0.
                    let b1 = if taps.len() == 2 { b0 + 3 } else { b0 };
                    mask[slot] = b0;
                    mask[slot + 1] = b1;
                    w[2 * lane] = taps.first().copied().unwrap_or(0);
                    w[2 * lane + 1] = taps.get(1).copied().unwrap_or(0);
                }
            }
            plan.base.push(base);
            plan.masks.push(mask);
            plan.weights.push(w);
        }
        Some(plan)
    }

    /// Bytes past a row's start that [`horizontal_rows_quads`] may read.
    pub(super) fn reach(&self) -> usize {
        3 * self.base.last().copied().unwrap_or(0) + 16
    }
}

/// `R` RGB output rows of the horizontal pass by the quad plan `plan` of `aw`: the whole quads,
/// then the scalar tail; source row `r` starts at byte `offs[r]` of `src`.
///
/// # Safety
/// The CPU must support AVX2; every `drows[r]` is `3·out_w` bytes; for every row
/// `offs[r] + plan.reach() ≤ src.len()`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn horizontal_rows_quads<const R: usize>(
    src: &[u8],
    offs: [usize; R],
    aw: &AxisWeights,
    plan: &QuadPlan,
    drows: [&mut [u8]; R],
) {
    let round = _mm256_set1_epi32(1 << (aw.precision - 1));
    let shift = _mm_cvtsi32_si128(aw.precision as i32);
    let sp = src.as_ptr();
    let mut drows = drows;
    for (q, ((&base, mask), w)) in plan
        .base
        .iter()
        .zip(&plan.masks)
        .zip(&plan.weights)
        .enumerate()
    {
        // SAFETY: 16-byte reads inside the 32-byte mask and the 48-byte weight arrays.
        let (m0, m1, w0, w1) = unsafe {
            (
                _mm_loadu_si128(mask.as_ptr().cast()),
                _mm_loadu_si128(mask.as_ptr().add(16).cast()),
                _mm256_loadu_si256(w.as_ptr().cast()),
                _mm_loadu_si128(w.as_ptr().add(16).cast()),
            )
        };
        for (r, drow) in drows.iter_mut().enumerate() {
            // SAFETY: `offs[r] + 3·base + 16 ≤ offs[r] + reach ≤ src.len()` (the caller's check).
            let p = unsafe { _mm_loadu_si128(sp.add(offs[r] + 3 * base).cast()) };
            let lo = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_shuffle_epi8(p, m0)), w0);
            let hi = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_shuffle_epi8(p, m1)), w1);
            let lo = _mm256_sra_epi32(_mm256_add_epi32(lo, round), shift);
            let hi = _mm_sra_epi32(_mm_add_epi32(hi, _mm256_castsi256_si128(round)), shift);
            let a = _mm_packs_epi32(
                _mm256_castsi256_si128(lo),
                _mm256_extracti128_si256::<1>(lo),
            );
            let b = _mm_packs_epi32(hi, _mm_setzero_si128());
            let bytes = _mm_packus_epi16(a, b);
            let o = 12 * q;
            if o + 16 <= drow.len() {
                // SAFETY: 16 bytes from `o` lie inside `drow`; the 4 past the quad's 12 are
                // written again by the next quad or the tail.
                unsafe { _mm_storeu_si128(drow.as_mut_ptr().add(o).cast(), bytes) };
            } else {
                let mut t = [0u8; 16];
                // SAFETY: a 16-byte store into a 16-byte array.
                unsafe { _mm_storeu_si128(t.as_mut_ptr().cast(), bytes) };
                drow[o..o + 12].copy_from_slice(&t[..12]);
            }
        }
    }
    for (r, drow) in drows.iter_mut().enumerate() {
        pixels_tail(src, offs[r], aw, plan.covered, drow);
    }
}

/// Bytes past a row's start that [`horizontal_rows_rgb`] may read: the last pixel's loads.
pub(super) fn reach(aw: &AxisWeights) -> usize {
    let last = aw.start.last().copied().unwrap_or(0);
    3 * last + 12 * aw.groups.saturating_sub(1) + 16
}

/// One RGB output row by the portable arithmetic, for the image's last rows, where a 16-byte
/// load would leave `src`.
pub(super) fn row_tail(src: &[u8], off: usize, aw: &AxisWeights, drow: &mut [u8]) {
    pixels_tail(src, off, aw, 0, drow);
}

/// Output pixels `from..` of one RGB row by the portable arithmetic.
fn pixels_tail(src: &[u8], off: usize, aw: &AxisWeights, from: usize, drow: &mut [u8]) {
    let round = 1i32 << (aw.precision - 1);
    for (ox, out) in drow.chunks_exact_mut(3).enumerate().skip(from) {
        let s = aw.start[ox];
        let mut acc = [round; 3];
        for (k, &wk) in aw.taps(ox).iter().enumerate() {
            for c in 0..3 {
                acc[c] += i32::from(src[off + (s + k) * 3 + c]) * i32::from(wk);
            }
        }
        for c in 0..3 {
            out[c] = super::finish(acc[c], aw.precision);
        }
    }
}

/// Narrow 16 i32 sums (two registers of 8, in column order, rounding term included) to 16
/// bytes as `finish` does, and store them.
#[inline(always)]
unsafe fn store16(lo: __m256i, hi: __m256i, shift: __m128i, dst: *mut u8) {
    let lo = _mm256_sra_epi32(lo, shift);
    let hi = _mm256_sra_epi32(hi, shift);
    let a = _mm_packs_epi32(
        _mm256_castsi256_si128(lo),
        _mm256_extracti128_si256::<1>(lo),
    );
    let b = _mm_packs_epi32(
        _mm256_castsi256_si128(hi),
        _mm256_extracti128_si256::<1>(hi),
    );
    _mm_storeu_si128(dst as *mut __m128i, _mm_packus_epi16(a, b));
}

/// Accumulate `Σ_k w_k · row_k[x..x+16]` for two taps at a time into `lo` (columns 0..8) and
/// `hi` (8..16): bytes of the two rows interleaved, widened, `pmaddwd` with `[w_k w_k+1]`.
#[inline(always)]
unsafe fn taps16(r0: *const u8, r1: *const u8, wpair: __m256i, lo: &mut __m256i, hi: &mut __m256i) {
    let a = _mm_loadu_si128(r0 as *const __m128i);
    let b = _mm_loadu_si128(r1 as *const __m128i);
    let l = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b));
    let h = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(a, b));
    *lo = _mm256_add_epi32(*lo, _mm256_madd_epi16(l, wpair));
    *hi = _mm256_add_epi32(*hi, _mm256_madd_epi16(h, wpair));
}

/// One output row of the vertical pass: `src` holds rows from `row0` on, `row_len` bytes each.
///
/// # Safety
/// The CPU must support AVX2; rows `start[oy] − row0 .. + len[oy]` lie inside `src` and
/// `drow.len() == row_len`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn vertical_row(
    src: &[u8],
    row0: usize,
    row_len: usize,
    aw: &AxisWeights,
    oy: usize,
    drow: &mut [u8],
) {
    let s = aw.start[oy] - row0;
    let w = aw.taps(oy);
    let n = w.len();
    let round = _mm256_set1_epi32(1 << (aw.precision - 1));
    let shift = _mm_cvtsi32_si128(aw.precision as i32);
    // Weight pairs broadcast once per row; an odd last tap pairs with weight 0 on itself.
    let mut pairs = [(_mm256_setzero_si256(), 0usize, 0usize); 64];
    let npairs = n.div_ceil(2);
    if npairs > pairs.len() {
        super::vertical_cols(src, s, row_len, w, aw.precision, 0, drow);
        return;
    }
    for (j, p) in pairs.iter_mut().enumerate().take(npairs) {
        let k = 2 * j;
        let (w0, w1, k1) = if k + 1 < n {
            (w[k], w[k + 1], k + 1)
        } else {
            (w[k], 0, k)
        };
        let packed = (u32::from(w0 as u16) | (u32::from(w1 as u16) << 16)) as i32;
        *p = (
            _mm256_set1_epi32(packed),
            (s + k) * row_len,
            (s + k1) * row_len,
        );
    }
    let sp = src.as_ptr();
    let dp = drow.as_mut_ptr();
    let mut x = 0;
    // SAFETY (loads/stores): x + 32 (or + 16) ≤ row_len, every row offset is a row inside `src`.
    while x + 32 <= row_len {
        let (mut a, mut b, mut c, mut d) = (round, round, round, round);
        for &(wpair, o0, o1) in &pairs[..npairs] {
            taps16(sp.add(o0 + x), sp.add(o1 + x), wpair, &mut a, &mut b);
            taps16(
                sp.add(o0 + x + 16),
                sp.add(o1 + x + 16),
                wpair,
                &mut c,
                &mut d,
            );
        }
        store16(a, b, shift, dp.add(x));
        store16(c, d, shift, dp.add(x + 16));
        x += 32;
    }
    while x + 16 <= row_len {
        let (mut a, mut b) = (round, round);
        for &(wpair, o0, o1) in &pairs[..npairs] {
            taps16(sp.add(o0 + x), sp.add(o1 + x), wpair, &mut a, &mut b);
        }
        store16(a, b, shift, dp.add(x));
        x += 16;
    }
    if x < row_len {
        super::vertical_cols(src, s, row_len, w, aw.precision, x, drow);
    }
}
