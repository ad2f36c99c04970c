//! A tower held for a stream of passes ([`crate::Model::encode_stream`]): each pass is staged
//! (on CUDA: uploaded from page-locked memory on a copy stream) while the previous pass runs,
//! launched, and its rows collected before the next pass is launched.

use std::any::Any;

use vision_prep::Prepared;

use crate::cuda_engine::CudaSession;
use crate::tower::Tower;
use crate::tower_error::InputError;

/// One pass's input, built off the device's thread: the prepared images (host path) or the
/// tower's host-prepared batch (CUDA: validated, in the GEMM precision; the family's own type,
/// which only its tower takes back).
pub(crate) enum PassInput {
    Host(Vec<Prepared>),
    Cuda(Box<dyn Any + Send>),
}

/// A pass between [`Session::stage`] and [`Session::launch`].
pub(crate) enum Staged {
    Host(Vec<Prepared>),
    Cuda(Box<dyn Any>),
}

enum Held<'a> {
    /// The host path computes a pass at launch; its rows wait here.
    Host(Option<Vec<Vec<f32>>>),
    /// A CUDA tower's lock and the batch in flight.
    Cuda(Box<dyn CudaSession + 'a>),
}

/// The tower, held for a stream: on CUDA its device lock is taken for the session's lifetime.
pub(crate) struct Session<'a> {
    tower: &'a Tower,
    held: Held<'a>,
    /// Patches of the pass in flight (for out-of-memory messages).
    patches: usize,
}

impl Tower {
    /// A pass's input from its prepared images; on CUDA the tower's host half of `prepare`
    /// (validation, patch rows in the GEMM precision), which needs no device. Also returns the
    /// prepared images the input no longer needs (all of them on CUDA, for the preprocessor to
    /// recycle; none on the host, whose input owns them).
    pub(crate) fn pass_input(
        &self,
        prepared: Vec<Prepared>,
    ) -> Result<(PassInput, Vec<Prepared>), InputError> {
        let p = self.precision();
        let images = self.images_of(&prepared)?;
        let n = self
            .patches(&images)?
            .iter()
            .fold(0usize, |a, &b| a.saturating_add(b));
        let input = match self.engine.cuda().and_then(|c| c.pass_input(p, &images, n)) {
            Some(batch) => PassInput::Cuda(batch?),
            None => {
                drop(images);
                return Ok((PassInput::Host(prepared), Vec::new()));
            }
        };
        drop(images);
        Ok((input, prepared))
    }

    /// Holds the tower for a stream of passes (CUDA: its device lock, until the session drops).
    pub(crate) fn session(&self) -> Session<'_> {
        let held = match self.engine.cuda() {
            Some(c) => Held::Cuda(c.session()),
            None => Held::Host(None),
        };
        Session {
            tower: self,
            held,
            patches: 0,
        }
    }
}

impl Session<'_> {
    /// Stages a pass of `patches` patches: on CUDA its upload is queued on the copy stream and
    /// overlaps the pass in flight.
    pub(crate) fn stage(&mut self, input: PassInput, patches: usize) -> Result<Staged, InputError> {
        let staged = match (&mut self.held, input) {
            (Held::Host(_), PassInput::Host(p)) => Some(Staged::Host(p)),
            (Held::Cuda(c), PassInput::Cuda(b)) => {
                c.stage(b, patches).transpose()?.map(Staged::Cuda)
            }
            _ => None,
        };
        staged.ok_or_else(|| InputError::Message("a pass prepared for another engine".into()))
    }

    /// The rows of the pass in flight, per image (waits for it); `None` when none is in flight.
    pub(crate) fn collect(&mut self) -> Result<Option<Vec<Vec<f32>>>, InputError> {
        let n = self.patches;
        match &mut self.held {
            Held::Host(done) => Ok(done.take()),
            Held::Cuda(c) => c.collect(n),
        }
    }

    /// Launches a staged pass of `patches` patches (CUDA: queued, returns at once; host: runs
    /// it). Its rows come from the next [`Session::collect`].
    pub(crate) fn launch(&mut self, staged: Staged, patches: usize) -> Result<(), InputError> {
        self.patches = patches;
        let launched = match (&mut self.held, staged) {
            (Held::Host(done), Staged::Host(p)) => {
                *done = Some(self.tower.encode_batch(&p)?.per_image);
                Some(Ok(()))
            }
            (Held::Cuda(c), Staged::Cuda(b)) => c.launch(b, patches),
            _ => None,
        };
        launched.unwrap_or_else(|| {
            Err(InputError::Message(
                "a pass staged for another engine".into(),
            ))
        })
    }
}
