//! JPEG header and decode, bit-identical to what `convert_to_rgb(PIL.Image.open(f))` sees.
//!
//! Pillow decodes JPEG with libjpeg-turbo at its defaults (ISLOW integer IDCT, fancy upsampling,
//! block smoothing on, its YCbCr→RGB tables) and asks for `L`, `RGB` or inverted CMYK (`CMYK;I`,
//! Pillow JpegImagePlugin.py "assume adobe conventions"), which `convert("RGB")` then turns into RGB
//! (Pillow src/libImaging/Convert.c `cmyk2rgb`). We run the same library: `mozjpeg-sys` builds
//! libjpeg-turbo's decoder (the mozjpeg fork, whose decoding side is libjpeg-turbo's) from vendored C
//! with only a C compiler, and its SIMD where nasm is on the build machine's PATH; libjpeg-turbo's
//! SIMD is bit-exact with its C code on real files, so the output is the same bytes as Pillow's.
//!
//! On a pool of [`OWN_DECODE_MIN_THREADS`] threads or more, a large baseline file goes through our
//! own decode first (`own_decode`: `jpeg_entropy` splits the Huffman decode over the pool,
//! `jpeg_idct` reconstructs the rows in chunks), which gives libjpeg's bytes or declines; every
//! decline and every error goes through libjpeg as before.
//!
//! Errors: libjpeg reports a fatal error through `error_exit`, which must not return. Ours unwinds
//! (`resume_unwind`, no panic hook, no message) through the C frames, which `mozjpeg-sys` compiles
//! with `-fexceptions` for exactly this, to the `catch_unwind` in `with_session`, which turns it into
//! [`PrepError::Decode`]. The decoder object is destroyed on every path. (A build with
//! `panic = "abort"` would abort on a corrupt JPEG instead; the workspace builds with unwinding.)

use std::os::raw::{c_int, c_long};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use mozjpeg_sys as ffi;

use crate::error::{PrepError, Result};
use crate::resize::{resize_rgb_in, Filter, RgbWidthResize};
use crate::rgb::RgbImage;

/// Pillow JpegImagePlugin.py `SOF`: only 8-bit samples are opened ("cannot handle N-bit layers").
const PIL_JPEG_BITS: u8 = 8;

/// Progressive scans a decode may read before it is refused (not upstream: a guard against
/// scan bombs, small files whose thousands of scans each walk the whole image; libjpeg-turbo's
/// own fuzz targets stop at 500 too). Real progressive files have about 10.
pub(crate) const MAX_JPEG_SCANS: c_int = 500;

/// What the JPEG frame header (SOFn) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JpegHeader {
    /// Samples per line.
    pub width: u32,
    /// Lines.
    pub height: u32,
    /// Colour components (Pillow: 1 → L, 3 → RGB, 4 → CMYK).
    pub components: u8,
}

fn header_error(reason: impl Into<String>) -> PrepError {
    PrepError::Decode {
        format: "jpeg".into(),
        reason: format!("header: {}", reason.into()),
    }
}

/// Walk the markers up to the first frame header, as Pillow's `JpegImageFile._open` does, and
/// refuse what Pillow refuses: a sample precision other than 8 bits, a component count other than
/// 1, 3 or 4. Reads nothing past the frame header and allocates nothing.
pub(crate) fn read_header(bytes: &[u8]) -> Result<JpegHeader> {
    if bytes.len() < 3 || bytes[0] != 0xFF || bytes[1] != 0xD8 {
        return Err(header_error("no SOI marker"));
    }
    let mut i = 2;
    loop {
        // Junk between markers is skipped (Pillow does too); fill bytes 0xFF repeat.
        while i < bytes.len() && bytes[i] != 0xFF {
            i += 1;
        }
        while i < bytes.len() && bytes[i] == 0xFF {
            i += 1;
        }
        let Some(&code) = bytes.get(i) else {
            return Err(header_error(
                "no frame header (SOF) before the end of the data",
            ));
        };
        i += 1;
        match code {
            // Stuffed zero, TEM and RSTn carry no length.
            0x00 | 0x01 | 0xD0..=0xD7 => continue,
            0xD8 => continue,
            0xD9 | 0xDA => return Err(header_error("image data before any frame header (SOF)")),
            _ => {}
        }
        let len = match bytes.get(i..i + 2) {
            Some(b) => usize::from(u16::from_be_bytes([b[0], b[1]])),
            None => return Err(header_error("truncated marker length")),
        };
        if len < 2 {
            return Err(header_error(format!(
                "marker 0xFF{code:02X} of length {len}"
            )));
        }
        // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
        if matches!(code, 0xC0..=0xCF) && !matches!(code, 0xC4 | 0xC8 | 0xCC) {
            let Some(sof) = bytes.get(i + 2..i + 8) else {
                return Err(header_error("truncated frame header"));
            };
            let (bits, height, width, components) = (
                sof[0],
                u32::from(u16::from_be_bytes([sof[1], sof[2]])),
                u32::from(u16::from_be_bytes([sof[3], sof[4]])),
                sof[5],
            );
            if bits != PIL_JPEG_BITS {
                return Err(header_error(format!("cannot handle {bits}-bit layers")));
            }
            if !matches!(components, 1 | 3 | 4) {
                return Err(header_error(format!(
                    "cannot handle {components}-layer images"
                )));
            }
            return Ok(JpegHeader {
                width,
                height,
                components,
            });
        }
        i += len;
    }
}

/// A libjpeg fatal error on its way from `error_exit` (or our source manager) to `with_session`.
struct LibjpegError(String);

/// libjpeg's message for the pending error code (its `format_message`, into an 80-byte buffer).
fn message(cinfo: &mut ffi::jpeg_common_struct) -> String {
    // SAFETY: `cinfo.err` points at the live error manager set up in `decode`.
    let Some(format) = (unsafe { cinfo.err.as_ref() }).and_then(|e| e.format_message) else {
        return "libjpeg error".into();
    };
    let mut buffer = [0u8; 80];
    // The binding declares the buffer `&[u8; 80]` although libjpeg writes into it; call it through
    // a pointer-typed signature so the write is not through a shared reference.
    type FormatMessage = unsafe extern "C-unwind" fn(*mut ffi::jpeg_common_struct, *mut u8);
    // SAFETY: both signatures pass two pointers under the same ABI; libjpeg writes at most
    // JMSG_LENGTH_MAX (80) bytes, NUL-terminated, into `buffer`.
    unsafe {
        let format: FormatMessage = std::mem::transmute(format);
        format(cinfo, buffer.as_mut_ptr());
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

/// `error_exit`: never returns; unwinds to `decode` without running the panic hook.
unsafe extern "C-unwind" fn error_exit(cinfo: &mut ffi::jpeg_common_struct) {
    let msg = message(cinfo);
    resume_unwind(Box::new(LibjpegError(msg)))
}

/// `output_message`: warnings are not printed (Pillow's `output` is empty too).
unsafe extern "C-unwind" fn output_message(_cinfo: &mut ffi::jpeg_common_struct) {}

/// Our source manager: the whole file is in memory, so asking for more means it is truncated.
/// After the last scanline (`finishing`) it suspends instead, as Pillow's reader does when the
/// data ends there (a missing EOI is not an error upstream).
#[repr(C)]
struct Source {
    mgr: ffi::jpeg_source_mgr,
    finishing: bool,
}

unsafe extern "C-unwind" fn init_source(_cinfo: &mut ffi::jpeg_decompress_struct) {}
unsafe extern "C-unwind" fn term_source(_cinfo: &mut ffi::jpeg_decompress_struct) {}

unsafe extern "C-unwind" fn fill_input_buffer(
    cinfo: &mut ffi::jpeg_decompress_struct,
) -> ffi::boolean {
    // SAFETY: `cinfo.src` is the `Source` installed by `decode` (its first field is the manager).
    if unsafe { (*(cinfo.src as *const Source)).finishing } {
        return 0;
    }
    resume_unwind(Box::new(LibjpegError(
        "image file is truncated (the data ends inside the image)".into(),
    )))
}

unsafe extern "C-unwind" fn skip_input_data(
    cinfo: &mut ffi::jpeg_decompress_struct,
    num_bytes: c_long,
) {
    // SAFETY: as in `fill_input_buffer`.
    let src = unsafe { &mut *(cinfo.src as *mut Source) };
    let n = usize::try_from(num_bytes).unwrap_or(0);
    if n > src.mgr.bytes_in_buffer {
        if src.finishing {
            src.mgr.bytes_in_buffer = 0;
            return;
        }
        resume_unwind(Box::new(LibjpegError(
            "image file is truncated (a marker runs past the end)".into(),
        )))
    }
    // SAFETY: `n ≤ bytes_in_buffer`, so the pointer stays inside the input slice.
    src.mgr.next_input_byte = unsafe { src.mgr.next_input_byte.add(n) };
    src.mgr.bytes_in_buffer -= n;
}

unsafe extern "C-unwind" fn resync_to_restart(
    cinfo: &mut ffi::jpeg_decompress_struct,
    desired: c_int,
) -> ffi::boolean {
    // SAFETY: libjpeg's own default resync, called with the decompressor it handed us.
    unsafe { ffi::jpeg_resync_to_restart(cinfo, desired) }
}

/// Progress monitor: refuses a file past [`MAX_JPEG_SCANS`] scans.
unsafe extern "C-unwind" fn progress_monitor(cinfo: &mut ffi::jpeg_common_struct) {
    if cinfo.is_decompressor == 0 {
        return;
    }
    // SAFETY: `is_decompressor` says this common struct heads a `jpeg_decompress_struct`.
    let scans =
        unsafe { (*(cinfo as *mut _ as *mut ffi::jpeg_decompress_struct)).input_scan_number };
    if scans > MAX_JPEG_SCANS {
        resume_unwind(Box::new(LibjpegError(format!(
            "more than {MAX_JPEG_SCANS} scans"
        ))))
    }
}

/// Everything libjpeg points into, boxed together so the addresses stay put.
struct Session {
    cinfo: ffi::jpeg_decompress_struct,
    err: ffi::jpeg_error_mgr,
    src: Source,
    progress: ffi::jpeg_progress_mgr,
    created: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.created {
            // SAFETY: created by `jpeg_create_decompress`; destroying is valid in any state,
            // including after an error exit, and never raises one.
            unsafe { ffi::jpeg_destroy_decompress(&mut self.cinfo) };
        }
    }
}

/// PIL `MULDIV255`: `(a·b + 128)` divided by 255 with shifts (Pillow src/libImaging/ImagingUtils.h).
#[inline]
fn muldiv255(a: u32, b: u32) -> u32 {
    let t = a * b + 128;
    ((t >> 8) + t) >> 8
}

/// One pixel of Pillow's `CMYK;I` unpack (each sample inverted) followed by `cmyk2rgb`
/// (Pillow src/libImaging/Convert.c: `nk = 255 − k`, `v = nk − MULDIV255(c, nk)`).
#[inline]
fn inverted_cmyk_to_rgb(p: &[u8], out: &mut [u8]) {
    let nk = u32::from(p[3]); // 255 − (255 − k)
    for c in 0..3 {
        let v = 255 - u32::from(p[c]);
        out[c] = (nk - muldiv255(v, nk)) as u8;
    }
}

/// Fewest pixels an image must have before [`decode_banded`] splits it: below about a
/// megapixel the extra decompressors' setup is not won back.
pub(crate) const BAND_MIN_PIXELS: u64 = 1 << 20;

/// Fewest iMCU rows (8 or 16 image rows each) a band gets.
const BAND_MIN_IMCU_ROWS: usize = 4;

/// The share of a baseline decode's time a skip costs (the entropy decoding a band re-reads for
/// the rows above it): sizes the bands so that each finishes at about the same time. Measured on
/// the 1920×1080 quality-90 photo of `xtask prep-breakdown` with libjpeg-turbo's SIMD
/// (2026-12-06, one core): skipping to the last 16 rows took 2.6 of the whole decode's 6.1 ms.
const ENTROPY_SHARE: f64 = 0.45;

/// Decode a JPEG whose header admitted `width × height` into RGB as Pillow + `convert_to_rgb` do,
/// on up to `bands` decompressors at once, each writing its own rows (the same bytes either way).
/// `max_memory` caps libjpeg's large buffers (the coefficient store of progressive files).
/// The RGB buffer comes from `scratch` (every byte is written).
///
/// A single-scan (baseline) JPEG can only be entropy-decoded from the start, but libjpeg-turbo's
/// `jpeg_skip_scanlines` skips the IDCT, upsampling and colour conversion of the rows it passes.
/// Band `k` skips to one iMCU row before its first row, decodes that row and discards it (so the
/// fancy upsampler's context above the band is the one a whole decode has), then decodes its
/// rows; the last band reads on to EOI, as Pillow does. Bands are cut at iMCU rows, longer
/// first (a later band re-reads more entropy-coded data), on the rayon pool. A progressive or
/// multi-scan file, one under [`BAND_MIN_PIXELS`] or `bands ≤ 1` decodes whole on this thread.
pub(crate) fn decode_banded(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    scratch: &crate::pages::Scratch,
    bands: usize,
) -> Result<RgbImage> {
    if let Some(data) = own_decode(bytes, width, height, max_memory, scratch, bands) {
        return Ok(RgbImage {
            width: width as usize,
            height: height as usize,
            data,
        });
    }
    let cuts = cuts_for(bytes, width, height, max_memory, bands)?;
    decode_cuts(bytes, width, height, max_memory, scratch, &cuts).map(|data| RgbImage {
        width: width as usize,
        height: height as usize,
        data,
    })
}

/// The band cuts [`decode_banded`] decodes a `width × height` JPEG in with up to `bands`
/// decompressors: `[0, height]` (one band) for a progressive or multi-scan file, one under
/// [`BAND_MIN_PIXELS`] or `bands ≤ 1`.
fn cuts_for(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    bands: usize,
) -> Result<Vec<usize>> {
    let h = height as usize;
    if bands <= 1 || u64::from(width) * u64::from(height) < BAND_MIN_PIXELS {
        return Ok(vec![0, h]);
    }
    Ok(
        match with_session(|s| probe(s, bytes, width, height, max_memory))? {
            Some(imcu) => band_cuts(h, imcu, bands, ENTROPY_SHARE),
            None => vec![0, h],
        },
    )
}

/// Image rows a band decodes before it hands them to the horizontal resize pass on another
/// thread of the pool ([`decode_resized`]). After the last band ends, one such chunk's pass is
/// left before the vertical pass can start, so smaller is a shorter tail; each chunk is one pool
/// task (a few µs of overhead) and its last row is copied once (the SIMD row kernel reads past a
/// row's end). 32 rows (not measured against other sizes): 34 chunks for 1080 rows, each 3% of
/// the image.
const HPASS_CHUNK_ROWS: usize = 32;

/// Decode a JPEG whose header admitted `width × height` as [`decode_banded`] does and resize it
/// to `out_w × out_h` with `filter`: the bytes of `resize_rgb_in` on that decode. When the file
/// is decoded in several bands and the width changes, each band hands its rows, every
/// [`HPASS_CHUNK_ROWS`], to the resize's horizontal pass on the pool's other threads while it
/// decodes on, so after the last band only its last chunk's horizontal pass and the vertical pass
/// remain. Otherwise (one band, or the same width) it decodes, then resizes; at the source's own
/// size the decode is the result. Buffers come from (and the decoded image, once resized, goes
/// back to) `scratch`; `parallel` splits the resize's rows over the
/// pool where it runs after the decode. A decode error is the one [`decode_banded`] reports.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_resized(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    scratch: &crate::pages::Scratch,
    bands: usize,
    (out_w, out_h): (usize, usize),
    filter: Filter,
    parallel: bool,
) -> Result<RgbImage> {
    let (w, h) = (width as usize, height as usize);
    let plan = RgbWidthResize::new(w, h, out_w, out_h, filter);
    if let Some(data) = own_decode_resized(
        bytes,
        (width, height),
        max_memory,
        scratch,
        bands,
        plan.as_ref(),
        (out_w, out_h, filter),
        parallel,
    ) {
        return Ok(RgbImage {
            width: out_w,
            height: out_h,
            data,
        });
    }
    let cuts = cuts_for(bytes, width, height, max_memory, bands)?;
    let data = match plan {
        Some(plan) if cuts.len() > 2 => decode_cuts_resized(
            bytes, width, height, max_memory, scratch, &cuts, &plan, parallel,
        )?,
        // The resize is the identity: the decode itself.
        _ if (out_w, out_h) == (w, h) => {
            decode_cuts(bytes, width, height, max_memory, scratch, &cuts)?
        }
        _ => {
            let rgb = decode_cuts(bytes, width, height, max_memory, scratch, &cuts)?;
            let out = resize_rgb_in(&rgb, w, h, out_w, out_h, filter, parallel, scratch);
            scratch.give(rgb);
            out
        }
    };
    Ok(RgbImage {
        width: out_w,
        height: out_h,
        data,
    })
}

/// [`decode_cuts`] with `plan`'s horizontal pass run on each band's rows, a chunk of
/// [`HPASS_CHUNK_ROWS`] at a time, as soon as they are decoded (one pool task per chunk, while
/// the band decodes its next rows), then the vertical pass: the resized image.
#[allow(clippy::too_many_arguments)]
fn decode_cuts_resized(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    scratch: &crate::pages::Scratch,
    cuts: &[usize],
    plan: &RgbWidthResize,
    parallel: bool,
) -> Result<Vec<u8>> {
    let (w, h) = (width as usize, height as usize);
    let mut rgb = scratch.take(w * h * 3);
    let mut tmp = scratch.take(plan.rows().len() * plan.row_bytes());
    // Every band's chunks up front: (source rows, their RGB rows, the intermediate rows they
    // give: those of `keep`, maybe none), all disjoint slices of the two buffers.
    let mut jobs: Vec<Band<'_>> = Vec::with_capacity(cuts.len());
    let (mut rgb_rest, mut tmp_rest) = (rgb.as_mut_slice(), tmp.as_mut_slice());
    for pair in cuts.windows(2) {
        let chunks = chunks_of(pair[0]..pair[1], w, plan, &mut rgb_rest, &mut tmp_rest);
        jobs.push(Band {
            rows: pair[0]..pair[1],
            chunks,
        });
    }
    let mut done: Vec<Result<()>> = cuts.windows(2).map(|_| Ok(())).collect();
    rayon::scope(|sc| {
        for (band, slot) in jobs.into_iter().zip(done.iter_mut()) {
            sc.spawn(move |sc| {
                *slot = with_session(|s| {
                    let out_comps =
                        start_rows(s, bytes, width, height, max_memory, band.rows.start)?;
                    for c in band.chunks {
                        read_rows(s, w, c.rows.clone(), out_comps, &mut *c.out)?;
                        if c.kept.is_empty() {
                            continue;
                        }
                        // The chunk's rows are final: read them from here on.
                        let src: &[u8] = c.out;
                        let rows = c.kept.start - c.rows.start..c.kept.end - c.rows.start;
                        let mid = c.mid;
                        sc.spawn(move |_| plan.horizontal(src, rows, mid));
                    }
                    finish_rows(s, band.rows.end == h);
                    Ok(())
                });
            });
        }
    });
    // The first error in row order, as a whole decode meets it.
    if let Some(e) = done.into_iter().find_map(|r| r.err()) {
        scratch.give(rgb);
        scratch.give(tmp);
        return Err(e);
    }
    let out = plan.finish(tmp, parallel, scratch);
    // Kept after the resized image took its buffer (see `own_decode_resized`).
    scratch.give(rgb);
    Ok(out)
}

/// Rows `rows` cut into chunks of [`HPASS_CHUNK_ROWS`]: each takes its RGB rows from the front of
/// `rgb_rest` and the intermediate rows of `plan`'s horizontal pass it gives (those of
/// `plan.rows()`, maybe none) from the front of `tmp_rest`.
fn chunks_of<'a>(
    rows: std::ops::Range<usize>,
    w: usize,
    plan: &RgbWidthResize,
    rgb_rest: &mut &'a mut [u8],
    tmp_rest: &mut &'a mut [u8],
) -> Vec<Chunk<'a>> {
    let keep = plan.rows();
    let end = rows.end;
    let mut chunks = Vec::with_capacity(rows.len().div_ceil(HPASS_CHUNK_ROWS));
    for start in rows.step_by(HPASS_CHUNK_ROWS) {
        let rows = start..(start + HPASS_CHUNK_ROWS).min(end);
        let (out, rest) = std::mem::take(rgb_rest).split_at_mut(rows.len() * w * 3);
        *rgb_rest = rest;
        let kept = rows.start.clamp(keep.start, keep.end)..rows.end.clamp(keep.start, keep.end);
        let (mid, rest) = std::mem::take(tmp_rest).split_at_mut(kept.len() * plan.row_bytes());
        *tmp_rest = rest;
        chunks.push(Chunk {
            rows,
            out,
            kept,
            mid,
        });
    }
    chunks
}

/// Fewest pool threads our own decode runs on; with fewer, libjpeg's banded decode is faster. Its
/// entropy decode reads the scan twice (once to find where blocks start, once into the planes)
/// and its IDCT is about libjpeg's, so it wins only where the work spreads over many threads: on
/// the 2-core development VM (2026-12-07, `xtask prep-breakdown`, 1920×1080 gemma4 JPEG) it took
/// 4.6–5.8 ms against the libjpeg bands' 3.9.
const OWN_DECODE_MIN_THREADS: usize = 4;

/// Our own decode's first half (`jpeg_entropy`): the frame and its coefficients, the entropy
/// decode split over up to `bands` pool threads, or `None` where it declines and libjpeg decodes:
/// fewer than [`OWN_DECODE_MIN_THREADS`] threads or an image under [`BAND_MIN_PIXELS`] (one libjpeg decompressor is as fast there),
/// a file that is not one baseline scan of grey or YCbCr the reconstruction reproduces
/// (`jpeg_idct::supports`), coefficients larger than `max_memory`, or anything irregular in the
/// scan (a corrupt file's error then comes from libjpeg, as before).
fn own_coefficients(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    bands: usize,
) -> Option<(crate::jpeg_frame::Frame, crate::jpeg_frame::Coefficients)> {
    if bands < OWN_DECODE_MIN_THREADS || u64::from(width) * u64::from(height) < BAND_MIN_PIXELS {
        return None;
    }
    own_coefficients_of_any_size(bytes, width, height, max_memory, bands)
}

/// [`own_coefficients`] without its size and thread gate (the tests take small files through it).
fn own_coefficients_of_any_size(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    bands: usize,
) -> Option<(crate::jpeg_frame::Frame, crate::jpeg_frame::Coefficients)> {
    let frame = frame_of(bytes, width, height, max_memory)?;
    crate::jpeg_idct::supports(&frame).ok()?;
    let size: u64 = frame
        .components
        .iter()
        .map(|c| (c.stored_w * c.stored_h * 64 * std::mem::size_of::<i16>()) as u64)
        .sum();
    if size > max_memory {
        return None;
    }
    let coefs = crate::jpeg_entropy::decode_parallel(bytes, &frame, bands).ok()?;
    Some((frame, coefs))
}

/// Our own decode of a baseline JPEG ([`own_coefficients`], then the rows reconstructed a chunk of
/// [`HPASS_CHUNK_ROWS`] at a time on the pool, `jpeg_idct`): libjpeg's bytes, or `None` where it
/// declines (the caller decodes with libjpeg). The buffer comes from `scratch`.
fn own_decode(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    scratch: &crate::pages::Scratch,
    bands: usize,
) -> Option<Vec<u8>> {
    let (frame, coefs) = own_coefficients(bytes, width, height, max_memory, bands)?;
    own_rows(&frame, &coefs, scratch)
}

/// Every row of `frame` reconstructed from `coefs` a chunk of [`HPASS_CHUNK_ROWS`] at a time on the
/// pool, into a buffer from `scratch`; `None` where the reconstruction declines.
fn own_rows(
    frame: &crate::jpeg_frame::Frame,
    coefs: &crate::jpeg_frame::Coefficients,
    scratch: &crate::pages::Scratch,
) -> Option<Vec<u8>> {
    use rayon::prelude::*;
    let row = frame.width * 3;
    let mut data = scratch.take(row * frame.height);
    let done = data
        .par_chunks_mut(HPASS_CHUNK_ROWS * row)
        .enumerate()
        .all(|(i, out)| {
            let first = i * HPASS_CHUNK_ROWS;
            let rows = first..first + out.len() / row;
            crate::jpeg_idct::reconstruct_rows(frame, coefs, rows, out).is_ok()
        });
    if done {
        return Some(data);
    }
    scratch.give(data);
    None
}

/// [`own_decode`] resized to `out_w × out_h` with `filter`: with a width-changing `plan`, each
/// chunk's horizontal pass runs right after its rows are reconstructed, on the same task, and the
/// vertical pass after the last (`parallel` splits it over the pool); otherwise decode, then
/// `resize_rgb_in`. The bytes of `resize_rgb_in` on libjpeg's decode, or `None` where our decode
/// declines.
#[allow(clippy::too_many_arguments)]
fn own_decode_resized(
    bytes: &[u8],
    (width, height): (u32, u32),
    max_memory: u64,
    scratch: &crate::pages::Scratch,
    bands: usize,
    plan: Option<&RgbWidthResize>,
    (out_w, out_h, filter): (usize, usize, Filter),
    parallel: bool,
) -> Option<Vec<u8>> {
    use rayon::prelude::*;
    let (w, h) = (width as usize, height as usize);
    let Some(plan) = plan else {
        let rgb = own_decode(bytes, width, height, max_memory, scratch, bands)?;
        if (out_w, out_h) == (w, h) {
            // The resize is the identity (glm5_next's content at the source's size): the decode.
            return Some(rgb);
        }
        let out = resize_rgb_in(&rgb, w, h, out_w, out_h, filter, parallel, scratch);
        scratch.give(rgb);
        return Some(out);
    };
    let (frame, coefs) = own_coefficients(bytes, width, height, max_memory, bands)?;
    let mut rgb = scratch.take(w * h * 3);
    let mut tmp = scratch.take(plan.rows().len() * plan.row_bytes());
    let (mut rgb_rest, mut tmp_rest) = (rgb.as_mut_slice(), tmp.as_mut_slice());
    let chunks = chunks_of(0..h, w, plan, &mut rgb_rest, &mut tmp_rest);
    let done = chunks.into_par_iter().all(|c| {
        if crate::jpeg_idct::reconstruct_rows(&frame, &coefs, c.rows.clone(), c.out).is_err() {
            return false;
        }
        if !c.kept.is_empty() {
            let rows = c.kept.start - c.rows.start..c.kept.end - c.rows.start;
            plan.horizontal(c.out, rows, c.mid);
        }
        true
    });
    if !done {
        scratch.give(rgb);
        scratch.give(tmp);
        return None;
    }
    let out = plan.finish(tmp, parallel, scratch);
    // Kept only now, so the resized image (a quarter of it for gemma4's 1080p) does not take
    // this buffer: given back as the resized image's, it came back too short for the next
    // decode, and lengthening it was a serial 4.4 MB fill before every decode.
    scratch.give(rgb);
    Some(out)
}

/// One band of [`decode_cuts_resized`]: its rows and their chunks, in order.
struct Band<'a> {
    rows: std::ops::Range<usize>,
    chunks: Vec<Chunk<'a>>,
}

/// One chunk of a band: its source rows, where they are decoded, the rows of them the resize
/// keeps (within `rows`, maybe none) and where their horizontal pass goes.
struct Chunk<'a> {
    rows: std::ops::Range<usize>,
    out: &'a mut [u8],
    kept: std::ops::Range<usize>,
    mid: &'a mut [u8],
}

/// Decodes rows `cuts[k]..cuts[k + 1]` of each band `k` on its own decompressor (in parallel when
/// there are several) into one buffer from `scratch`. `cuts` starts at 0, ends at the height and
/// every inner cut is a multiple of the image's iMCU height.
fn decode_cuts(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    scratch: &crate::pages::Scratch,
    cuts: &[usize],
) -> Result<Vec<u8>> {
    use rayon::prelude::*;
    let (w, h) = (width as usize, height as usize);
    let mut data = scratch.take(w * h * 3);
    let mut jobs = Vec::with_capacity(cuts.len());
    let mut rest = data.as_mut_slice();
    for pair in cuts.windows(2) {
        let (band, tail) = rest.split_at_mut((pair[1] - pair[0]) * w * 3);
        jobs.push((pair[0]..pair[1], band));
        rest = tail;
    }
    let run = |(rows, out): (std::ops::Range<usize>, &mut [u8])| {
        with_session(|s| decode_rows(s, bytes, width, height, max_memory, rows, out))
    };
    if jobs.len() == 1 {
        jobs.into_iter().try_for_each(run)?;
    } else {
        // Every band's answer, then the first error in row order (a whole decode meets the
        // earliest problem first).
        let done: Vec<Result<()>> = jobs.into_par_iter().map(run).collect();
        done.into_iter().collect::<Result<()>>()?;
    }
    Ok(data)
}

/// Band boundaries for `h` rows of iMCU height `imcu`, at most `bands` bands, each at least
/// [`BAND_MIN_IMCU_ROWS`] iMCU rows: band `k` starting at `s_k` costs about
/// `share·s_k + len_k` (the entropy decoding of the rows above it, then its own rows), so
/// `s_{k+1} = c + (1 − share)·s_k` with `c` chosen to end at `h`.
fn band_cuts(h: usize, imcu: usize, bands: usize, share: f64) -> Vec<usize> {
    let imcu = imcu.max(1);
    let n = bands.min(h / (imcu * BAND_MIN_IMCU_ROWS)).max(1);
    if n == 1 {
        return vec![0, h];
    }
    let keep = 1.0 - share;
    let c = h as f64 * share / (1.0 - keep.powi(n as i32));
    let mut cuts = vec![0usize];
    let mut s = 0.0f64;
    for _ in 1..n {
        s = c + keep * s;
        let cut = ((s / imcu as f64).round() as usize) * imcu;
        let last = *cuts.last().unwrap_or(&0);
        if cut >= last + imcu * BAND_MIN_IMCU_ROWS && cut + imcu * BAND_MIN_IMCU_ROWS <= h {
            cuts.push(cut);
        }
    }
    cuts.push(h);
    cuts
}

/// Runs `f` on a fresh decompressor session, turning a libjpeg fatal error into
/// [`PrepError::Decode`]; the decompressor is destroyed on every path.
fn with_session<T>(f: impl FnOnce(&mut Session) -> Result<T>) -> Result<T> {
    let mut session = Box::new(Session {
        // SAFETY: the libjpeg structs are plain C data for which all-zero is the documented
        // "not yet initialised" state (null pointers, `None` callbacks, enum value 0).
        cinfo: unsafe { std::mem::zeroed() },
        err: unsafe { std::mem::zeroed() },
        src: Source {
            mgr: unsafe { std::mem::zeroed() },
            finishing: false,
        },
        progress: unsafe { std::mem::zeroed() },
        created: false,
    });
    let run = catch_unwind(AssertUnwindSafe(|| f(&mut session)));
    drop(session);
    match run {
        Ok(r) => r,
        Err(payload) => match payload.downcast::<LibjpegError>() {
            Ok(e) => Err(PrepError::Decode {
                format: "jpeg".into(),
                reason: e.0,
            }),
            // Not a libjpeg error: a bug of ours; let it continue.
            Err(other) => resume_unwind(other),
        },
    }
}

/// Creates the decompressor of `s` on `bytes` and reads the header, checking it against the
/// admitted size.
fn open(s: &mut Session, bytes: &[u8], width: u32, height: u32, max_memory: u64) -> Result<()> {
    // SAFETY: the decompressor is created here, and its error manager, source and progress
    // monitor live in the same boxed `Session` and outlive it; the input slice outlives the
    // session (dropped in `with_session` before the caller's borrow ends).
    unsafe {
        s.cinfo.common.err = ffi::jpeg_std_error(&mut s.err);
        s.err.error_exit = Some(error_exit);
        s.err.output_message = Some(output_message);
        ffi::jpeg_create_decompress(&mut s.cinfo);
        s.created = true;
        (*s.cinfo.common.mem).max_memory_to_use =
            c_long::try_from(max_memory).unwrap_or(c_long::MAX);
        s.progress.progress_monitor = Some(progress_monitor);
        s.cinfo.common.progress = &mut s.progress;
        s.src.mgr.next_input_byte = bytes.as_ptr();
        s.src.mgr.bytes_in_buffer = bytes.len();
        s.src.mgr.init_source = Some(init_source);
        s.src.mgr.fill_input_buffer = Some(fill_input_buffer);
        s.src.mgr.skip_input_data = Some(skip_input_data);
        s.src.mgr.resync_to_restart = Some(resync_to_restart);
        s.src.mgr.term_source = Some(term_source);
        s.cinfo.src = &mut s.src.mgr;
        ffi::jpeg_read_header(&mut s.cinfo, 1);
    }
    if (s.cinfo.image_width, s.cinfo.image_height) != (width, height) {
        return Err(PrepError::DimensionMismatch {
            width,
            height,
            got_width: s.cinfo.image_width,
            got_height: s.cinfo.image_height,
        });
    }
    Ok(())
}

/// The frame our own baseline decode takes ([`crate::jpeg_frame`]), or `None` where libjpeg
/// decodes the file: `jpeg_entropy::parse_frame`'s reading of the markers, kept only where it
/// agrees with libjpeg's own reading of the same header (component count, sampling factors,
/// blocks per component, quantisation tables, where the scan's data starts) and libjpeg codes the
/// file as one scan of grey or YCbCr (its colour-space guess from the JFIF / Adobe markers and
/// component ids, which we take as is). A header libjpeg refuses gives `None` too: its own decode
/// then reports the error.
pub(crate) fn frame_of(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
) -> Option<crate::jpeg_frame::Frame> {
    use crate::jpeg_frame::Colour;
    let mut frame = crate::jpeg_entropy::parse_frame(bytes)?;
    let agreed = with_session(|s| {
        open(s, bytes, width, height, max_memory)?;
        // SAFETY: the decompressor was created and its header read by `open`.
        if unsafe { ffi::jpeg_has_multiple_scans(&s.cinfo) } != 0 {
            return Ok(None);
        }
        let colour = match (s.cinfo.num_components, s.cinfo.jpeg_color_space) {
            (1, ffi::J_COLOR_SPACE::JCS_GRAYSCALE) => Colour::Grey,
            (3, ffi::J_COLOR_SPACE::JCS_YCbCr) => Colour::YCbCr,
            _ => return Ok(None),
        };
        let n = usize::try_from(s.cinfo.num_components).unwrap_or(0);
        if n != frame.components.len()
            || bytes.len() - s.src.mgr.bytes_in_buffer != frame.scan_start
        {
            return Ok(None);
        }
        // SAFETY: `comp_info` holds `num_components` entries after `jpeg_read_header`.
        let comps = unsafe { std::slice::from_raw_parts(s.cinfo.comp_info, n) };
        for (ours, theirs) in frame.components.iter().zip(comps) {
            let quant = usize::try_from(theirs.quant_tbl_no)
                .ok()
                .and_then(|q| s.cinfo.quant_tbl_ptrs.get(q))
                // SAFETY: a non-null table pointer of the decompressor points at a live table.
                .and_then(|&t| unsafe { t.as_ref() });
            let same = quant.is_some_and(|q| q.quantval == ours.quant)
                && usize::try_from(theirs.h_samp_factor) == Ok(ours.h)
                && usize::try_from(theirs.v_samp_factor) == Ok(ours.v)
                && theirs.width_in_blocks as usize == ours.width_in_blocks
                && theirs.height_in_blocks as usize == ours.height_in_blocks;
            if !same {
                return Ok(None);
            }
        }
        Ok(Some(colour))
    });
    frame.colour = agreed.ok()??;
    Some(frame)
}

/// libjpeg's reading of a single-scan JPEG and its quantised coefficients
/// (`jpeg_read_coefficients`): the oracle our entropy decode is tested against, and the input the
/// reconstruction's tests start from. The frame's Huffman tables are left empty, `scan_start` and
/// `restart_interval` 0; each plane holds libjpeg's own array, `width_in_blocks` and
/// `height_in_blocks` rounded up to the sampling factors (`stored_w`, `stored_h`), blocks in
/// natural order with absolute DCs.
#[cfg(test)]
pub(crate) fn libjpeg_frame(
    bytes: &[u8],
) -> Result<(crate::jpeg_frame::Frame, crate::jpeg_frame::Coefficients)> {
    use crate::jpeg_frame::{Coefficients, Colour, Component, Frame, HuffTable};
    let header = read_header(bytes)?;
    with_session(|s| {
        open(s, bytes, header.width, header.height, u64::MAX)?;
        let colour = match s.cinfo.jpeg_color_space {
            ffi::J_COLOR_SPACE::JCS_GRAYSCALE => Colour::Grey,
            _ => Colour::YCbCr,
        };
        let (w, h) = (header.width as usize, header.height as usize);
        // SAFETY: header read; the arrays returned live until the decompressor is destroyed,
        // and each row access stays inside the component's rounded-up block rows.
        unsafe {
            let arrays = ffi::jpeg_read_coefficients(&mut s.cinfo);
            let n = usize::try_from(s.cinfo.num_components).unwrap_or(0);
            let comps = std::slice::from_raw_parts(s.cinfo.comp_info, n);
            let max_h = comps
                .iter()
                .map(|c| c.h_samp_factor as usize)
                .max()
                .unwrap_or(1);
            let max_v = comps
                .iter()
                .map(|c| c.v_samp_factor as usize)
                .max()
                .unwrap_or(1);
            let access = (*s.cinfo.common.mem)
                .access_virt_barray
                .expect("libjpeg's memory manager has access_virt_barray");
            let mut frame = Frame {
                width: w,
                height: h,
                max_h,
                max_v,
                mcus_x: w.div_ceil(8 * max_h),
                mcus_y: h.div_ceil(8 * max_v),
                components: Vec::with_capacity(n),
                restart_interval: 0,
                colour,
                scan_start: 0,
            };
            let mut planes = Vec::with_capacity(n);
            for (ci, comp) in comps.iter().enumerate() {
                let (ch, cv) = (comp.h_samp_factor as usize, comp.v_samp_factor as usize);
                let (bw, bh) = (
                    comp.width_in_blocks as usize,
                    comp.height_in_blocks as usize,
                );
                let (sw, sh) = if n > 1 {
                    (bw.next_multiple_of(ch), bh.next_multiple_of(cv))
                } else {
                    (bw, bh)
                };
                let mut blocks = Vec::with_capacity(sw * sh * 64);
                for by in 0..sh {
                    let rows = access(&mut s.cinfo.common, *arrays.add(ci), by as u32, 1, 0);
                    let row = *rows;
                    for bx in 0..sw {
                        blocks.extend_from_slice(&*row.add(bx));
                    }
                }
                planes.push(blocks);
                let q = &*s.cinfo.quant_tbl_ptrs[comp.quant_tbl_no as usize];
                let empty = HuffTable {
                    bits: [0; 17],
                    values: Vec::new(),
                };
                frame.components.push(Component {
                    h: ch,
                    v: cv,
                    quant: q.quantval,
                    dc: empty.clone(),
                    ac: empty,
                    sampled_width: (w * ch).div_ceil(max_h),
                    sampled_height: (h * cv).div_ceil(max_v),
                    width_in_blocks: bw,
                    height_in_blocks: bh,
                    stored_w: sw,
                    stored_h: sh,
                });
            }
            if n == 1 {
                frame.mcus_x = frame.components[0].width_in_blocks;
                frame.mcus_y = frame.components[0].height_in_blocks;
            }
            s.src.finishing = true;
            ffi::jpeg_finish_decompress(&mut s.cinfo);
            Ok((frame, Coefficients { planes }))
        }
    })
}

/// [`crate::fuzzing::own_jpeg_agrees_with_libjpeg`]: our own decode (any size, `threads` ways)
/// against libjpeg's whole decode of `bytes`.
pub(crate) fn own_agrees_with_libjpeg(
    bytes: &[u8],
    threads: usize,
    max_pixels: u64,
) -> Option<bool> {
    let header = read_header(bytes).ok()?;
    let (w, h) = (header.width, header.height);
    if u64::from(w) * u64::from(h) > max_pixels {
        return None;
    }
    let none = crate::pages::Scratch::none();
    let theirs = decode_cuts(bytes, w, h, 64 << 20, none, &[0, h as usize]).ok()?;
    let (frame, coefs) = own_coefficients_of_any_size(bytes, w, h, 64 << 20, threads)?;
    let ours = own_rows(&frame, &coefs, none)?;
    Some(ours == theirs)
}

/// The output rows of one iMCU row when the file is single-scan (so bands can skip), else `None`.
fn probe(
    s: &mut Session,
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
) -> Result<Option<usize>> {
    open(s, bytes, width, height, max_memory)?;
    // SAFETY: the decompressor was created and its header read by `open`.
    let multi = unsafe { ffi::jpeg_has_multiple_scans(&s.cinfo) } != 0;
    let v = usize::try_from(s.cinfo.max_v_samp_factor).unwrap_or(0);
    // DCTSIZE output rows per sample row at scale 1/1.
    Ok((!multi && (1..=4).contains(&v)).then_some(8 * v))
}

/// Decodes output rows `rows` into `out` (`rows.len()` rows of `3·width` bytes) on session `s`.
/// A band that does not start at row 0 skips to one iMCU row above its start (`rows.start` must
/// be a multiple of the iMCU height) and decodes that row into a discarded buffer first; the band
/// that ends at the last row reads on to EOI.
fn decode_rows(
    s: &mut Session,
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    rows: std::ops::Range<usize>,
    out: &mut [u8],
) -> Result<()> {
    let (w, h) = (width as usize, height as usize);
    if rows.end > h {
        return Err(PrepError::BadSetting(format!(
            "JPEG rows {rows:?} of a {w}x{h} image"
        )));
    }
    let out_comps = start_rows(s, bytes, width, height, max_memory, rows.start)?;
    read_rows(s, w, rows.clone(), out_comps, out)?;
    finish_rows(s, rows.end == h);
    Ok(())
}

/// Opens session `s` on `bytes` and starts the decompressor at output row `first` (a multiple
/// of the iMCU height): skips to one iMCU row above it and decodes that row into a discarded
/// buffer (the fancy upsampler's context). Returns the decoder's output components per pixel.
fn start_rows(
    s: &mut Session,
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    first: usize,
) -> Result<usize> {
    let w = width as usize;
    open(s, bytes, width, height, max_memory)?;
    let comps = s.cinfo.num_components;
    s.cinfo.out_color_space = match comps {
        1 => ffi::J_COLOR_SPACE::JCS_GRAYSCALE,
        3 => ffi::J_COLOR_SPACE::JCS_RGB,
        4 => ffi::J_COLOR_SPACE::JCS_CMYK,
        n => {
            return Err(PrepError::UnsupportedPixelLayout(format!(
                "JPEG with {n} components"
            )))
        }
    };
    // libjpeg's defaults, stated: what Pillow decodes with outside draft mode.
    s.cinfo.dct_method = ffi::J_DCT_METHOD::JDCT_ISLOW;
    s.cinfo.do_fancy_upsampling = 1;
    s.cinfo.do_block_smoothing = 1;
    s.cinfo.buffered_image = 0;
    s.cinfo.raw_data_out = 0;
    s.cinfo.scale_num = 1;
    s.cinfo.scale_denom = 1;
    // SAFETY: the decompressor was created and its header read by `open`.
    unsafe { ffi::jpeg_start_decompress(&mut s.cinfo) };
    let out_comps = s.cinfo.output_components as usize;
    if (s.cinfo.output_width, s.cinfo.output_height) != (width, height)
        || out_comps != comps as usize
    {
        return Err(PrepError::Decode {
            format: "jpeg".into(),
            reason: format!(
                "decoder output {}x{}x{} for a {width}x{height}x{comps} header",
                s.cinfo.output_width, s.cinfo.output_height, out_comps
            ),
        });
    }
    if first > 0 {
        // One iMCU row above the band is decoded and discarded: the upsampler's context.
        let imcu = 8 * usize::try_from(s.cinfo.max_v_samp_factor).unwrap_or(1);
        let lead = first.saturating_sub(imcu);
        if lead > 0 {
            // SAFETY: started decompressor; `lead < height`. The source only suspends after
            // the last scanline, which a skip inside the image never reaches.
            let skipped = unsafe { ffi::jpeg_skip_scanlines(&mut s.cinfo, lead as u32) };
            if skipped as usize != lead {
                return Err(PrepError::Decode {
                    format: "jpeg".into(),
                    reason: format!("decoder skipped {skipped} of {lead} lines"),
                });
            }
        }
        let mut discard = vec![0u8; w * out_comps];
        while (s.cinfo.output_scanline as usize) < first {
            let mut ptr = [discard.as_mut_ptr()];
            // SAFETY: one row of `w·out_comps` bytes.
            let got = unsafe { ffi::jpeg_read_scanlines(&mut s.cinfo, ptr.as_mut_ptr(), 1) };
            if got != 1 {
                return Err(PrepError::Decode {
                    format: "jpeg".into(),
                    reason: format!("decoder stopped at line {}", s.cinfo.output_scanline),
                });
            }
        }
    }
    Ok(out_comps)
}

/// Ends the decode on session `s` after its rows were read: the band that ends at the last row
/// (`last`) reads on to EOI as Pillow does (an error there fails the image, running out of data
/// does not).
fn finish_rows(s: &mut Session, last: bool) {
    if last {
        s.src.finishing = true;
        // SAFETY: every scanline was read.
        unsafe { ffi::jpeg_finish_decompress(&mut s.cinfo) };
    }
}

/// Reads output rows `rows` (the decompressor's next ones) into `out`, converting grey and
/// inverted CMYK to RGB as Pillow does.
fn read_rows(
    s: &mut Session,
    w: usize,
    rows: std::ops::Range<usize>,
    out_comps: usize,
    out: &mut [u8],
) -> Result<()> {
    if out.len() != rows.len() * w * 3 {
        return Err(PrepError::BadSetting(format!(
            "JPEG rows {rows:?} into {} bytes at width {w}",
            out.len()
        )));
    }
    // Rows per call: libjpeg hands out at most `rec_outbuf_height` (1..4) at a time anyway.
    const BATCH: usize = 4;
    let mut scratch = if out_comps == 3 {
        Vec::new()
    } else {
        vec![0u8; BATCH * w * out_comps]
    };
    // libjpeg writes RGB rows straight into `out`, other layouts into `scratch`. Each base
    // pointer is taken once (`as_mut_ptr` creates no reference) and every row pointer is derived
    // from it: a fresh `&mut out[..]` per row would invalidate the rows before it under Stacked
    // Borrows. In the RGB case nothing else touches `out` until the loop ends; otherwise `base`
    // points into `scratch`, which is only read (a shared slice) between calls, and `out` is
    // written through slices.
    let (base, stride, per_batch) = if out_comps == 3 {
        (out.as_mut_ptr(), w * 3, true)
    } else {
        (scratch.as_mut_ptr(), w * out_comps, false)
    };
    while (s.cinfo.output_scanline as usize) < rows.end {
        let y = s.cinfo.output_scanline as usize - rows.start;
        let n = BATCH.min(rows.end - rows.start - y);
        let first = if per_batch { y } else { 0 };
        let mut ptrs = [std::ptr::null_mut::<u8>(); BATCH];
        for (k, p) in ptrs.iter_mut().enumerate().take(n) {
            // SAFETY: in bounds: row `first + k` < rows.len() of `out` (rows.len()·w·3 bytes),
            // or < BATCH of `scratch`.
            *p = unsafe { base.add((first + k) * stride) };
        }
        // SAFETY: started decompressor; `n` row pointers into buffers of `stride` bytes each.
        let got =
            unsafe { ffi::jpeg_read_scanlines(&mut s.cinfo, ptrs.as_mut_ptr(), n as u32) } as usize;
        if got == 0 || got > n {
            return Err(PrepError::Decode {
                format: "jpeg".into(),
                reason: format!(
                    "decoder stopped at line {} of {}",
                    rows.start + y,
                    s.cinfo.output_height
                ),
            });
        }
        if out_comps != 3 {
            let dst = &mut out[y * w * 3..(y + got) * w * 3];
            let src = &scratch[..got * w * out_comps];
            if out_comps == 1 {
                for (d, &v) in dst.chunks_exact_mut(3).zip(src) {
                    d.fill(v);
                }
            } else {
                for (d, p) in dst.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                    inverted_cmyk_to_rgb(p, d);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn header_refusals_follow_pillow() {
        // SOI, SOF0 with 12-bit samples.
        let twelve = [
            0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x0B, 12, 0, 8, 0, 8, 1, 1, 0x11, 0,
        ];
        assert!(matches!(
            read_header(&twelve),
            Err(PrepError::Decode { .. })
        ));
        let two_layers = [
            0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x0E, 8, 0, 8, 0, 8, 2, 1, 0x11, 0, 2, 0x11, 0,
        ];
        assert!(matches!(
            read_header(&two_layers),
            Err(PrepError::Decode { .. })
        ));
        let ok = [
            0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0, 0, 0xFF, 0xFF, 0xC2, 0x00, 0x0B, 8, 0, 7, 1, 44,
            1, 1, 0x11, 0,
        ];
        assert_eq!(
            read_header(&ok).ok(),
            Some(JpegHeader {
                width: 300,
                height: 7,
                components: 1
            })
        );
        assert!(read_header(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]).is_err());
        assert!(read_header(&[0xFF, 0xD8, 0xFF, 0xE1, 0xFF]).is_err());
    }

    /// Bands are cut at iMCU rows, in order, none shorter than the minimum, longer first.
    #[test]
    fn band_cuts_cover_the_rows_at_imcu_rows() {
        for (h, imcu, bands) in [
            (1080, 16, 2),
            (1080, 16, 8),
            (896, 8, 16),
            (1000, 16, 64),
            (70, 16, 8),
        ] {
            let cuts = band_cuts(h, imcu, bands, ENTROPY_SHARE);
            assert_eq!((cuts[0], cuts[cuts.len() - 1]), (0, h), "{cuts:?}");
            assert!(cuts.len() - 1 <= bands, "{cuts:?}");
            for pair in cuts.windows(2) {
                assert!(pair[1] >= pair[0] + imcu * BAND_MIN_IMCU_ROWS || cuts.len() == 2);
            }
            assert!(
                cuts[1..cuts.len() - 1].iter().all(|c| c % imcu == 0),
                "{cuts:?}"
            );
            let lens: Vec<usize> = cuts.windows(2).map(|p| p[1] - p[0]).collect();
            assert!(
                lens[..lens.len() - 1]
                    .windows(2)
                    .all(|l| l[0] + imcu >= l[1]),
                "{lens:?}"
            );
        }
        assert_eq!(band_cuts(1080, 16, 1, ENTROPY_SHARE), vec![0, 1080]);
        assert!(band_cuts(1080, 16, 4, ENTROPY_SHARE).len() == 5);
    }

    /// Every JPEG of the Pillow corpus (`fixtures/prep/jpeg`) and of the fixture images, sorted.
    pub(crate) fn fixture_jpegs() -> Vec<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files: Vec<std::path::PathBuf> = Vec::new();
        for dir in [
            root.join("fixtures/prep/jpeg"),
            root.join("fixtures/images"),
        ] {
            for e in std::fs::read_dir(&dir).expect("fixture dir") {
                let p = e.expect("entry").path();
                if p.extension().is_some_and(|x| x == "jpg" || x == "jpeg") {
                    files.push(p);
                }
            }
        }
        files.sort();
        files
    }

    /// Every JPEG of the Pillow corpus and of the fixture images, decoded in bands of one iMCU
    /// row each (every band boundary a skip, the most boundaries there can be) and in a few bands,
    /// gives the whole decode's bytes; multi-scan files are not banded at all.
    #[test]
    fn banded_decodes_equal_the_whole_decode() {
        let files = fixture_jpegs();
        let none = crate::pages::Scratch::none();
        let (mut banded, mut multi) = (0, 0);
        for f in &files {
            let bytes = std::fs::read(f).expect("read");
            let hd = read_header(&bytes).expect("header");
            let (w, h) = (hd.width, hd.height);
            let whole = decode_banded(&bytes, w, h, 64 << 20, none, 1).expect("whole decode");
            let Some(imcu) = with_session(|s| probe(s, &bytes, w, h, 64 << 20)).expect("probe")
            else {
                multi += 1;
                continue;
            };
            let every: Vec<usize> = (0..h as usize).step_by(imcu).chain([h as usize]).collect();
            for cuts in [every, band_cuts(h as usize, imcu, 3, ENTROPY_SHARE)] {
                let got = decode_cuts(&bytes, w, h, 64 << 20, none, &cuts).expect("banded");
                assert!(got == whole.data, "{}: bands {cuts:?}", f.display());
            }
            banded += 1;
        }
        eprintln!("banded jpeg decode: {banded} single-scan files exact, {multi} multi-scan");
        assert!(banded >= 50 && multi >= 5, "{banded} {multi}");
    }

    /// A synthetic JPEG from libjpeg-turbo's own encoder (mozjpeg at its `JCP_FASTEST` profile,
    /// libjpeg-turbo's defaults), quality 90: `w × h` gradients with xorshift noise, RGB with the
    /// luma sampled `samp` = (h, v) times the chroma ((2, 2) 4:2:0, (2, 1) 4:2:2, (1, 1) 4:4:4),
    /// or grey; baseline, or progressive (`jpeg_simple_progression`).
    pub(crate) fn encode(
        w: usize,
        h: usize,
        grey: bool,
        samp: (i32, i32),
        progressive: bool,
    ) -> Vec<u8> {
        let comps = if grey { 1 } else { 3 };
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w * 7919 + h) as u64;
        let pixels: Vec<u8> = (0..w * h * comps)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (px, py, c) = ((i / comps) % w, (i / comps) / w, i % comps);
                let smooth = (px * 255 / w + py * 255 / h + c * 85) as u64;
                ((smooth + (x >> 60)) % 256) as u8
            })
            .collect();
        // SAFETY: the compressor and its error manager live on this frame for the whole
        // compression; the error manager unwinds (never returns) on an error, which would end
        // the test; each row pointer covers `w·comps` bytes of `pixels`; the output buffer is
        // libjpeg's malloc, read once and freed here.
        unsafe {
            let mut err: ffi::jpeg_error_mgr = std::mem::zeroed();
            let mut c: ffi::jpeg_compress_struct = std::mem::zeroed();
            let e = ffi::jpeg_std_error(&mut err);
            e.error_exit = Some(error_exit);
            c.common.err = e;
            ffi::jpeg_create_compress(&mut c);
            let mut buf: *mut u8 = std::ptr::null_mut();
            let mut size: std::os::raw::c_ulong = 0;
            ffi::jpeg_mem_dest(&mut c, &mut buf, &mut size);
            c.image_width = w as u32;
            c.image_height = h as u32;
            c.input_components = comps as c_int;
            c.in_color_space = if grey {
                ffi::J_COLOR_SPACE::JCS_GRAYSCALE
            } else {
                ffi::J_COLOR_SPACE::JCS_RGB
            };
            ffi::jpeg_c_set_int_param(
                &mut c,
                ffi::J_INT_PARAM::JINT_COMPRESS_PROFILE,
                ffi::JCP_FASTEST as c_int,
            );
            ffi::jpeg_set_defaults(&mut c);
            ffi::jpeg_set_quality(&mut c, 90, 1);
            if !grey {
                let ci = std::slice::from_raw_parts_mut(c.comp_info, 3);
                (ci[0].h_samp_factor, ci[0].v_samp_factor) = samp;
                for k in &mut ci[1..] {
                    (k.h_samp_factor, k.v_samp_factor) = (1, 1);
                }
            }
            if progressive {
                ffi::jpeg_simple_progression(&mut c);
            }
            ffi::jpeg_start_compress(&mut c, 1);
            while (c.next_scanline as usize) < h {
                let row = [pixels[c.next_scanline as usize * w * comps..].as_ptr()];
                ffi::jpeg_write_scanlines(&mut c, row.as_ptr(), 1);
            }
            ffi::jpeg_finish_compress(&mut c);
            let out = std::slice::from_raw_parts(buf, size as usize).to_vec();
            ffi::jpeg_destroy_compress(&mut c);
            libc::free(buf.cast());
            out
        }
    }

    /// Today's way: the whole decode in `cuts`, then `resize_rgb_in`.
    fn decode_then_resize(bytes: &[u8], cuts: Option<&[usize]>, out: (usize, usize)) -> Vec<u8> {
        let hd = read_header(bytes).expect("header");
        let (w, h) = (hd.width as usize, hd.height as usize);
        let none = crate::pages::Scratch::none();
        let rgb = match cuts {
            Some(cuts) => decode_cuts(bytes, hd.width, hd.height, 64 << 20, none, cuts),
            None => decode_banded(bytes, hd.width, hd.height, 64 << 20, none, 1).map(|i| i.data),
        }
        .expect("decode");
        resize_rgb_in(&rgb, w, h, out.0, out.1, Filter::Bicubic, false, none)
    }

    /// Output sizes for a `w × h` source: down and up in both axes, one axis only, and the
    /// gemma4-like 2/3 downscale.
    fn out_sizes(w: usize, h: usize) -> [(usize, usize); 6] {
        [
            // The identity (glm5_next's content at the source's size): the decode itself.
            (w, h),
            (w * 2 / 3, h * 2 / 3),
            (w + 37, h * 5 / 4),
            ((w / 2).max(1), h),
            (w, (h / 2).max(1)),
            (w * 3 / 5 + 1, h + 9),
        ]
    }

    /// The decode that resizes its bands while it decodes gives the bytes of the decode, then
    /// the resize: on every single-scan JPEG of the Pillow corpus and the fixture images, in
    /// bands of one iMCU row each and in 3 bands (the overlapped path forced on small files), and
    /// through `decode_resized` itself (small files: the fallback), up and down in each axis.
    #[test]
    fn decode_resized_equals_decode_then_resize_on_the_fixtures() {
        let files = fixture_jpegs();
        let none = crate::pages::Scratch::none();
        let mut overlapped = 0;
        for f in &files {
            let bytes = std::fs::read(f).expect("read");
            let hd = read_header(&bytes).expect("header");
            let (w, h) = (hd.width as usize, hd.height as usize);
            let imcu =
                with_session(|s| probe(s, &bytes, hd.width, hd.height, 64 << 20)).expect("probe");
            for out in out_sizes(w, h) {
                if out.0 == 0 || out.1 == 0 {
                    continue;
                }
                let want = decode_then_resize(&bytes, None, out);
                for bands in [1, 6] {
                    let got = decode_resized(
                        &bytes,
                        hd.width,
                        hd.height,
                        64 << 20,
                        none,
                        bands,
                        out,
                        Filter::Bicubic,
                        bands > 1,
                    )
                    .expect("decode_resized");
                    assert!(got.data == want, "{}: {out:?} bands {bands}", f.display());
                }
                let (Some(imcu), Some(plan)) = (
                    imcu,
                    RgbWidthResize::new(w, h, out.0, out.1, Filter::Bicubic),
                ) else {
                    continue;
                };
                let every: Vec<usize> = (0..h).step_by(imcu).chain([h]).collect();
                for cuts in [every, band_cuts(h, imcu, 3, ENTROPY_SHARE)] {
                    let got = decode_cuts_resized(
                        &bytes,
                        hd.width,
                        hd.height,
                        64 << 20,
                        none,
                        &cuts,
                        &plan,
                        true,
                    )
                    .expect("overlapped");
                    assert!(got == want, "{}: {out:?} cuts {cuts:?}", f.display());
                    overlapped += 1;
                }
            }
        }
        eprintln!("decode_resized: {overlapped} overlapped decodes of the fixtures exact");
        assert!(overlapped >= 300, "{overlapped}");
    }

    /// The same on synthetic JPEGs past [`BAND_MIN_PIXELS`] (so `decode_resized` bands them
    /// itself): 4:2:0, 4:2:2, 4:4:4 and grey, odd sizes, one just above the minimum, one just
    /// below and a progressive one (both decoded whole, then resized), at 1, 2, 6 and 16 bands.
    #[test]
    fn decode_resized_equals_decode_then_resize_on_synthetic_jpegs() {
        let none = crate::pages::Scratch::none();
        let cases = [
            (
                "4:2:0, odd, just above the minimum",
                1029,
                1021,
                false,
                (2, 2),
                false,
            ),
            ("4:2:2", 1200, 901, false, (2, 1), false),
            ("4:4:4, odd", 1111, 999, false, (1, 1), false),
            ("grey", 1025, 1025, true, (1, 1), false),
            (
                "4:2:0, just below the minimum",
                1023,
                1023,
                false,
                (2, 2),
                false,
            ),
            ("4:2:0, progressive", 1100, 1000, false, (2, 2), true),
        ];
        for (name, w, h, grey, samp, progressive) in cases {
            let bytes = encode(w, h, grey, samp, progressive);
            let banded = (w * h) as u64 >= BAND_MIN_PIXELS && !progressive;
            let cuts = cuts_for(&bytes, w as u32, h as u32, 64 << 20, 6).expect("cuts");
            assert_eq!(cuts.len() > 2, banded, "{name}: {cuts:?}");
            for out in out_sizes(w, h) {
                let want = decode_then_resize(&bytes, None, out);
                for bands in [1, 2, 6, 16] {
                    let got = decode_resized(
                        &bytes,
                        w as u32,
                        h as u32,
                        64 << 20,
                        none,
                        bands,
                        out,
                        Filter::Bicubic,
                        true,
                    )
                    .expect("decode_resized");
                    assert!(got.data == want, "{name}: {out:?} bands {bands}");
                    assert_eq!((got.width, got.height), out);
                }
            }
        }
    }

    /// A truncated large JPEG fails the same way whether it is decoded then resized or resized
    /// while it decodes (the first error in row order), at any band count.
    #[test]
    fn decode_resized_reports_the_whole_decodes_error() {
        let none = crate::pages::Scratch::none();
        let bytes = encode(1200, 1000, false, (2, 2), false);
        for keep in [bytes.len() / 3, bytes.len() * 2 / 3, bytes.len() - 10] {
            let cut = &bytes[..keep];
            for bands in [1, 2, 6, 16] {
                let want = decode_banded(cut, 1200, 1000, 64 << 20, none, bands)
                    .map(|i| i.data.len())
                    .map_err(|e| e.to_string());
                let got = decode_resized(
                    cut,
                    1200,
                    1000,
                    64 << 20,
                    none,
                    bands,
                    (800, 666),
                    Filter::Bicubic,
                    true,
                )
                .map(|i| i.data.len())
                .map_err(|e| e.to_string());
                assert!(want.is_err(), "{keep} bytes decoded");
                assert_eq!(
                    got.map(|_| ()),
                    want.map(|_| ()),
                    "{keep} bytes, bands {bands}"
                );
            }
        }
    }

    /// Hostile bytes inside the entropy-coded data (runs of flipped bits: libjpeg's corrupt-data
    /// warnings, a marker in the middle of a scan, an early EOI, the file cut short) give the overlapped decode
    /// the answer of the whole decode then the resize: the same bytes, or the same error, at
    /// every band count.
    /// A decode that resizes, repeated on one file with its buffers kept, reuses them as they are:
    /// the decoded image's buffer is kept only after the resized image took its own, so the next
    /// decode does not find it shortened (a serial fill of 4.4 MB before each 1080p decode for
    /// gemma4, seen 2026-12-07), on libjpeg's bands and on our own decode.
    #[test]
    fn repeated_decode_resized_reuses_its_buffers_unlengthened() {
        let bytes = encode(1200, 1000, false, (2, 2), false);
        for bands in [1, 6, 16] {
            let scratch = crate::pages::Scratch::new(256 << 20);
            for round in 0..4 {
                let before = scratch.lengthened();
                let got = decode_resized(
                    &bytes,
                    1200,
                    1000,
                    64 << 20,
                    &scratch,
                    bands,
                    (600, 500),
                    Filter::Bicubic,
                    true,
                )
                .expect("decode_resized");
                // As `Preprocessor::prepare` does once the tensors are made.
                scratch.give(got.data);
                if round > 0 {
                    assert_eq!(scratch.lengthened(), before, "bands {bands} round {round}");
                }
            }
        }
    }

    #[test]
    fn decode_resized_equals_decode_then_resize_on_corrupted_scans() {
        let none = crate::pages::Scratch::none();
        let good = encode(1200, 1000, false, (2, 2), false);
        // The scan data starts after the SOS segment; corrupt from a tenth of the way in.
        let sos = good
            .windows(2)
            .position(|w| w == [0xFF, 0xDA])
            .expect("SOS");
        let body = sos + 16;
        let (mut cases, mut outcomes) = (0, [0usize; 2]);
        for (k, at) in [0.1f64, 0.35, 0.6, 0.85, 0.97].iter().enumerate() {
            let pos = body + ((good.len() - 2 - body) as f64 * at) as usize;
            for (how, patch) in [
                (
                    "flipped",
                    vec![0x5A ^ good[pos], 0xA5 ^ good[pos + 1], 0x3C],
                ),
                ("RST out of order", vec![0xFF, 0xD3 + (k as u8 % 4)]),
                ("EOI early", vec![0xFF, 0xD9]),
                ("zeros", vec![0; 64]),
                ("cut here", Vec::new()),
            ] {
                let mut bad = good.clone();
                if patch.is_empty() {
                    bad.truncate(pos);
                } else {
                    let end = (pos + patch.len()).min(bad.len() - 2);
                    bad[pos..end].copy_from_slice(&patch[..end - pos]);
                }
                let whole = decode_banded(&bad, 1200, 1000, 64 << 20, none, 1)
                    .map(|i| {
                        resize_rgb_in(&i.data, 1200, 1000, 800, 666, Filter::Bicubic, false, none)
                    })
                    .map_err(|e| e.to_string());
                for bands in [1, 2, 6, 16] {
                    let got = decode_resized(
                        &bad,
                        1200,
                        1000,
                        64 << 20,
                        none,
                        bands,
                        (800, 666),
                        Filter::Bicubic,
                        true,
                    )
                    .map(|i| i.data)
                    .map_err(|e| e.to_string());
                    assert!(got == whole, "{how} at {at}: bands {bands}");
                    cases += 1;
                }
                outcomes[usize::from(whole.is_ok())] += 1;
            }
        }
        eprintln!(
            "corrupted scans: {} decoded, {} refused",
            outcomes[1], outcomes[0]
        );
        assert_eq!(cases, 100);
        // Both answers occur: the decoded ones compare pixels, the refused ones errors.
        assert!(outcomes[0] >= 2 && outcomes[1] >= 2, "{outcomes:?}");
    }

    /// Our own decode (the entropy decode over the pool, the rows reconstructed in chunks) gives
    /// libjpeg's bytes on every fixture JPEG and on synthetic files of every sampling we take,
    /// at odd sizes, and it takes (does not decline) the baseline ones.
    #[test]
    fn own_decode_equals_libjpeg() {
        let none = crate::pages::Scratch::none();
        let mut files: Vec<(String, Vec<u8>)> = fixture_jpegs()
            .into_iter()
            .map(|p| (p.display().to_string(), std::fs::read(&p).expect("fixture")))
            .collect();
        for (w, h) in [
            (1, 1),
            (9, 7),
            (33, 17),
            (250, 131),
            (641, 479),
            (1920, 1080),
        ] {
            for samp in [(1, 1), (2, 1), (1, 2), (2, 2)] {
                files.push((
                    format!("{w}x{h} {samp:?}"),
                    encode(w, h, false, samp, false),
                ));
            }
            files.push((format!("{w}x{h} grey"), encode(w, h, true, (1, 1), false)));
        }
        let (mut taken, mut baseline) = (0, 0);
        for (name, bytes) in &files {
            let Ok(header) = read_header(bytes) else {
                continue;
            };
            let (w, h) = (header.width, header.height);
            let Ok(whole) = decode_banded(bytes, w, h, u64::MAX, none, 1) else {
                continue;
            };
            let single = with_session(|s| probe(s, bytes, w, h, u64::MAX))
                .ok()
                .flatten();
            baseline += usize::from(single.is_some());
            for threads in [1, 3, 16] {
                let Some((frame, coefs)) =
                    own_coefficients_of_any_size(bytes, w, h, u64::MAX, threads)
                else {
                    continue;
                };
                let rgb = own_rows(&frame, &coefs, none).expect("reconstruction declined");
                assert!(rgb == whole.data, "{name}: {threads} threads");
                taken += usize::from(threads == 1);
            }
        }
        eprintln!("own decode: {taken} of {baseline} single-scan files taken");
        // Every synthetic file is baseline 4:4:4 / 4:2:2 / 4:4:0 / 4:2:0 or grey.
        assert!(
            taken >= 30,
            "only {taken} of {baseline} single-scan files taken"
        );
    }

    /// `Preprocessor::prepare` (which resizes a large JPEG while it decodes, for gemma4, glm46v
    /// and glm5_next) gives the tensors of `prepare_rgb` on the decoded image, on the pool and not.
    #[test]
    fn prepare_of_a_large_jpeg_equals_prepare_rgb_of_its_decode() {
        use crate::{law, Family, ImageSource, Law, ModelConfigs, PrepSettings, Preprocessor};
        let bytes = encode(1920, 1080, false, (2, 2), false);
        for (law, family) in [
            (Law::Gemma4(law::Gemma4Law::default()), Family::Gemma4),
            (Law::Glm46V(law::Glm46VLaw::default()), Family::GlmOcr),
            (Law::Glm5Next(law::Glm5NextLaw::default()), Family::Glm5Next),
        ] {
            for parallel in [false, true] {
                let settings = PrepSettings {
                    parallel,
                    ..Default::default()
                };
                let tokens = crate::config::tokens_for(&law, &ModelConfigs::default());
                let pre = Preprocessor::from_law(law.clone(), tokens, family, settings);
                let rgb = pre.decode(ImageSource::Bytes(&bytes)).expect("decode");
                let want = pre.prepare_rgb(&rgb).expect("prepare_rgb");
                let got = pre.prepare(ImageSource::Bytes(&bytes)).expect("prepare");
                assert!(got == want, "{family:?} parallel={parallel}");
            }
        }
    }

    /// `prep_jpeg.py` checksum: Σ byte_i·(i mod 65521 + 1), wrapping u64.
    fn checksum(data: &[u8]) -> u64 {
        data.iter().enumerate().fold(0u64, |acc, (i, &v)| {
            acc.wrapping_add(u64::from(v).wrapping_mul((i % 65521) as u64 + 1))
        })
    }

    /// Bound: EXACT against `convert_to_rgb(PIL.Image.open(f))` (Pillow 13.0.0, libjpeg-turbo 3.2.0)
    /// on the `prep_jpeg.py` corpus: 4:4:4 / 4:2:2 / 4:2:0, baseline and progressive, L and CMYK,
    /// 1×1 to 95×64, qualities 10..100, restart markers, optimised and custom tables.
    #[test]
    fn corpus_matches_pillow_exactly() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prep/jpeg");
        let text = std::fs::read_to_string(dir.join("cases.json")).expect("cases.json");
        let table: serde_json::Value = serde_json::from_str(&text).expect("json");
        let mut bad = Vec::new();
        let cases = table["cases"].as_array().expect("cases");
        for case in cases {
            let file = case["file"].as_str().expect("file");
            let bytes = std::fs::read(dir.join(file)).expect("read");
            let size = |k: &str| case[k].as_u64().expect("size") as u32;
            let want: u64 = case["checksum"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .expect("checksum");
            let header = read_header(&bytes).expect("header");
            assert_eq!(
                (header.width, header.height),
                (size("width"), size("height")),
                "{file}"
            );
            match decode_banded(
                &bytes,
                header.width,
                header.height,
                64 << 20,
                crate::pages::Scratch::none(),
                1,
            ) {
                Ok(img) if checksum(&img.data) == want => {}
                Ok(_) => bad.push(format!("{file}: RGB differs from Pillow")),
                Err(e) => bad.push(format!("{file}: {e}")),
            }
        }
        eprintln!(
            "jpeg corpus: {} of {} files exact",
            cases.len() - bad.len(),
            cases.len()
        );
        assert!(cases.len() >= 100 && bad.is_empty(), "{bad:#?}");
    }
}
