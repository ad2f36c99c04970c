//! The cuBLASLt handle, its workspace and the per-shape plan cache that every [`crate::Device`]
//! holds; `gemm` runs the plans. Depends on the GEMM's parameters only, not on the device, so
//! the device module can own one without a module loop.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::sys;

use super::lt_lib as lt;
use cudarc::driver::{CudaSlice, CudaStream};

use super::shape::{
    gemm_tuning_from, Epilogue, GemmShape, GemmTuned, GemmTuning, GEMM_CANDIDATES, GEMM_TUNING_ENV,
};
use crate::error::{GpuError, Result};

/// An operand's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Dtype {
    F32,
    Bf16,
    F16,
}

impl Dtype {
    /// cuBLASLt's name of the type.
    fn cuda(self) -> sys::cudaDataType_t {
        match self {
            Dtype::F32 => sys::cudaDataType_t::CUDA_R_32F,
            Dtype::Bf16 => sys::cudaDataType_t::CUDA_R_16BF,
            Dtype::F16 => sys::cudaDataType_t::CUDA_R_16F,
        }
    }

    /// Bytes per element.
    pub(super) fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
}

/// What a plan is cached under: the shape (offsets zeroed), the dtypes, the bias, the epilogue
/// and the operands' alignments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    pub(super) shape: GemmShape,
    /// x and W.
    pub(super) input: Dtype,
    /// y.
    pub(super) output: Dtype,
    pub(super) bias: Option<Dtype>,
    pub(super) epilogue: Epilogue,
    pub(super) align: [u32; 4],
}

/// One cuBLASLt matmul plan: its descriptors and the algorithm in use.
pub(super) struct Plan {
    pub(super) desc: sys::cublasLtMatmulDesc_t,
    pub(super) a: sys::cublasLtMatrixLayout_t,
    pub(super) b: sys::cublasLtMatrixLayout_t,
    pub(super) c: sys::cublasLtMatrixLayout_t,
    pub(super) algo: sys::cublasLtMatmulAlgo_t,
    /// The heuristic's answers, best first (`algo` is one of them).
    pub(super) candidates: Vec<sys::cublasLtMatmulAlgo_t>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: the descriptors were created by this plan and are destroyed once, here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// The per-shape plans, the tuning mode and what tuning measured.
#[derive(Default)]
pub(super) struct Plans {
    pub(super) plans: HashMap<PlanKey, Plan>,
    pub(super) tuning: GemmTuning,
    pub(super) tuned: Vec<GemmTuned>,
}

/// The cuBLASLt handle, its workspace and the per-shape plan cache.
pub(crate) struct Lt {
    pub(super) handle: sys::cublasLtHandle_t,
    pub(super) workspace: CudaSlice<u8>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) plans: Mutex<Plans>,
}

// SAFETY: the handle and descriptors are only used under the plan mutex or from &self calls that
// cuBLASLt documents as thread-safe for distinct descriptors.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.lock().map(|mut p| p.plans.clear()).ok();
        // SAFETY: created in Lt::new, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// cuBLASLt's recommended workspace on Hopper.
pub(super) const WORKSPACE_BYTES: usize = 32 << 20;

impl Lt {
    /// A handle, its workspace and an empty plan cache tuned as [`GEMM_TUNING_ENV`] asks (a value
    /// that names no tuning is an error, never ignored).
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let tuning =
            gemm_tuning_from(std::env::var_os(GEMM_TUNING_ENV).as_deref()).map_err(|v| {
                GpuError::Unusable(format!(
                    "{GEMM_TUNING_ENV}={v:?}: expected `heuristic` or `measured` (or unset)"
                ))
            })?;
        let handle = lt::create_handle()?;
        // SAFETY: u8 workspace, contents irrelevant.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(|e| GpuError::from_alloc(e, WORKSPACE_BYTES))?;
        Ok(Lt {
            handle,
            workspace,
            stream: stream.clone(),
            plans: Mutex::new(Plans {
                tuning,
                ..Plans::default()
            }),
        })
    }
}

pub(super) unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        v as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )?;
    Ok(())
}

impl Lt {
    pub(super) fn make_plan(&self, key: &PlanKey) -> Result<Plan> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        use sys::cudaDataType_t as T;
        let s = key.shape;
        let (in_t, out_t) = (key.input.cuda(), key.output.cuda());
        let a = lt::create_matrix_layout(in_t, s.k as u64, s.n as u64, s.k as i64)?;
        let b = lt::create_matrix_layout(in_t, s.k as u64, s.m as u64, s.ldx as i64)?;
        let c = lt::create_matrix_layout(out_t, s.n as u64, s.m as u64, s.ldy as i64)?;
        let desc =
            lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, T::CUDA_R_32F)?;
        let mut plan = Plan {
            desc,
            a,
            b,
            c,
            algo: unsafe { std::mem::zeroed() },
            candidates: Vec::new(),
        };
        // SAFETY: fresh descriptors owned by `plan`; attribute values have the documented types.
        unsafe {
            // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 (not re-exported by cudarc::cublaslt)
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?;
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?;
            let epi = match (key.bias.is_some(), key.epilogue) {
                (false, Epilogue::None) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
                (true, Epilogue::None) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
                (false, Epilogue::GeluTanh) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
                (true, Epilogue::GeluTanh) => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            };
            set_desc(desc, D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
            if let Some(b) = key.bias {
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &b.cuda())?;
            }
            let pref = lt::create_matmul_pref()?;
            let set_pref = |attr: sys::cublasLtMatmulPreferenceAttributes_t,
                            v: u64,
                            u32v: bool|
             -> Result<()> {
                if u32v {
                    let x = v as u32;
                    lt::set_matmul_pref_attribute(
                        pref,
                        attr,
                        &x as *const u32 as *const c_void,
                        4,
                    )?;
                } else {
                    lt::set_matmul_pref_attribute(
                        pref,
                        attr,
                        &v as *const u64 as *const c_void,
                        8,
                    )?;
                }
                Ok(())
            };
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            let r = (|| -> Result<Vec<sys::cublasLtMatmulAlgo_t>> {
                set_pref(
                    P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    WORKSPACE_BYTES as u64,
                    false,
                )?;
                set_pref(
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    key.align[0] as u64,
                    true,
                )?;
                set_pref(
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    key.align[1] as u64,
                    true,
                )?;
                set_pref(
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    key.align[2] as u64,
                    true,
                )?;
                set_pref(
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                    key.align[3] as u64,
                    true,
                )?;
                let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
                    vec![std::mem::zeroed(); GEMM_CANDIDATES];
                let found =
                    lt::algo_get_heuristic(self.handle, desc, a, b, c, c, pref, &mut results)?;
                results.truncate(found);
                Ok(results
                    .into_iter()
                    .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                    .map(|r| r.algo)
                    .collect::<Vec<_>>())
            })();
            let _ = lt::destroy_matmul_pref(pref);
            plan.candidates = r?;
            plan.algo = *plan
                .candidates
                .first()
                .ok_or(GpuError::CublasLt(CublasError(
                    sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
                )))?;
        }
        Ok(plan)
    }
}
