//! The typed error of the Gemma-4 tower.

/// Everything that can go wrong loading or running the Gemma-4 tower.
#[derive(Debug, thiserror::Error)]
pub enum GemmaError {
    /// The weight file has no Gemma-4 vision tower (another family, or a text-only release).
    #[error("no Gemma-4 vision weights: {0}")]
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
    /// The GGUF reader refused a tensor.
    #[error(transparent)]
    Gguf(#[from] gguf_reader::GgufError),
    /// The safetensors reader refused a tensor.
    #[error(transparent)]
    SafeTensors(#[from] st_reader::StError),
    /// The input patches are inconsistent (row width, positions, grid).
    #[error("input: {0}")]
    Input(String),
}

/// Short for `Result<T, GemmaError>`.
pub type Result<T> = std::result::Result<T, GemmaError>;

// Its kind (`Input` is the input's fault, the rest the weights') and `?` into the CUDA path's
// error.
gpu_core::family_error!(GemmaError, GemmaError::Input);
