//! The DLPack ABI (dmlc/dlpack `include/dlpack/dlpack.h`, v1.x) as far as this package uses it:
//! the structs a producer hands out in a capsule, and the managed tensors this package exports.
//!
//! An exported tensor owns what keeps its memory alive (an `Arc` of the rows) in its
//! `manager_ctx`, never a Python object: the consumer's deleter may run on any thread, without
//! the GIL, even during interpreter shutdown (dmlc/dlpack#103), and only drops Rust values.

use std::any::Any;
use std::ffi::c_void;

/// `DLDeviceType::kDLCPU`.
pub const KDL_CPU: i32 = 1;
/// `DLDeviceType::kDLCUDA`.
pub const KDL_CUDA: i32 = 2;
/// `DLDeviceType::kDLCUDAHost` (page-locked host memory: readable as host memory).
pub const KDL_CUDA_HOST: i32 = 3;

/// `DLDataTypeCode::kDLInt`.
pub const KDL_INT: u8 = 0;
/// `DLDataTypeCode::kDLUInt`.
pub const KDL_UINT: u8 = 1;
/// `DLDataTypeCode::kDLFloat`.
pub const KDL_FLOAT: u8 = 2;
/// `DLDataTypeCode::kDLBfloat`.
pub const KDL_BFLOAT: u8 = 4;
/// `DLDataTypeCode::kDLBool`.
pub const KDL_BOOL: u8 = 6;

/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer copied the data for this export.
pub const FLAG_IS_COPIED: u64 = 1 << 1;

/// The DLPack version this package exports in versioned capsules (the 1.0 layout; nothing of
/// later minor versions is used).
pub const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// A `DLDeviceType`.
    pub device_type: i32,
    /// The device ordinal.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// A `DLDataTypeCode`.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

impl DLDataType {
    /// float32.
    pub const F32: DLDataType = DLDataType {
        code: KDL_FLOAT,
        bits: 32,
        lanes: 1,
    };
    /// bfloat16.
    pub const BF16: DLDataType = DLDataType {
        code: KDL_BFLOAT,
        bits: 16,
        lanes: 1,
    };
    /// float16 (IEEE half).
    pub const F16: DLDataType = DLDataType {
        code: KDL_FLOAT,
        bits: 16,
        lanes: 1,
    };
    /// uint8 (raw RGB video frames).
    pub const U8: DLDataType = DLDataType {
        code: KDL_UINT,
        bits: 8,
        lanes: 1,
    };

    /// The NumPy / PyTorch spelling (`float32`, `int64`, `bool`, …), for messages.
    pub fn name(self) -> String {
        let kind = match self.code {
            KDL_INT => "int",
            KDL_UINT => "uint",
            KDL_FLOAT => "float",
            KDL_BFLOAT => "bfloat",
            KDL_BOOL => return "bool".into(),
            other => return format!("DLPack type code {other} × {} bits", self.bits),
        };
        if self.lanes == 1 {
            format!("{kind}{}", self.bits)
        } else {
            format!("{kind}{}x{}", self.bits, self.lanes)
        }
    }
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// The data pointer (a device address for CUDA).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or NULL for compact row-major.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor` (the legacy, unversioned capsule `"dltensor"`).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; called once by its consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLManagedTensorVersioned` (the capsule `"dltensor_versioned"`).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version of this struct.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; called once by its consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// What an exported 2-D tensor is: its first element, extents, element type and device.
#[derive(Debug, Clone, Copy)]
pub struct Export2d {
    /// Address of element `[0, 0]`.
    pub data: u64,
    /// `[rows, columns]`.
    pub shape: [i64; 2],
    /// Element type.
    pub dtype: DLDataType,
    /// Device.
    pub device: DLDevice,
    /// Set `DLPACK_FLAG_BITMASK_IS_COPIED` (versioned capsules only).
    pub copied: bool,
}

/// A legacy managed tensor and everything its pointers point at, in one allocation; the
/// managed tensor comes first, so a `*mut DLManagedTensor` is a `*mut Legacy`.
#[repr(C)]
struct Legacy {
    managed: DLManagedTensor,
    shape: [i64; 2],
    strides: [i64; 2],
    owner: Box<dyn Any + Send>,
}

/// The versioned counterpart of [`Legacy`].
#[repr(C)]
struct Versioned {
    managed: DLManagedTensorVersioned,
    shape: [i64; 2],
    strides: [i64; 2],
    owner: Box<dyn Any + Send>,
}

fn tensor(e: &Export2d) -> DLTensor {
    DLTensor {
        data: e.data as usize as *mut c_void,
        device: e.device,
        ndim: 2,
        dtype: e.dtype,
        // Set once the allocation exists (they point into it).
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// A legacy `DLManagedTensor` for `e`, keeping `owner` alive until its deleter runs. The caller
/// hands the pointer to a consumer (in a capsule) or frees it with its deleter.
pub fn export_legacy(e: &Export2d, owner: Box<dyn Any + Send>) -> *mut DLManagedTensor {
    let mut b = Box::new(Legacy {
        managed: DLManagedTensor {
            dl_tensor: tensor(e),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        shape: e.shape,
        // Compact row-major, stated explicitly (NULL strides are deprecated).
        strides: [e.shape[1], 1],
        owner,
    });
    b.managed.dl_tensor.shape = b.shape.as_mut_ptr();
    b.managed.dl_tensor.strides = b.strides.as_mut_ptr();
    let p = Box::into_raw(b);
    // SAFETY: `p` was just made from a live box.
    unsafe { (*p).managed.manager_ctx = p.cast() };
    p.cast()
}

/// A `DLManagedTensorVersioned` for `e` (see [`export_legacy`]).
pub fn export_versioned(e: &Export2d, owner: Box<dyn Any + Send>) -> *mut DLManagedTensorVersioned {
    let mut b = Box::new(Versioned {
        managed: DLManagedTensorVersioned {
            version: VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: if e.copied { FLAG_IS_COPIED } else { 0 },
            dl_tensor: tensor(e),
        },
        shape: e.shape,
        strides: [e.shape[1], 1],
        owner,
    });
    b.managed.dl_tensor.shape = b.shape.as_mut_ptr();
    b.managed.dl_tensor.strides = b.strides.as_mut_ptr();
    let p = Box::into_raw(b);
    // SAFETY: `p` was just made from a live box.
    unsafe { (*p).managed.manager_ctx = p.cast() };
    p.cast()
}

/// The deleter of [`export_legacy`]'s tensors: frees the allocation and drops the owner (the
/// rows' `Arc`). Runs on any thread, with or without the GIL; never unwinds into the caller.
unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` came from `export_legacy` (the deleter is only reachable through it) and the
    // DLPack contract calls the deleter once.
    let b = unsafe { Box::from_raw(p.cast::<Legacy>()) };
    // A panic in a drop must not cross the C boundary; there is nobody to report it to.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(b)));
}

/// The deleter of [`export_versioned`]'s tensors (see [`delete_legacy`]).
unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`, for `export_versioned`.
    let b = unsafe { Box::from_raw(p.cast::<Versioned>()) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(b)));
}

/// A producer's tensor as read from its `DLTensor`, for the consumers in this package (the
/// processor tensors of `encode_prepared`, the `out=` buffer).
#[derive(Debug, Clone)]
pub struct Borrowed {
    /// Address of the first element (`data + byte_offset`).
    pub addr: u64,
    /// Device.
    pub device: DLDevice,
    /// Element type.
    pub dtype: DLDataType,
    /// Extents, outermost first.
    pub shape: Vec<usize>,
    /// Strides in elements (compact row-major when the producer gave none).
    pub strides: Vec<i64>,
}

impl Borrowed {
    /// Reads `t`'s fields.
    ///
    /// # Safety
    /// `t` must be a valid `DLTensor` whose `shape` and `strides` hold `ndim` entries.
    pub unsafe fn read(t: &DLTensor) -> Result<Borrowed, String> {
        let ndim = usize::try_from(t.ndim).map_err(|_| format!("ndim {} is negative", t.ndim))?;
        if ndim > 32 {
            return Err(format!("ndim {ndim} is over 32"));
        }
        let shape_i: &[i64] = if ndim == 0 {
            &[]
        } else {
            // SAFETY: the caller's contract: `shape` holds `ndim` entries.
            unsafe { std::slice::from_raw_parts(t.shape, ndim) }
        };
        let shape = shape_i
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("negative extent in {shape_i:?}")))
            .collect::<Result<Vec<usize>, String>>()?;
        let strides = if t.strides.is_null() || ndim == 0 {
            contiguous_strides(&shape)
        } else {
            // SAFETY: the caller's contract: non-NULL `strides` hold `ndim` entries.
            unsafe { std::slice::from_raw_parts(t.strides, ndim) }.to_vec()
        };
        Ok(Borrowed {
            addr: (t.data as usize as u64).wrapping_add(t.byte_offset),
            device: t.device,
            dtype: t.dtype,
            shape,
            strides,
        })
    }

    /// Elements it holds (saturating).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Whether its elements are compact row-major (extents of 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let want = contiguous_strides(&self.shape);
        self.numel() == 0
            || self
                .shape
                .iter()
                .zip(self.strides.iter().zip(&want))
                .all(|(&d, (&s, &w))| d == 1 || s == w)
    }
}

/// Compact row-major strides of `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1] as i64);
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn export(copied: bool) -> Export2d {
        Export2d {
            data: 0x1000,
            shape: [3, 5],
            dtype: DLDataType::F32,
            device: DLDevice {
                device_type: KDL_CPU,
                device_id: 0,
            },
            copied,
        }
    }

    /// The structs have the C layout of dlpack.h on 64-bit targets.
    #[test]
    fn layouts_match_dlpack_h() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
        assert_eq!(size_of::<DLManagedTensor>(), 64);
        assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    }

    /// An exported tensor describes the rows and keeps their owner alive until its deleter runs,
    /// on whatever thread that is.
    #[test]
    fn the_deleter_releases_the_owner_on_any_thread() {
        let rows = Arc::new(vec![0f32; 15]);
        let p = export_legacy(&export(false), Box::new(rows.clone()));
        let v = export_versioned(&export(true), Box::new(rows.clone()));
        assert_eq!(Arc::strong_count(&rows), 3);
        // SAFETY: both were just exported and not freed.
        unsafe {
            let t = &(*p).dl_tensor;
            assert_eq!(std::slice::from_raw_parts(t.shape, 2), &[3, 5]);
            assert_eq!(std::slice::from_raw_parts(t.strides, 2), &[5, 1]);
            assert_eq!(t.data as usize, 0x1000);
            assert_eq!((*p).manager_ctx, p.cast());
            assert_eq!((*v).flags, FLAG_IS_COPIED);
            assert_eq!((*v).version, VERSION);
            assert_eq!(std::slice::from_raw_parts((*v).dl_tensor.shape, 2), &[3, 5]);
        }
        let (pa, va) = (p as usize, v as usize);
        std::thread::spawn(move || {
            let (p, v) = (
                pa as *mut DLManagedTensor,
                va as *mut DLManagedTensorVersioned,
            );
            // SAFETY: each deleter is called once, on tensors exported above.
            unsafe {
                ((*p).deleter.unwrap())(p);
                ((*v).deleter.unwrap())(v);
            }
        })
        .join()
        .unwrap();
        assert_eq!(Arc::strong_count(&rows), 1);
    }

    #[test]
    fn contiguity_ignores_unit_extents() {
        let b = |shape: Vec<usize>, strides: Vec<i64>| Borrowed {
            addr: 0,
            device: DLDevice {
                device_type: KDL_CPU,
                device_id: 0,
            },
            dtype: DLDataType::F32,
            shape,
            strides,
        };
        assert!(b(vec![2, 3], vec![3, 1]).is_contiguous());
        assert!(b(vec![1, 3], vec![99, 1]).is_contiguous());
        assert!(!b(vec![2, 3], vec![1, 2]).is_contiguous());
        assert!(b(vec![0, 3], vec![7, 7]).is_contiguous());
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(DLDataType::BF16.name(), "bfloat16");
        assert_eq!(DLDataType::F16.name(), "float16");
        assert_eq!(
            DLDataType {
                code: KDL_BOOL,
                bits: 8,
                lanes: 1
            }
            .name(),
            "bool"
        );
    }
}
