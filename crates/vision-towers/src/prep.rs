//! The model's preprocessor (from its config files, or a GGUF's defaults) and image reading.

use crate::WeightFile;
use st_reader::Checkpoint;
use std::path::{Path, PathBuf};
use vision_prep::{GgufGemma4Settings, ImageSource, ModelConfigs, PrepSettings, Preprocessor};

/// An image file larger than this is refused before it is read (the decode budget applies
/// after; this only bounds the read).
pub const MAX_IMAGE_FILE_BYTES: u64 = 512 << 20;

/// Why a preprocessor could not be built or an image not read.
#[derive(Debug, thiserror::Error)]
pub enum PrepOpenError {
    /// vision-prep refused the configs or the image.
    #[error("{path}: {source}")]
    Prep {
        /// The model or image the problem is about.
        path: PathBuf,
        /// What vision-prep found wrong.
        #[source]
        source: vision_prep::PrepError,
    },
    /// The model's tokenizer.json could not be read.
    #[error(transparent)]
    Tokenizer(#[from] st_reader::StError),
    /// The image file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The image path.
        path: PathBuf,
        /// The operating system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The image file is larger than [`MAX_IMAGE_FILE_BYTES`].
    #[error("{path}: {len} bytes is over the {MAX_IMAGE_FILE_BYTES}-byte image file limit")]
    TooLarge {
        /// The image path.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
}

impl PrepOpenError {
    /// The error of vision-prep's refusal of the model at `model` (its configs).
    pub(crate) fn at(model: &Path) -> impl Fn(vision_prep::PrepError) -> PrepOpenError + Copy + '_ {
        move |source| PrepOpenError::Prep {
            path: model.to_path_buf(),
            source,
        }
    }
}

impl tower_core::Classify for PrepOpenError {
    /// The processor's own refusal keeps its kind ([`vision_prep::PrepError`]'s); the tokenizer
    /// files are the model's (`Weights`); a file that cannot be read, or an image file over the
    /// size limit, `Io`.
    fn kind(&self) -> tower_core::ErrorKind {
        match self {
            PrepOpenError::Prep { source, .. } => source.kind(),
            PrepOpenError::Tokenizer(_) => tower_core::ErrorKind::Weights,
            PrepOpenError::Io { .. } | PrepOpenError::TooLarge { .. } => tower_core::ErrorKind::Io,
        }
    }
}

/// The preprocessor the model at `model` (already opened as `file`) asks for.
///
/// Safetensors checkpoints name their image processor in `preprocessor_config.json` /
/// `processor_config.json`; token ids come from `config.json`, `tokenizer_config.json` and, only
/// when those lack an id, `tokenizer.json`. A GGUF mmproj carries no processor config: Gemma-4
/// defaults with the file's patch size, token ids unknown.
pub fn preprocessor_for(
    model: &Path,
    file: &WeightFile,
    settings: PrepSettings,
) -> Result<Preprocessor, PrepOpenError> {
    match file {
        WeightFile::Gguf(g) => {
            let patch_size = g.get("clip.vision.patch_size").and_then(|v| v.as_u32());
            let gguf = GgufGemma4Settings {
                patch_size,
                ..Default::default()
            };
            Preprocessor::gemma4_gguf(&gguf, settings).map_err(PrepOpenError::at(model))
        }
        WeightFile::SafeTensors(ck) => from_checkpoint_configs(
            model,
            ck,
            |cfg| Preprocessor::from_configs(cfg, settings),
            |pre| pre.tokens().all().iter().all(|t| t.id.is_some()),
        ),
    }
}

/// A processor built from the checkpoint's configs (`build`) and, only when it leaves a prompt
/// token without an id (`ids_known` is false), built again with the checkpoint's `tokenizer.json`
/// (read only then).
pub(crate) fn from_checkpoint_configs<P>(
    model: &Path,
    ck: &Checkpoint,
    build: impl Fn(&ModelConfigs) -> Result<P, vision_prep::PrepError>,
    ids_known: impl Fn(&P) -> bool,
) -> Result<P, PrepOpenError> {
    let mut cfg = ModelConfigs {
        config: ck.config().cloned(),
        preprocessor_config: ck.preprocessor_config().cloned(),
        processor_config: ck.processor_config().cloned(),
        tokenizer_config: ck.tokenizer_config().cloned(),
        tokenizer_json: None,
    };
    let pre = build(&cfg).map_err(PrepOpenError::at(model))?;
    if ids_known(&pre) {
        return Ok(pre);
    }
    cfg.tokenizer_json = ck.tokenizer_json()?;
    build(&cfg).map_err(PrepOpenError::at(model))
}

/// Image bytes from a command-line argument: a `data:` URI, a refused scheme (`http:`, …), or
/// a file path.
pub fn read_image_arg(arg: &str) -> Result<ImageArg, PrepOpenError> {
    // Case-insensitive on the first five bytes only (a URI may be 20 MB).
    let looks_like_uri = arg
        .trim_start()
        .as_bytes()
        .get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"data:"))
        || arg.contains("://");
    if looks_like_uri {
        return ImageSource::parse_uri(arg)
            .map(|_| ImageArg::Uri(arg.to_string()))
            .map_err(|source| PrepOpenError::Prep {
                path: PathBuf::from(short(arg)),
                source,
            });
    }
    let path = PathBuf::from(arg);
    let io = |source| PrepOpenError::Io {
        path: path.clone(),
        source,
    };
    let len = std::fs::metadata(&path).map_err(io)?.len();
    if len > MAX_IMAGE_FILE_BYTES {
        return Err(PrepOpenError::TooLarge { path, len });
    }
    Ok(ImageArg::Bytes(std::fs::read(&path).map_err(io)?, path))
}

/// An image named on the command line, read.
#[derive(Debug)]
pub enum ImageArg {
    /// A file's bytes and its path.
    Bytes(Vec<u8>, PathBuf),
    /// A `data:` URI.
    Uri(String),
}

impl ImageArg {
    /// The bytes or URI as vision-prep takes them.
    pub fn source(&self) -> ImageSource<'_> {
        match self {
            ImageArg::Bytes(b, _) => ImageSource::Bytes(b),
            ImageArg::Uri(u) => ImageSource::DataUri(u),
        }
    }

    /// How errors name this image.
    pub fn label(&self) -> PathBuf {
        match self {
            ImageArg::Bytes(_, p) => p.clone(),
            ImageArg::Uri(u) => PathBuf::from(short(u)),
        }
    }
}

/// The first 40 characters of a URI, for error messages.
fn short(uri: &str) -> String {
    let s: String = uri.chars().take(40).collect();
    if s.len() < uri.len() {
        format!("{s}…")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `data:` prefix is matched without regard to case or leading space, and nothing
    /// shorter than it is taken for a URI.
    #[test]
    fn data_uri_prefix_is_case_insensitive() {
        for arg in ["DATA:image/png;base64,", "  Data:,", "data:"] {
            let got = read_image_arg(arg);
            assert!(
                matches!(&got, Ok(ImageArg::Uri(_)) | Err(PrepOpenError::Prep { .. })),
                "{arg:?}: {got:?}"
            );
        }
        for arg in ["dat", "", "é", "datæ:x"] {
            assert!(
                matches!(read_image_arg(arg), Err(PrepOpenError::Io { .. })),
                "{arg:?}"
            );
        }
    }
}
