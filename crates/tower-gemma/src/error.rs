//! The typed error of the Gemma-4 tower.

gpu_core::family_error! {
    /// Everything that can go wrong loading or running the Gemma-4 tower.
    GemmaError, "Gemma-4",
    readers {
        /// The GGUF reader refused a tensor.
        Gguf(gguf_reader::GgufError),
        /// The safetensors reader refused a tensor.
        SafeTensors(st_reader::StError),
    }
    {}
}

/// Short for `Result<T, GemmaError>`.
pub type Result<T> = std::result::Result<T, GemmaError>;
