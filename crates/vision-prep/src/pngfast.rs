//! The fast path for the commonest PNG, 8-bit RGB without interlacing: chunks walked and
//! CRC-checked here, the zlib stream inflated by `fdeflate` (the inflater the `png` crate runs)
//! straight into one buffer of filtered rows, and the rows unfiltered out of place into the RGB
//! image by SSE4.1 kernels (Paeth, Average and Sub are a chain through each row's previous pixel;
//! three channels ride one register), which the `png` crate's scalar 3-byte Paeth is 2–3× slower
//! than. PNG is lossless, so any correct decoder gives the same bytes; this one declines
//! ([`decode_rgb8`] returns `None`) everything it does not take whole and well formed — another
//! colour type, depth or interlace, a `tRNS` chunk, an unknown critical chunk, a bad CRC or
//! Adler-32, a short or long stream — and the general decoder then decides, as before.

use crate::pages::Scratch;
use crate::rgb::RgbImage;

/// PNG file signature (PNG spec §5.2).
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
/// Bytes per pixel of 8-bit RGB (colour type 2, bit depth 8).
const BPP: usize = 3;

/// One chunk: its type and its data, CRC checked.
struct Chunk<'a> {
    kind: [u8; 4],
    data: &'a [u8],
}

/// The chunks of `bytes` after the signature, in order; `None` at the first malformed one.
fn chunks(bytes: &[u8]) -> impl Iterator<Item = Option<Chunk<'_>>> {
    let mut at = PNG_SIGNATURE.len();
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || at >= bytes.len() {
            return None;
        }
        let chunk = (|| {
            let len = u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
            let end = at.checked_add(12)?.checked_add(len)?;
            let body = bytes.get(at + 4..end - 4)?;
            let crc = u32::from_be_bytes(bytes.get(end - 4..end)?.try_into().ok()?);
            if crc32fast::hash(body) != crc {
                return None;
            }
            at = end;
            Some(Chunk {
                kind: body[..4].try_into().ok()?,
                data: &body[4..],
            })
        })();
        failed = chunk.is_none();
        Some(chunk)
    })
}

/// Decode an 8-bit RGB, non-interlaced PNG of the admitted `width × height`, or `None` when the
/// file is anything else or not well formed (the caller falls back to the general decoder).
pub(crate) fn decode_rgb8(
    bytes: &[u8],
    width: u32,
    height: u32,
    scratch: &Scratch,
) -> Option<RgbImage> {
    if !bytes.starts_with(&PNG_SIGNATURE) {
        return None;
    }
    let mut it = chunks(bytes);
    let ihdr = it.next()??;
    let h = ihdr.data;
    // IHDR: width, height, bit depth 8, colour type 2 (RGB), compression 0, filter 0, no interlace.
    if &ihdr.kind != b"IHDR" || h.len() != 13 || h[8..13] != [8, 2, 0, 0, 0] {
        return None;
    }
    let (w, hh) = (
        u32::from_be_bytes(h[0..4].try_into().ok()?),
        u32::from_be_bytes(h[4..8].try_into().ok()?),
    );
    if (w, hh) != (width, height) || w == 0 || hh == 0 {
        return None;
    }
    let (w, hh) = (w as usize, hh as usize);
    let mut zlib: Vec<u8> = Vec::new();
    let mut idat_done = false;
    let mut ended = false;
    for c in it {
        let c = c?;
        match &c.kind {
            b"IDAT" if !idat_done => zlib.extend_from_slice(c.data),
            b"IDAT" => return None,
            b"IEND" => {
                ended = true;
                break;
            }
            // A transparent colour: the general decoder expands it to alpha, composited on white.
            b"tRNS" => return None,
            // RGB may carry a suggested palette; it does not change the pixels.
            b"PLTE" if zlib.is_empty() => {}
            k if k[0].is_ascii_uppercase() => return None,
            _ => idat_done |= !zlib.is_empty(),
        }
    }
    if !ended || zlib.is_empty() {
        return None;
    }
    let row = w.checked_mul(BPP)?;
    let filtered_len = row.checked_add(1)?.checked_mul(hh)?;
    // One byte past each buffer's end, so the kernels' 4-byte loads and stores stay inside.
    let mut filtered = scratch.take(filtered_len.checked_add(1)?);
    let inflated = inflate_exact(&zlib, &mut filtered[..filtered_len]);
    let mut data = scratch.take(row.checked_mul(hh)?.checked_add(1)?);
    let ok = inflated && unfilter_rows(Kernels::detect(), &filtered, row, &mut data);
    scratch.give(filtered);
    if !ok {
        scratch.give(data);
        return None;
    }
    data.truncate(row * hh);
    Some(RgbImage {
        width: w,
        height: hh,
        data,
    })
}

/// Inflate the zlib stream `z` into exactly `out` (the Adler-32 checked); false when it is
/// invalid, shorter, or longer.
fn inflate_exact(z: &[u8], out: &mut [u8]) -> bool {
    let mut d = fdeflate::Decompressor::new();
    let (mut read, mut written) = (0, 0);
    while !d.is_done() {
        match d.read(&z[read..], out, written, true) {
            Ok((0, 0)) | Err(_) => return false,
            Ok((r, n)) => {
                read += r;
                written += n;
            }
        }
    }
    // Nothing may be left past the stream's end, nor unwritten.
    written == out.len() && read == z.len()
}

/// Unfilter `filtered` (each row: a filter byte, then `row` bytes) into `out` (`row` bytes per
/// row); both carry one byte past their rows. False at an unknown filter type. Runs of Paeth rows
/// go [`PAETH_WAVE`] rows at a time.
fn unfilter_rows(kernels: Kernels, filtered: &[u8], row: usize, out: &mut [u8]) -> bool {
    // The kernels below rely on these lengths (whole pixels, one spare byte past each buffer):
    // checked here, where they are used, not only by the caller that sized the buffers.
    if row == 0 || !row.is_multiple_of(BPP) {
        return false;
    }
    let rows = filtered.len().saturating_sub(1) / (row + 1);
    let (Some(out_len), Some(filtered_len)) = (
        rows.checked_mul(row).and_then(|n| n.checked_add(1)),
        rows.checked_mul(row + 1).and_then(|n| n.checked_add(1)),
    ) else {
        return false;
    };
    if out.len() != out_len || filtered.len() != filtered_len {
        return false;
    }
    let zero = vec![0u8; row + 1];
    let kind = |y: usize| filtered[y * (row + 1)];
    let mut y = 0;
    while y < rows {
        #[cfg(target_arch = "x86_64")]
        if kernels != Kernels::Portable
            && y + PAETH_WAVE <= rows
            && (y..y + PAETH_WAVE).all(|r| kind(r) == FILTER_PAETH)
        {
            let base = out.as_mut_ptr();
            // SAFETY: the kernel was detected. Its 4-byte reads end at most one byte past a row:
            // the next filtered row's filter byte or `filtered`'s last byte; the next output row's
            // first byte (already written) or `zero`'s last. Its writes go to rows y..y+R of
            // `out`, and at most one byte past a row's last pixel only before that pixel's turn.
            unsafe {
                let prev = if y == 0 {
                    zero.as_ptr()
                } else {
                    base.add((y - 1) * row) as *const u8
                };
                let f = filtered.as_ptr().add(y * (row + 1));
                let o = base.add(y * row);
                match kernels {
                    Kernels::Avx2 => sse41::paeth_wave_avx2::<PAETH_WAVE>(f, prev, o, row),
                    _ => sse41::paeth_wave_sse41::<PAETH_WAVE>(f, prev, o, row),
                }
            }
            y += PAETH_WAVE;
            continue;
        }
        let (done, rest) = out.split_at_mut(y * row);
        let prev = if y == 0 {
            &zero[..row]
        } else {
            &done[(y - 1) * row..]
        };
        let f = &filtered[y * (row + 1)..(y + 1) * (row + 1)];
        if !unfilter_row(kernels, f[0], &f[1..], prev, &mut rest[..row]) {
            return false;
        }
        y += 1;
    }
    true
}

/// Paeth rows unfiltered together, each a pixel behind the one above: row `k` needs of row `k−1`
/// only the pixels already done, so the rows' dependency chains (about 10 cycles a pixel each)
/// overlap instead of running one after another.
#[cfg(target_arch = "x86_64")]
const PAETH_WAVE: usize = 4;

/// Which unfilter kernels run: the SSE4.1 ones, compiled for AVX2 (3-operand encodings, fewer
/// register copies) where the CPU has it, else portable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernels {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Sse41,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernels {
    fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                return Kernels::Avx2;
            }
            if std::is_x86_feature_detected!("sse4.1") {
                return Kernels::Sse41;
            }
        }
        Kernels::Portable
    }
}

/// PNG filter types (PNG spec §9.2).
const FILTER_NONE: u8 = 0;
const FILTER_SUB: u8 = 1;
const FILTER_UP: u8 = 2;
const FILTER_AVERAGE: u8 = 3;
const FILTER_PAETH: u8 = 4;

/// One row: `cur = unfilter(kind, f, prev)`; false at an unknown filter type.
fn unfilter_row(k: Kernels, kind: u8, f: &[u8], prev: &[u8], cur: &mut [u8]) -> bool {
    match kind {
        FILTER_NONE => cur.copy_from_slice(f),
        FILTER_UP => {
            for ((c, &x), &b) in cur.iter_mut().zip(f).zip(prev) {
                *c = x.wrapping_add(b);
            }
        }
        FILTER_SUB | FILTER_AVERAGE | FILTER_PAETH => {
            if f.len() != cur.len() || prev.len() != cur.len() || !cur.len().is_multiple_of(BPP) {
                return false;
            }
            match k {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: SSE4.1 was detected; the three slices have the same length, a multiple
                // of 3 (checked just above).
                Kernels::Sse41 | Kernels::Avx2 => unsafe { sse41::chain(kind, f, prev, cur) },
                Kernels::Portable => chain_portable(kind, f, prev, cur),
            }
        }
        _ => return false,
    }
    true
}

/// The Paeth predictor (PNG spec §9.4): of left `a`, above `b`, upper-left `c`, the one nearest
/// `a + b − c`, ties to `a` then `b`.
#[inline(always)]
fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let (ia, ib, ic) = (i16::from(a), i16::from(b), i16::from(c));
    let pa = (ib - ic).abs();
    let pb = (ia - ic).abs();
    let pc = (ia + ib - 2 * ic).abs();
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

/// Sub, Average and Paeth by the byte: each depends on the pixel to its left.
fn chain_portable(kind: u8, f: &[u8], prev: &[u8], cur: &mut [u8]) {
    for i in 0..cur.len() {
        let a = if i >= BPP { cur[i - BPP] } else { 0 };
        let b = prev[i];
        let c = if i >= BPP { prev[i - BPP] } else { 0 };
        let pred = match kind {
            FILTER_SUB => a,
            FILTER_AVERAGE => ((u16::from(a) + u16::from(b)) >> 1) as u8,
            _ => paeth(a, b, c),
        };
        cur[i] = f[i].wrapping_add(pred);
    }
}

#[cfg(target_arch = "x86_64")]
mod sse41 {
    use std::arch::x86_64::*;

    use super::{BPP, FILTER_AVERAGE, FILTER_SUB};

    /// Three bytes at `p` as i16 lanes 0..3 (lane 3 from the fourth byte when `wide`, else 0).
    ///
    /// # Safety
    /// `p..p+3` (`p..p+4` when `wide`) must be readable.
    #[inline(always)]
    unsafe fn load3(p: *const u8, wide: bool) -> __m128i {
        // SAFETY: the caller's range.
        let v = unsafe {
            if wide {
                (p as *const u32).read_unaligned()
            } else {
                u32::from(*p) | u32::from(*p.add(1)) << 8 | u32::from(*p.add(2)) << 16
            }
        };
        _mm_cvtepu8_epi16(_mm_cvtsi32_si128(v as i32))
    }

    /// The Paeth predictor of left `a`, above `b` and upper-left `c` (i16 lanes).
    #[inline(always)]
    unsafe fn paeth(a: __m128i, b: __m128i, c: __m128i) -> __m128i {
        let bc = _mm_sub_epi16(b, c);
        let ac = _mm_sub_epi16(a, c);
        let pa = _mm_abs_epi16(bc);
        let pb = _mm_abs_epi16(ac);
        let pc = _mm_abs_epi16(_mm_add_epi16(ac, bc));
        // a where pa ≤ pb and pa ≤ pc; else b where pb ≤ pc; else c.
        let not_a = _mm_or_si128(_mm_cmpgt_epi16(pa, pb), _mm_cmpgt_epi16(pa, pc));
        let b_or_c = _mm_blendv_epi8(b, c, _mm_cmpgt_epi16(pb, pc));
        _mm_blendv_epi8(a, b_or_c, not_a)
    }

    /// [`paeth_wave`] compiled for SSE4.1.
    ///
    /// # Safety
    /// As [`paeth_wave`].
    #[target_feature(enable = "sse4.1")]
    pub(super) unsafe fn paeth_wave_sse41<const R: usize>(
        f: *const u8,
        prev: *const u8,
        out: *mut u8,
        n: usize,
    ) {
        // SAFETY: forwarded contract.
        unsafe { paeth_wave::<R>(f, prev, out, n) }
    }

    /// [`paeth_wave`] compiled for AVX2.
    ///
    /// # Safety
    /// As [`paeth_wave`], on a CPU with AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn paeth_wave_avx2<const R: usize>(
        f: *const u8,
        prev: *const u8,
        out: *mut u8,
        n: usize,
    ) {
        // SAFETY: forwarded contract.
        unsafe { paeth_wave::<R>(f, prev, out, n) }
    }

    /// `R` consecutive Paeth rows of `n` bytes: `f` points at their filtered rows (filter byte
    /// first, `n + 1` bytes each), `prev` at the row above the first, `out` at their output rows.
    /// At step `i` row `k` does pixel `i − k`; its upper neighbours are row `k−1`'s last two
    /// outputs, kept in registers. Pixels go out as 4-byte stores (the fourth byte is the next
    /// pixel's, written over at its turn), a row's last pixel as 3 bytes.
    ///
    /// # Safety
    /// The CPU must support SSE4.1; `n` is a multiple of 3; `f..f + R·(n+1) + 1`,
    /// `prev..prev + n + 1` and `out..out + R·n + 1` are readable (writable) and `prev`'s rows do
    /// not overlap `out`'s first `R·n` bytes.
    #[inline(always)]
    unsafe fn paeth_wave<const R: usize>(f: *const u8, prev: *const u8, out: *mut u8, n: usize) {
        let px = n / BPP;
        let zero = _mm_setzero_si128();
        // Per row: its last output (left), the upper neighbour of that pixel (upper-left), and the
        // output the row below reads next.
        let (mut a, mut c, mut done) = ([zero; R], [zero; R], [zero; R]);
        // One step of every row that has a pixel at `i` (all of them when `ALL`).
        #[inline(always)]
        unsafe fn step<const R: usize, const ALL: bool>(
            i: usize,
            px: usize,
            n: usize,
            (f, prev, out): (*const u8, *const u8, *mut u8),
            a: &mut [__m128i; R],
            c: &mut [__m128i; R],
            done: &mut [__m128i; R],
        ) {
            let mask = _mm_set1_epi16(0xff);
            let mut above = _mm_setzero_si128();
            for k in 0..R {
                let b_row_above = above;
                above = done[k];
                if !ALL && (i < k || i - k >= px) {
                    continue;
                }
                let o = BPP * (i - k);
                // SAFETY (loads, stores): inside the ranges of the caller's contract.
                unsafe {
                    let x = load3(f.add(k * (n + 1) + 1 + o), true);
                    let b = if k == 0 {
                        load3(prev.add(o), true)
                    } else {
                        b_row_above
                    };
                    let v = _mm_and_si128(_mm_add_epi16(x, paeth(a[k], b, c[k])), mask);
                    let px4 = _mm_cvtsi128_si32(_mm_packus_epi16(v, v)) as u32;
                    let dst = out.add(k * n + o);
                    if ALL || i - k + 1 < px {
                        (dst as *mut u32).write_unaligned(px4);
                    } else {
                        std::ptr::copy_nonoverlapping(px4.to_le_bytes().as_ptr(), dst, BPP);
                    }
                    a[k] = v;
                    c[k] = b;
                    done[k] = v;
                }
            }
        }
        let ptrs = (f, prev, out);
        // Steady steps: every row has a pixel, none its last.
        let steady = (R - 1)..px.saturating_sub(1).max(R - 1);
        // SAFETY (each step): the caller's contract.
        unsafe {
            for i in 0..steady.start {
                step::<R, false>(i, px, n, ptrs, &mut a, &mut c, &mut done);
            }
            for i in steady.clone() {
                step::<R, true>(i, px, n, ptrs, &mut a, &mut c, &mut done);
            }
            for i in steady.end..px + R - 1 {
                step::<R, false>(i, px, n, ptrs, &mut a, &mut c, &mut done);
            }
        }
    }

    /// Sub / Average / Paeth over one row, a pixel a step, the three channels as i16 lanes (lane 3
    /// carries the next pixel's first byte and is never stored).
    ///
    /// # Safety
    /// The CPU must support SSE4.1; `f`, `prev` and `cur` have one length, a multiple of 3.
    #[target_feature(enable = "sse4.1")]
    pub(super) unsafe fn chain(kind: u8, f: &[u8], prev: &[u8], cur: &mut [u8]) {
        let n = cur.len();
        let mask = _mm_set1_epi16(0xff);
        let (fp, pp, cp) = (f.as_ptr(), prev.as_ptr(), cur.as_mut_ptr());
        let (mut a, mut c) = (_mm_setzero_si128(), _mm_setzero_si128());
        let mut i = 0;
        while i < n {
            // Four-byte loads while a fourth byte exists.
            let wide = i + 4 <= n;
            // SAFETY: `i + 3 ≤ n` (n is a multiple of 3), and `i + 4 ≤ n` when `wide`.
            let (x, b) = unsafe { (load3(fp.add(i), wide), load3(pp.add(i), wide)) };
            let pred = match kind {
                FILTER_SUB => a,
                FILTER_AVERAGE => _mm_srli_epi16::<1>(_mm_add_epi16(a, b)),
                // SAFETY: SSE4.1 (this function's target feature).
                _ => unsafe { paeth(a, b, c) },
            };
            let v = _mm_and_si128(_mm_add_epi16(x, pred), mask);
            let px = (_mm_cvtsi128_si32(_mm_packus_epi16(v, v)) as u32).to_le_bytes();
            // SAFETY: `i + 3 ≤ n = cur.len()`.
            unsafe { std::ptr::copy_nonoverlapping(px.as_ptr(), cp.add(i), BPP) };
            a = v;
            c = b;
            i += BPP;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::codecs::png::{CompressionType, FilterType, PngEncoder};
    use image::ImageEncoder;

    fn encode(
        w: u32,
        h: u32,
        px: &[u8],
        filter: FilterType,
        color: image::ExtendedColorType,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        PngEncoder::new_with_quality(&mut out, CompressionType::Fast, filter)
            .write_image(px, w, h, color)
            .expect("encode");
        out
    }

    /// Pixels with runs, gradients and noise, so each filter meets every predictor branch.
    fn pixels(w: u32, h: u32, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..w * h * 3)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match (i / 3 / w) % 3 {
                    0 => (s % 256) as u8,
                    1 => (i % 251) as u8,
                    _ => ((i / 3 % w) * 255 / w.max(1)) as u8 ^ (s % 7) as u8,
                }
            })
            .collect()
    }

    /// Every kernel set this CPU can run.
    fn all_kernels() -> Vec<Kernels> {
        let mut k = vec![Kernels::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("sse4.1") {
                k.push(Kernels::Sse41);
            }
            if std::is_x86_feature_detected!("avx2") {
                k.push(Kernels::Avx2);
            }
        }
        k
    }

    fn general(bytes: &[u8]) -> Vec<u8> {
        image::load_from_memory_with_format(bytes, image::ImageFormat::Png)
            .expect("decode")
            .to_rgb8()
            .into_raw()
    }

    /// Every filter type (and the encoder's adaptive mix) at widths 1..=13 and a wide one: the fast
    /// path takes the file and gives the general decoder's bytes, by each kernel set.
    #[test]
    fn equals_the_general_decoder() {
        let filters = [
            FilterType::NoFilter,
            FilterType::Sub,
            FilterType::Up,
            FilterType::Avg,
            FilterType::Paeth,
            FilterType::Adaptive,
        ];
        let mut sizes: Vec<(u32, u32)> = (1..=13).map(|w| (w, 5)).collect();
        sizes.extend([(1, 1), (640, 7), (97, 33)]);
        for (w, h) in sizes {
            let px = pixels(w, h, u64::from(w * 131 + h));
            for f in filters {
                let bytes = encode(w, h, &px, f, image::ExtendedColorType::Rgb8);
                let want = general(&bytes);
                assert_eq!(want, px);
                let got = decode_rgb8(&bytes, w, h, Scratch::none()).expect("fast path");
                assert!(got.data == want, "{w}x{h} {f:?}");
                // Every kernel set this CPU runs, on the same rows.
                let row = w as usize * 3;
                let zlib: Vec<u8> = chunks(&bytes)
                    .map(|c| c.expect("chunk"))
                    .filter(|c| &c.kind == b"IDAT")
                    .flat_map(|c| c.data.to_vec())
                    .collect();
                let mut filtered = vec![0u8; (row + 1) * h as usize + 1];
                let end = filtered.len() - 1;
                assert!(inflate_exact(&zlib, &mut filtered[..end]));
                for kernels in all_kernels() {
                    let mut out = vec![0u8; row * h as usize + 1];
                    assert!(unfilter_rows(kernels, &filtered, row, &mut out));
                    out.pop();
                    assert!(out == want, "{w}x{h} {f:?} {kernels:?}");
                }
            }
        }
    }

    /// The unfilter kernels check the lengths their raw reads and writes rely on where they run:
    /// a row that is not whole pixels, or buffers without their spare byte, are declined by every
    /// kernel set (false), never unfiltered.
    #[test]
    fn unfilter_declines_partial_pixels_and_wrong_lengths() {
        for kernels in all_kernels() {
            for row in [1usize, 2, 4, 5, 7, 8] {
                let rows = 5;
                // every row Paeth, so the wave kernel would take them
                let mut filtered = vec![0u8; (row + 1) * rows + 1];
                for y in 0..rows {
                    filtered[y * (row + 1)] = FILTER_PAETH;
                }
                let mut out = vec![0u8; row * rows + 1];
                assert!(
                    !unfilter_rows(kernels, &filtered, row, &mut out),
                    "{kernels:?} row {row}"
                );
            }
            let row = 6;
            let filtered = vec![FILTER_PAETH; (row + 1) * 5 + 1];
            let mut short = vec![0u8; row * 5];
            assert!(!unfilter_rows(kernels, &filtered, row, &mut short));
            let mut out = vec![0u8; row * 5 + 1];
            assert!(!unfilter_rows(
                kernels,
                &filtered[..filtered.len() - 1],
                row,
                &mut out
            ));
            assert!(!unfilter_rows(kernels, &filtered, 0, &mut out));
            let (f, prev, mut cur) = (vec![0u8; 6], vec![0u8; 5], vec![0u8; 6]);
            assert!(!unfilter_row(kernels, FILTER_AVERAGE, &f, &prev, &mut cur));
            let (f, prev, mut cur) = (vec![0u8; 4], vec![0u8; 4], vec![0u8; 4]);
            assert!(!unfilter_row(kernels, FILTER_SUB, &f, &prev, &mut cur));
        }
    }

    /// What the fast path leaves to the general decoder: other colour types and depths, `tRNS`,
    /// a wrong admitted size, a bad CRC, a truncated file, a stream with bytes after its end.
    #[test]
    fn declines_what_it_does_not_take_whole() {
        let (w, h) = (17, 9);
        let px = pixels(w, h, 5);
        let ok = encode(w, h, &px, FilterType::Paeth, image::ExtendedColorType::Rgb8);
        assert!(decode_rgb8(&ok, w, h, Scratch::none()).is_some());
        assert!(
            decode_rgb8(&ok, w + 1, h, Scratch::none()).is_none(),
            "size"
        );
        let rgba: Vec<u8> = px.chunks(3).flat_map(|p| [p[0], p[1], p[2], 200]).collect();
        let rgba = encode(
            w,
            h,
            &rgba,
            FilterType::Paeth,
            image::ExtendedColorType::Rgba8,
        );
        assert!(decode_rgb8(&rgba, w, h, Scratch::none()).is_none(), "RGBA");
        let px16: Vec<u8> = px.iter().flat_map(|&v| [v, v]).collect();
        let rgb16 = encode(
            w,
            h,
            &px16,
            FilterType::Sub,
            image::ExtendedColorType::Rgb16,
        );
        assert!(
            decode_rgb8(&rgb16, w, h, Scratch::none()).is_none(),
            "16-bit"
        );
        // A tRNS chunk inserted after IHDR (8 + 25 bytes).
        let mut trns = ok[..33].to_vec();
        let body = [b't', b'R', b'N', b'S', 0, 1, 0, 2, 0, 3];
        trns.extend_from_slice(&6u32.to_be_bytes());
        trns.extend_from_slice(&body);
        trns.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
        trns.extend_from_slice(&ok[33..]);
        assert_eq!(general(&trns).len(), px.len(), "still a valid PNG");
        assert!(decode_rgb8(&trns, w, h, Scratch::none()).is_none(), "tRNS");
        // One flipped byte anywhere past the signature: a CRC (or the stream) fails.
        for at in [12, 20, 40, ok.len() / 2, ok.len() - 9, ok.len() - 1] {
            let mut bad = ok.clone();
            bad[at] ^= 0x10;
            assert!(
                decode_rgb8(&bad, w, h, Scratch::none()).is_none(),
                "flip at {at}"
            );
        }
        for cut in (8..ok.len()).step_by(7) {
            assert!(
                decode_rgb8(&ok[..cut], w, h, Scratch::none()).is_none(),
                "cut at {cut}"
            );
        }
    }
}
