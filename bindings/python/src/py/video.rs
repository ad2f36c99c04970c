//! A video's Python arguments turned into Rust values while the GIL is held (the frames: a list
//! of encoded images, or raw RGB in one buffer; the metadata; the sampling settings), and the
//! video read and run without it: only the sampled frames' files are read, after the metadata
//! budgets (docs/VIDEO.md).

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyMemoryView, PyString};

use vision_towers::vision_prep::video::{VideoMetadata, VideoSettings};
use vision_towers::vision_prep::{ImageSource, PrepError, Video, VideoFrames};
use vision_towers::{Model, ModelError, PrepOpenError};

use crate::dlpack::{DLDataType, KDL_CPU, KDL_CUDA_HOST};
use crate::failure::Failure;
use crate::py::capsule;
use crate::py::input::{self, Image, Read};

/// Raw RGB bytes: a `bytes` object's contents in place, or a copy.
pub enum Raw<'a> {
    /// A `bytes` object's contents (immutable; the caller's argument keeps it alive).
    Borrowed(&'a [u8]),
    /// A copy of a `bytearray`, a `memoryview` or a DLPack array.
    Owned(Vec<u8>),
}

impl Raw<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Raw::Borrowed(b) => b,
            Raw::Owned(v) => v,
        }
    }
}

/// A video's frames, extracted.
pub enum Frames<'a> {
    /// One encoded image per frame (bytes, a path, a `data:` URI).
    Encoded(Vec<Image<'a>>),
    /// Raw RGB u8 frames, `height·width·3` bytes each, back to back.
    Rgb {
        /// The frames' bytes.
        data: Raw<'a>,
        /// Frame width.
        width: u32,
        /// Frame height.
        height: u32,
    },
}

/// Everything a video call takes, extracted.
pub struct VideoArgs<'a> {
    /// The frames.
    pub frames: Frames<'a>,
    /// The metadata (`total_num_frames` defaults to the frames handed in).
    pub metadata: VideoMetadata,
    /// The sampling settings.
    pub settings: VideoSettings,
}

/// The sampling settings a call names (each `None` keeps the video processor config's).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sampling {
    /// glm5_next target sampling rate.
    pub sample_fps: Option<f64>,
    /// gemma4 frames sampled.
    pub num_frames: Option<u64>,
    /// Most frames sampled.
    pub max_frames: Option<u64>,
    /// gemma4 soft tokens per frame.
    pub max_soft_tokens: Option<u32>,
    /// glm5_next token budget of the whole video, lower bound.
    pub min_image_tokens: Option<u64>,
    /// glm5_next token budget of the whole video.
    pub max_image_tokens: Option<u64>,
}

/// What the caller says of the video besides its frames.
#[derive(Debug, Clone, Copy, Default)]
pub struct Described {
    /// The video's frame rate.
    pub fps: Option<f64>,
    /// Frames in the video (default: the frames handed in).
    pub total_num_frames: Option<u64>,
    /// Duration in seconds.
    pub duration: Option<f64>,
    /// Raw frames' width.
    pub width: Option<u32>,
    /// Raw frames' height.
    pub height: Option<u32>,
}

fn is_raw(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(obj.cast::<PyBytes>().is_ok()
        || obj.cast::<PyByteArray>().is_ok()
        || obj.cast::<PyMemoryView>().is_ok()
        || (obj.hasattr("__dlpack__")? && obj.cast::<pyo3::types::PyList>().is_err()))
}

/// The frame objects of a list of encoded frames (empty for raw frames, which are one object).
pub fn frame_list<'py>(frames: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if is_raw(frames)? {
        return Ok(Vec::new());
    }
    if frames.cast::<PyString>().is_ok() || frames.hasattr("__fspath__")? {
        return Err(Failure::type_error(
            "encode_video takes a list of frames (one encoded image each) or raw RGB frames \
             (bytes with width and height, or a uint8 array [frames, height, width, 3])",
        )
        .into_pyerr(frames.py()));
    }
    frames.try_iter()?.collect()
}

/// Extracts the frames, metadata and settings (`objs`: [`frame_list`]'s answer).
pub fn args<'a>(
    frames: &'a Bound<'_, PyAny>,
    objs: &'a [Bound<'_, PyAny>],
    described: Described,
    sampling: Sampling,
) -> PyResult<VideoArgs<'a>> {
    let py = frames.py();
    let fail = |f: Failure| f.into_pyerr(py);
    let (frames, given) = if is_raw(frames)? {
        let (data, shape) = raw(frames).map_err(fail)?;
        let (width, height) = match (shape, described.width, described.height) {
            (Some((_, _, w)), Some(dw), _) if dw != w => {
                return Err(fail(Failure::value(format!(
                    "width {dw} differs from the frames' {w}"
                ))))
            }
            (Some((_, h, _)), _, Some(dh)) if dh != h => {
                return Err(fail(Failure::value(format!(
                    "height {dh} differs from the frames' {h}"
                ))))
            }
            (Some((_, h, w)), _, _) => (w, h),
            (None, Some(w), Some(h)) if w > 0 && h > 0 => (w, h),
            (None, Some(_), Some(_)) => {
                return Err(fail(Failure::value(
                    "raw RGB frames need a positive width and height",
                )))
            }
            (None, _, _) => {
                return Err(fail(Failure::value(
                    "raw RGB frames in bytes need width= and height= (or pass a uint8 array \
                     [frames, height, width, 3])",
                )))
            }
        };
        let each = u64::from(width) * u64::from(height) * 3;
        let len = data.bytes().len() as u64;
        let given = match (shape, described.total_num_frames) {
            (Some((f, _, _)), _) => u64::from(f),
            (None, Some(n)) => n,
            (None, None) if len.is_multiple_of(each) => len / each,
            (None, None) => {
                return Err(fail(Failure::value(format!(
                    "{len} bytes are not whole {width}x{height} RGB frames ({each} bytes each)"
                ))))
            }
        };
        if len > given.saturating_mul(each) {
            return Err(fail(Failure::value(format!(
                "{len} bytes hold more than {given} {width}x{height} RGB frames ({each} bytes \
                 each)"
            ))));
        }
        (
            Frames::Rgb {
                data,
                width,
                height,
            },
            given,
        )
    } else {
        let imgs = objs
            .iter()
            .enumerate()
            .map(|(i, o)| input::image(o, i))
            .collect::<PyResult<Vec<Image<'_>>>>()?;
        let n = imgs.len() as u64;
        (Frames::Encoded(imgs), n)
    };
    let settings = VideoSettings {
        fps: sampling.sample_fps,
        num_frames: sampling.num_frames,
        max_frames: sampling.max_frames,
        max_soft_tokens: sampling.max_soft_tokens,
        min_image_tokens: sampling.min_image_tokens,
        max_image_tokens: sampling.max_image_tokens,
        ..VideoSettings::default()
    };
    Ok(VideoArgs {
        frames,
        metadata: VideoMetadata {
            total_num_frames: described.total_num_frames.unwrap_or(given),
            fps: described.fps,
            duration: described.duration,
        },
        settings,
    })
}

/// Raw RGB bytes and, for a DLPack array, its `(frames, height, width)`.
#[allow(clippy::type_complexity)]
fn raw<'a>(obj: &'a Bound<'_, PyAny>) -> Result<(Raw<'a>, Option<(u32, u32, u32)>), Failure> {
    let py = obj.py();
    let err = |e: PyErr| Failure::type_error(format!("frames: {}", e.value(py)));
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok((Raw::Borrowed(b.as_bytes()), None));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok((Raw::Owned(b.to_vec()), None));
    }
    if obj.cast::<PyMemoryView>().is_ok() {
        let b = obj.call_method0("tobytes").map_err(err)?;
        let b = b.cast::<PyBytes>().map_err(|e| err(e.into()))?;
        return Ok((Raw::Owned(b.as_bytes().to_vec()), None));
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("max_version", (1, 0)).map_err(err)?;
    let cap = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
            obj.call_method0("__dlpack__")
        }
        other => other,
    }
    .map_err(err)?;
    let t = capsule::read(&cap, "frames")?;
    if t.device.device_type != KDL_CPU && t.device.device_type != KDL_CUDA_HOST {
        return Err(Failure::value(format!(
            "frames: on DLPack device type {}; pass host frames",
            t.device.device_type
        )));
    }
    let dims = |v: usize| u32::try_from(v).ok();
    let shape = match t.shape.as_slice() {
        [f, h, w, 3] => match (dims(*f), dims(*h), dims(*w)) {
            (Some(f), Some(h), Some(w)) => (f, h, w),
            _ => return Err(Failure::value(format!("frames: shape {:?}", t.shape))),
        },
        _ => {
            return Err(Failure::value(format!(
                "frames: shape {:?}, raw RGB frames are [frames, height, width, 3]",
                t.shape
            )))
        }
    };
    if t.dtype != DLDataType::U8 {
        return Err(Failure::value(format!(
            "frames: dtype {}, raw RGB frames are uint8",
            t.dtype.name()
        )));
    }
    if !t.is_contiguous() {
        return Err(Failure::value(format!(
            "frames: strides {:?} for shape {:?} are not contiguous (numpy.ascontiguousarray)",
            t.strides, t.shape
        )));
    }
    let n = t.numel();
    // SAFETY: `cap` (unconsumed) keeps the producer's host memory alive while it is copied, and
    // a contiguous uint8 tensor's `n` bytes lie at `addr`.
    let data = unsafe { std::slice::from_raw_parts(t.addr as usize as *const u8, n) }.to_vec();
    drop(cap);
    Ok((Raw::Owned(data), Some(shape)))
}

/// A video refused by vision-prep, as the facade reports it (named by the model's path).
fn prep_failure(model: &Model, source: PrepError) -> Failure {
    let e = ModelError::Prep(PrepOpenError::Prep {
        path: model.path().to_path_buf(),
        source,
    });
    Failure::model(&e)
}

/// Builds the model's video preprocessor for `args`, reads the frames it samples (only those:
/// the others are never read), and hands the video to `run`. The metadata budgets are checked
/// before any file is read.
pub fn with_video<T>(
    model: &Model,
    args: &VideoArgs<'_>,
    run: impl FnOnce(
        &vision_towers::vision_prep::VideoPreprocessor,
        &Video<'_>,
    ) -> Result<T, ModelError>,
) -> Result<T, Failure> {
    let failed = |e: ModelError| Failure::model(&e);
    let pre = model.video_preprocessor(args.settings).map_err(failed)?;
    let meta = args.metadata;
    match &args.frames {
        Frames::Rgb {
            data,
            width,
            height,
        } => {
            // The metadata first (its frame budget bounds the slices made below); frames past
            // the bytes handed in are empty: vision-prep checks the byte and pixel budgets
            // before it says which frame is short.
            pre.sampled_indices(&meta)
                .map_err(|e| prep_failure(model, e))?;
            let each = (*width as usize * *height as usize * 3).max(1);
            let total = usize::try_from(meta.total_num_frames).unwrap_or(usize::MAX);
            let mut frames: Vec<&[u8]> = data.bytes().chunks(each).collect();
            if frames.len() < total {
                frames.resize(total, &[]);
            }
            let video = Video {
                frames: VideoFrames::Rgb {
                    width: *width,
                    height: *height,
                    frames: &frames,
                },
                metadata: meta,
            };
            run(&pre, &video).map_err(failed)
        }
        Frames::Encoded(imgs) => {
            let sampled = pre
                .sampled_indices(&meta)
                .map_err(|e| prep_failure(model, e))?;
            let mut reads: Vec<Option<Read<'_>>> = (0..imgs.len()).map(|_| None).collect();
            for &i in &sampled {
                let i = usize::try_from(i).unwrap_or(usize::MAX);
                let (Some(img), Some(slot)) = (imgs.get(i), reads.get_mut(i)) else {
                    continue;
                };
                if slot.is_none() {
                    *slot = Some(input::read(img, Some(i))?);
                }
            }
            let sources: Vec<ImageSource<'_>> = reads
                .iter()
                .map(|r| r.as_ref().map_or(ImageSource::Bytes(&[]), Read::source))
                .collect();
            let video = Video {
                frames: VideoFrames::Encoded(&sources),
                metadata: meta,
            };
            run(&pre, &video).map_err(failed)
        }
    }
}
