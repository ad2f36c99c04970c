//! The typed error of the Step-3.7 tower.

/// Everything that can go wrong loading or running the Step-3.7 tower.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The weight file has no Step-3.7 vision tower (another family, or a text-only release).
    #[error("no Step-3.7 vision weights: {0}")]
    NoVisionWeights(String),
    /// A config value is missing, of the wrong type, or out of range.
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
    /// The file holds a vision tensor this tower does not know; it is refused, never ignored.
    #[error("unknown vision tensor {0} (this tower does not know what to do with it)")]
    UnknownTensor(String),
    /// The file holds the tower twice (two prefixes, or both the vendor and the HF layout).
    #[error("ambiguous vision weights: {0}")]
    Ambiguous(String),
    /// The safetensors reader refused a tensor.
    #[error(transparent)]
    SafeTensors(#[from] st_reader::StError),
    /// The input views are inconsistent (lengths, sides, crop counts, masks).
    #[error("input: {0}")]
    Input(String),
}

/// Short for `Result<T, StepError>`.
pub type Result<T> = std::result::Result<T, StepError>;

// Its kind (`Input` is the input's fault, the rest the weights') and `?` into the CUDA path's
// error.
gpu_core::family_error!(StepError, StepError::Input);
