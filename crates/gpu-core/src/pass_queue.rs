//! A queue of passes whose rows are read back to the host while the next pass runs
//! ([`PassQueue`]): what a stream of passes needs so the device never waits for the host
//! between two passes.
//!
//! A pass launched into the tower's workspace must have its rows read back before the next pass
//! may overwrite them, so the host's readback (the copy to the host, then the copies into each
//! image's rows) used to sit between two passes with the device idle: 46 ms a pass on the H100
//! host for step3p7's 55 MB of f32 rows, most of it page faults in fresh host memory
//! (docs/PERF.md v0.31). Here each pass's projection writes into rows buffers of the queue's own
//! (two, reused), the readback runs on a stream of its own into page-locked memory kept between
//! passes, and the caller launches pass k+1 before it collects pass k.

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{result, CudaStream, PinnedHostSlice};

use crate::staging::pinned;
use crate::tower::TowerResult;
use crate::{Batch, Device, DeviceTower, GpuError, OwnedRows, Result, RowsDtype};

/// Passes a [`PassQueue`] holds launched and not yet collected, at most: the one the device runs
/// and the one whose rows the host reads back. A third launch would need a third rows buffer
/// and gain nothing (the device runs one pass at a time).
pub const PASSES_IN_FLIGHT: usize = 2;

/// Page-locked host memory and the stream the rows are read back on (created on the first read).
struct Readback {
    stream: Arc<CudaStream>,
    /// Grown to the largest pass read so far.
    host: PinnedHostSlice<f32>,
}

impl Readback {
    /// Copies the first `len` elements of `rows` (f32) into the page-locked memory once the tower
    /// wrote them (blocks) and hands them out, valid until the next read.
    fn read(&mut self, dev: &Device, rows: &OwnedRows, len: usize) -> Result<&[f32]> {
        if rows.dtype() != RowsDtype::F32 || len > rows.len() {
            return Err(GpuError::shape(
                "pass rows",
                format!(
                    "{len} f32 elements read from {} of {}",
                    rows.len(),
                    rows.dtype().name()
                ),
            ));
        }
        if len > self.host.len() {
            // the old memory goes first: no copy reads it (every read waits for its copy)
            self.host = pinned(dev, len)?;
        }
        dev.ctx.bind_to_thread()?;
        self.stream.wait(rows.ready())?;
        let host = &mut self.host.as_mut_slice()?[..len];
        if len > 0 {
            // SAFETY: `rows` holds at least `len` f32 elements of device memory of this context
            // (checked above), written once `ready` is reached, which the stream waits for first;
            // `host` is page-locked memory of `len` elements, not touched until the stream is
            // synchronized below.
            unsafe { result::memcpy_dtoh_async(host, rows.addr(), self.stream.cu_stream()) }?;
        }
        self.stream.synchronize()?;
        Ok(host)
    }
}

/// One pass launched and not yet collected.
struct Flight<M> {
    batch: Batch<M>,
    rows: OwnedRows,
    /// Elements of `rows` the pass wrote.
    len: usize,
}

/// Passes launched on a tower with their rows in buffers of the queue's own, collected in launch
/// order while later passes run (module docs). A caller keeps at most [`PASSES_IN_FLIGHT`]
/// passes launched: launch pass k+1, then collect pass k, whose rows are read back while k+1 runs.
pub struct PassQueue<M> {
    in_flight: VecDeque<Flight<M>>,
    /// Rows buffers of collected passes, for the next launches.
    spare: Vec<OwnedRows>,
    readback: Option<Readback>,
}

impl<M> Default for PassQueue<M> {
    fn default() -> Self {
        PassQueue {
            in_flight: VecDeque::new(),
            spare: Vec::new(),
            readback: None,
        }
    }
}

impl<M> std::fmt::Debug for PassQueue<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassQueue")
            .field("in_flight", &self.in_flight.len())
            .field("spare", &self.spare)
            .finish()
    }
}

impl<M> PassQueue<M> {
    /// An empty queue (it allocates on the first launch).
    pub fn new() -> Self {
        Self::default()
    }

    /// Passes launched and not yet collected.
    pub fn len(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether no pass is waiting to be collected.
    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// Queues `batch`'s pass on `tower` with its rows written into a buffer of the queue's own
    /// ([`DeviceTower::launch_into`]) and returns at once (an f16 tower's rows are checked when
    /// collected). An error when [`PASSES_IN_FLIGHT`] passes wait to be collected already.
    pub fn launch<T: DeviceTower<Meta = M>>(
        &mut self,
        tower: &mut T,
        batch: Batch<M>,
    ) -> TowerResult<(), T> {
        if self.in_flight.len() >= PASSES_IN_FLIGHT {
            return Err(T::unsupported(format!(
                "{PASSES_IN_FLIGHT} passes wait to be collected: collect one before the next launch"
            )));
        }
        let len = T::batch_rows(&batch)
            .checked_mul(tower.width())
            .ok_or_else(|| T::unsupported("the pass's rows overflow".into()))?;
        let mut rows = match self.spare.iter().position(|r| r.len() >= len) {
            Some(i) => self.spare.swap_remove(i),
            None => {
                self.spare.clear(); // too small: freed before the larger one is taken
                tower.device().alloc_rows(len, RowsDtype::F32)?
            }
        };
        let launched = rows
            .target()
            .range(0, len)
            .map_err(Into::into)
            .and_then(|target| tower.launch_into(&batch, target));
        // recorded after whatever the launch queued, even a failed one's: the buffer is read
        // and freed only after it
        let marked = tower.device().mark_ready(&rows).map_err(Into::into);
        match launched.and(marked) {
            Ok(()) => {
                self.in_flight.push_back(Flight { batch, rows, len });
                Ok(())
            }
            Err(e) => {
                self.spare.push(rows);
                Err(e)
            }
        }
    }

    /// The rows of the oldest pass launched, per image (waits for it; `None` when none is
    /// launched): read back on a stream of their own into page-locked memory, then split
    /// ([`DeviceTower::rows_of`]: in f16 an error when any is not finite).
    #[allow(clippy::type_complexity)]
    pub fn collect<T: DeviceTower<Meta = M>>(
        &mut self,
        tower: &T,
    ) -> TowerResult<Option<Vec<T::Rows>>, T> {
        let Some(Flight { batch, rows, len }) = self.in_flight.pop_front() else {
            return Ok(None);
        };
        let dev = tower.device();
        let readback = match &mut self.readback {
            Some(r) => r,
            None => self.readback.insert(Readback {
                stream: dev.ctx.new_stream().map_err(GpuError::from)?,
                host: pinned(dev, len)?,
            }),
        };
        let read = readback.read(dev, &rows, len);
        // the buffer is free again whatever the read gave: its copy has finished (or never ran)
        self.spare.push(rows);
        Ok(Some(tower.rows_of(&batch, read?)?))
    }
}
