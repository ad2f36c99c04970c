//! Tensor maps (`CUtensorMap`) for the bulk tensor copies of the sm_90a kernels (attention, fused GEMM).

use cudarc::driver::sys;
use cudarc::driver::DeviceRepr;

use crate::Result;

/// A CUDA tensor map: 128 opaque bytes made by the driver, passed to a kernel by value
/// (`const __grid_constant__ TmaDesc`, declared in `kernels/sm90a.cuh`).
#[derive(Clone, Copy)]
#[repr(C, align(128))]
pub(crate) struct TensorMap([u64; 16]);

// SAFETY: plain bytes with the size and alignment of the kernel parameter (`TmaDesc`, 128 bytes).
unsafe impl DeviceRepr for TensorMap {}

/// Columns of one box: 64 bf16 = 128 bytes, the span of the 128-byte swizzle the kernel's shared-memory
/// layout uses (one "atom column").
pub(crate) const BOX_COLS: u32 = 64;

/// A 2-D map `{cols, rows}` over a row-major bf16 matrix at `base` with row stride `ld` (elements):
/// boxes of `box_cols × box_rows` in the 128-byte swizzle (`box_cols` ≤ 64). Loads read columns past `cols`
/// and rows past `rows` as zeros; stores skip them. The caller guarantees `base` is 16-byte aligned, `ld` is
/// a multiple of 8 and the buffer holds `rows` rows of `cols` columns at stride `ld`.
pub(crate) fn rows_bf16(
    base: u64,
    cols: usize,
    rows: usize,
    ld: usize,
    box_cols: u32,
    box_rows: u32,
) -> Result<TensorMap> {
    encode_bf16(
        base,
        &[cols as u64, rows as u64],
        &[(ld * 2) as u64],
        &[box_cols, box_rows],
    )
}

/// A 3-D map `{head_dim, heads, tokens}` over one operand of a `[tokens, ld]` bf16 matrix whose head `h` of
/// token `t` starts at element `base + t·ld + h·head_dim`; boxes of `{64, 1, box_rows}` land in shared memory
/// in the 128-byte swizzle. Columns past `head_dim` and tokens past `tokens` read as zeros.
/// The caller guarantees `base` is 16-byte aligned, `head_dim` and `ld` are multiples of 8 and the matrix
/// holds `tokens` rows of `heads·head_dim` columns.
pub(crate) fn head_major_bf16(
    base: u64,
    head_dim: usize,
    heads: usize,
    tokens: usize,
    ld: usize,
    box_rows: u32,
) -> Result<TensorMap> {
    encode_bf16(
        base,
        &[head_dim as u64, heads as u64, tokens as u64],
        &[(head_dim * 2) as u64, (ld * 2) as u64],
        &[BOX_COLS, 1, box_rows],
    )
}

/// A bf16 tensor map of rank `dims.len()` (strides in bytes for dimensions 1.., boxes in elements), 128-byte
/// swizzle, 256-byte L2 promotion, zero fill.
fn encode_bf16(base: u64, dims: &[u64], strides: &[u64], boxes: &[u32]) -> Result<TensorMap> {
    debug_assert!(strides.len() + 1 == dims.len() && boxes.len() == dims.len());
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::uninit();
    let elem = [1u32; 5];
    // SAFETY: `dims`, `boxes` and `elem` hold at least `rank` values and `strides` rank − 1 (the driver
    // reads no more); the driver writes the 128-byte map into `map` (aligned as CUtensorMap requires).
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            dims.len() as u32,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result()?;
    // SAFETY: the call succeeded, so the driver initialised the map.
    let map = unsafe { map.assume_init() };
    Ok(TensorMap(map.opaque))
}
