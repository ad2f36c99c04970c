//! Every family's CUDA tower behind one path, written once over [`gpu_core::DeviceTower`]: a
//! device encode's passes into one device buffer ([`run_job`]) and the CUDA session of a stream
//! of passes ([`cuda_session`]: each pass staged, launched and collected with the tower's lock
//! held).

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use gpu_core::{Batch, DeviceTower, HostBatch, HostCopy, PassQueue, RowsTarget};
use tower_core::ClassifiedError;

use crate::device_rows::{Dest, DeviceResult, DeviceRows, Job, RequestTimings};
use crate::session::{not_staged, Inbox, PassTicket, StreamSession};
use crate::tower_error::{cuda_err, InputError};

/// The CUDA path's session: the tower's lock, the staged batch and the passes launched, whose
/// rows are read back while the next pass runs ([`PassQueue`]).
struct CudaSession<'a, T: DeviceTower> {
    tower: MutexGuard<'a, T>,
    inbox: Inbox<HostBatch<T::Meta>>,
    staged: Option<Batch<T::Meta>>,
    launched: PassQueue<T::Meta>,
    /// Patches of the passes launched, oldest first (for out-of-memory messages).
    patches: VecDeque<usize>,
}

impl<T: DeviceTower<Family: ClassifiedError>> StreamSession for CudaSession<'_, T> {
    fn stage(&mut self, ticket: PassTicket, patches: usize) -> Result<(), InputError> {
        let host = self.inbox.take(ticket)?;
        // The device's thread stages while the producer keeps the pool busy with the next pass.
        let batch = self
            .tower
            .stage(host, HostCopy::OneThread)
            .map_err(|e| cuda_err(e, patches))?;
        self.staged = Some(batch);
        Ok(())
    }

    fn launch(&mut self, patches: usize) -> Result<(), InputError> {
        let batch = self.staged.take().ok_or_else(not_staged)?;
        self.launched
            .launch(&mut *self.tower, batch)
            .map_err(|e| cuda_err(e, patches))?;
        self.patches.push_back(patches);
        Ok(())
    }

    fn collect(&mut self) -> Result<Option<Vec<Vec<f32>>>, InputError> {
        let patches = self.patches.pop_front().unwrap_or(0);
        let rows = self
            .launched
            .collect(&*self.tower)
            .map_err(|e| cuda_err(e, patches))?;
        Ok(rows.map(|r| r.into_iter().map(Into::into).collect()))
    }
}

/// The CUDA session of a stream: `tower` (its lock held until the session drops) stages,
/// launches and collects the passes that arrive in `inbox`.
pub(crate) fn cuda_session<'a, T: DeviceTower<Family: ClassifiedError>>(
    tower: MutexGuard<'a, T>,
    inbox: Inbox<HostBatch<T::Meta>>,
) -> Box<dyn StreamSession + 'a> {
    Box::new(CudaSession {
        tower,
        inbox,
        staged: None,
        launched: PassQueue::new(),
        patches: VecDeque::new(),
    })
}

/// The lock of a CUDA tower (a panic in another pass does not poison it for good).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `job`'s passes on `cuda` (a tower of `config`) over its family's `images`, rows into
/// the job's destination.
pub(crate) fn run_job<T: DeviceTower<Family: ClassifiedError>>(
    job: &Job<'_>,
    cuda: &Mutex<T>,
    config: &T::Config,
    images: &[T::Image<'_>],
) -> Result<DeviceResult, InputError> {
    // The host half of every pass first, before the device is taken.
    let start = Instant::now();
    let mut timings = RequestTimings::default();
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
    let laid_out = Instant::now();
    timings.host_layout = laid_out - start;
    let mut tower = lock(cuda);
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
    let mut mark = Instant::now();
    timings.device_setup = mark - laid_out;
    let mut row = 0;
    let mut result = Ok(());
    for ((host, rows), range) in hosts.into_iter().zip(job.passes) {
        let n = job.pass_patches(range);
        let pass = |tower: &mut T, target: &mut RowsTarget<'_>| -> Result<(), InputError> {
            // Every pass of the request was prepared above, so the cores are idle here.
            let batch = tower
                .stage(host, HostCopy::Spread)
                .map_err(|e| cuda_err(e, n))?;
            let staged = Instant::now();
            timings.upload += staged - mark;
            mark = staged;
            let out = target.range(row * width, rows * width).map_err(gpu)?;
            tower.run_into(&batch, out).map_err(|e| cuda_err(e, n))?;
            let queued = Instant::now();
            timings.launch += queued - mark;
            mark = queued;
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
    timings.launch += mark.elapsed();
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
        timings,
    })
}
