//! The state every CUDA tower keeps between passes, written once: the CUDA graphs of its
//! forward, the uploader of staged batches and the workspace. A family keeps its weights, its
//! workspace layout (`W`), its planning and its op sequence; the lifecycle around them is here.

use std::sync::Arc;

use crate::{
    attention_head_dim, CudaError, Device, DeviceInputs, GraphStats, GraphStatus, Graphs, HostCopy,
    HostInputs, InputBuffers, Precision, Result, Uploader,
};

/// What every family's CUDA tower holds beside its weights, written once: the device, the
/// config, the precision of the GEMMs, the head dim attention runs at, and the [`PassRunner`].
#[derive(Debug)]
pub struct TowerBase<C, W> {
    /// The device the tower runs on.
    pub dev: Arc<Device>,
    /// The family's dimensions and laws.
    pub cfg: C,
    /// The precision the weights were uploaded in.
    pub precision: Precision,
    /// Head dim the attention kernels run at (`head_dim`, or the next kernel size when padded).
    pub kd: usize,
    /// The LM width of the rows.
    pub width: usize,
    /// Graphs, uploader and workspace: the lifecycle every tower shares.
    pub passes: PassRunner<W>,
}

impl<C, W> TowerBase<C, W> {
    /// The base of a tower of `cfg` with heads of `head_dim` and rows `width` wide on `dev` in
    /// `precision`: refused when
    /// the device's tier lacks the precision ([`Device::precision_refusal`]) or the attention
    /// kernels the head dim ([`attention_head_dim`]).
    pub fn new<F: std::error::Error + 'static>(
        dev: Arc<Device>,
        cfg: C,
        precision: Precision,
        head_dim: usize,
        width: usize,
    ) -> std::result::Result<Self, CudaError<F>> {
        if let Some(why) = dev.precision_refusal(precision) {
            return Err(CudaError::Unsupported(why));
        }
        let kd = attention_head_dim(precision, head_dim)
            .map_err(|e| CudaError::Unsupported(e.to_string()))?;
        Ok(TowerBase {
            dev,
            cfg,
            precision,
            kd,
            width,
            passes: PassRunner::default(),
        })
    }
}

/// Graphs, uploader and workspace of one tower (see the module docs).
#[derive(Debug)]
pub struct PassRunner<W> {
    // Declared (so dropped) in the order the towers held them: workspace, graphs, uploader.
    /// The buffers of a pass, kept between calls and grown on demand.
    ws: Option<W>,
    /// CUDA graphs of the 16-bit (bf16, f16) forward, per batch layout.
    graphs: Graphs,
    /// Asynchronous uploads of staged batches (created on the first [`PassRunner::stage`]).
    uploader: Option<Uploader>,
}

impl<W> Default for PassRunner<W> {
    fn default() -> Self {
        PassRunner {
            ws: None,
            graphs: Graphs::default(),
            uploader: None,
        }
    }
}

impl<W> PassRunner<W> {
    /// Queues the upload of a host-prepared batch's inputs from page-locked memory on a copy
    /// stream of its own and returns at once; valid until two more are staged. `copy` says
    /// which threads copy the inputs into the page-locked memory.
    pub fn stage(
        &mut self,
        dev: &Device,
        precision: Precision,
        host: &HostInputs,
        copy: HostCopy,
    ) -> Result<DeviceInputs> {
        Uploader::stage_into(&mut self.uploader, dev, precision, host, copy)
    }

    /// Turns CUDA graphs of the 16-bit forward on (the default) or off (every forward eager).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set_enabled(on);
    }

    /// Whether CUDA graphs are used and, if a capture failed, why not.
    pub fn graph_status(&self) -> &GraphStatus {
        self.graphs.status()
    }

    /// What the graph cache did so far (captures, replays, eager forwards).
    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.stats()
    }

    /// The workspace, if one was allocated.
    pub fn workspace(&self) -> Option<&W> {
        self.ws.as_ref()
    }

    /// Replaces the workspace by `alloc`'s: the old one is freed first and the graphs, which
    /// address its buffers, are dropped; on an error the tower is left without a workspace.
    pub fn regrow<E>(
        &mut self,
        alloc: impl FnOnce() -> std::result::Result<W, E>,
    ) -> std::result::Result<(), E> {
        self.ws = None; // free the old one first
        self.graphs.invalidate(); // the graphs address the old buffers
        self.ws = Some(alloc()?);
        Ok(())
    }

    /// Takes the workspace out for a pass (give it back with [`PassRunner::put_workspace`]).
    pub fn take_workspace(&mut self) -> Option<W> {
        self.ws.take()
    }

    /// Gives the workspace back after a pass.
    pub fn put_workspace(&mut self, ws: W) {
        self.ws = Some(ws);
    }

    /// Copies a batch's inputs into the workspace's fixed buffers (a staged batch's after its
    /// upload finished, on the device), where a graph reads them.
    pub fn load_inputs(
        &self,
        dev: &Device,
        inputs: &DeviceInputs,
        dst: &mut InputBuffers,
    ) -> Result<()> {
        dev.load_inputs(inputs, self.uploader.as_ref(), dst)
    }

    /// Takes the graphs out for a graphed forward (`Graphs::run`, whose forward may then borrow
    /// the tower that holds this runner); give them back with [`PassRunner::put_graphs`].
    pub fn take_graphs(&mut self) -> Graphs {
        std::mem::take(&mut self.graphs)
    }

    /// Gives the graphs back after a graphed forward.
    pub fn put_graphs(&mut self, graphs: Graphs) {
        self.graphs = graphs;
    }
}

/// Splits `all`, the rows of a pass laid out image after image (`width` values a row), into one
/// vector per image of `rows_per[i]` rows. Rows past the sum of `rows_per` are left out; a
/// `rows_per` asking for more rows than `all` holds gets only the rows there are (never panics).
pub fn split_rows<T: Clone>(all: &[T], rows_per: &[usize], width: usize) -> Vec<Vec<T>> {
    let mut out = Vec::with_capacity(rows_per.len());
    let mut start = 0;
    for &n in rows_per {
        let (a, b) = (
            (start * width).min(all.len()),
            ((start + n) * width).min(all.len()),
        );
        out.push(all[a..b].to_vec());
        start += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::split_rows;

    #[test]
    fn split_rows_cuts_image_after_image() {
        let all: Vec<u32> = (0..12).collect();
        assert_eq!(
            split_rows(&all, &[1, 0, 2], 3),
            vec![vec![0, 1, 2], vec![], vec![3, 4, 5, 6, 7, 8]]
        );
        // Short input: no panic, only the rows there are.
        assert_eq!(
            split_rows(&all[..4], &[1, 1], 3),
            vec![vec![0, 1, 2], vec![3]]
        );
    }
}
