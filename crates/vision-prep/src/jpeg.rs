//! JPEG header and decode, bit-identical to what `convert_to_rgb(PIL.Image.open(f))` sees.
//!
//! Pillow decodes JPEG with libjpeg-turbo at its defaults (ISLOW integer IDCT, fancy upsampling,
//! block smoothing on, its YCbCr→RGB tables) and asks for `L`, `RGB` or inverted CMYK (`CMYK;I`,
//! Pillow JpegImagePlugin.py "assume adobe conventions"), which `convert("RGB")` then turns into RGB
//! (Pillow src/libImaging/Convert.c `cmyk2rgb`). We run the same library: `mozjpeg-sys` builds
//! libjpeg-turbo's decoder (the mozjpeg fork, whose decoding side is libjpeg-turbo's) from vendored C
//! with only a C compiler. Its SIMD paths are not built (they need nasm); libjpeg-turbo's SIMD is
//! bit-exact with its C code, so the output is the same bytes as Pillow's.
//!
//! Errors: libjpeg reports a fatal error through `error_exit`, which must not return. Ours unwinds
//! (`resume_unwind`, no panic hook, no message) through the C frames, which `mozjpeg-sys` compiles
//! with `-fexceptions` for exactly this, to the `catch_unwind` in [`decode`], which turns it into
//! [`PrepError::Decode`]. The decoder object is destroyed on every path. (A build with
//! `panic = "abort"` would abort on a corrupt JPEG instead; the workspace builds with unwinding.)

use std::os::raw::{c_int, c_long};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use mozjpeg_sys as ffi;

use crate::error::{PrepError, Result};
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

/// A libjpeg fatal error on its way from `error_exit` (or our source manager) to [`decode`].
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

/// Decode a JPEG whose header admitted `width × height` into RGB as Pillow + `convert_to_rgb` do.
/// `max_memory` caps libjpeg's large buffers (the coefficient store of progressive files).
/// The RGB buffer comes from `scratch` (every byte is written).
pub(crate) fn decode(
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    scratch: &crate::pages::Scratch,
) -> Result<RgbImage> {
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
    let run = catch_unwind(AssertUnwindSafe(|| {
        decode_in(&mut session, bytes, width, height, max_memory, scratch)
    }));
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

fn decode_in(
    s: &mut Session,
    bytes: &[u8],
    width: u32,
    height: u32,
    max_memory: u64,
    scratch: &crate::pages::Scratch,
) -> Result<RgbImage> {
    let (w, h) = (width as usize, height as usize);
    // SAFETY (whole function): every libjpeg call gets the decompressor created here, whose error
    // manager, source and progress monitor live in the same boxed `Session` and outlive it; the
    // input slice outlives the session (dropped in `decode` before returning); scanline pointers
    // point into buffers sized for the rows and widths libjpeg reports, checked below.
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
        if (s.cinfo.image_width, s.cinfo.image_height) != (width, height) {
            return Err(PrepError::DimensionMismatch {
                width,
                height,
                got_width: s.cinfo.image_width,
                got_height: s.cinfo.image_height,
            });
        }
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
        ffi::jpeg_start_decompress(&mut s.cinfo);
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

        let mut data = scratch.take(w * h * 3);
        // Rows per call: libjpeg hands out at most `rec_outbuf_height` (1..4) at a time anyway.
        const BATCH: usize = 4;
        let mut scratch = if out_comps == 3 {
            Vec::new()
        } else {
            vec![0u8; BATCH * w * out_comps]
        };
        // libjpeg writes RGB rows straight into `data`, other layouts into `scratch`. Each base
        // pointer is taken once (`Vec::as_mut_ptr` creates no reference) and every row pointer is
        // derived from it: a fresh `&mut data[..]` per row would invalidate the rows before it
        // under Stacked Borrows. In the RGB case nothing else touches `data` until the loop
        // ends; otherwise `base` points into `scratch`, which is only read (a shared slice)
        // between calls, and `data` is written through slices.
        let (base, stride, per_batch) = if out_comps == 3 {
            (data.as_mut_ptr(), w * 3, true)
        } else {
            (scratch.as_mut_ptr(), w * out_comps, false)
        };
        while (s.cinfo.output_scanline as usize) < h {
            let y = s.cinfo.output_scanline as usize;
            let rows = BATCH.min(h - y);
            let first = if per_batch { y } else { 0 };
            let mut ptrs = [std::ptr::null_mut::<u8>(); BATCH];
            for (k, p) in ptrs.iter_mut().enumerate().take(rows) {
                // In bounds: row `first + k` < h of `data` (h·w·3 bytes), or < BATCH of `scratch`.
                *p = base.add((first + k) * stride);
            }
            let got =
                ffi::jpeg_read_scanlines(&mut s.cinfo, ptrs.as_mut_ptr(), rows as u32) as usize;
            if got == 0 || got > rows {
                return Err(PrepError::Decode {
                    format: "jpeg".into(),
                    reason: format!("decoder stopped at line {y} of {h}"),
                });
            }
            if out_comps != 3 {
                let dst = &mut data[y * w * 3..(y + got) * w * 3];
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
        // Read to EOI as Pillow does: an error there fails the image, running out of data does not.
        s.src.finishing = true;
        ffi::jpeg_finish_decompress(&mut s.cinfo);
        Ok(RgbImage {
            width: w,
            height: h,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
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
            match decode(
                &bytes,
                header.width,
                header.height,
                64 << 20,
                crate::pages::Scratch::none(),
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
