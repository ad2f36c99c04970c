//! Images in, rows out: into rows the library allocates, a caller's host buffer, or a caller's
//! CUDA buffer on a caller's stream.

use vision_towers::vision_prep::{ImageSource, Plan, PrepError};
use vision_towers::{Device, DeviceOut, Model, ModelError, RowsDtype};

use crate::error::{guard, guard_value, vt_status, Failure};
use crate::ffi::{check_extent, need_out, slice, slice_mut, write_opt};
use crate::model::{model_arg, vt_model};

/// What a [`vt_image`]'s bytes are.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum vt_image_kind {
    /// An image file's bytes (JPEG, PNG, WebP, GIF, BMP; the format is sniffed from them).
    VT_IMAGE_BYTES = 0,
    /// A `data:[<mime>];base64,<payload>` URI (UTF-8, not NUL-terminated: `len` bytes). Any
    /// other scheme (`http:`, `file:`, …) is refused: the library never fetches.
    VT_IMAGE_DATA_URI = 1,
}

/// One image: `len` bytes at `data`, read only during the call. A zeroed struct plus `data`
/// and `len` is an image file's bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct vt_image {
    /// The bytes (NULL only with `len == 0`).
    pub data: *const u8,
    /// How many.
    pub len: usize,
    /// A `vt_image_kind`: `VT_IMAGE_BYTES` (0) or `VT_IMAGE_DATA_URI`.
    pub kind: u32,
}

/// The element type of rows written to a device buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum vt_dtype {
    /// 32-bit floats (4 bytes per element).
    VT_DTYPE_F32 = 0,
    /// bfloat16 (2 bytes per element, little-endian; needs a bf16 model).
    VT_DTYPE_BF16 = 1,
    /// float16, IEEE half (2 bytes per element, little-endian; needs an f16 model).
    VT_DTYPE_F16 = 2,
}

/// The image source of `img`, the `index`-th of the call.
///
/// # Safety
/// `img.data` is NULL or points at `img.len` bytes alive for `'a`.
pub(crate) unsafe fn image_source<'a>(
    img: &vt_image,
    index: usize,
) -> Result<ImageSource<'a>, Failure> {
    let what = format!("images[{index}].data");
    // SAFETY: the caller's contract.
    let bytes = unsafe { slice(img.data, img.len, &what) }?;
    let refuse = |source| Failure::from(ModelError::Image { index, source });
    match img.kind {
        0 => Ok(ImageSource::Bytes(bytes)),
        1 => {
            let text = std::str::from_utf8(bytes)
                .map_err(|_| refuse(PrepError::BadDataUri("the URI is not valid UTF-8".into())))?;
            ImageSource::parse_uri(text).map_err(refuse)
        }
        k => Err(Failure::invalid(format!(
            "images[{index}].kind: {k} is not a vt_image_kind (0 or 1)"
        ))),
    }
}

/// The sources of `n` images at `images`.
///
/// # Safety
/// `images` is NULL or points at `n` `vt_image`s whose bytes live for `'a`.
pub(crate) unsafe fn sources<'a>(
    images: *const vt_image,
    n: usize,
) -> Result<Vec<ImageSource<'a>>, Failure> {
    if n == 0 {
        return Err(Failure::invalid("no images (n_images is 0)"));
    }
    // SAFETY: the caller's contract.
    let images = unsafe { slice(images, n, "images") }?;
    images
        .iter()
        .enumerate()
        // SAFETY: the caller's contract on every image's bytes.
        .map(|(i, img)| unsafe { image_source(img, i) })
        .collect()
}

/// The caller's row-offset array (`len` entries, or NULL) after checking it and the `needed`
/// out-param.
///
/// # Safety
/// `row_offsets` is NULL or `len` writable `size_t`s for `'a`.
pub(crate) unsafe fn offsets_arg<'a>(
    row_offsets: *mut usize,
    len: usize,
    needed: *mut usize,
) -> Result<Option<&'a mut [usize]>, Failure> {
    if !needed.is_null() {
        need_out(needed, "needed")?;
    }
    if row_offsets.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's contract.
    Ok(Some(unsafe { slice_mut(row_offsets, len, "row_offsets") }?))
}

/// Every image's plan from its header (refusals name their image), the total rows and the
/// elements they take at the model's width.
fn plan_all(m: &Model, sources: &[ImageSource<'_>]) -> Result<(Vec<Plan>, usize), Failure> {
    let plans = sources
        .iter()
        .enumerate()
        .map(|(index, s)| {
            m.preprocessor()
                .plan(*s)
                .map_err(|source| Failure::from(ModelError::Image { index, source }))
        })
        .collect::<Result<Vec<Plan>, Failure>>()?;
    let rows = plans
        .iter()
        .try_fold(0usize, |a, p| a.checked_add(usize::try_from(p.rows).ok()?))
        .ok_or_else(|| Failure::invalid("the images' rows overflow size_t"))?;
    let elements = rows
        .checked_mul(m.width())
        .ok_or_else(|| Failure::invalid("the images' rows overflow size_t"))?;
    Ok((plans, elements))
}

/// Row offsets (`counts.len() + 1` entries, from 0) of images with these row counts.
pub(crate) fn offsets_of(counts: impl IntoIterator<Item = usize>) -> Vec<usize> {
    let mut offsets = vec![0];
    for c in counts {
        offsets.push(offsets.last().copied().unwrap_or(0) + c);
    }
    offsets
}

/// The refusal of a buffer of `have` elements where `need` are needed.
fn too_small(what: &str, have: usize, need: usize, n: usize, width: usize) -> Failure {
    Failure::new(
        vt_status::VT_ERR_BUFFER_TOO_SMALL,
        format!(
            "{what} holds {have} elements; the rows of the {n} image(s) need {} × {width} = \
             {need}",
            need / width.max(1)
        ),
    )
}

/// Rows the library allocated: `[rows, width]` f32 row-major, image after image in request
/// order. Made by [`vt_model_encode`] or `vt_model_encode_tensors`, freed by [`vt_rows_free`].
///
/// Thread safety: immutable; a `const vt_rows*` may be read from several threads.
pub struct vt_rows {
    pub(crate) data: Vec<f32>,
    pub(crate) offsets: Vec<usize>,
    pub(crate) width: usize,
}

/// Admits, decodes and prepares the `n_images` images (in parallel), runs them through the
/// tower (in passes of at most `max_patches_per_pass` patches) and writes the new rows to
/// `*out` (f32 on the host, whatever the device).
///
/// Statuses: `VT_ERR_NULL_ARGUMENT`, `VT_ERR_INVALID_ARGUMENT` (no images, an unknown `kind`),
/// `VT_ERR_IMAGE` and `VT_ERR_IMAGE_TOO_LARGE` (with `vt_last_error_image`),
/// `VT_ERR_OUT_OF_MEMORY` (the model stays usable), `VT_ERR_DEVICE`.
///
/// # Safety
/// `model` is a live handle; `images` points at `n_images` `vt_image`s whose bytes are valid
/// for the call; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_encode(
    model: *const vt_model,
    images: *const vt_image,
    n_images: usize,
    out: *mut *mut vt_rows,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        // SAFETY: the caller's contract.
        let sources = unsafe { sources(images, n_images) }?;
        need_out(out, "out")?;
        let (_, elements) = plan_all(m, &sources)?;
        let encoded = m.encode(&sources)?;
        let mut data = Vec::with_capacity(elements);
        for e in &encoded {
            data.extend_from_slice(&e.rows);
        }
        let rows = vt_rows {
            offsets: offsets_of(encoded.iter().map(|e| e.plan.rows as usize)),
            data,
            width: m.width(),
        };
        let handle = Box::into_raw(Box::new(rows));
        // SAFETY: checked non-NULL and aligned above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// [`vt_model_encode`] into the caller's host buffer `out` of `out_len` floats: the rows go to
/// its start, image after image; image `i` holds rows `row_offsets[i] .. row_offsets[i + 1]`.
///
/// Out-params (each may be NULL): `row_offsets` (`n_images + 1` entries) on `VT_OK`; `*needed`
/// (the elements the rows take) on `VT_OK` and on `VT_ERR_BUFFER_TOO_SMALL`, which is decided
/// from the images' headers before anything is decoded or written.
///
/// # Safety
/// As [`vt_model_encode`]; `out` is NULL (with `out_len == 0`) or `out_len` writable floats not
/// overlapping the images; `row_offsets` is NULL or `n_images + 1` writable `size_t`s; `needed`
/// is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_encode_into(
    model: *const vt_model,
    images: *const vt_image,
    n_images: usize,
    out: *mut f32,
    out_len: usize,
    row_offsets: *mut usize,
    needed: *mut usize,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        // SAFETY: the caller's contract.
        let sources = unsafe { sources(images, n_images) }?;
        if out.is_null() && out_len > 0 {
            return Err(Failure::null("out"));
        }
        check_extent::<f32>(out as usize, out_len, "out")?;
        // SAFETY: the caller's contract.
        let offsets_out = unsafe { offsets_arg(row_offsets, n_images + 1, needed) }?;
        let (_, elements) = plan_all(m, &sources)?;
        if out_len < elements {
            // SAFETY: the caller's contract.
            unsafe { write_opt(needed, elements) };
            return Err(too_small("out", out_len, elements, n_images, m.width()));
        }
        // SAFETY: `out` holds out_len >= elements writable floats (the caller's contract); the
        // pointer was checked for alignment and extent above.
        let dst = unsafe { slice_mut(out, elements, "out") }?;
        let encoded = m.encode(&sources)?;
        let mut at = 0;
        for e in &encoded {
            let end = at + e.rows.len();
            let Some(d) = dst.get_mut(at..end) else {
                return Err(Failure::new(
                    vt_status::VT_ERR_INTERNAL,
                    "the tower gave more rows than the plans",
                ));
            };
            d.copy_from_slice(&e.rows);
            at = end;
        }
        if let Some(o) = offsets_out {
            o.copy_from_slice(&offsets_of(encoded.iter().map(|e| e.plan.rows as usize)));
        }
        // SAFETY: the caller's contract.
        unsafe { write_opt(needed, elements) };
        Ok(())
    })
}

/// Checks that rows of `dtype` can go to a device buffer of model `m`; its CUDA ordinal.
pub(crate) fn device_target(m: &Model, dtype: u32) -> Result<(usize, RowsDtype), Failure> {
    let dtype = match dtype {
        0 => RowsDtype::F32,
        1 => RowsDtype::Bf16,
        2 => RowsDtype::F16,
        d => {
            return Err(Failure::invalid(format!(
                "dtype: {d} is not a vt_dtype (0, 1 or 2)"
            )))
        }
    };
    let Device::Cuda(ordinal) = m.device() else {
        return Err(Failure::new(
            vt_status::VT_ERR_UNSUPPORTED,
            format!(
                "rows on a GPU need a model opened on CUDA; this one runs on {} (device \"cuda\", \
                 or \"auto\" on a machine with a GPU)",
                m.device()
            ),
        ));
    };
    if let Some(why) = vision_towers::rows_dtype_refusal(m.precision(), dtype) {
        let (prec, vt) = match dtype {
            RowsDtype::Bf16 => ("VT_PRECISION_BF16", "VT_DTYPE_BF16"),
            RowsDtype::F16 => ("VT_PRECISION_F16", "VT_DTYPE_F16"),
            RowsDtype::F32 => ("VT_PRECISION_F32", "VT_DTYPE_F32"),
        };
        return Err(Failure::new(
            vt_status::VT_ERR_UNSUPPORTED,
            format!("{vt}: {why} (open it with {prec} or ask for VT_DTYPE_F32 rows)"),
        ));
    }
    Ok((ordinal, dtype))
}

/// The device memory `dst` of `dst_len` elements of `dtype` as the facade's output, on `stream`.
///
/// # Safety
/// `vt_model_encode_device`'s contract on `dst` and `stream`.
pub(crate) unsafe fn device_out(
    dst: *mut std::ffi::c_void,
    dst_len: usize,
    dtype: RowsDtype,
    ordinal: usize,
    stream: *mut std::ffi::c_void,
) -> Result<DeviceOut, Failure> {
    if dst.is_null() {
        return Err(Failure::null("dst"));
    }
    let (align, bytes) = (dtype.size(), dst_len.checked_mul(dtype.size()));
    if !(dst as usize).is_multiple_of(align) {
        return Err(Failure::invalid(format!(
            "dst is not aligned to {align} bytes"
        )));
    }
    if bytes.is_none_or(|b| (dst as usize).checked_add(b).is_none()) {
        return Err(Failure::invalid(format!(
            "dst: {dst_len} elements run past the address space"
        )));
    }
    // SAFETY: the caller's contract: `dst` is `dst_len` elements of device memory of the model's
    // device (its primary context), not used by anything else until the rows are written in
    // `stream`'s order; `stream` is NULL (the legacy default stream) or a live stream there.
    Ok(unsafe { DeviceOut::new(dst as u64, dst_len, dtype, ordinal, stream as u64) })
}

/// [`vt_model_encode`] with the rows written to the caller's CUDA memory `dst` (`dst_len`
/// elements of `dtype`), ordered with the caller's `stream`: the tower starts after the work
/// `stream` has queued, and `stream` waits (on the device) for the rows. Returns once the work
/// is queued: read the rows in `stream`'s order (or after synchronising it). Image `i` holds rows
/// `row_offsets[i] .. row_offsets[i + 1]` from the start of `dst`.
///
/// `dst` is a `CUdeviceptr` / `cudaMalloc` pointer of the model's device (its primary context, the
/// one the CUDA runtime and PyTorch use); `stream` a `CUstream` / `cudaStream_t` of that context,
/// NULL for the legacy default stream, `(void*)2` for the per-thread default stream.
///
/// Statuses: those of `vt_model_encode`, and `VT_ERR_UNSUPPORTED` (a model on the CPU; 16-bit rows
/// from a model of another precision), `VT_ERR_BUFFER_TOO_SMALL` (decided from the headers, before the device is
/// touched), `VT_ERR_OUT_OF_MEMORY` (nothing usable in `dst`; the model stays usable).
/// Out-params as [`vt_model_encode_into`].
///
/// # Safety
/// As [`vt_model_encode`]; `dst` is device memory of the model's device holding `dst_len`
/// elements of `dtype`, not used by anything else until the rows are written in `stream`'s
/// order; `stream` is NULL or a live stream of that device's primary context, alive until the
/// queued work completes; `row_offsets` and `needed` as in [`vt_model_encode_into`].
#[no_mangle]
pub unsafe extern "C" fn vt_model_encode_device(
    model: *const vt_model,
    images: *const vt_image,
    n_images: usize,
    dst: *mut std::ffi::c_void,
    dst_len: usize,
    dtype: u32,
    stream: *mut std::ffi::c_void,
    row_offsets: *mut usize,
    needed: *mut usize,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        // SAFETY: the caller's contract.
        let sources = unsafe { sources(images, n_images) }?;
        let (ordinal, dtype) = device_target(m, dtype)?;
        // SAFETY: the caller's contract on `dst` and `stream`.
        let out = unsafe { device_out(dst, dst_len, dtype, ordinal, stream) }?;
        // SAFETY: the caller's contract.
        let offsets_out = unsafe { offsets_arg(row_offsets, n_images + 1, needed) }?;
        let (_, elements) = plan_all(m, &sources)?;
        if dst_len < elements {
            // SAFETY: the caller's contract.
            unsafe { write_opt(needed, elements) };
            return Err(too_small("dst", dst_len, elements, n_images, m.width()));
        }
        let plans = m.encode_device_into(&sources, &out)?;
        if let Some(o) = offsets_out {
            o.copy_from_slice(&offsets_of(plans.iter().map(|p| p.rows as usize)));
        }
        // SAFETY: the caller's contract.
        unsafe { write_opt(needed, elements) };
        Ok(())
    })
}

/// Frees rows (NULL: nothing).
///
/// # Safety
/// `rows` is NULL or rows from this library not freed before.
#[no_mangle]
pub unsafe extern "C" fn vt_rows_free(rows: *mut vt_rows) {
    guard_value((), || {
        if !rows.is_null() {
            // SAFETY: rows from `Box::into_raw` in this library, freed once.
            drop(unsafe { Box::from_raw(rows) });
        }
    })
}

/// Reads rows for a getter.
///
/// # Safety
/// `rows` is NULL or live rows.
unsafe fn get<'a>(rows: *const vt_rows) -> Option<&'a vt_rows> {
    // SAFETY: the caller's contract.
    unsafe { rows.as_ref() }
}

/// The rows, `vt_rows_count × vt_rows_width` floats row-major; NULL for NULL.
///
/// # Safety
/// `rows` is NULL or live rows.
#[no_mangle]
pub unsafe extern "C" fn vt_rows_data(rows: *const vt_rows) -> *const f32 {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(rows) }.map_or(std::ptr::null(), |r| r.data.as_ptr())
    })
}

/// Rows of all images together; 0 for NULL.
///
/// # Safety
/// `rows` is NULL or live rows.
#[no_mangle]
pub unsafe extern "C" fn vt_rows_count(rows: *const vt_rows) -> usize {
    guard_value(0, || {
        // SAFETY: the caller's contract.
        unsafe { get(rows) }.map_or(0, |r| r.offsets.last().copied().unwrap_or(0))
    })
}

/// The LM width (floats per row); 0 for NULL.
///
/// # Safety
/// `rows` is NULL or live rows.
#[no_mangle]
pub unsafe extern "C" fn vt_rows_width(rows: *const vt_rows) -> usize {
    // SAFETY: the caller's contract.
    guard_value(0, || unsafe { get(rows) }.map_or(0, |r| r.width))
}

/// Images the rows belong to; 0 for NULL.
///
/// # Safety
/// `rows` is NULL or live rows.
#[no_mangle]
pub unsafe extern "C" fn vt_rows_images(rows: *const vt_rows) -> usize {
    guard_value(0, || {
        // SAFETY: the caller's contract.
        unsafe { get(rows) }.map_or(0, |r| r.offsets.len().saturating_sub(1))
    })
}

/// Row offsets, `vt_rows_images + 1` entries: image `i` holds rows `offsets[i] ..
/// offsets[i + 1]`; NULL for NULL.
///
/// # Safety
/// `rows` is NULL or live rows.
#[no_mangle]
pub unsafe extern "C" fn vt_rows_offsets(rows: *const vt_rows) -> *const usize {
    guard_value(std::ptr::null(), || {
        // SAFETY: the caller's contract.
        unsafe { get(rows) }.map_or(std::ptr::null(), |r| r.offsets.as_ptr())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `dst` checks that `vt_model_encode_device`, `vt_model_encode_tensors_device` and
    /// `vt_model_encode_video_device` share refuse before any device is used, so they run here
    /// (on a CUDA model through the entry points: `tests/gpu.rs`).
    #[test]
    fn device_out_refuses_a_null_a_misaligned_and_an_overflowing_dst() {
        use vt_status::{VT_ERR_INVALID_ARGUMENT, VT_ERR_NULL_ARGUMENT};
        let cases = [
            (0usize, RowsDtype::F32, VT_ERR_NULL_ARGUMENT, "dst is NULL"),
            (0, RowsDtype::Bf16, VT_ERR_NULL_ARGUMENT, "dst is NULL"),
            (258, RowsDtype::F32, VT_ERR_INVALID_ARGUMENT, "aligned to 4"),
            (
                257,
                RowsDtype::Bf16,
                VT_ERR_INVALID_ARGUMENT,
                "aligned to 2",
            ),
            (
                usize::MAX - 7,
                RowsDtype::F32,
                VT_ERR_INVALID_ARGUMENT,
                "address space",
            ),
        ];
        for (addr, dtype, status, word) in cases {
            // SAFETY: every case is refused before `dst` or the stream is used.
            let got = unsafe {
                device_out(
                    addr as *mut std::ffi::c_void,
                    4,
                    dtype,
                    0,
                    std::ptr::null_mut(),
                )
            };
            let f = got.expect_err("refused");
            assert_eq!(f.status, status, "{addr:#x} {dtype:?}: {}", f.message);
            assert!(f.message.contains(word), "{addr:#x}: {:?}", f.message);
        }
    }
}
