//! The family's tower where it runs: the host reference or the CUDA path, one arm per family.

use tower_gemma::{GemmaCuda, GemmaTower};
use tower_glm5::{GlmCuda, GlmTower};
use tower_step::{StepCuda, StepTower};

use crate::cuda_engine::{Cuda, CudaEngine};

/// The family's weights where they run. A CUDA tower keeps only the config on the host; its
/// `&mut` runs take turns behind the mutex.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one long-lived handle per model; boxing buys nothing
pub(crate) enum Engine {
    GemmaHost(GemmaTower),
    GemmaCuda(Cuda<GemmaCuda>),
    GlmHost(GlmTower),
    GlmCuda(Cuda<GlmCuda>),
    StepHost(StepTower),
    StepCuda(Cuda<StepCuda>),
}

impl Engine {
    /// The CUDA tower, whatever its family (`None` on the host): the one place the facade's
    /// device plumbing tells the families apart.
    pub(crate) fn cuda(&self) -> Option<&dyn CudaEngine> {
        match self {
            Engine::GemmaCuda(c) => Some(c),
            Engine::GlmCuda(c) => Some(c),
            Engine::StepCuda(c) => Some(c),
            Engine::GemmaHost(_) | Engine::GlmHost(_) | Engine::StepHost(_) => None,
        }
    }

    /// [`Engine::cuda`], mutably.
    pub(crate) fn cuda_mut(&mut self) -> Option<&mut dyn CudaEngine> {
        match self {
            Engine::GemmaCuda(c) => Some(c),
            Engine::GlmCuda(c) => Some(c),
            Engine::StepCuda(c) => Some(c),
            Engine::GemmaHost(_) | Engine::GlmHost(_) | Engine::StepHost(_) => None,
        }
    }

    /// Turns the CUDA path's graphs on or off (the host paths have none).
    pub(crate) fn with_graphs(mut self, on: bool) -> Engine {
        if let Some(c) = self.cuda_mut() {
            c.set_graphs(on);
        }
        self
    }
}
