//! How the language model attends over an image's rows.

/// How the language model attends over the rows of an image, so an engine can refuse a serving
/// path that cannot honour it. One law per family, stated by its tower crate from the model's
/// text config (`lm_attention`), and reported by the facade's `Model::lm_attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmAttention {
    /// Causal everywhere, image rows included (glm5_next, glm_ocr, step3p7, and gemma4 unless
    /// its text config says otherwise).
    Causal,
    /// gemma4 with `text_config.use_bidirectional_attention = "vision"`: sliding-window layers
    /// attend bidirectionally within one contiguous run of image soft tokens
    /// (`AND(sliding_window, OR(causal, same_block))`; BOI/EOI are not part of the run); full
    /// attention layers stay causal (modeling_gemma4.py, create_masks_for_vision_model).
    BidirectionalImageRunsInSlidingLayers,
    /// The whole text model is non-causal (gemma4 `"all"`; step3p7's
    /// `use_bidirectional_attention = true`, which no release sets).
    Bidirectional,
}
