//! The reconstruction of a baseline JPEG's rows from its quantised coefficients, byte for byte as
//! libjpeg-turbo's decode (the `mozjpeg-sys` build: `JDCT_ISLOW`, `do_fancy_upsampling`, output
//! `JCS_RGB` for YCbCr files and `JCS_GRAYSCALE` for grey ones, which we replicate to RGB).
//!
//! Any band of image rows is reconstructed on its own ([`reconstruct_rows`]): it reads only the
//! coefficient blocks its rows need, plus the one sample row above and below that the vertical
//! fancy upsampler reads, so bands can run on different threads and give the whole decode's bytes.
//!
//! The laws, each from the vendored libjpeg-turbo source (`mozjpeg-sys-2.2.3/vendor`):
//!
//! - **IDCT** (`jidctint.c` `jpeg_idct_islow`; `simd/x86_64/jidctint-{avx2,sse2}.asm`): each
//!   pass is an exact integer linear map (the Loeffler butterfly with 13-bit constants; no
//!   rounding inside a pass), then a rounding shift: 11 bits after the columns, 18 after the
//!   rows, then `+128` and the range limit. The portable kernel computes it in `i32` lanes with
//!   wrapping arithmetic, a ring homomorphism of the C code's 64-bit `JLONG` arithmetic: where
//!   the exact results fit `i32` (always, when the conditions below hold; the test
//!   `kernels_are_exact_where_libjpeg_agrees` bounds the matrix) the bytes are the C code's. The
//!   AVX2 kernel is libjpeg-turbo's own AVX2 algorithm (`jsimd_idct_islow_avx2`: 16-bit lanes,
//!   `madd` products, 16-bit sums) written with intrinsics, exact under the same conditions.
//! - **Where libjpeg's C and SIMD builds part** (hostile coefficients only). The SIMD
//!   dequantises with `pmullw` (16 bits, wraps), forms `in0±in4`, `in1+in5`, `in3+in7` with
//!   16-bit `paddw`/`psubw` in both passes, keeps the pass-1 results in 16 bits (`packssdw`
//!   saturates; its all-AC-zero shortcut shifts with `psllw`, which wraps) and clamps the
//!   output with saturating packs. The C code keeps everything exact and limits the output
//!   through `range_limit[x & 1023]` (`jdmaster.c` `prepare_range_limit_table`), a faithful
//!   clamp only for `x ∈ [-512, 511]` (it wraps beyond). Both builds give the clamp of the
//!   exact value when every dequantised coefficient, every one of those sums in both passes and
//!   every pass-1 result lies in `i16`, and every output before the clamp in `[-512, 511]`;
//!   [`reconstruct_rows`] checks exactly that and otherwise declines. The check is cheap
//!   bounds kept while reconstructing (every dequantised coefficient and pass-1 result in
//!   `-16384..=16383`, so any sum of two fits `i16`; every output in `-512..=511`), and only
//!   where those leave doubt the exact test of each block the rows read ([`block_agrees`]). A
//!   quantiser above 32767 is declined outright (the SIMD build holds the table in `short`s,
//!   the C build in `int`s).
//! - **Upsampling** (`jdsample.c` `jinit_upsampler`, with `do_fancy`): per component, from the
//!   ratios of the largest sampling factors to its own: 1×1 full size; 2×1 the fancy triangle
//!   filter if `downsampled_width > 2`, else box; 1×2 always fancy (`h1v2_fancy_upsample`);
//!   2×2 fancy if `downsampled_width > 2`, else box. Other ratios are declined (libjpeg's
//!   `int_upsample`, untested here). The vertical context (`jdmainct.c`: `make_funny_pointers`,
//!   `set_wraparound_pointers`, `set_bottom_pointers`) is the sample row above or below,
//!   the first row standing in for the one above row 0 and the last real row
//!   (`downsampled_height - 1`) for every one below it. libjpeg-turbo's SIMD upsamplers
//!   (`jdsample-avx2.asm`) give the C code's bytes (they write a copy of the last column past
//!   the row's end for the edge case).
//! - **Colour** (`jdcolor.c` `build_ycc_rgb_table`, `jdcolext.c`): `R = y + ⌊(91881·(cr−128) +
//!   2¹⁵) / 2¹⁶⌋`, `G = y + ⌊(−22554·(cb−128) − 46802·(cr−128) + 2¹⁵) / 2¹⁶⌋`, `B = y +
//!   ⌊(116130·(cb−128) + 2¹⁵) / 2¹⁶⌋`, each clamped to 0..255 (`FIX(1.40200)`, `FIX(0.34414)`,
//!   `FIX(0.71414)`, `FIX(1.77200)` at 16 bits). Grey: `L` to `(L, L, L)`.
//!
//! Speed: a band is reconstructed one iMCU row at a time (each block once, the component rows in
//! cache), through row kernels ([`Kernels`]): portable code whose passes work on 8 lanes of
//! `[i32; 8]` (16-bit sums in the upsamplers), and, picked at run time where the CPU has AVX2,
//! the same code compiled for AVX2 with the IDCT and the colour conversion written with AVX2
//! intrinsics (the colour kernel checked against the formula on every (Cb, Cr) pair). Blocks
//! whose AC coefficients are all zero take a shortcut with the same results (a lone DC gives
//! `4·d` after pass 1 and `(4·d + 16) >> 5` after pass 2).

// Until the decoder calls it, only the tests do.

use std::ops::Range;

use crate::jpeg_frame::{Coefficients, Colour, Component, Frame};

/// Why our reconstruction declines a frame or block (the caller then decodes with libjpeg).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unsupported(pub &'static str);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// libjpeg's `D_MAX_BLOCKS_IN_MCU`: an interleaved scan with more blocks per MCU is refused by
/// libjpeg itself (`jdinput.c`), so it is not ours to decode either.
const MAX_BLOCKS_IN_MCU: usize = 10;

/// Checks once per frame that this module reproduces libjpeg for it: grey (1 component) or
/// YCbCr (3), every sampling ratio (largest factor over the component's) 1 or 2 per axis and
/// whole, libjpeg's geometry (sample and block counts) as `jpeg_frame` states it, quantisers at
/// most 32767.
pub(crate) fn supports(frame: &Frame) -> Result<(), Unsupported> {
    if frame.width == 0 || frame.height == 0 {
        return Err(Unsupported("empty image"));
    }
    match (frame.colour, frame.components.len()) {
        (Colour::Grey, 1) | (Colour::YCbCr, 3) => {}
        _ => {
            return Err(Unsupported(
                "colour space other than grey or 3-component YCbCr",
            ))
        }
    }
    let max_h = frame.components.iter().map(|c| c.h).max().unwrap_or(0);
    let max_v = frame.components.iter().map(|c| c.v).max().unwrap_or(0);
    if (max_h, max_v) != (frame.max_h, frame.max_v) || !(1..=4).contains(&max_h) {
        return Err(Unsupported("largest sampling factors inconsistent"));
    }
    if !(1..=4).contains(&max_v) {
        return Err(Unsupported("largest sampling factors inconsistent"));
    }
    if frame.interleaved() && frame.blocks_per_mcu() > MAX_BLOCKS_IN_MCU {
        return Err(Unsupported("more than 10 blocks per MCU (libjpeg refuses)"));
    }
    for c in &frame.components {
        if !(1..=4).contains(&c.h) || !(1..=4).contains(&c.v) {
            return Err(Unsupported("sampling factor outside 1..=4"));
        }
        method(frame, c)?;
        let sw = (frame.width * c.h).div_ceil(max_h);
        let sh = (frame.height * c.v).div_ceil(max_v);
        if c.sampled_width != sw
            || c.sampled_height != sh
            || c.width_in_blocks != sw.div_ceil(8)
            || c.height_in_blocks != sh.div_ceil(8)
            || c.stored_w < c.width_in_blocks
            || c.stored_h < c.height_in_blocks
        {
            return Err(Unsupported("component geometry other than libjpeg's"));
        }
        if c.quant.iter().any(|&q| q > i16::MAX as u16) {
            return Err(Unsupported("quantiser above 32767"));
        }
    }
    Ok(())
}

/// libjpeg's upsampling method of one component (`jdsample.c` `jinit_upsampler`, fancy on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    /// `fullsize_upsample`: the samples as they are.
    Full,
    /// `h2v1_fancy_upsample` (`downsampled_width > 2`).
    H2V1Fancy,
    /// `h2v1_upsample`: each sample twice.
    H2V1Box,
    /// `h1v2_fancy_upsample` (any width; reads the context rows).
    H1V2Fancy,
    /// `h2v2_fancy_upsample` (`downsampled_width > 2`; reads the context rows).
    H2V2Fancy,
    /// `h2v2_upsample`: each sample in a 2×2 square.
    H2V2Box,
}

fn method(frame: &Frame, c: &Component) -> Result<Method, Unsupported> {
    if c.h == 0 || c.v == 0 || !frame.max_h.is_multiple_of(c.h) || !frame.max_v.is_multiple_of(c.v)
    {
        return Err(Unsupported("sampling ratio not whole"));
    }
    let wide = c.sampled_width > 2;
    Ok(match (frame.max_h / c.h, frame.max_v / c.v) {
        (1, 1) => Method::Full,
        (2, 1) if wide => Method::H2V1Fancy,
        (2, 1) => Method::H2V1Box,
        (1, 2) => Method::H1V2Fancy,
        (2, 2) if wide => Method::H2V2Fancy,
        (2, 2) => Method::H2V2Box,
        _ => return Err(Unsupported("sampling ratio other than 1 or 2")),
    })
}

/// One component, checked and ready to reconstruct.
struct CompPlan<'a> {
    method: Method,
    /// The quantiser in natural order, widened.
    quant: [i32; 64],
    /// As the frame gives it (for [`block_agrees`]).
    quant_raw: [u16; 64],
    /// As 16-bit lanes (every quantiser is at most 32767), for the AVX2 IDCT.
    quant16: [i16; 64],
    /// `16383 / quantiser` (`u16::MAX` where it is 0), as `u16` bits in `i16`s: the largest
    /// |coefficient| whose dequantised value surely keeps libjpeg's SIMD sums in 16 bits.
    limit16: [i16; 64],
    /// The coefficient blocks, `stored_w` per block row.
    plane: &'a [i16],
    stored_w: usize,
    width_in_blocks: usize,
    /// libjpeg's `downsampled_width` / `downsampled_height`.
    dw: usize,
    dh: usize,
}

impl CompPlan<'_> {
    /// The sample rows of this component that output rows `rows` (non-empty) read.
    fn sample_rows(&self, rows: &Range<usize>) -> Range<usize> {
        let (first, last) = (rows.start, rows.end - 1);
        match self.method {
            Method::Full | Method::H2V1Fancy | Method::H2V1Box => first..last + 1,
            Method::H2V2Box => first / 2..last / 2 + 1,
            Method::H1V2Fancy | Method::H2V2Fancy => {
                // An even output row reads the sample row above its own, an odd one the row
                // below (clamped to the real rows, as jdmainct.c's pointer lists do).
                let lo = if first.is_multiple_of(2) {
                    (first / 2).saturating_sub(1)
                } else {
                    first / 2
                };
                let hi = if last % 2 == 1 {
                    (last / 2 + 1).min(self.dh - 1)
                } else {
                    last / 2
                };
                lo..hi + 1
            }
        }
    }
}

/// A frame and its coefficients, checked.
struct Plan<'a> {
    width: usize,
    max_v: usize,
    colour: Colour,
    comps: Vec<CompPlan<'a>>,
}

impl<'a> Plan<'a> {
    fn new(frame: &Frame, coefs: &'a Coefficients) -> Result<Self, Unsupported> {
        supports(frame)?;
        if coefs.planes.len() != frame.components.len() {
            return Err(Unsupported(
                "coefficient planes do not match the components",
            ));
        }
        let mut comps = Vec::with_capacity(frame.components.len());
        for (c, plane) in frame.components.iter().zip(&coefs.planes) {
            if plane.len() != c.stored_w * c.stored_h * 64 {
                return Err(Unsupported("coefficient plane of the wrong size"));
            }
            comps.push(CompPlan {
                method: method(frame, c)?,
                quant: c.quant.map(i32::from),
                quant_raw: c.quant,
                quant16: c.quant.map(|q| q as i16),
                limit16: c
                    .quant
                    .map(|q| 16383u16.checked_div(q).unwrap_or(u16::MAX) as i16),
                plane,
                stored_w: c.stored_w,
                width_in_blocks: c.width_in_blocks,
                dw: c.sampled_width,
                dh: c.sampled_height,
            });
        }
        Ok(Plan {
            width: frame.width,
            max_v: frame.max_v,
            colour: frame.colour,
            comps,
        })
    }
}

/// Writes image rows `rows` (any sub-range of `0..frame.height`) as RGB (3 bytes per pixel,
/// `frame.width` pixels per row) into `out` (`rows.len() · width · 3` bytes): libjpeg-turbo's
/// decode of those rows. Reads only the coefficient blocks those rows need (and the context one
/// sample row above and below for the vertical fancy upsampler). Declines a frame [`supports`]
/// declines, a call whose rows or buffer do not fit the frame, and rows some coefficient of which
/// would make libjpeg's C and SIMD builds disagree (see the module's notes); `out` is then
/// unspecified.
pub(crate) fn reconstruct_rows(
    frame: &Frame,
    coefs: &Coefficients,
    rows: Range<usize>,
    out: &mut [u8],
) -> Result<(), Unsupported> {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = Avx2::detect() {
        return reconstruct_with(k, frame, coefs, rows, out);
    }
    reconstruct_with(Portable, frame, coefs, rows, out)
}

/// [`reconstruct_rows`] with kernels `k`.
fn reconstruct_with<K: Kernels>(
    k: K,
    frame: &Frame,
    coefs: &Coefficients,
    rows: Range<usize>,
    out: &mut [u8],
) -> Result<(), Unsupported> {
    let plan = Plan::new(frame, coefs)?;
    if rows.start > rows.end || rows.end > frame.height {
        return Err(Unsupported("rows outside the image"));
    }
    if out.len() != rows.len() * frame.width * 3 {
        return Err(Unsupported("output buffer of the wrong size"));
    }
    if rows.is_empty() {
        return Ok(());
    }
    if band(k, &plan, rows.clone(), out) {
        return Ok(());
    }
    // The cheap bounds leave doubt: check every block the band read, exactly.
    for c in &plan.comps {
        let samples = c.sample_rows(&rows);
        for by in samples.start / 8..samples.end.div_ceil(8) {
            let row = &c.plane[by * c.stored_w * 64..][..c.width_in_blocks * 64];
            let (blocks, _) = row.as_chunks::<64>();
            if !blocks.iter().all(|b| block_agrees(b, &c.quant_raw)) {
                return Err(Unsupported(
                    "coefficients where libjpeg's C and SIMD builds disagree",
                ));
            }
        }
    }
    Ok(())
}

/// The row kernels [`band`] runs: portable code ([`Portable`]) or AVX2 code ([`Avx2`]), the same
/// bytes wherever a band is accepted.
trait Kernels: Copy {
    /// Sample rows `rows` (within `0..8`; others may be left unwritten) of block row `by` of
    /// component `c` into `dst` (8 rows of `stride` bytes). Returns whether every value lay
    /// surely where libjpeg's builds agree (see [`Bounds::surely_agree`]); where not, the
    /// caller checks the blocks exactly.
    fn idct_row(
        self,
        c: &CompPlan,
        by: usize,
        rows: Range<usize>,
        dst: &mut [u8],
        stride: usize,
    ) -> bool;
    /// One output row of an upsampled component from its sample row `near` and the context row
    /// `far` (both `downsampled_width` long), `bias` 1 for the upper row of a pair, 2 for the
    /// lower (`h1v2_fancy_upsample`'s); writes at least `width` samples of `out`.
    fn upsample(
        self,
        method: Method,
        near: &[u8],
        far: &[u8],
        bias: u16,
        sums: &mut [u16],
        out: &mut [u8],
    );
    /// YCbCr rows (at least `out.len() / 3` samples each) to one RGB row.
    fn ycc(self, y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]);
    /// A grey row (at least `out.len() / 3` samples) to RGB.
    fn grey(self, l: &[u8], out: &mut [u8]);
}

/// The kernels in portable code.
#[derive(Clone, Copy)]
struct Portable;

impl Kernels for Portable {
    fn idct_row(
        self,
        c: &CompPlan,
        by: usize,
        _rows: Range<usize>,
        dst: &mut [u8],
        stride: usize,
    ) -> bool {
        idct_block_row(c, by, dst, stride)
    }
    fn upsample(
        self,
        method: Method,
        near: &[u8],
        far: &[u8],
        bias: u16,
        sums: &mut [u16],
        out: &mut [u8],
    ) {
        upsample_row(method, near, far, bias, sums, out);
    }
    fn ycc(self, y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
        ycc_to_rgb(y, cb, cr, out);
    }
    fn grey(self, l: &[u8], out: &mut [u8]) {
        grey_to_rgb(l, out);
    }
}

/// The kernels compiled with AVX2 enabled. A value exists only where the CPU has AVX2
/// ([`Avx2::detect`]).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx2(());

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    fn detect() -> Option<Self> {
        std::arch::is_x86_feature_detected!("avx2").then_some(Avx2(()))
    }
}

#[cfg(target_arch = "x86_64")]
impl Kernels for Avx2 {
    fn idct_row(
        self,
        c: &CompPlan,
        by: usize,
        rows: Range<usize>,
        dst: &mut [u8],
        stride: usize,
    ) -> bool {
        // SAFETY: an `Avx2` exists only where the CPU has AVX2, all the callee requires.
        unsafe {
            if rows.len() <= 2 {
                avx2::idct_row_partial(c, by, rows, dst, stride)
            } else {
                avx2::idct_row(c, by, dst, stride)
            }
        }
    }
    fn upsample(
        self,
        method: Method,
        near: &[u8],
        far: &[u8],
        bias: u16,
        sums: &mut [u16],
        out: &mut [u8],
    ) {
        // SAFETY: as in `idct_row`.
        unsafe { avx2::upsample(method, near, far, bias, sums, out) }
    }
    fn ycc(self, y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
        // SAFETY: as in `idct_row`.
        unsafe { avx2::ycc(y, cb, cr, out) }
    }
    fn grey(self, l: &[u8], out: &mut [u8]) {
        // SAFETY: as in `idct_row`.
        unsafe { avx2::grey(l, out) }
    }
}

/// The kernels compiled with AVX2 enabled: the IDCT (libjpeg-turbo's AVX2 algorithm) and the
/// colour conversion written with intrinsics, the upsampling the portable code.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{CompPlan, Method};
    use super::{
        FIX_0_298631336, FIX_0_390180644, FIX_0_541196100, FIX_0_765366865, FIX_0_899976223,
        FIX_1_175875602, FIX_1_501321110, FIX_1_847759065, FIX_1_961570560, FIX_2_053119869,
        FIX_2_562915447, FIX_3_072711026,
    };

    /// Pairs of 16-bit constants `(a, b)` repeated over the low 128-bit half and `(c, d)` over
    /// the high one (operands of `_mm256_madd_epi16`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn pairs((a, b): (i32, i32), (c, d): (i32, i32)) -> __m256i {
        let pair = |lo: i32, hi: i32| _mm_set1_epi32((hi << 16) | (lo & 0xFFFF));
        _mm256_set_m128i(pair(c, d), pair(a, b))
    }

    /// One pass of libjpeg-turbo's `jsimd_idct_islow_avx2` (`dodct`): inputs as rows (pass 1) or
    /// columns (pass 2) of 16-bit values, two per register (`in0_4` = 0 low, 4 high; `in3_1`,
    /// `in2_6`, `in7_5`); outputs `data0_1`, `data3_2`, `data4_5`, `data7_6`, shifted right by
    /// `SHIFT` with rounding and packed to 16 bits with saturation. Products are formed by
    /// `madd` on pairs (exact in 32 bits); `in0 ± in4`, `in7 + in3` and `in5 + in1` are 16-bit
    /// sums, exact when every input lies in `-16384..=16383`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn dodct<const SHIFT: i32>(
        in04: __m256i,
        in31: __m256i,
        in26: __m256i,
        in75: __m256i,
    ) -> [__m256i; 4] {
        let swap = |v: __m256i| _mm256_permute2x128_si256::<0x01>(v, v);
        // Even part: tmp3 = z2·(c0.541 + c0.765) + z3·c0.541 (low half), tmp2 = z3·(c0.541 −
        // c1.847) + z2·c0.541 (high half); tmp0, tmp1 = (in0 ± in4) << 13.
        let in62 = swap(in26);
        let k = pairs(
            (FIX_0_541196100 + FIX_0_765366865, FIX_0_541196100),
            (FIX_0_541196100 - FIX_1_847759065, FIX_0_541196100),
        );
        let tmp32_l = _mm256_madd_epi16(_mm256_unpacklo_epi16(in26, in62), k);
        let tmp32_h = _mm256_madd_epi16(_mm256_unpackhi_epi16(in26, in62), k);
        let signs = _mm256_set_m128i(_mm_set1_epi16(-1), _mm_set1_epi16(1));
        let s = _mm256_add_epi16(swap(in04), _mm256_sign_epi16(in04, signs));
        let zero = _mm256_setzero_si256();
        let tmp01_l = _mm256_srai_epi32::<{ 16 - 13 }>(_mm256_unpacklo_epi16(zero, s));
        let tmp01_h = _mm256_srai_epi32::<{ 16 - 13 }>(_mm256_unpackhi_epi16(zero, s));
        let t1011_l = _mm256_add_epi32(tmp01_l, tmp32_l);
        let t1312_l = _mm256_sub_epi32(tmp01_l, tmp32_l);
        let t1011_h = _mm256_add_epi32(tmp01_h, tmp32_h);
        let t1312_h = _mm256_sub_epi32(tmp01_h, tmp32_h);
        // Odd part: z3, z4 with z5 folded in; tmp0..tmp3 with z1, z2 folded in.
        let z34 = _mm256_add_epi16(in75, in31);
        let z43 = swap(z34);
        let kz = pairs(
            (FIX_1_175875602 - FIX_1_961570560, FIX_1_175875602),
            (FIX_1_175875602 - FIX_0_390180644, FIX_1_175875602),
        );
        let z34_l = _mm256_madd_epi16(_mm256_unpacklo_epi16(z34, z43), kz);
        let z34_h = _mm256_madd_epi16(_mm256_unpackhi_epi16(z34, z43), kz);
        let in13 = swap(in31);
        let p_l = _mm256_unpacklo_epi16(in75, in13);
        let p_h = _mm256_unpackhi_epi16(in75, in13);
        let ka = pairs(
            (FIX_0_298631336 - FIX_0_899976223, -FIX_0_899976223),
            (FIX_2_053119869 - FIX_2_562915447, -FIX_2_562915447),
        );
        let t01_l = _mm256_add_epi32(_mm256_madd_epi16(p_l, ka), z34_l);
        let t01_h = _mm256_add_epi32(_mm256_madd_epi16(p_h, ka), z34_h);
        let kb = pairs(
            (-FIX_0_899976223, FIX_1_501321110 - FIX_0_899976223),
            (-FIX_2_562915447, FIX_3_072711026 - FIX_2_562915447),
        );
        let t32_l = _mm256_add_epi32(_mm256_madd_epi16(p_l, kb), swap(z34_l));
        let t32_h = _mm256_add_epi32(_mm256_madd_epi16(p_h, kb), swap(z34_h));
        // Final stage.
        let round = _mm256_set1_epi32(1 << (SHIFT - 1));
        let out = |l: __m256i, h: __m256i| {
            _mm256_packs_epi32(
                _mm256_srai_epi32::<SHIFT>(_mm256_add_epi32(l, round)),
                _mm256_srai_epi32::<SHIFT>(_mm256_add_epi32(h, round)),
            )
        };
        [
            out(
                _mm256_add_epi32(t1011_l, t32_l),
                _mm256_add_epi32(t1011_h, t32_h),
            ),
            out(
                _mm256_add_epi32(t1312_l, t01_l),
                _mm256_add_epi32(t1312_h, t01_h),
            ),
            out(
                _mm256_sub_epi32(t1312_l, t01_l),
                _mm256_sub_epi32(t1312_h, t01_h),
            ),
            out(
                _mm256_sub_epi32(t1011_l, t32_l),
                _mm256_sub_epi32(t1011_h, t32_h),
            ),
        ]
    }

    /// libjpeg-turbo's `dotranspose`: rows (`[r0|r1]`, `[r3|r2]`, `[r4|r5]`, `[r7|r6]`, 16-bit)
    /// to columns `[c0|c4]`, `[c1|c5]`, `[c2|c6]`, `[c3|c7]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn transpose(m: [__m256i; 4]) -> [__m256i; 4] {
        let a = _mm256_permute4x64_epi64::<0xD8>(m[0]);
        let b = _mm256_permute4x64_epi64::<0x72>(m[1]);
        let c = _mm256_permute4x64_epi64::<0xD8>(m[2]);
        let d = _mm256_permute4x64_epi64::<0x72>(m[3]);
        let (e, f) = (_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
        let (g, h) = (_mm256_unpacklo_epi16(c, d), _mm256_unpackhi_epi16(c, d));
        let (a, b) = (_mm256_unpacklo_epi16(e, f), _mm256_unpacklo_epi16(g, h));
        let (c, d) = (_mm256_unpackhi_epi16(e, f), _mm256_unpackhi_epi16(g, h));
        [
            _mm256_unpacklo_epi64(a, b),
            _mm256_unpackhi_epi64(a, b),
            _mm256_unpacklo_epi64(c, d),
            _mm256_unpackhi_epi64(c, d),
        ]
    }

    /// Two rows (16 coefficients) from `b[at..]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load_rows(b: &[i16; 64], at: usize) -> __m256i {
        let r = &b[at..at + 16];
        _mm256_setr_epi16(
            r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13],
            r[14], r[15],
        )
    }

    /// What one block row's blocks fed the "surely agree" test (see
    /// [`Bounds::surely_agree`](super::Bounds::surely_agree)): a nonzero lane where some
    /// |coefficient| exceeds `16383 / quantiser` (`coef`), a top bit where some pass-1 result
    /// `w + 16384` leaves `0..32768` (`pass1`), a bit above the 10th where some output
    /// `x + 512` leaves `0..1024` (`out`).
    struct Doubt {
        coef: __m256i,
        pass1: __m256i,
        out: __m256i,
        dc: bool,
    }

    /// [`idct_block`](super::idct_block) by libjpeg-turbo's AVX2 algorithm: the same bytes
    /// wherever `doubt` stays clear (every dequantised coefficient and pass-1 result in
    /// `-16384..=16383`, so no 16-bit sum wraps and no pack saturates; see [`dodct`]); 8 rows of
    /// 8 bytes (little-endian).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn idct_block(
        coef: &[i16; 64],
        q: &[__m256i; 4],
        lim: &[__m256i; 4],
        q00: i32,
        doubt: &mut Doubt,
    ) -> [u64; 8] {
        let rows = [
            load_rows(coef, 0),
            load_rows(coef, 16),
            load_rows(coef, 32),
            load_rows(coef, 48),
        ];
        let dc_lane = _mm256_setr_epi16(
            0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let ac = _mm256_or_si256(
            _mm256_or_si256(_mm256_and_si256(rows[0], dc_lane), rows[1]),
            _mm256_or_si256(rows[2], rows[3]),
        );
        if _mm256_testz_si256(ac, ac) == 1 {
            // All AC zero: 4·d after pass 1, (4·d + 16) >> 5 after pass 2 (as `idct_block`).
            let d = i32::from(coef[0]).wrapping_mul(q00);
            let w = d.wrapping_mul(4);
            let x = w.wrapping_add(16) >> 5;
            doubt.dc |= !(-16384..=16383).contains(&d)
                || !(-16384..=16383).contains(&w)
                || !(-512..=511).contains(&x);
            let byte = u64::from((x + 128).clamp(0, 255) as u8);
            return [byte * 0x0101_0101_0101_0101; 8];
        }
        let mut d = [_mm256_setzero_si256(); 4];
        for ((d, &r), (&q, &lim)) in d.iter_mut().zip(&rows).zip(q.iter().zip(lim)) {
            let over = _mm256_xor_si256(_mm256_max_epu16(_mm256_abs_epi16(r), lim), lim);
            doubt.coef = _mm256_or_si256(doubt.coef, over);
            *d = _mm256_mullo_epi16(r, q);
        }
        // d = [r0|r1], [r2|r3], [r4|r5], [r6|r7].
        let in04 = _mm256_permute2x128_si256::<0x20>(d[0], d[2]);
        let in31 = _mm256_permute2x128_si256::<0x31>(d[1], d[0]);
        let in26 = _mm256_permute2x128_si256::<0x20>(d[1], d[3]);
        let in75 = _mm256_permute2x128_si256::<0x31>(d[3], d[2]);
        let w = dodct::<{ 13 - 2 }>(in04, in31, in26, in75);
        let centre16 = _mm256_set1_epi16(16384);
        for &v in &w {
            doubt.pass1 = _mm256_or_si256(doubt.pass1, _mm256_add_epi16(v, centre16));
        }
        let [c04, c15, c26, c37] = transpose(w);
        let in75 = _mm256_permute2x128_si256::<0x31>(c37, c15);
        let in31 = _mm256_permute2x128_si256::<0x20>(c37, c15);
        let x = dodct::<{ 13 + 2 + 3 }>(c04, in31, c26, in75);
        let centre_out = _mm256_set1_epi16(512);
        for &v in &x {
            doubt.out = _mm256_or_si256(doubt.out, _mm256_add_epi16(v, centre_out));
        }
        let [r04, r15, r26, r37] = transpose(x);
        // Signed saturation to -128..=127, then + 128: the clamp of x + 128 to 0..=255.
        let flip = _mm256_set1_epi8(-128);
        let a = _mm256_xor_si256(_mm256_packs_epi16(r04, r15), flip); // r0 r1 | r4 r5
        let b = _mm256_xor_si256(_mm256_packs_epi16(r26, r37), flip); // r2 r3 | r6 r7
        [
            _mm256_extract_epi64::<0>(a) as u64,
            _mm256_extract_epi64::<1>(a) as u64,
            _mm256_extract_epi64::<0>(b) as u64,
            _mm256_extract_epi64::<1>(b) as u64,
            _mm256_extract_epi64::<2>(a) as u64,
            _mm256_extract_epi64::<3>(a) as u64,
            _mm256_extract_epi64::<2>(b) as u64,
            _mm256_extract_epi64::<3>(b) as u64,
        ]
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn rows16(v: &[i16; 64]) -> [__m256i; 4] {
        [
            load_rows(v, 0),
            load_rows(v, 16),
            load_rows(v, 32),
            load_rows(v, 48),
        ]
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn idct_row(c: &CompPlan, by: usize, dst: &mut [u8], stride: usize) -> bool {
        let row = &c.plane[by * c.stored_w * 64..][..c.width_in_blocks * 64];
        let (blocks, _) = row.as_chunks::<64>();
        let q = rows16(&c.quant16);
        let lim = rows16(&c.limit16);
        let zero = _mm256_setzero_si256();
        let mut doubt = Doubt {
            coef: zero,
            pass1: zero,
            out: zero,
            dc: false,
        };
        for (bx, block) in blocks.iter().enumerate() {
            let px = idct_block(block, &q, &lim, c.quant[0], &mut doubt);
            for (r, p) in px.iter().enumerate() {
                let at = r * stride + bx * 8;
                dst[at..at + 8].copy_from_slice(&p.to_le_bytes());
            }
        }
        let pass1 = _mm256_and_si256(doubt.pass1, _mm256_set1_epi16(i16::MIN));
        let out = _mm256_and_si256(doubt.out, _mm256_set1_epi16(!1023));
        let any = _mm256_or_si256(doubt.coef, _mm256_or_si256(pass1, out));
        !doubt.dc && _mm256_testz_si256(any, any) == 1
    }

    /// [`idct_row`] for `rows.len() ≤ 2` sample rows of each block (a block row at a band's
    /// edge): for each, one row of pass 1 (`Σ_k M[r][k]·d_k` by `madd` on coefficient rows,
    /// lanes the columns) and its pass 2 (`Σ_c M[n][c]·w_c`, lanes the output columns), `M` the
    /// integer matrix of [`idct_1d`](super::idct_1d). The exact sums of jidctint.c's butterfly
    /// (it is that matrix; no rounding inside a pass), so the bytes of [`idct_row`] for those
    /// rows wherever it is sure; unsure as it would be, for the rows computed (libjpeg's other
    /// rows do not touch these).
    #[target_feature(enable = "avx2")]
    pub(super) fn idct_row_partial(
        c: &CompPlan,
        by: usize,
        rows: std::ops::Range<usize>,
        dst: &mut [u8],
        stride: usize,
    ) -> bool {
        let m = super::idct_matrix();
        let pack = |a: i32, b: i32| (b << 16) | (a & 0xFFFF);
        // Pass-2 constants: pair j of the row's inputs, each output column n a lane.
        let mut kp = [_mm256_setzero_si256(); 4];
        for (j, kp) in kp.iter_mut().enumerate() {
            let e = |n: usize| pack(m[n][2 * j], m[n][2 * j + 1]);
            *kp = _mm256_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7));
        }
        // Pass-1 constants of each row computed: pair j of the coefficient rows.
        let mut kr = [[_mm256_setzero_si256(); 4]; 2];
        for (kr, r) in kr.iter_mut().zip(rows.clone()) {
            for (j, k) in kr.iter_mut().enumerate() {
                *k = _mm256_set1_epi32(pack(m[r][2 * j], m[r][2 * j + 1]));
            }
        }
        let row = &c.plane[by * c.stored_w * 64..][..c.width_in_blocks * 64];
        let (blocks, _) = row.as_chunks::<64>();
        let q = rows16(&c.quant16);
        let lim = rows16(&c.limit16);
        let zero = _mm256_setzero_si256();
        let mut doubt = Doubt {
            coef: zero,
            pass1: zero,
            out: zero,
            dc: false,
        };
        let dc_lane = _mm256_setr_epi16(
            0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        for (bx, block) in blocks.iter().enumerate() {
            let raw = [
                load_rows(block, 0),
                load_rows(block, 16),
                load_rows(block, 32),
                load_rows(block, 48),
            ];
            let ac = _mm256_or_si256(
                _mm256_or_si256(_mm256_and_si256(raw[0], dc_lane), raw[1]),
                _mm256_or_si256(raw[2], raw[3]),
            );
            if _mm256_testz_si256(ac, ac) == 1 {
                // All AC zero, as in `idct_block`.
                let d = i32::from(block[0]).wrapping_mul(c.quant[0]);
                let w = d.wrapping_mul(4);
                let x = w.wrapping_add(16) >> 5;
                doubt.dc |= !(-16384..=16383).contains(&d)
                    || !(-16384..=16383).contains(&w)
                    || !(-512..=511).contains(&x);
                let byte = (x + 128).clamp(0, 255) as u8;
                for r in rows.clone() {
                    let at = r * stride + bx * 8;
                    dst[at..at + 8].fill(byte);
                }
                continue;
            }
            // Dequantised rows d_k, 16 bits (exact where `doubt.coef` stays clear).
            let mut d = [_mm_setzero_si128(); 8];
            for (k, ((&r, &q), &lim)) in raw.iter().zip(&q).zip(&lim).enumerate() {
                let over = _mm256_xor_si256(_mm256_max_epu16(_mm256_abs_epi16(r), lim), lim);
                doubt.coef = _mm256_or_si256(doubt.coef, over);
                let v = _mm256_mullo_epi16(r, q);
                d[2 * k] = _mm256_castsi256_si128(v);
                d[2 * k + 1] = _mm256_extracti128_si256::<1>(v);
            }
            // Pairs (d_2j, d_2j+1) of each column, columns 0..4 low, 4..8 high.
            let mut pairs = [zero; 4];
            for (j, p) in pairs.iter_mut().enumerate() {
                let (a, b) = (d[2 * j], d[2 * j + 1]);
                *p = _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
            }
            for (r, kr) in rows.clone().zip(&kr) {
                let mut acc = _mm256_set1_epi32(1 << 10);
                for (p, k) in pairs.iter().zip(kr) {
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(*p, *k));
                }
                let w = _mm256_srai_epi32::<11>(acc);
                let w16 =
                    _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
                let w16x = _mm256_zextsi128_si256(_mm_add_epi16(w16, _mm_set1_epi16(16384)));
                doubt.pass1 = _mm256_or_si256(doubt.pass1, w16x);
                let mut acc = _mm256_set1_epi32(1 << 17);
                let wpair = [
                    _mm_extract_epi32::<0>(w16),
                    _mm_extract_epi32::<1>(w16),
                    _mm_extract_epi32::<2>(w16),
                    _mm_extract_epi32::<3>(w16),
                ];
                for (&wp, &k) in wpair.iter().zip(&kp) {
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_set1_epi32(wp), k));
                }
                let x = _mm256_srai_epi32::<18>(acc);
                let x16 =
                    _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
                let x16o = _mm256_zextsi128_si256(_mm_add_epi16(x16, _mm_set1_epi16(512)));
                doubt.out = _mm256_or_si256(doubt.out, x16o);
                // Signed saturation to -128..=127, then + 128, as `idct_block`.
                let bytes = _mm_xor_si128(_mm_packs_epi16(x16, x16), _mm_set1_epi8(-128));
                let at = r * stride + bx * 8;
                dst[at..at + 8].copy_from_slice(&(_mm_cvtsi128_si64(bytes) as u64).to_le_bytes());
            }
        }
        let pass1 = _mm256_and_si256(doubt.pass1, _mm256_set1_epi16(i16::MIN));
        let out = _mm256_and_si256(doubt.out, _mm256_set1_epi16(!1023));
        let any = _mm256_or_si256(doubt.coef, _mm256_or_si256(pass1, out));
        !doubt.dc && _mm256_testz_si256(any, any) == 1
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn upsample(
        method: Method,
        near: &[u8],
        far: &[u8],
        bias: u16,
        sums: &mut [u16],
        out: &mut [u8],
    ) {
        super::upsample_row(method, near, far, bias, sums, out);
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn load32(b: &[u8; 32]) -> __m256i {
        let c = b.as_chunks::<8>().0;
        _mm256_setr_epi64x(
            i64::from_le_bytes(c[0]),
            i64::from_le_bytes(c[1]),
            i64::from_le_bytes(c[2]),
            i64::from_le_bytes(c[3]),
        )
    }

    /// `pshufb` masks that place channel `ch` of 16 pixels in bytes `16·k..16·k + 16` of their
    /// 48-byte RGB interleave (other bytes zero), for both 128-bit halves.
    const fn interleave_mask(ch: usize, k: usize) -> [u8; 32] {
        let mut m = [0x80u8; 32];
        let mut j = 0;
        while j < 16 {
            let at = 16 * k + j;
            if at % 3 == ch {
                m[j] = (at / 3) as u8;
                m[16 + j] = (at / 3) as u8;
            }
            j += 1;
        }
        m
    }

    const MASKS: [[[u8; 32]; 3]; 3] = {
        let mut m = [[[0u8; 32]; 3]; 3];
        let mut ch = 0;
        while ch < 3 {
            let mut k = 0;
            while k < 3 {
                m[ch][k] = interleave_mask(ch, k);
                k += 1;
            }
            ch += 1;
        }
        m
    };

    /// Bytes `r`, `g`, `b` of 32 pixels (pixels 0..16 in the low half, 16..32 in the high
    /// one) interleaved into `out`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn store_rgb(r: __m256i, g: __m256i, b: __m256i, out: &mut [u8; 96]) {
        let mut parts = [_mm256_setzero_si256(); 3];
        for (k, part) in parts.iter_mut().enumerate() {
            let pick = |v: __m256i, ch: usize| _mm256_shuffle_epi8(v, load32(&MASKS[ch][k]));
            *part = _mm256_or_si256(_mm256_or_si256(pick(r, 0), pick(g, 1)), pick(b, 2));
        }
        // parts[k] holds bytes 16k..16k+16 of pixels 0..16 (low half) and of 16..32 (high).
        let words = [
            _mm256_extract_epi64::<0>(parts[0]),
            _mm256_extract_epi64::<1>(parts[0]),
            _mm256_extract_epi64::<0>(parts[1]),
            _mm256_extract_epi64::<1>(parts[1]),
            _mm256_extract_epi64::<0>(parts[2]),
            _mm256_extract_epi64::<1>(parts[2]),
            _mm256_extract_epi64::<2>(parts[0]),
            _mm256_extract_epi64::<3>(parts[0]),
            _mm256_extract_epi64::<2>(parts[1]),
            _mm256_extract_epi64::<3>(parts[1]),
            _mm256_extract_epi64::<2>(parts[2]),
            _mm256_extract_epi64::<3>(parts[2]),
        ];
        for (o, w) in out.as_chunks_mut::<8>().0.iter_mut().zip(words) {
            *o = w.to_le_bytes();
        }
    }

    /// `(c·v + 2^15) >> 16` exactly, from the 16-bit halves of the 32-bit product (`c`, `v` in
    /// `i16`): the high half, plus one where the low half's top bit is set.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mul_round16(v: __m256i, c: i16) -> __m256i {
        let c = _mm256_set1_epi16(c);
        _mm256_sub_epi16(
            _mm256_mulhi_epi16(v, c),
            _mm256_srai_epi16::<15>(_mm256_mullo_epi16(v, c)),
        )
    }

    /// R, G, B of 16 pixels (`i16` lanes, y in 0..=255): `ycc_pixel` before the clamp. The
    /// constants split as 91881 = 2¹⁶ + 26345, 116130 = 2·2¹⁶ − 14942, −46802 = −2¹⁶ + 18734,
    /// so every product fits the 16-bit multiplies (exactness: [`tests::ycc_kernel_is_exact`]).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn ycc16(y: __m256i, cb: __m256i, cr: __m256i) -> [__m256i; 3] {
        let centre = _mm256_set1_epi16(128);
        let (cb, cr) = (_mm256_sub_epi16(cb, centre), _mm256_sub_epi16(cr, centre));
        let r = _mm256_add_epi16(cr, mul_round16(cr, 26345));
        let b = _mm256_add_epi16(_mm256_add_epi16(cb, cb), mul_round16(cb, -14942));
        let k = _mm256_set1_epi32((18734 << 16) | (-22554i32 & 0xFFFF));
        let half = _mm256_set1_epi32(1 << 15);
        let lo = _mm256_madd_epi16(_mm256_unpacklo_epi16(cb, cr), k);
        let hi = _mm256_madd_epi16(_mm256_unpackhi_epi16(cb, cr), k);
        let lo = _mm256_srai_epi32::<16>(_mm256_add_epi32(lo, half));
        let hi = _mm256_srai_epi32::<16>(_mm256_add_epi32(hi, half));
        let g = _mm256_sub_epi16(_mm256_packs_epi32(lo, hi), cr);
        [
            _mm256_add_epi16(y, r),
            _mm256_add_epi16(y, g),
            _mm256_add_epi16(y, b),
        ]
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn ycc(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
        let mut done = 0;
        let chunks = out
            .as_chunks_mut::<96>()
            .0
            .iter_mut()
            .zip(y.as_chunks::<32>().0)
            .zip(cb.as_chunks::<32>().0)
            .zip(cr.as_chunks::<32>().0);
        for (((o, y), cb), cr) in chunks {
            let (y, cb, cr) = (load32(y), load32(cb), load32(cr));
            let wide = |v: __m256i, half| match half {
                0 => _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)),
                _ => _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(v)),
            };
            let a = ycc16(wide(y, 0), wide(cb, 0), wide(cr, 0));
            let b = ycc16(wide(y, 1), wide(cb, 1), wide(cr, 1));
            // Saturating packs clamp to 0..=255; the permute puts pixels 0..16 low, 16..32 high.
            let bytes = |i: usize| {
                _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(a[i], b[i]))
            };
            store_rgb(bytes(0), bytes(1), bytes(2), o);
            done += 32;
        }
        super::ycc_to_rgb(&y[done..], &cb[done..], &cr[done..], &mut out[3 * done..]);
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn grey(l: &[u8], out: &mut [u8]) {
        let mut done = 0;
        for (o, l) in out
            .as_chunks_mut::<96>()
            .0
            .iter_mut()
            .zip(l.as_chunks::<32>().0)
        {
            let v = load32(l);
            store_rgb(v, v, v, o);
            done += 32;
        }
        super::grey_to_rgb(&l[done..], &mut out[3 * done..]);
    }
}

/// Eight lanes.
type V = [i32; 8];

/// Running bounds of the values whose range decides whether libjpeg's builds agree: the
/// dequantised coefficients and pass-1 results (`lo16`/`hi16`), and the outputs before the
/// clamp (`lo_out`/`hi_out`), lane by lane.
#[derive(Clone, Copy)]
struct Bounds {
    lo16: V,
    hi16: V,
    lo_out: V,
    hi_out: V,
}

impl Bounds {
    fn new() -> Self {
        Bounds {
            lo16: [i32::MAX; 8],
            hi16: [i32::MIN; 8],
            lo_out: [i32::MAX; 8],
            hi_out: [i32::MIN; 8],
        }
    }

    #[inline(always)]
    fn note16(&mut self, v: &V) {
        for ((lo, hi), &x) in self.lo16.iter_mut().zip(&mut self.hi16).zip(v) {
            *lo = (*lo).min(x);
            *hi = (*hi).max(x);
        }
    }

    #[inline(always)]
    fn note_out(&mut self, v: &V) {
        for ((lo, hi), &x) in self.lo_out.iter_mut().zip(&mut self.hi_out).zip(v) {
            *lo = (*lo).min(x);
            *hi = (*hi).max(x);
        }
    }

    /// Whether every value noted lies where both builds of libjpeg surely give the C code's
    /// exact result: dequantised coefficients and pass-1 results in `-16384..=16383` (so they
    /// and the 16-bit sums of two of them fit `i16`), outputs in `-512..=511`.
    fn surely_agree(&self) -> bool {
        let lo16 = self.lo16.iter().min().copied().unwrap_or(0);
        let hi16 = self.hi16.iter().max().copied().unwrap_or(0);
        let lo = self.lo_out.iter().min().copied().unwrap_or(0);
        let hi = self.hi_out.iter().max().copied().unwrap_or(0);
        lo16 >= -16384 && hi16 <= 16383 && lo >= -512 && hi <= 511
    }
}

/// One lane type of the IDCT butterfly: [`V`] (wrapping `i32`, the fast path) or `i64` (exact,
/// the checks).
trait Lane: Copy {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mulc(self, c: i32) -> Self;
    /// `· 2^CONST_BITS`.
    fn shl13(self) -> Self;
}

// Plain index loops here and below: `array::map` / `from_fn` are not always inlined into the
// AVX2 copy, and then run as out-of-line SSE2 code.
impl Lane for V {
    #[inline(always)]
    fn add(mut self, o: Self) -> Self {
        for i in 0..8 {
            self[i] = self[i].wrapping_add(o[i]);
        }
        self
    }
    #[inline(always)]
    fn sub(mut self, o: Self) -> Self {
        for i in 0..8 {
            self[i] = self[i].wrapping_sub(o[i]);
        }
        self
    }
    #[inline(always)]
    fn mulc(mut self, c: i32) -> Self {
        for x in &mut self {
            *x = x.wrapping_mul(c);
        }
        self
    }
    #[inline(always)]
    fn shl13(mut self) -> Self {
        for x in &mut self {
            *x = x.wrapping_shl(13);
        }
        self
    }
}

impl Lane for i64 {
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mulc(self, c: i32) -> Self {
        self * i64::from(c)
    }
    #[inline(always)]
    fn shl13(self) -> Self {
        self * (1 << 13)
    }
}

// jidctint.c's constants: FIX(x) = round(x · 2^13).
const FIX_0_298631336: i32 = 2446;
const FIX_0_390180644: i32 = 3196;
const FIX_0_541196100: i32 = 4433;
const FIX_0_765366865: i32 = 6270;
const FIX_0_899976223: i32 = 7373;
const FIX_1_175875602: i32 = 9633;
const FIX_1_501321110: i32 = 12299;
const FIX_1_847759065: i32 = 15137;
const FIX_1_961570560: i32 = 16069;
const FIX_2_053119869: i32 = 16819;
const FIX_2_562915447: i32 = 20995;
const FIX_3_072711026: i32 = 25172;

/// One 1-D pass of `jpeg_idct_islow` before its descaling shift: inputs `x[k]` (frequency k),
/// outputs in natural order. The same sums and products as jidctint.c, in the same ring.
#[inline(always)]
fn idct_1d<L: Lane>(x: [L; 8]) -> [L; 8] {
    // Even part.
    let (z2, z3) = (x[2], x[6]);
    let z1 = z2.add(z3).mulc(FIX_0_541196100);
    let tmp2 = z1.add(z3.mulc(-FIX_1_847759065));
    let tmp3 = z1.add(z2.mulc(FIX_0_765366865));
    let tmp0 = x[0].add(x[4]).shl13();
    let tmp1 = x[0].sub(x[4]).shl13();
    let (tmp10, tmp13) = (tmp0.add(tmp3), tmp0.sub(tmp3));
    let (tmp11, tmp12) = (tmp1.add(tmp2), tmp1.sub(tmp2));
    // Odd part.
    let (t0, t1, t2, t3) = (x[7], x[5], x[3], x[1]);
    let z1 = t0.add(t3);
    let z2 = t1.add(t2);
    let z3 = t0.add(t2);
    let z4 = t1.add(t3);
    let z5 = z3.add(z4).mulc(FIX_1_175875602);
    let t0 = t0.mulc(FIX_0_298631336);
    let t1 = t1.mulc(FIX_2_053119869);
    let t2 = t2.mulc(FIX_3_072711026);
    let t3 = t3.mulc(FIX_1_501321110);
    let z1 = z1.mulc(-FIX_0_899976223);
    let z2 = z2.mulc(-FIX_2_562915447);
    let z3 = z3.mulc(-FIX_1_961570560).add(z5);
    let z4 = z4.mulc(-FIX_0_390180644).add(z5);
    let t0 = t0.add(z1.add(z3));
    let t1 = t1.add(z2.add(z4));
    let t2 = t2.add(z2.add(z3));
    let t3 = t3.add(z1.add(z4));
    [
        tmp10.add(t3),
        tmp11.add(t2),
        tmp12.add(t1),
        tmp13.add(t0),
        tmp13.sub(t0),
        tmp12.sub(t1),
        tmp11.sub(t2),
        tmp10.sub(t3),
    ]
}

/// The integer matrix of one [`idct_1d`] pass: `m[n][k]` = output `n` of input `k` alone (every
/// entry fits 16 bits).
fn idct_matrix() -> [[i32; 8]; 8] {
    let cols: [[i64; 8]; 8] =
        std::array::from_fn(|k| idct_1d(std::array::from_fn(|j| i64::from(j == k))));
    std::array::from_fn(|n| std::array::from_fn(|k| cols[k][n] as i32))
}

/// The 8×8 transpose in the three interleaving stages of AVX2 (32-bit unpacks within 128-bit
/// halves, 64-bit unpacks, 128-bit half swaps), written so the compiler sees the shuffles.
#[inline(always)]
fn transpose(m: &[V; 8]) -> [V; 8] {
    #[inline(always)]
    fn lo32(a: &V, b: &V) -> V {
        [a[0], b[0], a[1], b[1], a[4], b[4], a[5], b[5]]
    }
    #[inline(always)]
    fn hi32(a: &V, b: &V) -> V {
        [a[2], b[2], a[3], b[3], a[6], b[6], a[7], b[7]]
    }
    #[inline(always)]
    fn lo64(a: &V, b: &V) -> V {
        [a[0], a[1], b[0], b[1], a[4], a[5], b[4], b[5]]
    }
    #[inline(always)]
    fn hi64(a: &V, b: &V) -> V {
        [a[2], a[3], b[2], b[3], a[6], a[7], b[6], b[7]]
    }
    #[inline(always)]
    fn lo128(a: &V, b: &V) -> V {
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
    #[inline(always)]
    fn hi128(a: &V, b: &V) -> V {
        [a[4], a[5], a[6], a[7], b[4], b[5], b[6], b[7]]
    }
    let t = [
        lo32(&m[0], &m[1]),
        hi32(&m[0], &m[1]),
        lo32(&m[2], &m[3]),
        hi32(&m[2], &m[3]),
        lo32(&m[4], &m[5]),
        hi32(&m[4], &m[5]),
        lo32(&m[6], &m[7]),
        hi32(&m[6], &m[7]),
    ];
    // Columns (0, 4), (1, 5), (2, 6), (3, 7) of rows 0..4, then of rows 4..8.
    let u = [
        lo64(&t[0], &t[2]),
        hi64(&t[0], &t[2]),
        lo64(&t[1], &t[3]),
        hi64(&t[1], &t[3]),
        lo64(&t[4], &t[6]),
        hi64(&t[4], &t[6]),
        lo64(&t[5], &t[7]),
        hi64(&t[5], &t[7]),
    ];
    [
        lo128(&u[0], &u[4]),
        lo128(&u[1], &u[5]),
        lo128(&u[2], &u[6]),
        lo128(&u[3], &u[7]),
        hi128(&u[0], &u[4]),
        hi128(&u[1], &u[5]),
        hi128(&u[2], &u[6]),
        hi128(&u[3], &u[7]),
    ]
}

/// `jpeg_idct_islow` of one block (natural order, quantiser `q`): 8 rows of 8 samples. Notes the
/// values [`Bounds`] tracks.
#[inline(always)]
fn idct_block(coef: &[i16; 64], q: &[i32; 64], b: &mut Bounds) -> [[u8; 8]; 8] {
    let ac = coef[1..].iter().fold(0i16, |a, &c| a | c);
    if ac == 0 {
        // Every column is DC-only (pass 1 gives 4·d everywhere), then so is every row.
        let d = i32::from(coef[0]).wrapping_mul(q[0]);
        let w = d.wrapping_mul(4);
        let x = w.wrapping_add(16) >> 5;
        b.note16(&[d, w, d, w, d, w, d, w]);
        b.note_out(&[x; 8]);
        return [[(x + 128).clamp(0, 255) as u8; 8]; 8];
    }
    // Pass 1: columns (lanes), rows of coefficients in.
    let mut x = [[0i32; 8]; 8];
    for k in 0..8 {
        for c in 0..8 {
            x[k][c] = i32::from(coef[k * 8 + c]).wrapping_mul(q[k * 8 + c]);
        }
        b.note16(&x[k]);
    }
    let mut w = idct_1d(x);
    for v in &mut w {
        for e in v.iter_mut() {
            *e = e.wrapping_add(1 << 10) >> 11;
        }
        b.note16(v);
    }
    // Pass 2: rows (lanes after the transpose).
    let mut s = idct_1d(transpose(&w));
    for v in &mut s {
        for e in v.iter_mut() {
            *e = e.wrapping_add(1 << 17) >> 18;
        }
        b.note_out(v);
    }
    let s = transpose(&s);
    let mut px = [[0u8; 8]; 8];
    for r in 0..8 {
        for n in 0..8 {
            px[r][n] = (s[r][n] + 128).clamp(0, 255) as u8;
        }
    }
    px
}

/// Whether libjpeg's C and SIMD IDCTs of this block give the same bytes, and ours gives them:
/// every dequantised coefficient, the 16-bit sums `d0±d4`, `d1+d5`, `d3+d7` of each column, every
/// pass-1 result and the same sums of each row in `i16`, every output before the clamp in
/// `-512..=511` (see the module's notes). Exact (`i64`).
fn block_agrees(coef: &[i16; 64], quant: &[u16; 64]) -> bool {
    let in16 = |v: i64| (-32768..=32767).contains(&v);
    let sums_fit = |x: &[i64; 8]| {
        in16(x[0] + x[4]) && in16(x[0] - x[4]) && in16(x[1] + x[5]) && in16(x[3] + x[7])
    };
    let d: [i64; 64] = std::array::from_fn(|i| i64::from(coef[i]) * i64::from(quant[i]));
    if !d.iter().all(|&v| in16(v)) {
        return false;
    }
    let mut ws = [[0i64; 8]; 8];
    for c in 0..8 {
        let x: [i64; 8] = std::array::from_fn(|k| d[k * 8 + c]);
        if !sums_fit(&x) {
            return false;
        }
        for (n, o) in idct_1d(x).into_iter().enumerate() {
            let w = (o + (1 << 10)) >> 11;
            if !in16(w) {
                return false;
            }
            ws[n][c] = w;
        }
    }
    ws.iter().all(|row| {
        sums_fit(row)
            && idct_1d(*row)
                .iter()
                .all(|&o| (-512..=511).contains(&((o + (1 << 17)) >> 18)))
    })
}

/// The reconstructed block rows of one component that the rows in hand need: block rows
/// `first..first + count`, each 8 sample rows of `stride` bytes.
struct Window {
    data: Vec<u8>,
    stride: usize,
    first: usize,
    count: usize,
}

impl Window {
    fn new(stride: usize) -> Self {
        Window {
            data: Vec::new(),
            stride,
            first: 0,
            count: 0,
        }
    }

    /// Makes the window hold block rows `need` (which starts at or after the window's start),
    /// keeping the rows it already holds and reconstructing the others, of each only the sample
    /// rows in `band` (all the band in hand ever reads: a block row at its edge, read only for
    /// the upsampler's context or cut by the image's last row, is reconstructed in part).
    fn ensure<K: Kernels>(
        &mut self,
        k: K,
        need: Range<usize>,
        band: &Range<usize>,
        c: &CompPlan,
    ) -> bool {
        let mut sure = true;
        let row_bytes = 8 * self.stride;
        if need.start < self.first || need.start >= self.first + self.count {
            (self.first, self.count) = (need.start, 0);
        } else if need.start > self.first {
            let drop = need.start - self.first;
            self.data
                .copy_within(drop * row_bytes..self.count * row_bytes, 0);
            self.count -= drop;
            self.first = need.start;
        }
        while self.first + self.count < need.end {
            let by = self.first + self.count;
            let at = self.count * row_bytes;
            if self.data.len() < at + row_bytes {
                self.data.resize(at + row_bytes, 0);
            }
            let rows = band.start.max(8 * by) - 8 * by..band.end.min(8 * by + 8) - 8 * by;
            let dst = &mut self.data[at..at + row_bytes];
            sure &= k.idct_row(c, by, rows, dst, self.stride);
            self.count += 1;
        }
        sure
    }

    /// Sample row `sy` (held).
    #[inline(always)]
    fn row(&self, sy: usize) -> &[u8] {
        let r = sy - self.first * 8;
        &self.data[r * self.stride..(r + 1) * self.stride]
    }
}

/// [`Kernels::idct_row`].
#[inline(always)]
fn idct_block_row(c: &CompPlan, by: usize, dst: &mut [u8], stride: usize) -> bool {
    let mut b = Bounds::new();
    let row = &c.plane[by * c.stored_w * 64..][..c.width_in_blocks * 64];
    let (blocks, _) = row.as_chunks::<64>();
    for (bx, block) in blocks.iter().enumerate() {
        let px = idct_block(block, &c.quant, &mut b);
        for (r, p) in px.iter().enumerate() {
            let at = r * stride + bx * 8;
            dst[at..at + 8].copy_from_slice(p);
        }
    }
    b.surely_agree()
}

/// Reconstructs `rows` into `out`, one iMCU row (8·max_v output rows) at a time, each block
/// reconstructed once; returns whether every block surely gives libjpeg's bytes (else the
/// caller checks them exactly).
fn band<K: Kernels>(k: K, plan: &Plan, rows: Range<usize>, out: &mut [u8]) -> bool {
    let width = plan.width;
    let imcu = 8 * plan.max_v;
    let mut sure = true;
    let mut windows: Vec<Window> = plan
        .comps
        .iter()
        .map(|c| Window::new(c.width_in_blocks * 8))
        .collect();
    let widest = plan.comps.iter().map(|c| c.dw).max().unwrap_or(0);
    // Full-width rows of the upsampled components (2·dw ≥ width samples), and the column sums.
    let mut bufs: Vec<Vec<u8>> = plan
        .comps
        .iter()
        .map(|c| vec![0u8; (2 * c.dw).max(width)])
        .collect();
    let mut sums = vec![0u16; widest];
    let mut out_rows = out.chunks_exact_mut(width * 3);
    let mut y = rows.start;
    while y < rows.end {
        let end = ((y / imcu + 1) * imcu).min(rows.end);
        for (c, win) in plan.comps.iter().zip(windows.iter_mut()) {
            let s = c.sample_rows(&(y..end));
            sure &= win.ensure(k, s.start / 8..s.end.div_ceil(8), &c.sample_rows(&rows), c);
        }
        for yy in y..end {
            let Some(orow) = out_rows.next() else {
                return sure;
            };
            match (plan.colour, &plan.comps[..], &windows[..], &mut bufs[..]) {
                (Colour::YCbCr, [c0, c1, c2], [w0, w1, w2], [b0, b1, b2]) => {
                    let yr = component_row(k, c0, w0, yy, b0, &mut sums);
                    let cb = component_row(k, c1, w1, yy, b1, &mut sums);
                    let cr = component_row(k, c2, w2, yy, b2, &mut sums);
                    k.ycc(yr, cb, cr, orow);
                }
                (_, [c0], [w0], [b0]) => {
                    let l = component_row(k, c0, w0, yy, b0, &mut sums);
                    k.grey(l, orow);
                }
                // `supports` admits nothing else.
                _ => return sure,
            }
        }
        y = end;
    }
    sure
}

/// Output row `y` of component `c` at full resolution (at least `width` samples): a row of its
/// window, or that upsampled into `buf`.
fn component_row<'a, K: Kernels>(
    k: K,
    c: &CompPlan,
    win: &'a Window,
    y: usize,
    buf: &'a mut [u8],
    sums: &mut [u16],
) -> &'a [u8] {
    let dw = c.dw;
    let (near, far, bias) = match c.method {
        Method::Full => return win.row(y),
        Method::H2V1Box | Method::H2V1Fancy => (y, y, 0),
        Method::H2V2Box => (y / 2, y / 2, 0),
        Method::H1V2Fancy | Method::H2V2Fancy => {
            // The row above for the upper output row of the pair, below for the lower one.
            if y.is_multiple_of(2) {
                (y / 2, (y / 2).saturating_sub(1), 1)
            } else {
                (y / 2, (y / 2 + 1).min(c.dh - 1), 2)
            }
        }
    };
    let (near, far) = (&win.row(near)[..dw], &win.row(far)[..dw]);
    k.upsample(c.method, near, far, bias, sums, buf);
    buf
}

/// [`Kernels::upsample`].
#[inline(always)]
fn upsample_row(
    method: Method,
    near: &[u8],
    far: &[u8],
    bias: u16,
    sums: &mut [u16],
    out: &mut [u8],
) {
    let dw = near.len();
    match method {
        Method::Full => {
            for (o, &v) in out.iter_mut().zip(near) {
                *o = v;
            }
        }
        Method::H2V1Box | Method::H2V2Box => box_h2(near, out),
        Method::H2V1Fancy => {
            let sums = &mut sums[..dw];
            for (s, &v) in sums.iter_mut().zip(near) {
                *s = u16::from(v);
            }
            triangle_h2(sums, out, 1, 2, 2);
        }
        Method::H1V2Fancy => {
            for ((o, &a), &f) in out[..dw].iter_mut().zip(near).zip(far) {
                *o = ((3 * u16::from(a) + u16::from(f) + bias) >> 2) as u8;
            }
        }
        Method::H2V2Fancy => {
            let sums = &mut sums[..dw];
            for ((s, &a), &f) in sums.iter_mut().zip(near).zip(far) {
                *s = 3 * u16::from(a) + u16::from(f);
            }
            triangle_h2(sums, out, 8, 7, 4);
        }
    }
}

/// Each sample twice (`h2v1_upsample`, `h2v2_upsample`'s rows).
#[inline(always)]
fn box_h2(s: &[u8], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(2).zip(s) {
        o[0] = v;
        o[1] = v;
    }
}

/// The horizontal triangle filter of `h2v1_fancy_upsample` (`be, bo, shift` = 1, 2, 2 on the
/// samples) and `h2v2_fancy_upsample` (8, 7, 4 on the column sums `3·near + far`): output `2i`
/// is `(3·c[i] + c[i−1] + be) >> shift`, `2i + 1` is `(3·c[i] + c[i+1] + bo) >> shift`, the
/// outermost `c[i∓1]` standing in for the missing ones (which gives jdsample.c's first and last
/// columns). `c.len() > 2`; writes `out[..2·c.len()]`.
#[inline(always)]
fn triangle_h2(c: &[u16], out: &mut [u8], be: u16, bo: u16, shift: u32) {
    let n = c.len();
    if n < 3 || out.len() < 2 * n {
        return;
    }
    out[0] = ((4 * c[0] + be) >> shift) as u8;
    out[1] = ((3 * c[0] + c[1] + bo) >> shift) as u8;
    let inner = out[2..2 * n - 2].chunks_exact_mut(2);
    for ((o, (&p, &m)), &x) in inner.zip(c.iter().zip(&c[1..])).zip(&c[2..]) {
        o[0] = ((3 * m + p + be) >> shift) as u8;
        o[1] = ((3 * m + x + bo) >> shift) as u8;
    }
    out[2 * n - 2] = ((3 * c[n - 1] + c[n - 2] + be) >> shift) as u8;
    out[2 * n - 1] = ((4 * c[n - 1] + bo) >> shift) as u8;
}

// jdcolor.c's constants: FIX(x) = round(x · 2^16).
const FIX_1_40200: i32 = 91881;
const FIX_1_77200: i32 = 116130;
const FIX_0_71414: i32 = 46802;
const FIX_0_34414: i32 = 22554;
const ONE_HALF: i32 = 1 << 15;

/// `ycc_rgb_convert` of one pixel.
#[inline(always)]
fn ycc_pixel(y: u8, cb: u8, cr: u8) -> [u8; 3] {
    let (y, cb, cr) = (i32::from(y), i32::from(cb) - 128, i32::from(cr) - 128);
    let r = y + ((FIX_1_40200 * cr + ONE_HALF) >> 16);
    let g = y + ((-FIX_0_34414 * cb - FIX_0_71414 * cr + ONE_HALF) >> 16);
    let b = y + ((FIX_1_77200 * cb + ONE_HALF) >> 16);
    [
        r.clamp(0, 255) as u8,
        g.clamp(0, 255) as u8,
        b.clamp(0, 255) as u8,
    ]
}

/// [`Kernels::ycc`].
#[inline(always)]
fn ycc_to_rgb(y: &[u8], cb: &[u8], cr: &[u8], out: &mut [u8]) {
    const N: usize = 16;
    let mut o = out.chunks_exact_mut(3 * N);
    let mut ys = y.chunks_exact(N);
    let mut cbs = cb.chunks_exact(N);
    let mut crs = cr.chunks_exact(N);
    for (((o, y), cb), cr) in o
        .by_ref()
        .zip(ys.by_ref())
        .zip(cbs.by_ref())
        .zip(crs.by_ref())
    {
        let px: [[u8; 3]; N] = std::array::from_fn(|i| ycc_pixel(y[i], cb[i], cr[i]));
        o.copy_from_slice(px.as_flattened());
    }
    let n = o.into_remainder().len() / 3;
    let start = out.len() / 3 - n;
    let tail = &mut out[start * 3..];
    for (((p, &y), &cb), &cr) in tail
        .chunks_exact_mut(3)
        .zip(&y[start..])
        .zip(&cb[start..])
        .zip(&cr[start..])
    {
        p.copy_from_slice(&ycc_pixel(y, cb, cr));
    }
}

/// [`Kernels::grey`].
#[inline(always)]
fn grey_to_rgb(l: &[u8], out: &mut [u8]) {
    for (p, &v) in out.chunks_exact_mut(3).zip(l) {
        p.fill(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jpeg::tests::{encode, fixture_jpegs};
    use crate::jpeg::{decode_banded, libjpeg_frame};
    use crate::jpeg_frame::HuffTable;

    /// xorshift64.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Uniform in `lo..=hi`.
        fn range(&mut self, lo: i64, hi: i64) -> i64 {
            lo + (self.next() % (hi - lo + 1) as u64) as i64
        }
    }

    /// libjpeg's whole decode of `bytes` (RGB).
    fn libjpeg_rgb(bytes: &[u8], frame: &Frame) -> Vec<u8> {
        decode_banded(
            bytes,
            frame.width as u32,
            frame.height as u32,
            u64::MAX,
            crate::pages::Scratch::none(),
            1,
        )
        .expect("libjpeg decode")
        .data
    }

    /// Where two RGB images first differ, as (row, column, channel).
    fn first_difference(a: &[u8], b: &[u8], width: usize) -> Option<(usize, usize, usize)> {
        let i = a.iter().zip(b).position(|(x, y)| x != y)?;
        Some((i / (width * 3), i / 3 % width, i % 3))
    }

    /// `frame` reconstructed with kernels `k` in bands of `band` rows, concatenated.
    fn in_bands<K: Kernels>(
        k: K,
        frame: &Frame,
        coefs: &Coefficients,
        band: usize,
    ) -> Result<Vec<u8>, Unsupported> {
        let (w, h) = (frame.width, frame.height);
        let mut out = vec![0u8; w * h * 3];
        for (i, chunk) in out.chunks_mut(band * w * 3).enumerate() {
            reconstruct_with(k, frame, coefs, i * band..(i * band + band).min(h), chunk)?;
        }
        Ok(out)
    }

    /// The whole image by [`reconstruct_rows`] (`Err` if declined); then, where accepted, the
    /// same bytes from the portable kernels and from both kernels in bands of 8, 16, 24 and 37
    /// rows.
    fn reconstruct_all(frame: &Frame, coefs: &Coefficients) -> Result<Vec<u8>, Unsupported> {
        let (w, h) = (frame.width, frame.height);
        let mut whole = vec![0u8; w * h * 3];
        reconstruct_rows(frame, coefs, 0..h, &mut whole)?;
        let same = |got: Result<Vec<u8>, Unsupported>, what: &str| {
            let got = got.expect("rows of an accepted image");
            assert!(
                got == whole,
                "{what}: first difference {:?}",
                first_difference(&got, &whole, w)
            );
        };
        same(in_bands(Portable, frame, coefs, h), "portable kernels");
        for band in [8, 16, 24, 37] {
            same(
                in_bands(Portable, frame, coefs, band),
                "portable kernels in bands",
            );
            #[cfg(target_arch = "x86_64")]
            if let Some(k) = Avx2::detect() {
                same(in_bands(k, frame, coefs, band), "AVX2 kernels in bands");
            }
        }
        Ok(whole)
    }

    /// What [`check`] found.
    #[derive(Debug, PartialEq, Eq)]
    enum Outcome {
        Exact,
        Declined(&'static str),
    }

    /// Our reconstruction of `bytes` (libjpeg's own reading of its coefficients) against
    /// libjpeg's decode: exact (whole and in bands), or declined.
    fn check(name: &str, bytes: &[u8]) -> Outcome {
        let (frame, coefs) = libjpeg_frame(bytes).expect("libjpeg_frame");
        if let Err(Unsupported(why)) = supports(&frame) {
            return Outcome::Declined(why);
        }
        let want = libjpeg_rgb(bytes, &frame);
        match reconstruct_all(&frame, &coefs) {
            Ok(got) => {
                assert!(
                    got == want,
                    "{name}: {}x{} differs from libjpeg at (row, col, channel) {:?}",
                    frame.width,
                    frame.height,
                    first_difference(&got, &want, frame.width)
                );
                Outcome::Exact
            }
            Err(Unsupported(why)) => Outcome::Declined(why),
        }
    }

    /// Whether the first frame header of `bytes` is progressive (SOF2, 6, 10, 14): libjpeg then
    /// smooths blocks, which a reconstruction from the final coefficients does not do.
    fn progressive(bytes: &[u8]) -> bool {
        let mut i = 2;
        while i + 4 <= bytes.len() {
            if bytes[i] != 0xFF {
                i += 1;
                continue;
            }
            let code = bytes[i + 1];
            if code == 0xFF {
                i += 1;
                continue;
            }
            if matches!(code, 0xC0..=0xCF) && !matches!(code, 0xC4 | 0xC8 | 0xCC) {
                return matches!(code, 0xC2 | 0xC6 | 0xCA | 0xCE);
            }
            let len = usize::from(u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]));
            i += 2 + len;
        }
        false
    }

    /// Every fixture JPEG that libjpeg reads as one sequential frame and `supports` accepts is
    /// reconstructed exactly as libjpeg decodes it, whole and in bands.
    #[test]
    fn fixtures_equal_libjpeg() {
        let (mut exact, mut declined, mut skipped) = (0, Vec::new(), 0);
        for path in fixture_jpegs() {
            let bytes = std::fs::read(&path).expect("fixture");
            if progressive(&bytes) || libjpeg_frame(&bytes).is_err() {
                skipped += 1;
                continue;
            }
            let name = path.display().to_string();
            match check(&name, &bytes) {
                Outcome::Exact => exact += 1,
                Outcome::Declined(why) => declined.push(format!("{name}: {why}")),
            }
        }
        eprintln!(
            "jpeg_idct fixtures: {exact} exact, {} declined, {skipped} progressive or unread",
            declined.len()
        );
        for d in &declined {
            eprintln!("  declined {d}");
        }
        // Only the CMYK files (4 components) may be declined.
        assert!(
            declined.iter().all(|d| d.contains("colour space")),
            "{declined:#?}"
        );
        assert!(exact >= 50, "only {exact} fixtures exact");
    }

    /// Synthetic JPEGs from libjpeg's encoder at many sizes, 4:4:4, 4:2:2, 4:4:0, 4:2:0 and
    /// grey: each exact; none declined.
    #[test]
    fn synthetic_jpegs_equal_libjpeg() {
        let sizes = [
            (1, 1),
            (2, 2),
            (3, 1),
            (7, 5),
            (17, 9),
            (33, 31),
            (64, 64),
            (127, 65),
            (250, 131),
            (1000, 37),
        ];
        let mut n = 0;
        for (w, h) in sizes {
            for (grey, samp) in [
                (false, (1, 1)),
                (false, (2, 1)),
                (false, (1, 2)),
                (false, (2, 2)),
                (true, (1, 1)),
            ] {
                let bytes = encode(w, h, grey, samp, false);
                let name = format!("{w}x{h} grey={grey} {samp:?}");
                assert_eq!(check(&name, &bytes), Outcome::Exact, "{name}");
                n += 1;
            }
        }
        eprintln!("jpeg_idct synthetic: {n} exact");
    }

    /// libjpeg's natural-order index of zigzag position k (`jpeg_natural_order`).
    const ZIGZAG: [usize; 64] = [
        0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27,
        20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
        58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
    ];

    /// MSB-first bit writer with 0xFF stuffing.
    struct Bits {
        out: Vec<u8>,
        acc: u32,
        n: u32,
    }

    impl Bits {
        fn put(&mut self, value: u32, len: u32) {
            for i in (0..len).rev() {
                self.acc = (self.acc << 1) | ((value >> i) & 1);
                self.n += 1;
                if self.n == 8 {
                    let byte = self.acc as u8;
                    self.out.push(byte);
                    if byte == 0xFF {
                        self.out.push(0);
                    }
                    (self.acc, self.n) = (0, 0);
                }
            }
        }
        fn finish(mut self) -> Vec<u8> {
            while self.n != 0 {
                self.put(1, 1);
            }
            self.out
        }
    }

    /// Magnitude category and the bits that code `v` (JPEG F.1.2.1).
    fn category(v: i32) -> (u32, u32) {
        let s = 32 - v.unsigned_abs().leading_zeros();
        let bits = if v < 0 { v - 1 } else { v } as u32 & ((1u32 << s) - 1);
        (s, bits)
    }

    /// A baseline JPEG coding exactly `coefs` with `frame`'s size, sampling factors and
    /// quantisers (8-bit tables if all fit, else 16-bit), component ids 1.. (so libjpeg takes 3
    /// components as YCbCr), and Huffman tables that code every category up to 15: DC symbols
    /// 0..=15 at 5 bits, AC symbols EOB, ZRL and every (run, size ≤ 15) at 8 bits. Coefficient
    /// −32768 cannot be coded, nor a DC step whose difference is ±32768 mod 2¹⁶: `None` then.
    fn write_jpeg(frame: &Frame, coefs: &Coefficients) -> Option<Vec<u8>> {
        let n = frame.components.len();
        let mut f = vec![0xFF, 0xD8];
        let segment = |f: &mut Vec<u8>, marker: u8, body: &[u8]| {
            f.extend_from_slice(&[0xFF, marker]);
            f.extend_from_slice(&((body.len() + 2) as u16).to_be_bytes());
            f.extend_from_slice(body);
        };
        for (ci, c) in frame.components.iter().enumerate() {
            let wide = c.quant.iter().any(|&q| q > 255);
            let mut body = vec![(u8::from(wide) << 4) | ci as u8];
            for &z in &ZIGZAG {
                if wide {
                    body.extend_from_slice(&c.quant[z].to_be_bytes());
                } else {
                    body.push(c.quant[z] as u8);
                }
            }
            segment(&mut f, 0xDB, &body);
        }
        let mut sof = vec![8];
        sof.extend_from_slice(&(frame.height as u16).to_be_bytes());
        sof.extend_from_slice(&(frame.width as u16).to_be_bytes());
        sof.push(n as u8);
        for (ci, c) in frame.components.iter().enumerate() {
            sof.extend_from_slice(&[ci as u8 + 1, ((c.h as u8) << 4) | c.v as u8, ci as u8]);
        }
        segment(&mut f, 0xC0, &sof);
        let mut dht = vec![0x00, 0, 0, 0, 0, 16];
        dht.extend_from_slice(&[0; 11]);
        dht.extend(0..16u8);
        let ac_symbols: Vec<u8> = [0x00, 0xF0]
            .into_iter()
            .chain((0..16u8).flat_map(|r| (1..16u8).map(move |s| (r << 4) | s)))
            .collect();
        dht.extend_from_slice(&[0x10, 0, 0, 0, 0, 0, 0, 0, ac_symbols.len() as u8]);
        dht.extend_from_slice(&[0; 8]);
        dht.extend_from_slice(&ac_symbols);
        segment(&mut f, 0xC4, &dht);
        let ac_code = |sym: u8| {
            ac_symbols
                .iter()
                .position(|&s| s == sym)
                .expect("AC symbol") as u32
        };
        let mut sos = vec![n as u8];
        for ci in 0..n {
            sos.extend_from_slice(&[ci as u8 + 1, 0x00]);
        }
        sos.extend_from_slice(&[0, 63, 0]);
        segment(&mut f, 0xDA, &sos);
        let mut bits = Bits {
            out: Vec::new(),
            acc: 0,
            n: 0,
        };
        let mut last_dc = vec![0i64; n];
        let mut codable = true;
        let mut code_block = |bits: &mut Bits, ci: usize, bx: usize, by: usize| {
            let b = coefs.block(frame, ci, bx, by);
            let want = i64::from(b[0]);
            // The difference that brings libjpeg's int accumulator to `want` mod 2^16.
            let diff = (want - last_dc[ci]).rem_euclid(65536);
            let diff = if diff > 32768 { diff - 65536 } else { diff };
            codable &= diff.abs() <= 32767;
            last_dc[ci] += diff;
            let (s, v) = category(diff as i32);
            bits.put(s, 5);
            bits.put(v, s);
            let mut run = 0u8;
            for &z in &ZIGZAG[1..] {
                let c = b[z];
                if c == 0 {
                    run += 1;
                    continue;
                }
                codable &= c != i16::MIN;
                while run > 15 {
                    bits.put(ac_code(0xF0), 8);
                    run -= 16;
                }
                let (s, v) = category(i32::from(c));
                bits.put(ac_code((run << 4) | s as u8), 8);
                bits.put(v, s);
                run = 0;
            }
            if run > 0 {
                bits.put(ac_code(0x00), 8);
            }
        };
        if n == 1 {
            let c = &frame.components[0];
            for by in 0..c.height_in_blocks {
                for bx in 0..c.width_in_blocks {
                    code_block(&mut bits, 0, bx, by);
                }
            }
        } else {
            for my in 0..frame.mcus_y {
                for mx in 0..frame.mcus_x {
                    for (ci, c) in frame.components.iter().enumerate() {
                        for v in 0..c.v {
                            for h in 0..c.h {
                                code_block(&mut bits, ci, mx * c.h + h, my * c.v + v);
                            }
                        }
                    }
                }
            }
        }
        f.extend_from_slice(&bits.finish());
        f.extend_from_slice(&[0xFF, 0xD9]);
        codable.then_some(f)
    }

    /// A frame of `w × h` with these components' sampling factors and quantisers, libjpeg's
    /// geometry (as `libjpeg_frame` gives it).
    fn synth_frame(w: usize, h: usize, comps: &[((usize, usize), [u16; 64])]) -> Frame {
        let max_h = comps.iter().map(|c| c.0 .0).max().unwrap_or(1);
        let max_v = comps.iter().map(|c| c.0 .1).max().unwrap_or(1);
        let one = comps.len() == 1;
        let (mcus_x, mcus_y) = (w.div_ceil(8 * max_h), h.div_ceil(8 * max_v));
        let empty = HuffTable {
            bits: [0; 17],
            values: Vec::new(),
        };
        let components: Vec<Component> = comps
            .iter()
            .map(|&((ch, cv), quant)| {
                let (sw, sh) = ((w * ch).div_ceil(max_h), (h * cv).div_ceil(max_v));
                let (bw, bh) = (sw.div_ceil(8), sh.div_ceil(8));
                Component {
                    h: ch,
                    v: cv,
                    quant,
                    dc: empty.clone(),
                    ac: empty.clone(),
                    sampled_width: sw,
                    sampled_height: sh,
                    width_in_blocks: bw,
                    height_in_blocks: bh,
                    stored_w: if one { bw } else { mcus_x * ch },
                    stored_h: if one { bh } else { mcus_y * cv },
                }
            })
            .collect();
        Frame {
            width: w,
            height: h,
            max_h,
            max_v,
            mcus_x: if one {
                components[0].width_in_blocks
            } else {
                mcus_x
            },
            mcus_y: if one {
                components[0].height_in_blocks
            } else {
                mcus_y
            },
            components,
            restart_interval: 0,
            colour: if one { Colour::Grey } else { Colour::YCbCr },
            scan_start: 0,
        }
    }

    /// Plausible coefficients: a DC level wandering from block to block (dequantised within
    /// ±1000), a few small ACs in most blocks, some blocks DC-only.
    fn random_coefs(frame: &Frame, rng: &mut Rng) -> Coefficients {
        let mut coefs = Coefficients::zeroed(frame);
        for (c, plane) in frame.components.iter().zip(&mut coefs.planes) {
            let mut level = 0i64;
            for block in plane.chunks_exact_mut(64) {
                level = (level + rng.range(-150, 150)).clamp(-1000, 1000);
                block[0] = (level / i64::from(c.quant[0].max(1))) as i16;
                if rng.next().is_multiple_of(4) {
                    continue;
                }
                for _ in 0..rng.range(1, 12) {
                    let z = ZIGZAG[rng.range(1, 40) as usize];
                    let q = i64::from(c.quant[z].max(1));
                    block[z] = (rng.range(-200, 200) / q) as i16;
                }
            }
        }
        coefs
    }

    /// A quantiser table: `base` scaled up with the frequency, capped at 255.
    fn quant_table(base: u16) -> [u16; 64] {
        std::array::from_fn(|i| (base + (i / 8 + i % 8) as u16 * base / 2).clamp(1, 255))
    }

    /// Our JPEG writer codes what it is given: libjpeg reads back the same coefficients, and
    /// decodes a re-coded libjpeg file to the same pixels.
    #[test]
    fn write_jpeg_round_trips_through_libjpeg() {
        let mut rng = Rng(7);
        for (w, h, grey, samp) in [(33, 17, false, (2, 2)), (20, 9, true, (1, 1))] {
            let bytes = encode(w, h, grey, samp, false);
            let (frame, coefs) = libjpeg_frame(&bytes).expect("frame");
            let copy = write_jpeg(&frame, &coefs).expect("codable");
            let (frame2, coefs2) = libjpeg_frame(&copy).expect("frame of the copy");
            assert_eq!(frame2, frame);
            assert!(coefs2 == coefs);
            assert!(libjpeg_rgb(&copy, &frame) == libjpeg_rgb(&bytes, &frame));
        }
        let frame = synth_frame(
            41,
            23,
            &[
                ((1, 2), quant_table(3)),
                ((2, 1), quant_table(5)),
                ((1, 1), quant_table(5)),
            ],
        );
        let coefs = random_coefs(&frame, &mut rng);
        let copy = write_jpeg(&frame, &coefs).expect("codable");
        let (frame2, coefs2) = libjpeg_frame(&copy).expect("frame");
        assert_eq!(frame2, frame);
        assert!(coefs2 == coefs);
    }

    /// Files of random coefficients in every sampling layout we take (including 4:4:0, chroma
    /// sampled more finely than luma, 2×2-sampled grey, and layouts where a component's width of
    /// 1 or 2 samples turns the fancy upsampler off), and under 16-bit quantisers, are
    /// reconstructed exactly; layouts with a ratio of 3 or 4 are declined.
    #[test]
    fn random_coefficients_in_every_layout_equal_libjpeg() {
        let mut rng = Rng(0x5EED);
        let q = quant_table(4);
        let layouts: &[&[(usize, usize)]] = &[
            &[(1, 1)],
            &[(2, 2)],
            &[(1, 2)],
            &[(1, 1), (1, 1), (1, 1)],
            &[(2, 1), (1, 1), (1, 1)],
            &[(1, 2), (1, 1), (1, 1)],
            &[(2, 2), (1, 1), (1, 1)],
            &[(2, 2), (2, 1), (1, 2)],
            &[(1, 1), (2, 2), (2, 2)],
            &[(2, 2), (1, 2), (2, 2)],
            &[(2, 2), (2, 2), (1, 1)],
            &[(4, 1), (2, 1), (2, 1)],
            &[(1, 4), (1, 2), (1, 2)],
        ];
        let (mut exact, mut declined) = (0, 0);
        for layout in layouts {
            for (w, h) in [
                (1, 1),
                (2, 3),
                (3, 2),
                (4, 5),
                (5, 4),
                (9, 7),
                (31, 17),
                (70, 45),
            ] {
                let comps: Vec<_> = layout.iter().map(|&f| (f, q)).collect();
                let frame = synth_frame(w, h, &comps);
                let coefs = random_coefs(&frame, &mut rng);
                let bytes = write_jpeg(&frame, &coefs).expect("codable");
                match check(&format!("{layout:?} {w}x{h}"), &bytes) {
                    Outcome::Exact => exact += 1,
                    Outcome::Declined(why) => panic!("{layout:?} {w}x{h} declined: {why}"),
                }
            }
        }
        // 16-bit quantisers (up to 1000).
        let q16: [u16; 64] = std::array::from_fn(|i| 300 + 11 * i as u16);
        for (w, h) in [(16, 16), (45, 30)] {
            let frame = synth_frame(w, h, &[((2, 2), q16), ((1, 1), q16), ((1, 1), q16)]);
            let coefs = random_coefs(&frame, &mut rng);
            let bytes = write_jpeg(&frame, &coefs).expect("codable");
            assert_eq!(check("16-bit quantisers", &bytes), Outcome::Exact);
            exact += 1;
        }
        // Ratios of 3 and 4, and more than 10 blocks per MCU (libjpeg refuses those).
        for layout in [
            &[(3, 1), (1, 1), (1, 1)][..],
            &[(4, 1), (1, 1), (1, 1)],
            &[(1, 4), (1, 1), (1, 1)],
            &[(4, 2), (2, 1), (2, 1)],
        ] {
            let comps: Vec<_> = layout.iter().map(|&f| (f, q)).collect();
            let frame = synth_frame(40, 40, &comps);
            assert!(supports(&frame).is_err(), "{layout:?}");
            declined += 1;
        }
        eprintln!("jpeg_idct random layouts: {exact} exact, {declined} declined");
    }

    /// Coefficients set to extreme values (±1000, ±2047, ±4095, ±16383, ±32767 at the DC and at
    /// a few AC positions, under quantisers 1, 8, 64, 255 and 1000 (a 16-bit table)): each file
    /// is either declined or reconstructed exactly as libjpeg decodes it. Both happen.
    #[test]
    fn extreme_coefficients_are_exact_or_declined() {
        let mut rng = Rng(0xBAD);
        let (mut exact, mut declined, mut uncodable) = (0, 0, 0);
        let positions = [0usize, 1, 8, 9, 27, 36, 63];
        for qv in [1u16, 8, 64, 255, 1000] {
            for &value in &[1000i16, 2047, 4095, 16383, 32767] {
                for &pos in &positions {
                    for sign in [1i16, -1] {
                        let q = [qv; 64];
                        let frame = synth_frame(37, 21, &[((2, 2), q), ((1, 1), q), ((1, 1), q)]);
                        let mut coefs = random_coefs(&frame, &mut rng);
                        // The extreme value in a few blocks of each component.
                        for plane in &mut coefs.planes {
                            let blocks = plane.len() / 64;
                            for _ in 0..3 {
                                let b = rng.range(0, blocks as i64 - 1) as usize;
                                plane[b * 64 + pos] = sign * value;
                            }
                        }
                        let Some(bytes) = write_jpeg(&frame, &coefs) else {
                            uncodable += 1;
                            continue;
                        };
                        let name = format!("q {qv}, {} at {pos}", sign * value);
                        match check(&name, &bytes) {
                            Outcome::Exact => exact += 1,
                            Outcome::Declined(_) => declined += 1,
                        }
                    }
                }
            }
        }
        eprintln!(
            "jpeg_idct extreme coefficients: {exact} exact, {declined} declined, \
             {uncodable} not codable"
        );
        assert!(
            exact >= 20 && declined >= 20,
            "{exact} exact, {declined} declined"
        );
    }

    /// The exact IDCT (`i64`, jidctint.c's arithmetic with a faithful clamp) of one block.
    fn exact_idct(coef: &[i16; 64], quant: &[u16; 64]) -> [u8; 64] {
        let d: [i64; 64] = std::array::from_fn(|i| i64::from(coef[i]) * i64::from(quant[i]));
        let mut ws = [[0i64; 8]; 8];
        for c in 0..8 {
            let o = idct_1d(std::array::from_fn(|k| d[k * 8 + c]));
            for (n, &v) in o.iter().enumerate() {
                ws[n][c] = (v + (1 << 10)) >> 11;
            }
        }
        let mut px = [0u8; 64];
        for (r, row) in ws.iter().enumerate() {
            for (n, &v) in idct_1d(*row).iter().enumerate() {
                px[r * 8 + n] = (((v + (1 << 17)) >> 18) + 128).clamp(0, 255) as u8;
            }
        }
        px
    }

    /// One block through kernels `k`: its 64 samples and whether `k` was sure of them.
    fn kernel_block<K: Kernels>(k: K, coef: &[i16; 64], quant: &[u16; 64]) -> ([u8; 64], bool) {
        let c = CompPlan {
            method: Method::Full,
            quant: quant.map(i32::from),
            quant_raw: *quant,
            quant16: quant.map(|q| q as i16),
            limit16: quant.map(|q| 16383u16.checked_div(q).unwrap_or(u16::MAX) as i16),
            plane: coef,
            stored_w: 1,
            width_in_blocks: 1,
            dw: 8,
            dh: 8,
        };
        let mut px = [0u8; 64];
        let sure = k.idct_row(&c, 0, 0..8, &mut px, 8);
        (px, sure)
    }

    /// Rows `rows` of one block through kernels `k` (the others zero) and whether `k` was sure.
    fn kernel_rows<K: Kernels>(
        k: K,
        coef: &[i16; 64],
        quant: &[u16; 64],
        rows: Range<usize>,
    ) -> ([u8; 64], bool) {
        let c = CompPlan {
            method: Method::Full,
            quant: quant.map(i32::from),
            quant_raw: *quant,
            quant16: quant.map(|q| q as i16),
            limit16: quant.map(|q| 16383u16.checked_div(q).unwrap_or(u16::MAX) as i16),
            plane: coef,
            stored_w: 1,
            width_in_blocks: 1,
            dw: 8,
            dh: 8,
        };
        let mut px = [0u8; 64];
        let sure = k.idct_row(&c, 0, rows, &mut px, 8);
        (px, sure)
    }

    /// Block by block, against the exact IDCT, with coefficients from tiny to extreme: each
    /// kernel is sure only of blocks where libjpeg's builds agree ([`block_agrees`]), and gives
    /// the exact bytes wherever they agree (sure or not). And `i32` is wide enough for the
    /// portable kernel: with dequantised inputs in `i16`, no pass's exact result (before its
    /// shift, rounding constant added) leaves `i32`.
    #[test]
    fn kernels_are_exact_where_libjpeg_agrees() {
        // The integer matrix of one pass: column k = the pass applied to unit input k.
        let cols: [[i64; 8]; 8] =
            std::array::from_fn(|k| idct_1d(std::array::from_fn(|j| i64::from(j == k))));
        let l1 = (0..8)
            .map(|n| cols.iter().map(|c| c[n].abs()).sum::<i64>())
            .max()
            .unwrap_or(0);
        assert!(l1 * 32768 + (1 << 17) < 1 << 31, "row norm {l1}");
        let mut rng = Rng(99);
        let (mut agreed, mut sure_blocks, mut declined, mut partial_sure) = (0, 0, 0, 0);
        for round in 0..20000 {
            let scale = [1, 8, 64, 400, 1000, 4000, 16000, 32767][round % 8];
            let qmax = [1, 8, 255][round % 3];
            let quant: [u16; 64] = std::array::from_fn(|_| rng.range(1, qmax) as u16);
            let dc_only = round % 7 == 0;
            let coef: [i16; 64] = std::array::from_fn(|i| {
                if i == 0 || (!dc_only && rng.next().is_multiple_of(5)) {
                    (rng.range(-scale, scale) / i64::from(quant[i]).min(4)) as i16
                } else {
                    0
                }
            });
            let agrees = block_agrees(&coef, &quant);
            let exact = exact_idct(&coef, &quant);
            let mut check = |name: &str, (px, sure): ([u8; 64], bool)| {
                assert!(
                    !sure || agrees,
                    "{name} sure of a block libjpeg's builds split on"
                );
                if agrees {
                    assert!(px == exact, "{name}: {coef:?} {quant:?}");
                }
                sure_blocks += usize::from(sure);
            };
            check("portable", kernel_block(Portable, &coef, &quant));
            #[cfg(target_arch = "x86_64")]
            if let Some(k) = Avx2::detect() {
                check("AVX2", kernel_block(k, &coef, &quant));
                // Rows one or two at a time (the edge kernel): exact wherever sure or agreeing.
                for rows in [0..1, 3..4, 7..8, 0..2, 5..7] {
                    let (px, sure) = kernel_rows(k, &coef, &quant, rows.clone());
                    if sure || agrees {
                        let (a, b) = (rows.start * 8, rows.end * 8);
                        assert!(px[a..b] == exact[a..b], "AVX2 rows {rows:?}: {coef:?}");
                    }
                    partial_sure += usize::from(sure);
                }
            }
            agreed += usize::from(agrees);
            declined += usize::from(!agrees);
        }
        eprintln!(
            "kernels: {agreed} blocks where libjpeg agrees (exact), {declined} where not, \
             {sure_blocks} kernel runs sure, {partial_sure} partial runs sure"
        );
        assert!(agreed > 8000 && declined > 2000, "{agreed} {declined}");
    }

    /// The AVX2 colour kernels give `ycc_pixel` for every (Cb, Cr) pair at Y = 0, 128 and 255
    /// (which pins the offset added to Y over its whole range, hence every Y), and the grey one
    /// replicates; rows of every length mod 32.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn ycc_kernel_is_exact() {
        let Some(k) = Avx2::detect() else {
            eprintln!("no AVX2: the AVX2 kernels are not tested here");
            return;
        };
        let cb: Vec<u8> = (0..65536).map(|i| (i >> 8) as u8).collect();
        let cr: Vec<u8> = (0..65536).map(|i| i as u8).collect();
        for y in [0u8, 128, 255] {
            let ys = vec![y; 65536];
            let mut got = vec![0u8; 65536 * 3];
            k.ycc(&ys, &cb, &cr, &mut got);
            for (i, p) in got.chunks_exact(3).enumerate() {
                assert_eq!(
                    p,
                    ycc_pixel(y, cb[i], cr[i]),
                    "y {y} cb {} cr {}",
                    cb[i],
                    cr[i]
                );
            }
        }
        for n in [0, 1, 31, 32, 33, 95, 100] {
            let l: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            let (mut a, mut b) = (vec![0u8; 3 * n], vec![0u8; 3 * n]);
            k.ycc(
                &l,
                &l[..].iter().rev().copied().collect::<Vec<_>>(),
                &l,
                &mut a,
            );
            Portable.ycc(
                &l,
                &l[..].iter().rev().copied().collect::<Vec<_>>(),
                &l,
                &mut b,
            );
            assert_eq!(a, b, "{n}");
            k.grey(&l, &mut a);
            Portable.grey(&l, &mut b);
            assert_eq!(a, b, "{n}");
        }
    }

    /// libjpeg's C range limit (`jdmaster.c` `prepare_range_limit_table`, indexed by
    /// `x & RANGE_MASK` in jidctint.c) is the clamp of `x + 128` exactly for `x` in
    /// `-512..=511`, and wraps just outside; [`block_agrees`] accepts a lone DC exactly when its
    /// output lies there (and its pass-1 value `4·d` fits 16 bits).
    #[test]
    fn c_range_limit_is_a_clamp_only_within_512() {
        // sample_range_limit: 256 zeros, 0..=255, then (from the IDCT table's base, 128 on)
        // 384 × 255, 384 zeros, 0..128.
        let mut table = vec![0u8; 256];
        table.extend(0..=255u8);
        table.extend(std::iter::repeat_n(255u8, 384));
        table.extend(std::iter::repeat_n(0u8, 384));
        table.extend(0..128u8);
        let idct_base = 256 + 128;
        let limit = |x: i32| table[idct_base + (x & 1023) as usize];
        for x in -512..=511 {
            assert_eq!(limit(x), (x + 128).clamp(0, 255) as u8, "{x}");
        }
        assert_eq!((limit(512), limit(-513)), (0, 255));
        let mut coef = [0i16; 64];
        for (dc, agrees) in [(4091, true), (4092, false), (-4100, true), (-4101, false)] {
            coef[0] = dc;
            // (4·d + 16) >> 5: 511, 512, -512, -513.
            assert_eq!(block_agrees(&coef, &[1; 64]), agrees, "{dc}");
        }
    }

    /// The colour constants are jdcolor.c's `FIX(x)` at 16 bits.
    #[test]
    fn colour_constants_are_libjpegs() {
        let fix = |x: f64| (x * 65536.0 + 0.5) as i32;
        assert_eq!(
            [FIX_1_40200, FIX_1_77200, FIX_0_71414, FIX_0_34414],
            [fix(1.40200), fix(1.77200), fix(0.71414), fix(0.34414)]
        );
    }

    /// Frames we must not take are declined.
    #[test]
    fn odd_frames_are_declined() {
        let q = quant_table(2);
        let ok = synth_frame(16, 16, &[((2, 2), q), ((1, 1), q), ((1, 1), q)]);
        assert!(supports(&ok).is_ok());
        let mut f = ok.clone();
        f.colour = Colour::Grey;
        assert!(supports(&f).is_err());
        let mut f = ok.clone();
        f.components[1].quant[5] = 40000;
        assert!(supports(&f).is_err());
        let mut f = ok.clone();
        f.components[2].sampled_width += 1;
        assert!(supports(&f).is_err());
        let coefs = Coefficients::zeroed(&ok);
        let mut out = vec![0u8; 16 * 3];
        assert!(reconstruct_rows(&ok, &coefs, 16..17, &mut out).is_err());
        assert!(reconstruct_rows(&ok, &coefs, 0..2, &mut out).is_err());
        assert!(reconstruct_rows(&ok, &coefs, 3..4, &mut out).is_ok());
        assert!(reconstruct_rows(&ok, &Coefficients::default(), 3..4, &mut out).is_err());
    }
}
