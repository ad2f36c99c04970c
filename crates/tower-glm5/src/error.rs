//! The typed error of the GLM vision towers.

/// Everything that can go wrong loading or running a GLM vision tower.
#[derive(Debug, thiserror::Error)]
pub enum GlmError {
    /// The checkpoint has no GLM vision tower (a text-only release, or another family).
    #[error("no GLM vision weights: {0}")]
    NoVisionWeights(String),
    /// A config value is missing, of the wrong type, out of range, or disagrees with the tensors.
    #[error("config: {0}")]
    Config(String),
    /// A tensor the tower needs is absent.
    #[error("missing tensor {0}")]
    MissingTensor(String),
    /// A tensor has a shape other than the config implies.
    #[error("tensor {name}: shape {found:?}, expected {expected:?}")]
    Shape {
        /// The tensor.
        name: String,
        /// Its shape in the file (outermost first).
        found: Vec<usize>,
        /// The shape the config implies.
        expected: Vec<usize>,
    },
    /// The checkpoint holds a vision tensor this tower does not know; it is refused, never ignored.
    #[error("unknown vision tensor {0} (this tower does not know what to do with it)")]
    UnknownTensor(String),
    /// The safetensors reader refused a tensor.
    #[error(transparent)]
    SafeTensors(#[from] st_reader::StError),
    /// The input patches are inconsistent with the grid or the config.
    #[error("input: {0}")]
    Input(String),
}

/// Short for `Result<T, GlmError>`.
pub type Result<T> = std::result::Result<T, GlmError>;

// Its kind (`Input` is the input's fault, the rest the weights') and `?` into the CUDA path's
// error.
gpu_core::family_error!(GlmError, GlmError::Input);
