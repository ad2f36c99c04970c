//! A tower held for a stream of passes ([`crate::Model::encode_stream`]): each pass is staged
//! (on CUDA: uploaded from page-locked memory on a copy stream) while the previous pass runs,
//! launched, and its rows collected before the next pass is launched.

use std::sync::{MutexGuard, PoisonError};

use tower_gemma::{GemmaBatch, GemmaCuda, GemmaHostBatch};
use tower_glm5::{GlmBatch, GlmCuda, GlmHostBatch};
use tower_step::{StepBatch, StepCuda, StepHostBatch};
use vision_prep::Prepared;

use crate::inputs::Images;
use crate::tower::{Engine, Tower};
use crate::tower_error::{gemma_cuda_err, glm_cuda_err, step_cuda_err, InputError};

/// One pass's input, built off the device's thread: the prepared images (host path) or the
/// tower's host-prepared batch (CUDA: validated, in the GEMM precision).
#[allow(clippy::large_enum_variant)] // short-lived, one per pass
pub(crate) enum PassInput {
    Host(Vec<Prepared>),
    Gemma(GemmaHostBatch),
    Glm(GlmHostBatch),
    Step(StepHostBatch),
}

/// A pass between [`Session::stage`] and [`Session::launch`].
pub(crate) enum Staged {
    Host(Vec<Prepared>),
    Gemma(GemmaBatch),
    Glm(GlmBatch),
    Step(StepBatch),
}

enum Held<'a> {
    /// The host path computes a pass at launch; its rows wait here.
    Host(Option<Vec<Vec<f32>>>),
    Gemma(MutexGuard<'a, GemmaCuda>, Option<GemmaBatch>),
    Glm(MutexGuard<'a, GlmCuda>, Option<GlmBatch>),
    Step(MutexGuard<'a, StepCuda>, Option<StepBatch>),
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
        let p = match self.precision() {
            crate::Precision::F32 => gpu_core::CudaPrecision::F32,
            crate::Precision::Bf16 => gpu_core::CudaPrecision::Bf16,
        };
        let images = self.images_of(&prepared)?;
        let n = self
            .patches(&images)?
            .iter()
            .fold(0usize, |a, &b| a.saturating_add(b));
        let input = match (&self.engine, &images) {
            (Engine::GemmaCuda { config, .. }, Images::Gemma4(v)) => PassInput::Gemma(
                GemmaCuda::prepare_host(config, p, v).map_err(|e| gemma_cuda_err(e, n))?,
            ),
            (Engine::GlmCuda { config, .. }, Images::Glm(v)) => {
                PassInput::Glm(GlmCuda::prepare_host(config, p, v).map_err(|e| glm_cuda_err(e, n))?)
            }
            (Engine::StepCuda { config, .. }, Images::Step3p7(v)) => PassInput::Step(
                StepCuda::prepare_host(config, p, v).map_err(|e| step_cuda_err(e, n))?,
            ),
            _ => {
                drop(images);
                return Ok((PassInput::Host(prepared), Vec::new()));
            }
        };
        drop(images);
        Ok((input, prepared))
    }

    /// Holds the tower for a stream of passes (CUDA: its device lock, until the session drops).
    pub(crate) fn session(&self) -> Session<'_> {
        let held = match &self.engine {
            Engine::GemmaCuda { cuda, .. } => {
                Held::Gemma(cuda.lock().unwrap_or_else(PoisonError::into_inner), None)
            }
            Engine::GlmCuda { cuda, .. } => {
                Held::Glm(cuda.lock().unwrap_or_else(PoisonError::into_inner), None)
            }
            Engine::StepCuda { cuda, .. } => {
                Held::Step(cuda.lock().unwrap_or_else(PoisonError::into_inner), None)
            }
            Engine::GemmaHost(_) | Engine::GlmHost(_) | Engine::StepHost(_) => Held::Host(None),
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
        Ok(match (&mut self.held, input) {
            (Held::Host(_), PassInput::Host(p)) => Staged::Host(p),
            (Held::Gemma(c, _), PassInput::Gemma(b)) => {
                Staged::Gemma(c.stage(b).map_err(|e| gemma_cuda_err(e, patches))?)
            }
            (Held::Glm(c, _), PassInput::Glm(b)) => {
                Staged::Glm(c.stage(b).map_err(|e| glm_cuda_err(e, patches))?)
            }
            (Held::Step(c, _), PassInput::Step(b)) => {
                Staged::Step(c.stage(b).map_err(|e| step_cuda_err(e, patches))?)
            }
            _ => {
                return Err(InputError::Message(
                    "a pass prepared for another engine".into(),
                ))
            }
        })
    }

    /// The rows of the pass in flight, per image (waits for it); `None` when none is in flight.
    pub(crate) fn collect(&mut self) -> Result<Option<Vec<Vec<f32>>>, InputError> {
        let n = self.patches;
        Ok(match &mut self.held {
            Held::Host(done) => done.take(),
            Held::Gemma(c, b) => match b.take() {
                Some(b) => Some(c.rows(&b).map_err(|e| gemma_cuda_err(e, n))?),
                None => None,
            },
            Held::Glm(c, b) => match b.take() {
                Some(b) => Some(c.rows(&b).map_err(|e| glm_cuda_err(e, n))?),
                None => None,
            },
            Held::Step(c, b) => match b.take() {
                Some(b) => Some(
                    c.rows(&b)
                        .map_err(|e| step_cuda_err(e, n))?
                        .into_iter()
                        .map(|r| r.rows)
                        .collect(),
                ),
                None => None,
            },
        })
    }

    /// Launches a staged pass of `patches` patches (CUDA: queued, returns at once; host: runs
    /// it). Its rows come from the next [`Session::collect`].
    pub(crate) fn launch(&mut self, staged: Staged, patches: usize) -> Result<(), InputError> {
        self.patches = patches;
        match (&mut self.held, staged) {
            (Held::Host(done), Staged::Host(p)) => {
                *done = Some(self.tower.encode_batch(&p)?.per_image);
            }
            (Held::Gemma(c, slot), Staged::Gemma(b)) => {
                c.run(&b, false).map_err(|e| gemma_cuda_err(e, patches))?;
                *slot = Some(b);
            }
            (Held::Glm(c, slot), Staged::Glm(b)) => {
                c.run(&b, false).map_err(|e| glm_cuda_err(e, patches))?;
                *slot = Some(b);
            }
            (Held::Step(c, slot), Staged::Step(b)) => {
                c.run(&b, false).map_err(|e| step_cuda_err(e, patches))?;
                *slot = Some(b);
            }
            _ => {
                return Err(InputError::Message(
                    "a pass staged for another engine".into(),
                ))
            }
        }
        Ok(())
    }
}
