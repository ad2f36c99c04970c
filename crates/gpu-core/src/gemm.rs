//! GEMM `y = x·Wᵀ (+ bias) (+ GELU-tanh)` through cuBLASLt, f32 accumulation.
//!
//! Row-major `x [m, k]`, `W [n, k]` (PyTorch `Linear.weight`), `y [m, n]`. In cuBLASLt's
//! column-major terms this is `yᵀ (n×m) = op_T(W) (n×k) · xᵀ (k×m)`, so the bias (one value per
//! output feature) is cuBLASLt's per-row bias of D.
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::bf16;

use crate::device::{DeviceBuffer, Elem};
use crate::{Device, GpuError, Result};

/// GEMM inputs: `x` and `W` share a dtype.
#[derive(Debug, Clone, Copy)]
pub enum GemmInputs<'a> {
    /// bf16 operands on the tensor cores, f32 accumulation.
    Bf16 {
        /// `x [m, k]` (row stride `ldx`).
        x: &'a DeviceBuffer<bf16>,
        /// `W [n, k]`, dense.
        w: &'a DeviceBuffer<bf16>,
    },
    /// f32 operands, f32 arithmetic (no TF32): the exactness mode.
    F32 {
        /// `x [m, k]` (row stride `ldx`).
        x: &'a DeviceBuffer<f32>,
        /// `W [n, k]`, dense.
        w: &'a DeviceBuffer<f32>,
    },
}

/// The GEMM output buffer and its dtype.
#[derive(Debug)]
pub enum GemmOutput<'a> {
    /// bf16 output (rounded from the f32 accumulator after the epilogue).
    Bf16(&'a mut DeviceBuffer<bf16>),
    /// f32 output.
    F32(&'a mut DeviceBuffer<f32>),
    /// Rows handed to a caller, in the target's dtype (a tower's final projection).
    Rows(crate::RowsTarget<'a>),
}

/// Optional bias `[n]`.
#[derive(Debug, Clone, Copy)]
pub enum GemmBias<'a> {
    /// f32 bias.
    F32(&'a DeviceBuffer<f32>),
    /// bf16 bias.
    Bf16(&'a DeviceBuffer<bf16>),
}

/// Fused epilogue after the bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Epilogue {
    /// Nothing.
    #[default]
    None,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`), as cuBLASLt implements it.
    GeluTanh,
}

/// Shape and strides of one GEMM. Strides and offsets are in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of x and y (tokens).
    pub m: usize,
    /// Output features (rows of W).
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// Row stride of x (≥ k).
    pub ldx: usize,
    /// Row stride of y (≥ n).
    pub ldy: usize,
    /// Element offset of x's first row in its buffer.
    pub x_offset: usize,
    /// Element offset of y's first row in its buffer (e.g. writing into a column block of a wider buffer).
    pub y_offset: usize,
    /// `y += x·Wᵀ (+bias)` instead of `y =` (beta = 1; y is read first).
    pub accumulate: bool,
}

impl GemmShape {
    /// Dense `x [m, k]`, `y [m, n]`, overwrite.
    pub fn dense(m: usize, n: usize, k: usize) -> Self {
        GemmShape {
            m,
            n,
            k,
            ldx: k,
            ldy: n,
            x_offset: 0,
            y_offset: 0,
            accumulate: false,
        }
    }
}

/// How a GEMM shape's cuBLASLt algorithm is chosen, once per shape per [`Device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmTuning {
    /// cuBLASLt's first heuristic answer, untimed (the same choice every run).
    Heuristic,
    /// The fastest of up to [`GEMM_CANDIDATES`] heuristic answers, timed on the call's own buffers
    /// the first time a shape runs outside a graph capture (rows are reproducible within a process).
    #[default]
    Measured,
}

/// How many algorithms cuBLASLt's heuristic is asked for when a shape is tuned.
pub const GEMM_CANDIDATES: usize = 16;

/// Timed runs per candidate when a shape is tuned (after two untimed runs); the median counts.
const TUNE_RUNS: usize = 5;

/// A candidate replaces the heuristic's first answer only when it is this much faster (ratio of
/// medians), so timing noise does not flip the choice between equal algorithms.
const TUNE_MIN_GAIN: f32 = 0.98;

/// What tuning one GEMM shape measured (see [`Device::gemm_tuned`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmTuned {
    /// The shape (offsets zeroed).
    pub shape: GemmShape,
    /// bf16 operands (else f32).
    pub bf16: bool,
    /// Candidates cuBLASLt offered and that ran.
    pub candidates: usize,
    /// Median ms of the heuristic's first answer.
    pub heuristic_ms: f32,
    /// Median ms of the fastest candidate.
    pub best_ms: f32,
    /// Median ms of the candidate kept (the heuristic's unless another beat it by 2 %).
    pub chosen_ms: f32,
    /// Index of the kept candidate in the heuristic's order (0 = its first answer).
    pub chosen: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    shape: GemmShape,
    in_f32: bool,
    out_f32: bool,
    bias: Option<bool>, // Some(true) = f32 bias
    epilogue: Epilogue,
    align: [u32; 4],
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    /// The heuristic's answers, best first (`algo` is one of them).
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
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
struct Plans {
    plans: HashMap<PlanKey, Plan>,
    tuning: GemmTuning,
    tuned: Vec<GemmTuned>,
}

/// The cuBLASLt handle, its workspace and the per-shape plan cache.
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    plans: Mutex<Plans>,
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
const WORKSPACE_BYTES: usize = 32 << 20;

impl Lt {
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let handle = lt::create_handle()?;
        // SAFETY: u8 workspace, contents irrelevant.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(|e| GpuError::from_alloc(e, WORKSPACE_BYTES))?;
        Ok(Lt {
            handle,
            workspace,
            stream: stream.clone(),
            plans: Mutex::new(Plans::default()),
        })
    }
}

fn align_of(addr: u64) -> u32 {
    (1u64 << addr.trailing_zeros().min(8)) as u32
}

unsafe fn set_desc<T>(
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

fn check_len(
    op: &'static str,
    what: &str,
    len: usize,
    offset: usize,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Err(GpuError::shape(
            op,
            format!("{what}: empty matrix {rows}×{cols}"),
        ));
    }
    if ld < cols {
        return Err(GpuError::shape(
            op,
            format!("{what}: row stride {ld} < {cols} columns"),
        ));
    }
    // Checked: the launch's SAFETY argument rests on this bound, and a sum that wraps (release
    // builds do not trap) would pass it with a small number.
    let need = (rows - 1)
        .checked_mul(ld)
        .and_then(|n| n.checked_add(offset))
        .and_then(|n| n.checked_add(cols));
    match need {
        Some(need) if need <= len => Ok(()),
        _ => Err(GpuError::shape(
            op,
            format!(
                "{what}: {rows}×{cols} (stride {ld}, offset {offset}) needs {} elements, buffer has {len}",
                need.map_or("more than usize::MAX".to_string(), |n| n.to_string())
            ),
        )),
    }
}

impl Device {
    /// `y = x·Wᵀ (+ bias) (+ epilogue)` (or `y +=` with `shape.accumulate`), f32 accumulation.
    /// bf16 inputs run on the tensor cores; f32 inputs run in plain f32 (an exactness check).
    pub fn gemm(
        &self,
        inputs: GemmInputs<'_>,
        bias: Option<GemmBias<'_>>,
        out: GemmOutput<'_>,
        shape: GemmShape,
        epilogue: Epilogue,
    ) -> Result<()> {
        const OP: &str = "gemm";
        let s = shape;
        let (x_len, w_len, x_addr, w_addr, in_f32, esz) = match inputs {
            GemmInputs::Bf16 { x, w } => (x.len(), w.len(), x.addr(), w.addr(), false, 2u64),
            GemmInputs::F32 { x, w } => (x.len(), w.len(), x.addr(), w.addr(), true, 4u64),
        };
        check_len(OP, "x", x_len, s.x_offset, s.m, s.k, s.ldx)?;
        check_len(OP, "W", w_len, 0, s.n, s.k, s.k)?;
        let (y_len, y_addr, out_f32, ysz) = match &out {
            GemmOutput::Bf16(y) => (y.len(), y.addr(), false, 2u64),
            GemmOutput::F32(y) => (y.len(), y.addr(), true, 4u64),
            GemmOutput::Rows(t) => {
                self.check_target(t)?;
                let f32 = t.dtype == crate::RowsDtype::F32;
                (t.len, t.addr, f32, t.dtype.size() as u64)
            }
        };
        check_len(OP, "y", y_len, s.y_offset, s.m, s.n, s.ldy)?;
        let (bias_addr, bias_f32) = match bias {
            Some(GemmBias::F32(b)) => {
                check_len(OP, "bias", b.len(), 0, 1, s.n, s.n)?;
                (b.addr(), Some(true))
            }
            Some(GemmBias::Bf16(b)) => {
                check_len(OP, "bias", b.len(), 0, 1, s.n, s.n)?;
                (b.addr(), Some(false))
            }
            None => (0, None),
        };
        if in_f32 && epilogue != Epilogue::None && !out_f32 {
            return Err(GpuError::shape(OP, "f32 inputs need an f32 output"));
        }
        let x_ptr = x_addr + s.x_offset as u64 * esz;
        let y_ptr = y_addr + s.y_offset as u64 * ysz;
        let key = PlanKey {
            shape: GemmShape {
                x_offset: 0,
                y_offset: 0,
                ..s
            },
            in_f32,
            out_f32,
            bias: bias_f32,
            epilogue,
            align: [
                align_of(w_addr),
                align_of(x_ptr),
                align_of(y_ptr),
                align_of(y_ptr),
            ],
        };
        let ptrs = Ptrs {
            w: w_addr,
            x: x_ptr,
            y: y_ptr,
            bias: bias_addr,
        };
        // a panic elsewhere while the lock was held cannot leave a plan half-inserted
        let mut cache = self.lt.plans.lock().unwrap_or_else(|p| p.into_inner());
        let cache = &mut *cache;
        if !cache.plans.contains_key(&key) {
            let mut plan = self.lt.make_plan(&key)?;
            let capturing = self.stream.capture_status()?
                != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            if cache.tuning == GemmTuning::Measured && plan.candidates.len() > 1 && !capturing {
                let tuned = self.tune(&mut plan, &key, ptrs, y_len - s.y_offset, ysz)?;
                cache.tuned.push(tuned);
            }
            cache.plans.insert(key, plan);
        }
        let Some(plan) = cache.plans.get(&key) else {
            return Err(GpuError::shape(OP, "plan cache lost a plan"));
        };
        // SAFETY: every matrix extent was checked against its buffer above and the plan's layouts
        // describe exactly those extents.
        unsafe { self.matmul(plan, &plan.algo, s.accumulate, bias_f32.is_some(), ptrs) }?;
        Ok(())
    }
}

/// Device addresses of one call's operands (y already offset).
#[derive(Clone, Copy)]
struct Ptrs {
    w: u64,
    x: u64,
    y: u64,
    bias: u64,
}

impl Device {
    /// Sets how GEMM algorithms are chosen and forgets every plan (the next call of each shape
    /// plans, and with [`GemmTuning::Measured`] times, anew).
    pub fn set_gemm_tuning(&self, tuning: GemmTuning) {
        let mut cache = self.lt.plans.lock().unwrap_or_else(|p| p.into_inner());
        cache.plans.clear();
        cache.tuned.clear();
        cache.tuning = tuning;
    }

    /// How GEMM algorithms are chosen now.
    pub fn gemm_tuning(&self) -> GemmTuning {
        self.lt
            .plans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tuning
    }

    /// What tuning measured for every shape tuned since the device (or the last
    /// [`Device::set_gemm_tuning`]) started, in first-use order.
    pub fn gemm_tuned(&self) -> Vec<GemmTuned> {
        self.lt
            .plans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tuned
            .clone()
    }

    /// Times every candidate of `plan` on the call's buffers and keeps the fastest. An
    /// accumulating GEMM runs in place like the real call; y's extent is saved to a scratch
    /// buffer first and copied back after, so the call that follows adds onto the untouched y.
    fn tune(
        &self,
        plan: &mut Plan,
        key: &PlanKey,
        p: Ptrs,
        y_extent: usize,
        ysz: u64,
    ) -> Result<GemmTuned> {
        let s = key.shape;
        let y_bytes = y_extent * ysz as usize;
        let scratch = if s.accumulate {
            // SAFETY: a byte buffer that receives a copy of y before it is read.
            Some(
                unsafe { self.stream.alloc::<u8>(y_bytes) }
                    .map_err(|e| GpuError::from_alloc(e, y_bytes))?,
            )
        } else {
            None
        };
        let copy = |dst: u64, src: u64| -> Result<()> {
            // SAFETY: both ranges are y_bytes long: y's checked extent and the scratch of that size.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dst,
                    src,
                    y_bytes,
                    self.stream.cu_stream(),
                )?;
            }
            Ok(())
        };
        let saved = match &scratch {
            Some(buf) => {
                let (a, _g) = buf.device_ptr(&self.stream);
                copy(a, p.y)?;
                Some(a)
            }
            None => None,
        };
        let mut times: Vec<(usize, f32)> = Vec::new();
        for (i, algo) in plan.candidates.iter().enumerate() {
            // SAFETY: as in `gemm`: the extents were checked against the buffers, and y keeps its
            // extent (the real call's in-place C = D).
            let run = || unsafe { self.matmul(plan, algo, s.accumulate, key.bias.is_some(), p) };
            // a candidate cuBLASLt offers but then refuses is skipped; the first must run
            match self.time_ms(2, TUNE_RUNS, run) {
                Ok(t) => times.push((i, t[t.len() / 2])),
                Err(e) if i == 0 => return Err(e),
                Err(_) => {}
            }
        }
        let heuristic_ms = times.first().map_or(0.0, |t| t.1);
        let (best, best_ms) = times
            .iter()
            .copied()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, heuristic_ms));
        let (chosen, chosen_ms) = if best_ms < heuristic_ms * TUNE_MIN_GAIN {
            (best, best_ms)
        } else {
            (0, heuristic_ms)
        };
        if let Some(a) = plan.candidates.get(chosen) {
            plan.algo = *a;
        }
        if let Some(a) = saved {
            copy(p.y, a)?;
        }
        // the copy back is stream-ordered before the scratch is freed (stream-ordered free)
        drop(scratch);
        Ok(GemmTuned {
            shape: s,
            bf16: !key.in_f32,
            candidates: times.len(),
            heuristic_ms,
            best_ms,
            chosen_ms,
            chosen,
        })
    }
}

impl Device {
    /// One cuBLASLt call of `plan` with `algo`: `y (+)= W·x (+ bias)` in place (C = D = y); the bias
    /// pointer is set on the plan's descriptor first.
    ///
    /// # Safety
    /// `p`'s addresses must cover the extents `plan`'s layouts describe, and the buffers must
    /// outlive the stream-ordered call; the caller holds the plan-cache lock (the descriptor is shared).
    unsafe fn matmul(
        &self,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        accumulate: bool,
        bias: bool,
        p: Ptrs,
    ) -> Result<()> {
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0f32 });
        if bias {
            set_desc(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &p.bias,
            )?;
        }
        let (ws, _g) = self.lt.workspace.device_ptr(&self.lt.stream);
        lt::matmul(
            self.lt.handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            w_ptr_cast(p.w),
            plan.a,
            w_ptr_cast(p.x),
            plan.b,
            w_ptr_cast(p.y),
            plan.c,
            p.y as *mut c_void,
            plan.c,
            algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            self.stream.cu_stream() as *mut _,
        )?;
        Ok(())
    }
}

fn w_ptr_cast(a: u64) -> *const c_void {
    a as *const c_void
}

impl Lt {
    fn make_plan(&self, key: &PlanKey) -> Result<Plan> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        use sys::cudaDataType_t as T;
        let s = key.shape;
        let in_t = if key.in_f32 {
            T::CUDA_R_32F
        } else {
            T::CUDA_R_16BF
        };
        let out_t = if key.out_f32 {
            T::CUDA_R_32F
        } else {
            T::CUDA_R_16BF
        };
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
            if let Some(f) = key.bias {
                let bt = if f { T::CUDA_R_32F } else { T::CUDA_R_16BF };
                set_desc(desc, D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt)?;
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
                let mut found: std::ffi::c_int = 0;
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    desc,
                    a,
                    b,
                    c,
                    c,
                    pref,
                    GEMM_CANDIDATES as std::ffi::c_int,
                    results.as_mut_ptr(),
                    &mut found,
                )
                .result()?;
                results.truncate(found.max(0) as usize);
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
                .ok_or(GpuError::CublasLt(lt::CublasError(
                    sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
                )))?;
        }
        Ok(plan)
    }
}

#[allow(dead_code)]
fn _assert_elem<T: Elem>() {}

#[cfg(test)]
mod tests {
    use super::check_len;

    /// The GEMM operand check on the host: `offset + (rows − 1)·ld + cols` in checked arithmetic,
    /// so offsets and strides that would wrap in a release build are errors.
    #[test]
    fn operand_extent_check_never_wraps() {
        let ok = |len, offset, rows, cols, ld| check_len("gemm", "x", len, offset, rows, cols, ld);
        assert!(ok(12, 0, 3, 4, 4).is_ok());
        assert!(ok(11, 0, 3, 4, 4).is_err());
        assert!(ok(30, 6, 3, 4, 10).is_ok());
        assert!(ok(29, 6, 3, 4, 10).is_err());
        assert!(ok(100, 0, 0, 4, 4).is_err());
        assert!(ok(100, 0, 2, 4, 3).is_err(), "ld < cols");
        let half = 1usize << (usize::BITS - 1);
        // (rows − 1)·ld wraps to 0
        assert!(ok(16, 0, 3, 4, half).is_err());
        assert!(ok(16, 0, 2, 4, half).is_err(), "no wrap, just too large");
        // offset + … wraps
        assert!(ok(16, usize::MAX, 1, 4, 4).is_err());
        assert!(ok(16, half, 3, 4, half / 2).is_err());
        assert!(ok(usize::MAX, 1, usize::MAX, 1, 1).is_err());
        let e = ok(16, 0, 3, 4, half).unwrap_err().to_string();
        assert!(e.contains("more than usize::MAX"), "{e}");
    }
}
