//! The host reference of a family's tower, behind one trait.

use crate::ClassifiedError;

/// A family's host reference tower: the f32 forward and projection on the CPU, one padding-free
/// pass over a batch of images. Each tower crate implements it once (`GemmaTower`, `GlmTower`,
/// `StepTower`), so code over every family's host path (the facade, xtask's bench) is written
/// once.
pub trait HostTower: Send + Sync {
    /// One image's input (tower-core's typed inputs: [`crate::GemmaImage`], …).
    type Image<'a>;
    /// The family's error: the weights or the input are wrong.
    type Error: ClassifiedError;

    /// Each image's rows in the LM width, row-major, in order.
    fn encode_rows(&self, images: &[Self::Image<'_>]) -> Result<Vec<Vec<f32>>, Self::Error>;

    /// The LM width of the rows.
    fn width(&self) -> usize;
}
