//! gpu-core: the CUDA device, bf16 tensor-core GEMMs (cuBLASLt) and the PTX kernels the vision
//! towers run on, each with a host twin in [`host`].
//!
//! - [`Device`] owns a context, its compute stream, every kernel and a cuBLASLt handle. [`Device::new`]
//!   returns [`GpuError::NoDevice`] (never panics) on a machine without CUDA.
//! - Operations are methods on [`Device`]; each checks its shapes against the buffers first.
//! - [`Graph`] / [`Graphs`]: CUDA graphs of a tower's forward, captured per batch layout;
//!   [`Uploader`]: batch inputs uploaded from page-locked memory on a copy stream while the
//!   compute stream runs; [`Stager`]: weights uploaded chunk by chunk from any [`HostSource`]
//!   (e.g. a memory-mapped file's bytes) without a whole-tensor host copy.
//! - [`Device::gemm_act`]: on compute capability 9.0, a GEMM with the MLP's activation (or its gate
//!   over interleaved gate|up rows) in the epilogue, our own wgmma kernel; [`ActLinear`] uploads an MLP's
//!   gate|up for it where the device has it, else (and every plain fc1, [`fuses`]) for cuBLASLt + the
//!   activation pass.
//! - Kernels live in this crate's `kernels/*.cu`; their PTX (`kernels/ptx/`) and SASS fatbins
//!   (`kernels/sass/`) are committed beside them, shipped in the package and embedded with
//!   `include_str!` / `include_bytes!`, so no build needs nvcc (override the PTX at run time with
//!   `GPU_CORE_PTX_DIR`). See [`kernels`].
//!
//! **Architecture Invariant:** every device operation has a host twin in [`host`] with the same
//! layout; the GPU tests (`#[ignore = "needs a CUDA device"]`, run by `cargo xtask gpu-test`)
//! compare the two on fresh random inputs with poisoned outputs.
#![deny(missing_docs)]

mod act_linear;
mod batch;
mod device;
mod error;
mod gemm;
mod graph;
pub mod host;
pub mod kernels;
mod mixed;
mod ops;
mod pass_queue;
mod profile;
mod qkv_attn;
mod rows_out;
mod runner;
mod staging;
pub mod tier;
mod tma;
mod tower;
mod upload;

#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
mod gpu_tests_attn;
#[cfg(test)]
mod gpu_tests_f16;
#[cfg(test)]
mod gpu_tests_fused;
#[cfg(test)]
mod gpu_tests_graph;
#[cfg(test)]
mod gpu_tests_layout;
#[cfg(test)]
mod gpu_tests_nan;

pub use act_linear::{fuses, ActLinear};
pub use batch::{Batch, HostBatch, PassRows, PassWorkspace};
pub use device::{
    device_count, is_available, Device, DeviceBuffer, DeviceOptions, Elem, FAKE_DEVICE_ENV,
    POISON_ALLOC_ENV,
};
pub use error::{CudaError, GpuError, Result};
pub use gemm::lt_lib::{cublaslt, LtLibrary, LtSource, CUBLASLT_SONAME};
pub use gemm::{
    Epilogue, GemmBias, GemmInputs, GemmOutput, GemmShape, GemmTuned, GemmTuning, GEMM_CANDIDATES,
    GEMM_TUNING_ENV,
};
pub use graph::{
    Capture, Graph, GraphCache, GraphKey, GraphStats, GraphStatus, Graphs, Ran, Replay,
    DEFAULT_GRAPHS_PER_TOWER, SEEN_PER_GRAPH,
};
pub use half::{bf16, f16};
pub use kernels::{Kernel, Module, ModuleSource};
pub use mixed::{
    attention_head_dim, head_groups, pad_head_cols, pad_head_rows, GemmBuffer, BF16_ATTN_HEAD_DIMS,
};
pub use ops::{
    conv3x3s2_out, interleave_gate_up, rope_inv_freq, ActElem, AttnArgs, Clamp, FlashVariant,
    FusedAct, Gate, HalfElem, InterleavedGateUp, Mat, NormOut, QkvSpec, RopeLayout, RopeSpec,
    GATE_UP_GROUP, MAX_F32_ATTN_HEAD_DIM, MAX_NORM_WIDTH,
};
pub use pass_queue::{PassQueue, PASSES_IN_FLIGHT};
pub use profile::OpTime;
pub use qkv_attn::{QkNorm, QkvAttention};
pub use rows_out::{OwnedRows, RowsDtype, RowsTarget, PER_THREAD_DEFAULT_STREAM};
pub use runner::{split_rows, PassRunner, TowerBase};
pub use staging::{
    all_finite, recycled_bf16, DeviceInputs, HostCopy, HostGemm, HostInputs, InputBuffers,
    NonFinite, Uploader, SPREAD_COPY_MIN_BYTES, SPREAD_COPY_THREADS, UPLOAD_SLOTS,
};
pub use tier::{parse_tier, Arch, F16Attention, KernelSet, Tier, TierError, FORCE_TIER_ENV};
pub use tower::{DeviceTower, TowerResult};
// The shared vocabulary, from the crate below every other (gpu-core's own paths kept).
/// The crate below gpu-core, for [`family_error!`]'s expansion in the tower crates.
pub use tower_core;
pub use tower_core::{Activation, LmAttention, Precision};
pub use upload::{
    HostSource, HostTensor, LeBytes, LeDtype, StageElem, Stager, TensorStore, STAGING_BYTES,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without CUDA this must be an error value, not a panic, and the driver count
    /// says the same thing as the probe.
    #[test]
    fn device_new_without_cuda_is_no_device_or_works() {
        match Device::new(0) {
            Ok(_) => {
                assert!(is_available());
                assert!(matches!(device_count(), Ok(n) if n >= 1));
            }
            Err(GpuError::NoDevice(msg)) => {
                assert!(!msg.is_empty());
                assert!(!is_available());
                assert!(matches!(device_count(), Ok(0)), "{:?}", device_count());
            }
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }

    #[test]
    fn rope_inv_freq_follows_theta_law() {
        let f = rope_inv_freq(72, 100.0);
        assert_eq!(f.len(), 18);
        assert_eq!(f[0], 1.0);
        assert!((f[1] as f64 - 100f64.powf(-2.0 / 36.0)).abs() < 1e-7);
    }
}
