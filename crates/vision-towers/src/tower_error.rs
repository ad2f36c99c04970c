//! Why a tower could not be opened or run ([`TowerError`], public), and the pass-level error
//! the plumbing carries before the file name is attached (`InputError`), with each family's CUDA
//! error mapped into it.

use std::path::{Path, PathBuf};

use gpu_core::GpuError;
use tower_core::{ClassifiedError, Classify, ErrorKind, FamilyError};

use crate::{Device, Error};

/// Why a tower could not be opened or run.
#[derive(Debug, thiserror::Error)]
pub enum TowerError {
    /// The weight file could not be opened.
    #[error(transparent)]
    Open(#[from] Error),
    /// The file is not one of the supported families.
    #[error("{path}: no supported vision tower (family not recognised)")]
    UnknownFamily {
        /// The weight file.
        path: PathBuf,
    },
    /// The family is recognised but its tower is not built yet.
    #[error("{path}: the {family} tower is not implemented yet")]
    NotImplemented {
        /// The weight file.
        path: PathBuf,
        /// The family.
        family: &'static str,
    },
    /// The requested device, precision or setting is not available for this tower.
    #[error("{0}")]
    Unsupported(String),
    /// A CUDA device was asked for by name and none opens.
    #[error("no usable CUDA device for {device} ({reason})")]
    NoDevice {
        /// The device asked for.
        device: Device,
        /// Why it does not open, as the driver probe says.
        reason: String,
    },
    /// The device ran out of memory (while uploading weights, or inside a pass); after a pass
    /// the tower stays usable for the next call.
    #[error("{path}: CUDA out of memory {during} ({source}); retry with fewer images per call or a lower max_patches_per_pass")]
    OutOfMemory {
        /// The weight file.
        path: PathBuf,
        /// What was running: the weight upload, or a pass of so many patches.
        during: String,
        /// gpu-core's error.
        #[source]
        source: Box<GpuError>,
    },
    /// Any other device failure (driver, launch, cuBLASLt).
    #[error("{path}: {source}")]
    Gpu {
        /// The weight file.
        path: PathBuf,
        /// gpu-core's error.
        #[source]
        source: Box<GpuError>,
    },
    /// One image holds more patches than one pass may.
    #[error("{path}: image {index} has {patches} patches, over the ceiling of {ceiling} per pass (max_patches_per_pass); raise it to encode this image")]
    OverPassCeiling {
        /// The weight file.
        path: PathBuf,
        /// The image's position in the request.
        index: usize,
        /// Its patches.
        patches: usize,
        /// The ceiling.
        ceiling: usize,
    },
    /// A pass of a request split into several failed; image numbers inside `source` count from
    /// the pass's first image.
    #[error("in the pass over images {first}–{last} (numbered from 0 below): {source}")]
    Pass {
        /// The pass's first image in the request.
        first: usize,
        /// Its last image in the request.
        last: usize,
        /// What failed.
        #[source]
        source: Box<TowerError>,
    },
    /// The family's tower refused the weights (a missing, unknown or misshapen tensor, a config
    /// value out of range) or the inputs (a grid past its position table, an inconsistent
    /// count): [`TowerError::kind`] says which, and [`FamilyError::downcast_ref`] gives the
    /// family's own error (`tower_gemma::GemmaError`, `tower_glm5::GlmError`,
    /// `tower_step::StepError`).
    #[error("{path}: {source}")]
    Refused {
        /// The weight file or inputs.
        path: PathBuf,
        /// What the tower found wrong.
        #[source]
        source: FamilyError,
    },
    /// A prepared-input file is unreadable or lacks a tensor.
    #[error("{path}: {message}")]
    Inputs {
        /// The prepared-input file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

impl Classify for TowerError {
    fn kind(&self) -> ErrorKind {
        use crate::Error as E;
        match self {
            TowerError::Open(E::Io { .. }) => ErrorKind::Io,
            TowerError::Open(_)
            | TowerError::UnknownFamily { .. }
            | TowerError::NotImplemented { .. } => ErrorKind::Weights,
            TowerError::Unsupported(_) => ErrorKind::Unsupported,
            TowerError::NoDevice { .. } => ErrorKind::NoDevice,
            TowerError::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            TowerError::Gpu { .. } => ErrorKind::Device,
            TowerError::OverPassCeiling { .. } => ErrorKind::ImageTooLarge,
            TowerError::Pass { source, .. } => source.kind(),
            TowerError::Refused { source, .. } => source.kind(),
            TowerError::Inputs { .. } => ErrorKind::Input,
        }
    }
}

impl TowerError {
    /// The image of the request this error is about, where it names one (an image over the pass
    /// ceiling, counted across passes).
    pub fn image_index(&self) -> Option<usize> {
        match self {
            TowerError::OverPassCeiling { index, .. } => Some(*index),
            TowerError::Pass { first, source, .. } => source.image_index().map(|i| first + i),
            _ => None,
        }
    }

    /// Whether this is a device out-of-memory error (also inside one pass of several).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            TowerError::OutOfMemory { .. } => true,
            TowerError::Pass { source, .. } => source.is_out_of_memory(),
            _ => false,
        }
    }
}

/// Why prepared inputs could not be encoded (before the file name is attached).
#[derive(Debug)]
pub(crate) enum InputError {
    Message(String),
    /// Valid but not available here (`TowerError::Unsupported`).
    Unsupported(String),
    Family(FamilyError),
    OverCeiling {
        index: usize,
        patches: usize,
        ceiling: usize,
    },
    OutOfMemory {
        patches: usize,
        source: GpuError,
    },
    Gpu(GpuError),
    Pass {
        first: usize,
        last: usize,
        source: Box<InputError>,
    },
}

impl InputError {
    pub(crate) fn gpu(e: GpuError, patches: usize) -> InputError {
        if e.is_out_of_memory() {
            InputError::OutOfMemory { patches, source: e }
        } else {
            InputError::Gpu(e)
        }
    }

    /// A family's own error (its host path's, or inside its CUDA error).
    pub(crate) fn family(e: impl ClassifiedError) -> InputError {
        InputError::Family(FamilyError::new(e))
    }

    pub(crate) fn at(self, path: &Path) -> TowerError {
        let path = path.to_path_buf();
        match self {
            InputError::Message(message) => TowerError::Inputs { path, message },
            InputError::Unsupported(message) => TowerError::Unsupported(message),
            InputError::Family(source) => TowerError::Refused { path, source },
            InputError::OverCeiling {
                index,
                patches,
                ceiling,
            } => TowerError::OverPassCeiling {
                path,
                index,
                patches,
                ceiling,
            },
            InputError::OutOfMemory { patches, source } => TowerError::OutOfMemory {
                path,
                during: format!("in a pass of {patches} patches"),
                source: Box::new(source),
            },
            InputError::Gpu(source) => TowerError::Gpu {
                path,
                source: Box::new(source),
            },
            InputError::Pass {
                first,
                last,
                source,
            } => TowerError::Pass {
                first,
                last,
                source: Box::new(source.at(&path)),
            },
        }
    }
}

/// A family's CUDA path error in a pass of `patches` patches: one mapping for every family.
pub(crate) fn cuda_err<F: ClassifiedError>(
    e: gpu_core::CudaError<F>,
    patches: usize,
) -> InputError {
    use gpu_core::CudaError as E;
    match e {
        E::Gpu(e) => InputError::gpu(e, patches),
        E::Family(e) => InputError::family(e),
        E::Unsupported(m) => InputError::Message(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_recognised_through_a_pass() {
        let oom = TowerError::OutOfMemory {
            path: "m".into(),
            during: "in a pass of 9 patches".into(),
            source: Box::new(GpuError::OutOfMemory { bytes: 1 }),
        };
        assert!(oom.is_out_of_memory());
        let wrapped = TowerError::Pass {
            first: 2,
            last: 3,
            source: Box::new(oom),
        };
        assert!(wrapped.is_out_of_memory());
        assert!(!TowerError::Unsupported("x".into()).is_out_of_memory());
        assert!(GpuError::OutOfMemory { bytes: 1 }.is_out_of_memory());
        assert!(!GpuError::NoDevice("none".into()).is_out_of_memory());
    }
}
