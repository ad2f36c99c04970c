//! The typed error of the GLM vision towers.

gpu_core::family_error! {
    /// Everything that can go wrong loading or running a GLM vision tower.
    GlmError, "GLM",
    readers {
        /// The safetensors reader refused a tensor.
        SafeTensors(st_reader::StError),
    }
    {}
}

/// Short for `Result<T, GlmError>`.
pub type Result<T> = std::result::Result<T, GlmError>;
