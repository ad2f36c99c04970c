//! Every family's CUDA tower behind one path: the facade's plumbing (a pass, a stream session,
//! rows into a device buffer, graphs) is written once over [`gpu_core::DeviceTower`]; a family
//! only says which of the request's inputs are its own and how its errors read.

use std::any::Any;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, PoisonError};

use gpu_core::{Batch, DeviceTower, GraphStats, GraphStatus, HostBatch, Precision, RowsTarget};
use tower_gemma::GemmaCuda;
use tower_glm5::GlmCuda;
use tower_step::StepCuda;

use crate::device_rows::{Dest, DeviceResult, DeviceRows, Job};
use crate::inputs::Images;
use crate::tower_error::{cuda_err, InputError};
use tower_core::ClassifiedError;

/// What the facade needs of a family's CUDA tower beyond the contract: its inputs among a
/// request's. Its errors are gpu-core's one `CudaError` over the family's own error, mapped once
/// (`cuda_err`).
pub(crate) trait CudaFamily: DeviceTower<Meta: 'static, Family = Self::Refusal> + 'static {
    /// The family's own error (the weights or the input are wrong).
    type Refusal: ClassifiedError;

    /// The request's inputs when they are this family's.
    fn inputs<'b, 'a>(images: &'b Images<'a>) -> Option<&'b [Self::Image<'a>]>;
}

impl CudaFamily for GemmaCuda {
    type Refusal = tower_gemma::GemmaError;

    fn inputs<'b, 'a>(images: &'b Images<'a>) -> Option<&'b [Self::Image<'a>]> {
        match images {
            Images::Gemma4(v) => Some(v),
            _ => None,
        }
    }
}

impl CudaFamily for GlmCuda {
    type Refusal = tower_glm5::GlmError;

    fn inputs<'b, 'a>(images: &'b Images<'a>) -> Option<&'b [Self::Image<'a>]> {
        match images {
            Images::Glm(v) => Some(v),
            _ => None,
        }
    }
}

impl CudaFamily for StepCuda {
    type Refusal = tower_step::StepError;

    fn inputs<'b, 'a>(images: &'b Images<'a>) -> Option<&'b [Self::Image<'a>]> {
        match images {
            Images::Step3p7(v) => Some(v),
            _ => None,
        }
    }
}

/// A family's CUDA tower as the facade holds it: the config on the host, the tower behind a
/// mutex (its runs need `&mut`; CUDA passes from several threads take turns).
#[derive(Debug)]
pub(crate) struct Cuda<T: DeviceTower> {
    pub(crate) config: T::Config,
    pub(crate) cuda: Mutex<T>,
}

impl<T: DeviceTower> Cuda<T> {
    fn lock(&self) -> MutexGuard<'_, T> {
        self.cuda.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The one path over every family's CUDA tower (object-safe: the facade holds `&dyn`). A
/// method that takes the request's inputs answers `None` when they are another family's.
pub(crate) trait CudaEngine {
    /// Turns graph replay on or off.
    fn set_graphs(&mut self, on: bool);
    /// Graph status (waits for a pass in progress).
    fn graph_status(&self) -> GraphStatus;
    /// Graph statistics (waits for a pass in progress).
    fn graph_stats(&self) -> GraphStats;
    /// One synchronous pass over `images[range]` (`patches` in all): rows per image.
    fn pass(
        &self,
        images: &Images<'_>,
        range: Range<usize>,
        patches: usize,
    ) -> Option<Result<Vec<Vec<f32>>, InputError>>;
    /// The host half of a pass (no device): a family's host batch, type-erased.
    fn pass_input(
        &self,
        precision: Precision,
        images: &Images<'_>,
        patches: usize,
    ) -> Option<Result<Box<dyn Any + Send>, InputError>>;
    /// A device encode's passes, rows into one device buffer.
    fn run_device(
        &self,
        job: &Job<'_>,
        images: &Images<'_>,
    ) -> Option<Result<DeviceResult, InputError>>;
    /// The tower held for a stream of passes (its lock taken until the session drops).
    fn session(&self) -> Box<dyn CudaSession + '_>;
}

impl<T: CudaFamily> CudaEngine for Cuda<T> {
    fn set_graphs(&mut self, on: bool) {
        self.cuda
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .set_graphs(on);
    }

    fn graph_status(&self) -> GraphStatus {
        self.lock().graph_status().clone()
    }

    fn graph_stats(&self) -> GraphStats {
        self.lock().graph_stats()
    }

    fn pass(
        &self,
        images: &Images<'_>,
        range: Range<usize>,
        patches: usize,
    ) -> Option<Result<Vec<Vec<f32>>, InputError>> {
        let v = T::inputs(images)?;
        let mut c = self.lock();
        let run = |c: &mut T| {
            let batch = c.prepare(&v[range])?;
            c.run_pass(&batch)?;
            c.pass_rows(&batch)
        };
        Some(run(&mut c).map_err(|e| cuda_err(e, patches)))
    }

    fn pass_input(
        &self,
        precision: Precision,
        images: &Images<'_>,
        patches: usize,
    ) -> Option<Result<Box<dyn Any + Send>, InputError>> {
        let v = T::inputs(images)?;
        Some(
            T::prepare_host(&self.config, precision, v)
                .map(|b| Box::new(b) as Box<dyn Any + Send>)
                .map_err(|e| cuda_err(e, patches)),
        )
    }

    fn run_device(
        &self,
        job: &Job<'_>,
        images: &Images<'_>,
    ) -> Option<Result<DeviceResult, InputError>> {
        let v = T::inputs(images)?;
        Some(run_job(job, &self.cuda, &self.config, v))
    }

    fn session(&self) -> Box<dyn CudaSession + '_> {
        Box::new(Held::<T> {
            tower: self.lock(),
            in_flight: None,
        })
    }
}

/// A CUDA tower held for a stream of passes: stage, launch, collect (see `session.rs`).
pub(crate) trait CudaSession {
    /// Stages a host batch made by [`CudaEngine::pass_input`] (`None` if it is another
    /// family's): its upload is queued on the copy stream.
    fn stage(
        &mut self,
        input: Box<dyn Any + Send>,
        patches: usize,
    ) -> Option<Result<Box<dyn Any>, InputError>>;
    /// Launches a staged batch (`None` if it is another family's); queued, returns at once.
    fn launch(&mut self, staged: Box<dyn Any>, patches: usize) -> Option<Result<(), InputError>>;
    /// The rows of the pass in flight, per image (waits); `None` when none is in flight.
    fn collect(&mut self, patches: usize) -> Result<Option<Vec<Vec<f32>>>, InputError>;
}

/// The lock of a family's tower and the batch it runs.
struct Held<'a, T: DeviceTower> {
    tower: MutexGuard<'a, T>,
    in_flight: Option<Batch<T::Meta>>,
}

impl<T: CudaFamily> CudaSession for Held<'_, T> {
    fn stage(
        &mut self,
        input: Box<dyn Any + Send>,
        patches: usize,
    ) -> Option<Result<Box<dyn Any>, InputError>> {
        let host = input.downcast::<HostBatch<T::Meta>>().ok()?;
        Some(
            self.tower
                .stage(*host)
                .map(|b| Box::new(b) as Box<dyn Any>)
                .map_err(|e| cuda_err(e, patches)),
        )
    }

    fn launch(&mut self, staged: Box<dyn Any>, patches: usize) -> Option<Result<(), InputError>> {
        let batch = staged.downcast::<Batch<T::Meta>>().ok()?;
        Some(match self.tower.run_pass(&batch) {
            Ok(()) => {
                self.in_flight = Some(*batch);
                Ok(())
            }
            Err(e) => Err(cuda_err(e, patches)),
        })
    }

    fn collect(&mut self, patches: usize) -> Result<Option<Vec<Vec<f32>>>, InputError> {
        match self.in_flight.take() {
            Some(b) => Ok(Some(
                self.tower.pass_rows(&b).map_err(|e| cuda_err(e, patches))?,
            )),
            None => Ok(None),
        }
    }
}

/// Runs `job`'s passes on `cuda` (a tower of `config`) over its family's `images`, rows into
/// the job's destination.
pub(crate) fn run_job<T: CudaFamily>(
    job: &Job<'_>,
    cuda: &Mutex<T>,
    config: &T::Config,
    images: &[T::Image<'_>],
) -> Result<DeviceResult, InputError> {
    // The host half of every pass first, before the device is taken.
    let mut hosts = Vec::with_capacity(job.passes.len());
    let mut rows_per_image = Vec::with_capacity(images.len());
    for range in job.passes {
        let host = T::prepare_host(config, job.precision, &images[range.clone()])
            .map_err(|e| job.in_pass(range, cuda_err(e, job.pass_patches(range))))?;
        let rows = T::rows_per_image(&host);
        hosts.push((host, rows.iter().sum::<usize>()));
        rows_per_image.extend(rows);
    }
    let total: usize = rows_per_image.iter().sum();
    let mut tower = cuda.lock().unwrap_or_else(PoisonError::into_inner);
    let width = tower.width();
    let dev = tower.device().clone();
    let all_patches = job.patches.iter().fold(0usize, |a, &p| a.saturating_add(p));
    let gpu = |e: gpu_core::GpuError| InputError::gpu(e, all_patches);
    let need = total
        .checked_mul(width)
        .ok_or_else(|| InputError::Message(format!("{total} rows of {width} overflow")))?;
    let mut owned = None;
    let mut target: RowsTarget<'_> = match job.dest {
        Dest::Owned(dtype) => owned
            .insert(dev.alloc_rows(need, dtype).map_err(gpu)?)
            .target(),
        Dest::Caller(out) => {
            if out.len < need {
                return Err(InputError::Message(format!(
                    "the output holds {} elements, the rows need {total} × {width} = {need}",
                    out.len
                )));
            }
            if out.ordinal != dev.ordinal() {
                return Err(InputError::Message(format!(
                    "the output is on cuda:{}, the model on cuda:{}",
                    out.ordinal,
                    dev.ordinal()
                )));
            }
            // SAFETY: DeviceOut::new's contract: a live stream of this device's context.
            unsafe { dev.wait_for_stream(out.stream) }.map_err(gpu)?;
            // SAFETY: DeviceOut::new's contract: `len` elements of device memory of this
            // device, ordered after the caller's stream by the wait just queued.
            unsafe { RowsTarget::from_raw(out.addr, out.len, out.dtype, out.ordinal) }
        }
    };
    let mut row = 0;
    let mut result = Ok(());
    for ((host, rows), range) in hosts.into_iter().zip(job.passes) {
        let n = job.pass_patches(range);
        let pass = |tower: &mut T, target: &mut RowsTarget<'_>| -> Result<(), InputError> {
            let batch = tower.stage(host).map_err(|e| cuda_err(e, n))?;
            let out = target.range(row * width, rows * width).map_err(gpu)?;
            tower.run_into(&batch, out).map_err(|e| cuda_err(e, n))?;
            Ok(())
        };
        result = pass(&mut tower, &mut target).map_err(|e| job.in_pass(range, e));
        if result.is_err() {
            break;
        }
        row += rows;
    }
    // Ordered after everything queued, a failed pass too: the memory is freed (or handed to
    // the caller's stream) only after the kernels that may still write it.
    let ordered = match (&job.dest, &owned) {
        (Dest::Owned(_), Some(o)) => dev.mark_ready(o),
        // SAFETY: DeviceOut::new's contract, as above.
        (Dest::Caller(out), _) => unsafe { dev.signal_stream(out.stream) },
        (Dest::Owned(_), None) => Ok(()),
    };
    result?;
    ordered.map_err(gpu)?;
    let mut offsets = Vec::with_capacity(rows_per_image.len() + 1);
    offsets.push(0);
    for r in &rows_per_image {
        offsets.push(offsets.last().copied().unwrap_or(0) + r);
    }
    Ok(DeviceResult {
        owned: owned.map(|owned| DeviceRows::new(owned, offsets, width)),
        rows_per_image,
    })
}
