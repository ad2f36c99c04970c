//! The crate's one typed error.

/// Everything that can go wrong between image bytes and prepared tensors.
///
/// Every variant says what was wrong with the input in the caller's terms; none is a panic.
#[derive(Debug, thiserror::Error)]
pub enum PrepError {
    /// The bytes do not start with the magic of any image format we know.
    #[error("not an image: {0}")]
    NotAnImage(String),
    /// The bytes are an image in a format this crate does not decode (e.g. TIFF, AVIF).
    #[error("unsupported image format: {0}")]
    UnsupportedFormat(String),
    /// The header declares a zero width or height.
    #[error("zero-sized image: {width}x{height}")]
    ZeroSized {
        /// Declared width.
        width: u32,
        /// Declared height.
        height: u32,
    },
    /// The header declares more pixels than the decode budget allows; nothing was decoded.
    #[error(
        "image {width}x{height} ({pixels} pixels) exceeds the decode budget of {budget} pixels"
    )]
    OverBudget {
        /// Declared width.
        width: u32,
        /// Declared height.
        height: u32,
        /// width × height.
        pixels: u64,
        /// The configured budget ([`crate::AdmissionLimits::max_pixels`]).
        budget: u64,
    },
    /// A `data:` URI longer than the configured cap; refused before base64 decoding.
    #[error("data URI of {len} encoded bytes exceeds the cap of {cap} bytes")]
    DataUriTooLarge {
        /// Encoded length in bytes.
        len: usize,
        /// The configured cap ([`crate::AdmissionLimits::max_data_uri_bytes`]).
        cap: usize,
    },
    /// A `data:` URI that is not `data:[<mime>];base64,<payload>` or whose payload is not base64.
    #[error("malformed data URI: {0}")]
    BadDataUri(String),
    /// A URI with a scheme other than `data:` (`http:`, `https:`, `file:`, …): this crate never fetches.
    #[error("URI scheme `{0}` refused: vision-prep reads bytes and base64 data URIs only, never the network")]
    SchemeRefused(String),
    /// The decoder failed on the body (truncated, corrupt, or over the allocation limit).
    #[error("decoding the {format} body failed: {reason}")]
    Decode {
        /// The sniffed format.
        format: String,
        /// The decoder's message.
        reason: String,
    },
    /// The decoder produced another size than the header admitted.
    #[error("decoder produced {got_width}x{got_height} but the header admitted {width}x{height}")]
    DimensionMismatch {
        /// Admitted width.
        width: u32,
        /// Admitted height.
        height: u32,
        /// Decoded width.
        got_width: u32,
        /// Decoded height.
        got_height: u32,
    },
    /// A pixel layout the upstream RGB conversion has no law for here (e.g. 32-bit float).
    #[error("unsupported pixel layout: {0}")]
    UnsupportedPixelLayout(String),
    /// A model/processor config is missing, malformed, or has a value out of range.
    #[error("config error in {file}: {reason}")]
    Config {
        /// Which config (`preprocessor_config.json`, `config.json`, …).
        file: String,
        /// What was wrong.
        reason: String,
    },
    /// The processor config names an image processor class this crate has no law for.
    #[error("unknown image processor class `{0}` (known: Gemma4ImageProcessor, Glm5NextImageProcessor, Glm46VImageProcessor, Step3p7ImageProcessor)")]
    UnknownProcessor(String),
    /// The upstream processor itself refuses this size (it raises); we refuse it the same way.
    #[error("{processor} cannot plan a {width}x{height} image: {reason}")]
    Unplannable {
        /// Image processor class.
        processor: String,
        /// Source width.
        width: u32,
        /// Source height.
        height: u32,
        /// Why (mirrors the upstream exception).
        reason: String,
    },
    /// The prepared tensors would exceed the output budget (e.g. a 60000×32 image gives step3p7
    /// 3024 local crops = 9 GB of f32); the plan is still available.
    #[error("prepared tensors would take {bytes} bytes, over the output budget of {budget} bytes ({rows} embedding rows)")]
    OutputTooLarge {
        /// Bytes the tensors would take.
        bytes: u64,
        /// The configured budget ([`crate::PrepSettings::max_output_bytes`]).
        budget: u64,
        /// Rows of the plan.
        rows: u64,
    },
    /// The model's family has no video path here (step3p7 has none upstream; GLM-OCR's is not
    /// implemented, see docs/VIDEO.md).
    #[error("no video path for {0}")]
    NoVideoPath(String),
    /// A video over one of its metadata budgets ([`crate::video::VideoLimits`], checked before
    /// any frame is decoded or resized).
    #[error("video refused: {amount} {what}, over the budget of {budget}")]
    VideoOverBudget {
        /// What was counted (frames, pixels of the sampled frames, bytes handed in).
        what: String,
        /// The count.
        amount: u64,
        /// The configured budget.
        budget: u64,
    },
    /// A video whose metadata or frames do not fit together (no fps, 0 frames, frames of
    /// different sizes, a frame count other than the metadata's).
    #[error("bad video: {0}")]
    BadVideo(String),
    /// One frame of a video failed as an image would (admission, decode, resize).
    #[error("video frame {index}: {source}")]
    VideoFrame {
        /// The frame's index in the video.
        index: usize,
        /// Why.
        #[source]
        source: Box<PrepError>,
    },
    /// A setting out of its allowed range (e.g. `max_soft_tokens` not in {70,140,280,560,1120}).
    #[error("invalid setting: {0}")]
    BadSetting(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, PrepError>;

impl tower_core::Classify for PrepError {
    /// A budget over its limit is `ImageTooLarge`; a setting out of range `Setting`; the model's
    /// processor config `Weights`; a video for a family without a video path `Unsupported`; a
    /// refused video frame the frame's own kind; everything else (the bytes, the URI, the
    /// decoded image, the video's metadata) `Image`.
    fn kind(&self) -> tower_core::ErrorKind {
        use tower_core::ErrorKind as K;
        match self {
            PrepError::OverBudget { .. }
            | PrepError::DataUriTooLarge { .. }
            | PrepError::OutputTooLarge { .. }
            | PrepError::VideoOverBudget { .. } => K::ImageTooLarge,
            PrepError::BadSetting(_) => K::Setting,
            PrepError::Config { .. } | PrepError::UnknownProcessor(_) => K::Weights,
            PrepError::NoVideoPath(_) => K::Unsupported,
            PrepError::VideoFrame { source, .. } => source.kind(),
            PrepError::NotAnImage(_)
            | PrepError::UnsupportedFormat(_)
            | PrepError::ZeroSized { .. }
            | PrepError::BadDataUri(_)
            | PrepError::SchemeRefused(_)
            | PrepError::Decode { .. }
            | PrepError::DimensionMismatch { .. }
            | PrepError::UnsupportedPixelLayout(_)
            | PrepError::Unplannable { .. }
            | PrepError::BadVideo(_) => K::Image,
        }
    }
}
