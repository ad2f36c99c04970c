//! GEMM `y = x·Wᵀ (+ bias) (+ GELU-tanh)` through cuBLASLt, f32 accumulation; bf16, f16 or f32
//! operands.
//!
//! Row-major `x [m, k]`, `W [n, k]` (PyTorch `Linear.weight`), `y [m, n]`. In cuBLASLt's
//! column-major terms this is `yᵀ (n×m) = op_T(W) (n×k) · xᵀ (k×m)`, so the bias (one value per
//! output feature) is cuBLASLt's per-row bias of D.
use std::ffi::c_void;

use cudarc::cublaslt::sys;
use cudarc::driver::DevicePtr;
use half::{bf16, f16};

use crate::device::{DeviceBuffer, Elem};
use crate::{Device, GpuError, Result};

pub(crate) mod lt_cache;
pub mod lt_lib;
mod shape;

use lt_lib as lt;

use lt_cache::{set_desc, Dtype, Plan, PlanKey, WORKSPACE_BYTES};
pub use shape::{Epilogue, GemmShape, GemmTuned, GemmTuning, GEMM_CANDIDATES, GEMM_TUNING_ENV};

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
    /// f16 operands on the tensor cores, f32 accumulation (Turing's tensor cores have no bf16).
    F16 {
        /// `x [m, k]` (row stride `ldx`).
        x: &'a DeviceBuffer<f16>,
        /// `W [n, k]`, dense.
        w: &'a DeviceBuffer<f16>,
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
    /// f16 output (rounded from the f32 accumulator after the epilogue; ±∞ beyond ±65504).
    F16(&'a mut DeviceBuffer<f16>),
    /// f32 output.
    F32(&'a mut DeviceBuffer<f32>),
    /// Rows handed to a caller, in the target's dtype (a tower's final projection).
    Rows(crate::RowsTarget<'a>),
}

impl<'a> GemmOutput<'a> {
    /// A tower's projection output: the caller's target when there is one, else the
    /// workspace's f32 rows.
    pub fn rows_or(target: Option<crate::RowsTarget<'a>>, rows: &'a mut DeviceBuffer<f32>) -> Self {
        match target {
            Some(t) => GemmOutput::Rows(t),
            None => GemmOutput::F32(rows),
        }
    }
}

/// Optional bias `[n]`.
#[derive(Debug, Clone, Copy)]
pub enum GemmBias<'a> {
    /// f32 bias.
    F32(&'a DeviceBuffer<f32>),
    /// bf16 bias.
    Bf16(&'a DeviceBuffer<bf16>),
    /// f16 bias (for an f16 output: a 16-bit output takes its bias in its own type).
    F16(&'a DeviceBuffer<f16>),
}

/// Timed runs per candidate when a shape is tuned (after two untimed runs); the median counts.
const TUNE_RUNS: usize = 5;

/// A candidate replaces the heuristic's first answer only when it is this much faster (ratio of
/// medians), so timing noise does not flip the choice between equal algorithms.
const TUNE_MIN_GAIN: f32 = 0.98;

/// The output alignment every GEMM is planned for, at most: a plan is keyed on its operands'
/// alignments, and two plans of one shape are tuned apart and may pick algorithms whose f32
/// sums differ in the last bit. A tower's rows land in its own buffer (`encode`, 256-byte
/// aligned) or in a caller's at an offset (`encode_device`: the second pass of a multi-pass
/// encode starts `rows × width` elements in), and both must be the same rows, bitwise: so an
/// output aligned to 16 bytes or more is planned as 16 (what cuBLASLt's vector loads and TMA
/// need). One aligned below that still gets a plan of its own, since a plan for 16 would fault
/// there. Measured on the H100 (2026-12-06): capping only the caller's target left `encode` and
/// `encode_device` f32 rows 1.1e-7–1.7e-7 apart (rel-L2), on one pass and on two.
const OUT_ALIGN_PLAN: u32 = 16;

fn align_of(addr: u64) -> u32 {
    (1u64 << addr.trailing_zeros().min(8)) as u32
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
    /// bf16 and f16 inputs run on the tensor cores (f16 on every tier, bf16 from 8.0); f32 inputs
    /// run in plain f32 (an exactness check).
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
        let (x_len, w_len, x_addr, w_addr, input) = match inputs {
            GemmInputs::Bf16 { x, w } => (x.len(), w.len(), x.addr(), w.addr(), Dtype::Bf16),
            GemmInputs::F16 { x, w } => (x.len(), w.len(), x.addr(), w.addr(), Dtype::F16),
            GemmInputs::F32 { x, w } => (x.len(), w.len(), x.addr(), w.addr(), Dtype::F32),
        };
        let in_f32 = input == Dtype::F32;
        check_len(OP, "x", x_len, s.x_offset, s.m, s.k, s.ldx)?;
        check_len(OP, "W", w_len, 0, s.n, s.k, s.k)?;
        let (y_len, y_addr, output) = match &out {
            GemmOutput::Bf16(y) => (y.len(), y.addr(), Dtype::Bf16),
            GemmOutput::F16(y) => (y.len(), y.addr(), Dtype::F16),
            GemmOutput::F32(y) => (y.len(), y.addr(), Dtype::F32),
            GemmOutput::Rows(t) => {
                self.check_target(t)?;
                let dtype = match t.dtype {
                    crate::RowsDtype::F32 => Dtype::F32,
                    crate::RowsDtype::Bf16 => Dtype::Bf16,
                    crate::RowsDtype::F16 => Dtype::F16,
                };
                (t.len, t.addr, dtype)
            }
        };
        let (out_f32, esz, ysz) = (output == Dtype::F32, input.size(), output.size());
        check_len(OP, "y", y_len, s.y_offset, s.m, s.n, s.ldy)?;
        let (bias_addr, bias_dtype) = match bias {
            Some(GemmBias::F32(b)) => {
                check_len(OP, "bias", b.len(), 0, 1, s.n, s.n)?;
                (b.addr(), Some(Dtype::F32))
            }
            Some(GemmBias::Bf16(b)) => {
                check_len(OP, "bias", b.len(), 0, 1, s.n, s.n)?;
                (b.addr(), Some(Dtype::Bf16))
            }
            Some(GemmBias::F16(b)) => {
                check_len(OP, "bias", b.len(), 0, 1, s.n, s.n)?;
                (b.addr(), Some(Dtype::F16))
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
            input,
            output,
            bias: bias_dtype,
            epilogue,
            align: [
                align_of(w_addr),
                align_of(x_ptr),
                align_of(y_ptr).min(OUT_ALIGN_PLAN),
                align_of(y_ptr).min(OUT_ALIGN_PLAN),
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
        let open = self.prof_open(|| {
            let acc = if s.accumulate { " +C" } else { "" };
            let dtype = match input {
                Dtype::Bf16 => "",
                Dtype::F16 => " f16",
                Dtype::F32 => " f32",
            };
            format!("gemm {}×{}×{}{acc}{dtype}", s.m, s.n, s.k)
        })?;
        // SAFETY: every matrix extent was checked against its buffer above and the plan's layouts
        // describe exactly those extents.
        unsafe { self.matmul(plan, &plan.algo, s.accumulate, bias_dtype.is_some(), ptrs) }?;
        self.prof_close(open)
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
            bf16: key.input == Dtype::Bf16,
            f16: key.input == Dtype::F16,
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
