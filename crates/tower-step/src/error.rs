//! The typed error of the Step-3.7 tower.

gpu_core::family_error! {
    /// Everything that can go wrong loading or running the Step-3.7 tower.
    StepError, "Step-3.7",
    readers {
        /// The safetensors reader refused a tensor.
        SafeTensors(st_reader::StError),
    }
    {
        /// The file holds the tower twice (two prefixes, or both the vendor and the HF layout).
        #[error("ambiguous vision weights: {0}")]
        Ambiguous(String),
    }
}

/// Short for `Result<T, StepError>`.
pub type Result<T> = std::result::Result<T, StepError>;
