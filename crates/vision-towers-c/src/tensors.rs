//! An image processor's tensors handed in instead of image bytes (the HF processor's names and
//! layouts), encoded on the host or into a caller's device buffer.

use std::ffi::c_char;

use vision_towers::{Family, Model, ProcessorTensors};

use crate::encode::{device_out, device_target, offsets_arg, offsets_of, vt_rows};
use crate::error::{guard, guard_value, vt_status, Failure};
use crate::ffi::{need_out, slice, utf8, write_opt};
use crate::model::{model_arg, vt_model};

/// The most dimensions a tensor may have.
const MAX_DIMS: usize = 8;

/// A set of named tensors as the transformers image processor returns them (`pixel_values`,
/// `image_grid_thw`, `image_position_ids`, `num_local_patches`, `pixel_values_local`,
/// `patch_newline_masks`, …): float tensors as f32, integer and boolean ones as i64, row-major,
/// shapes outermost first. Made by [`vt_tensors_new`], filled by [`vt_tensors_add_f32`] /
/// [`vt_tensors_add_i64`] (values copied), freed by [`vt_tensors_free`].
///
/// Thread safety: filling needs exclusive use; a filled `const vt_tensors*` may be encoded from
/// several threads at once.
pub struct vt_tensors {
    set: ProcessorTensors,
    /// Every tensor's name and shape, to count the images before a run.
    shapes: Vec<(String, Vec<usize>)>,
}

impl vt_tensors {
    fn shape(&self, name: &str) -> Option<&[usize]> {
        self.shapes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.as_slice())
    }

    /// How many images the set holds for `family`, from the outer dimension of the tensor that
    /// has one entry per image; `None` when that tensor is absent (the tower then says so).
    fn images(&self, family: Family) -> Option<usize> {
        let name = match family {
            Family::Gemma4 => "pixel_values",
            Family::Glm5Next | Family::GlmOcr => "image_grid_thw",
            Family::Step3p7 => "num_local_patches",
        };
        self.shape(name)?.first().copied()
    }

    fn insert(&mut self, name: &str, shape: &[usize]) {
        self.shapes.retain(|(n, _)| n != name);
        self.shapes.push((name.to_string(), shape.to_vec()));
    }
}

/// Makes an empty tensor set and writes it to `*out`.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn vt_tensors_new(out: *mut *mut vt_tensors) -> vt_status {
    guard(|| {
        need_out(out, "out")?;
        let handle = Box::into_raw(Box::new(vt_tensors {
            set: ProcessorTensors::new(),
            shapes: Vec::new(),
        }));
        // SAFETY: checked non-NULL and aligned above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a tensor set (NULL: nothing).
///
/// # Safety
/// `tensors` is NULL or a set from [`vt_tensors_new`] not freed before.
#[no_mangle]
pub unsafe extern "C" fn vt_tensors_free(tensors: *mut vt_tensors) {
    guard_value((), || {
        if !tensors.is_null() {
            // SAFETY: a set from `Box::into_raw` in `vt_tensors_new`, freed once.
            drop(unsafe { Box::from_raw(tensors) });
        }
    })
}

/// The checked arguments of a `vt_tensors_add_*` call.
struct Added<'a, T> {
    set: &'a mut vt_tensors,
    name: &'a str,
    shape: &'a [usize],
    data: &'a [T],
}

/// The arguments every `vt_tensors_add_*` shares.
///
/// # Safety
/// As `vt_tensors_add_f32`.
unsafe fn add<'a, T: Copy>(
    tensors: *mut vt_tensors,
    name: *const c_char,
    shape: *const usize,
    ndim: usize,
    data: *const T,
    len: usize,
) -> Result<Added<'a, T>, Failure> {
    // SAFETY: the caller's contract.
    let set = unsafe { tensors.as_mut() }.ok_or_else(|| Failure::null("tensors"))?;
    // SAFETY: the caller's contract.
    let name = unsafe { utf8(name, "name") }?;
    if ndim > MAX_DIMS {
        return Err(Failure::invalid(format!(
            "tensor {name}: {ndim} dimensions, at most {MAX_DIMS}"
        )));
    }
    // SAFETY: the caller's contract.
    let shape = unsafe { slice(shape, ndim, "shape") }?;
    // SAFETY: the caller's contract.
    let data = unsafe { slice(data, len, "data") }?;
    Ok(Added {
        set,
        name,
        shape,
        data,
    })
}

/// Adds (or replaces) the float tensor `name` of shape `shape[0..ndim]` (outermost first; at
/// most 8 dimensions; `ndim == 0` is a scalar) with its `len` values, row-major; the values are
/// copied. `len` must equal the shape's product.
///
/// Statuses: `VT_ERR_NULL_ARGUMENT`, `VT_ERR_INVALID_ARGUMENT` (a name not UTF-8, too many
/// dimensions, a shape its values do not fill).
///
/// # Safety
/// `tensors` is a live set used by no other thread; `name` a NUL-terminated string; `shape`
/// NULL (with `ndim == 0`) or `ndim` `size_t`s; `data` NULL (with `len == 0`) or `len` floats.
#[no_mangle]
pub unsafe extern "C" fn vt_tensors_add_f32(
    tensors: *mut vt_tensors,
    name: *const c_char,
    shape: *const usize,
    ndim: usize,
    data: *const f32,
    len: usize,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { add(tensors, name, shape, ndim, data, len) }?;
        a.set
            .set
            .insert_f32(a.name, a.shape.to_vec(), a.data.to_vec())
            .map_err(|e| Failure::invalid(e.to_string()))?;
        a.set.insert(a.name, a.shape);
        Ok(())
    })
}

/// [`vt_tensors_add_f32`] for an integer or boolean tensor (`image_grid_thw`,
/// `image_position_ids`, `num_local_patches`, `patch_newline_masks`, …) as int64 values.
///
/// # Safety
/// As [`vt_tensors_add_f32`], with `data` NULL or `len` int64 values.
#[no_mangle]
pub unsafe extern "C" fn vt_tensors_add_i64(
    tensors: *mut vt_tensors,
    name: *const c_char,
    shape: *const usize,
    ndim: usize,
    data: *const i64,
    len: usize,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { add(tensors, name, shape, ndim, data, len) }?;
        a.set
            .set
            .insert_i64(a.name, a.shape.to_vec(), a.data.to_vec())
            .map_err(|e| Failure::invalid(e.to_string()))?;
        a.set.insert(a.name, a.shape);
        Ok(())
    })
}

/// The set behind a const handle.
///
/// # Safety
/// `tensors` is NULL or a live set.
unsafe fn tensors_arg<'a>(tensors: *const vt_tensors) -> Result<&'a vt_tensors, Failure> {
    // SAFETY: the caller's contract.
    unsafe { tensors.as_ref() }.ok_or_else(|| Failure::null("tensors"))
}

/// Runs the tower on the processor's tensors `tensors` (instead of image bytes) and writes the
/// new rows to `*out` (f32 on the host, one block per image in the set's order).
///
/// Statuses: `VT_ERR_NULL_ARGUMENT`, `VT_ERR_INPUT` (a tensor missing, mistyped or misshapen
/// for this model), `VT_ERR_IMAGE_TOO_LARGE` (an image over `max_patches_per_pass`),
/// `VT_ERR_OUT_OF_MEMORY`, `VT_ERR_DEVICE`.
///
/// # Safety
/// `model` is a live handle; `tensors` a live set no thread is filling; `out` valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn vt_model_encode_tensors(
    model: *const vt_model,
    tensors: *const vt_tensors,
    out: *mut *mut vt_rows,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        // SAFETY: the caller's contract.
        let t = unsafe { tensors_arg(tensors) }?;
        need_out(out, "out")?;
        let rows = m.encode_tensors(&t.set).map_err(Failure::from)?;
        let width = rows.width;
        let rows = vt_rows {
            offsets: offsets_of(rows.per_image.iter().map(|r| r.len() / width.max(1))),
            data: rows.per_image.concat(),
            width,
        };
        let handle = Box::into_raw(Box::new(rows));
        // SAFETY: checked non-NULL and aligned above.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// [`vt_model_encode_tensors`] with the rows written to the caller's CUDA memory `dst` on the
/// caller's `stream`, exactly as `vt_model_encode_device` does for image bytes.
///
/// Out-params (each may be NULL), written on `VT_OK`: `row_offsets` (`images + 1` entries; it
/// holds `offsets_len`, which must cover them), `*n_images` (the images the set held).
/// A `dst` too small is refused before the device is touched, with the needed count in the
/// message (prepared tensors state their rows only to the tower: `VT_ERR_INPUT` here).
///
/// # Safety
/// As [`vt_model_encode_tensors`], with `dst` and `stream` as in `vt_model_encode_device`;
/// `row_offsets` NULL or `offsets_len` writable `size_t`s; `n_images` NULL or valid for a write.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn vt_model_encode_tensors_device(
    model: *const vt_model,
    tensors: *const vt_tensors,
    dst: *mut std::ffi::c_void,
    dst_len: usize,
    dtype: u32,
    stream: *mut std::ffi::c_void,
    row_offsets: *mut usize,
    offsets_len: usize,
    n_images: *mut usize,
) -> vt_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { model_arg(model) }?;
        // SAFETY: the caller's contract.
        let t = unsafe { tensors_arg(tensors) }?;
        let (ordinal, dtype) = device_target(m, dtype)?;
        // SAFETY: the caller's contract on `dst` and `stream`.
        let out = unsafe { device_out(dst, dst_len, dtype, ordinal, stream) }?;
        // SAFETY: the caller's contract.
        let offsets_out = unsafe { offsets_arg(row_offsets, offsets_len, n_images) }?;
        if let (Some(o), Some(images)) = (&offsets_out, t.images(m.family())) {
            if o.len() <= images {
                return Err(Failure::invalid(format!(
                    "row_offsets holds {} entries; the tensors hold {images} image(s): {} needed",
                    o.len(),
                    images + 1
                )));
            }
        }
        let counts = encode_tensors_into(m, t, &out)?;
        if let Some(o) = offsets_out {
            let offsets = offsets_of(counts.iter().copied());
            let Some(head) = o.get_mut(..offsets.len()) else {
                return Err(Failure::new(
                    vt_status::VT_ERR_INTERNAL,
                    "the tower gave more images than the tensors' outer dimension",
                ));
            };
            head.copy_from_slice(&offsets);
        }
        // SAFETY: the caller's contract.
        unsafe { write_opt(n_images, counts.len()) };
        Ok(())
    })
}

fn encode_tensors_into(
    m: &Model,
    t: &vt_tensors,
    out: &vision_towers::DeviceOut,
) -> Result<Vec<usize>, Failure> {
    m.encode_tensors_into(&t.set, out).map_err(Failure::from)
}
