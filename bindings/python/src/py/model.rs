//! `Model`: a vision tower and its image processor behind one handle, shared by threads.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;
use pyo3::types::PyList;

use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{
    Device, DeviceOut, LmAttention, Model, Precision, RowsDtype, TowerOptions,
    DEFAULT_MAX_PATCHES_PER_PASS,
};

use crate::failure::{Class, Failure};
use crate::py::errors::detached;
use crate::py::input::{self, Image, Out, Read};
use crate::py::plan;
use crate::py::rows::{ImageRows, PlanInfo};
use crate::py::video::{self, Described, Sampling};
use vision_towers::tower_core::{Classify, ErrorKind};

/// A model: its image processor and its vision tower, on the CPU (the float32 reference) or a
/// CUDA device. Thread-safe: share one between threads; the GIL is released while images are
/// prepared and the tower runs.
#[pyclass(frozen, module = "vision_towers", name = "Model")]
pub struct PyModel {
    model: Arc<Model>,
    family: &'static str,
    width: usize,
    device: Device,
    precision: Precision,
    lm: LmAttention,
    max_rows: OnceLock<u64>,
}

/// What an encode returns: rows per image, or (with `out=`) each image's row count.
enum Encoded {
    Rows(Vec<ImageRows>),
    Counts(Vec<usize>),
}

impl<'py> IntoPyObject<'py> for Encoded {
    type Target = PyList;
    type Output = Bound<'py, PyList>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        match self {
            Encoded::Rows(r) => PyList::new(py, r),
            Encoded::Counts(c) => PyList::new(py, c),
        }
    }
}

fn parse_precision(p: Option<&str>) -> Result<Option<Precision>, Failure> {
    p.map(|p| p.to_ascii_lowercase().parse::<Precision>())
        .transpose()
        .map_err(|e| Failure::value(e.to_string()))
}

impl PyModel {
    /// The dtype of the rows asked for, checked against the model.
    fn rows_dtype(&self, asked: Option<RowsDtype>) -> Result<RowsDtype, Failure> {
        match (self.device, asked) {
            (Device::Cuda(_), None) => Ok(match self.precision {
                Precision::F32 => RowsDtype::F32,
                Precision::Bf16 => RowsDtype::Bf16,
                Precision::F16 => RowsDtype::F16,
            }),
            (Device::Cuda(_), Some(d)) => {
                match vision_towers::rows_dtype_refusal(self.precision, d) {
                    Some(why) => Err(Failure::unsupported(format!(
                        "{why} (this model runs in {}: open it with precision=\"bf16\" or \"f16\")",
                        self.precision
                    ))),
                    None => Ok(d),
                }
            }
            (_, None | Some(RowsDtype::F32)) => Ok(RowsDtype::F32),
            (_, Some(d @ (RowsDtype::Bf16 | RowsDtype::F16))) => {
                Err(Failure::unsupported(format!(
                    "{} rows on the CPU are refused: the CPU path is the float32 reference; ask \
                 for float32 or open the model on CUDA",
                    d.name()
                )))
            }
        }
    }

    /// The caller's `out` as a [`DeviceOut`] for `rows` rows (None = check the width only),
    /// ordered with `stream`.
    fn device_out(
        &self,
        out: &Out,
        asked: Option<RowsDtype>,
        stream: Option<u64>,
        rows: Option<usize>,
    ) -> Result<DeviceOut, Failure> {
        let Device::Cuda(ordinal) = self.device else {
            return Err(Failure::unsupported(format!(
                "out= takes a CUDA tensor and this model runs on {}; its rows come back as \
                 float32 host arrays",
                self.device
            )));
        };
        if let Some(d) = asked {
            if d != out.dtype {
                return Err(Failure::value(format!(
                    "dtype {} differs from out's {}",
                    d.name(),
                    out.dtype.name()
                )));
            }
        }
        self.rows_dtype(Some(out.dtype))?;
        if let Some(o) = out.ordinal {
            if o != ordinal {
                return Err(Failure::value(format!(
                    "out is on cuda:{o}, the model on cuda:{ordinal}"
                )));
            }
        }
        let fits = match (out.shape.as_slice(), rows) {
            ([r, w], Some(n)) => *r == n && *w == self.width,
            ([_, w], None) => *w == self.width,
            _ => false,
        };
        if !fits {
            return Err(Failure::value(format!(
                "out has shape {:?}; the rows need [{}, {}]",
                out.shape,
                rows.map_or_else(|| "rows".to_string(), |n| n.to_string()),
                self.width
            )));
        }
        let len = out.shape.iter().product::<usize>();
        let stream = stream.or(out.stream).unwrap_or(0);
        // SAFETY: `out` describes the caller's CUDA tensor (from its own __dlpack__ or
        // __cuda_array_interface__: device memory of the device's primary context, which PyTorch
        // and CuPy use), `len` elements of `out.dtype`, contiguous. The caller keeps it alive and
        // unused by others until `stream`'s work reaches the write (documented on `encode`).
        Ok(unsafe { DeviceOut::new(out.addr, len, out.dtype, ordinal, stream) })
    }
}

#[pymethods]
impl PyModel {
    /// Opens the weight file or model directory at `path`.
    #[new]
    #[pyo3(signature = (path, device=String::from("auto"), precision=None, max_soft_tokens=None,
                        max_image_tokens=None, max_megapixels=None, graphs=true,
                        max_patches_per_pass=None, gpu_tier=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        device: String,
        precision: Option<String>,
        max_soft_tokens: Option<u32>,
        max_image_tokens: Option<u64>,
        max_megapixels: Option<f64>,
        graphs: bool,
        max_patches_per_pass: Option<usize>,
        gpu_tier: Option<String>,
    ) -> PyResult<PyModel> {
        let force_tier = gpu_tier
            .as_deref()
            .map(vision_towers::parse_tier)
            .transpose()
            .map_err(|e| Failure::value(e.to_string()).into_pyerr(py))?;
        let device: Device = device
            .parse()
            .map_err(|e: vision_towers::ParseDeviceError| {
                Failure::value(e.to_string()).into_pyerr(py)
            })?;
        let precision = parse_precision(precision.as_deref()).map_err(|f| f.into_pyerr(py))?;
        let mut settings = PrepSettings {
            max_soft_tokens,
            max_image_tokens,
            ..PrepSettings::default()
        };
        if let Some(mp) = max_megapixels {
            if !(mp.is_finite() && mp > 0.0) {
                return Err(
                    Failure::value(format!("max_megapixels must be positive, got {mp}"))
                        .into_pyerr(py),
                );
            }
            settings.limits.max_pixels = (mp * 1e6).round().max(1.0) as u64;
        }
        let caller_budget = max_soft_tokens.is_some() || max_image_tokens.is_some();
        let options = TowerOptions {
            device,
            precision,
            max_patches_per_pass: max_patches_per_pass.unwrap_or(DEFAULT_MAX_PATCHES_PER_PASS),
            graphs,
            force_tier,
        };
        let model = detached(py, move || {
            Model::open_with(&path, &options, settings).map_err(|e| {
                let mut f = Failure::model(&e);
                // A budget the processor refuses is the caller's when the caller set one, else the
                // model's config's (the C ABI's rule).
                if e.kind() == ErrorKind::Setting && !caller_budget {
                    f.class = Class::BadModel;
                }
                f
            })
        })?;
        // `auto` on the CPU although a CUDA device is present: a warning, never silent
        if let Some(why) = model.cpu_reason() {
            let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
            let msg = std::ffi::CString::new(format!("vision_towers: running on the CPU: {why}"))
                .unwrap_or_default();
            PyErr::warn(py, &category, &msg, 1)?;
        }
        Ok(PyModel {
            family: model.family().name(),
            width: model.width(),
            device: model.device(),
            precision: model.precision(),
            lm: model.lm_attention(),
            model: Arc::new(model),
            max_rows: OnceLock::new(),
        })
    }

    /// `"gemma4"`, `"glm5_next"`, `"glm_ocr"` or `"step3p7"`.
    #[getter]
    fn family(&self) -> &'static str {
        self.family
    }

    /// The LM width of the rows (their columns).
    #[getter]
    fn width(&self) -> usize {
        self.width
    }

    /// Where the tower runs: `"cpu"` or `"cuda:N"` (what `"auto"` chose).
    #[getter]
    fn device(&self) -> String {
        self.device.to_string()
    }

    /// The tower's arithmetic: `"f32"`, `"bf16"` or `"f16"`.
    #[getter]
    fn precision(&self) -> String {
        self.precision.to_string()
    }

    /// Why `device="auto"` runs on the CPU although a CUDA device is present (an architecture
    /// without a GPU tier, a driver older than CUDA 13 needs, no cuBLASLt, a model the CUDA path
    /// does not take); None on CUDA and where the machine has no CUDA device. Opening such a model
    /// also issues a RuntimeWarning with the same text.
    #[getter]
    fn cpu_reason(&self) -> Option<String> {
        self.model.cpu_reason().map(str::to_string)
    }

    /// The GPU tier the tower runs (`"9.0 Hopper (H100, H200, GH200)"`; `"8.0 Ampere (A100,
    /// A30), forced on 9.0"` under `gpu_tier="8.0"` or `GPU_CORE_FORCE_TIER`); None on the CPU.
    #[getter]
    fn gpu_tier(&self) -> Option<String> {
        self.model.tier().map(str::to_string)
    }

    /// How the LM attends over image rows: `"causal"`, `"bidirectional"` (the whole text model),
    /// or `"bidirectional_image_runs_in_sliding_layers"` (gemma4 `use_bidirectional_attention =
    /// "vision"`: sliding-window layers attend both ways within one image's run of soft tokens).
    #[getter]
    fn lm_attention(&self) -> &'static str {
        match self.lm {
            LmAttention::Causal => "causal",
            LmAttention::BidirectionalImageRunsInSlidingLayers => {
                "bidirectional_image_runs_in_sliding_layers"
            }
            LmAttention::Bidirectional => "bidirectional",
        }
    }

    /// The weight file or directory it was opened from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.model.path().to_path_buf()
    }

    /// The plan of one image from its header alone (nothing decoded): a dict with `rows`,
    /// `prompt_runs` (`(token_id, count)` tuples; id None when the configs lack it),
    /// `prompt_tokens` (their texts), `is_embed` (one bool per prompt token: True where it
    /// receives a row; BOI/EOI and brackets stay text), `target` (w, h), `grid`, `width`,
    /// `height`, `family`, `processor` and a family `detail`.
    fn plan<'py>(&self, py: Python<'py>, image: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let img = input::image(image, 0)?;
        let model = self.model.clone();
        let planned = detached(py, move || {
            let read = input::read(&img, None)?;
            model.plan(read.source()).map_err(|e| match e {
                vision_towers::ModelError::Image { source, .. } => {
                    input::plan_failure(&source, &read)
                }
                other => Failure::model(&other),
            })
        })?;
        plan::to_dict(py, &planned)
    }

    /// The most rows one image can give under this model's settings (its budgets and decode
    /// limit), for sizing caches and memory profiling.
    fn max_rows_per_image(&self, py: Python<'_>) -> PyResult<u64> {
        let model = self.model.clone();
        let cell = &self.max_rows;
        detached(py, || {
            Ok(*cell.get_or_init(move || model.max_rows_per_image()))
        })
    }

    /// Encodes images (a list of bytes, bytearray, memoryview, paths or `data:` URIs) in
    /// padding-free passes and returns one `ImageRows` per image, in order: float32 host rows
    /// for a CPU model; for a CUDA model rows left on the device in `dtype` (default: the
    /// model's precision), one buffer shared by the images, exported without a copy through
    /// `__dlpack__` (`torch.from_dlpack(rows)` on the current stream: ordered, no host sync).
    ///
    /// `out`: a contiguous CUDA tensor `[total rows, width]` of float32 or bfloat16 (anything
    /// exporting `__dlpack__` or `__cuda_array_interface__`) to receive every image's rows in
    /// order; the call then returns each image's row count. The rows are written after the work
    /// `out_stream` has queued and `out_stream` waits for them (pass
    /// `torch.cuda.current_stream()` or its `.cuda_stream`; default: the legacy default stream).
    /// Keep `out` alive until that stream's work is done (PyTorch's allocator does, if `out` is
    /// used on that stream).
    #[pyo3(signature = (images, dtype=None, *, out=None, out_stream=None))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        images: &Bound<'py, PyAny>,
        dtype: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
        out_stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let objs = input::images(images)?;
        let imgs = objs
            .iter()
            .enumerate()
            .map(|(i, o)| input::image(o, i))
            .collect::<PyResult<Vec<Image<'_>>>>()?;
        let asked = input::dtype(dtype)?;
        let stream = input::stream(out_stream)?;
        let out = out
            .filter(|o| !o.is_none())
            .map(input::out)
            .transpose()
            .map_err(|f| f.into_pyerr(py))?;
        let dtype = self.rows_dtype(asked).map_err(|f| f.into_pyerr(py))?;
        let model = self.model.clone();
        let encoded = detached(py, || {
            let reads = imgs
                .iter()
                .enumerate()
                .map(|(i, img)| input::read(img, Some(i)))
                .collect::<Result<Vec<Read<'_>>, Failure>>()?;
            let sources: Vec<ImageSource<'_>> = reads.iter().map(Read::source).collect();
            let failed = |e: vision_towers::ModelError| Failure::model(&e);
            let info = |plan: vision_towers::vision_prep::Plan| Arc::new(PlanInfo::Image(plan));
            if let Some(out) = &out {
                // The plans first (headers only): the output's shape is checked before anything
                // is decoded or written.
                let mut total = 0usize;
                for (i, s) in sources.iter().enumerate() {
                    let plan = model.plan(*s).map_err(|e| match e {
                        vision_towers::ModelError::Image { source, .. } => {
                            Failure::model(&vision_towers::ModelError::Image { index: i, source })
                        }
                        other => failed(other),
                    })?;
                    total += plan.rows as usize;
                }
                let target = self.device_out(out, asked, stream, Some(total))?;
                let plans = model
                    .encode_device_into(&sources, &target)
                    .map_err(failed)?;
                return Ok(Encoded::Counts(
                    plans.iter().map(|p| p.rows as usize).collect(),
                ));
            }
            if sources.is_empty() {
                return Ok(Encoded::Rows(Vec::new()));
            }
            match self.device {
                Device::Cuda(_) => {
                    let d = model.encode_device(&sources, dtype).map_err(failed)?;
                    let plans = d.plans.into_iter().map(info).collect();
                    Ok(Encoded::Rows(ImageRows::on_device(d.rows, Some(plans))))
                }
                _ => {
                    let e = model.encode(&sources).map_err(failed)?;
                    Ok(Encoded::Rows(
                        e.into_iter()
                            .map(|e| ImageRows::on_host(e.rows, e.width, Some(info(e.plan))))
                            .collect(),
                    ))
                }
            }
        })?;
        encoded.into_pyobject(py)
    }

    /// Encodes the tensors of the model's HF image processor (a mapping of upstream names —
    /// `pixel_values`, `image_position_ids`, `image_grid_thw`, `pixel_values_local`,
    /// `num_local_patches`, `patch_newline_masks` — to CPU arrays: NumPy arrays, PyTorch CPU
    /// tensors, anything exporting `__dlpack__`) instead of image bytes: floats are read as
    /// float32, integers and booleans as int64. Returns as `encode` does (`plan` is None); with
    /// `out`, its shape must be `[rows, width]` with exactly the tensors' rows.
    #[pyo3(signature = (tensors, dtype=None, *, out=None, out_stream=None))]
    fn encode_prepared<'py>(
        &self,
        py: Python<'py>,
        tensors: &Bound<'py, PyAny>,
        dtype: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
        out_stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let set = input::tensors(tensors).map_err(|f| f.into_pyerr(py))?;
        let asked = input::dtype(dtype)?;
        let stream = input::stream(out_stream)?;
        let out = out
            .filter(|o| !o.is_none())
            .map(input::out)
            .transpose()
            .map_err(|f| f.into_pyerr(py))?;
        let dtype = self.rows_dtype(asked).map_err(|f| f.into_pyerr(py))?;
        let model = self.model.clone();
        let encoded = detached(py, || {
            let failed = |e: vision_towers::ModelError| Failure::model(&e);
            if let Some(out) = &out {
                let target = self.device_out(out, asked, stream, None)?;
                let counts = model.encode_tensors_into(&set, &target).map_err(failed)?;
                let total: usize = counts.iter().sum();
                if out.shape.first() != Some(&total) {
                    return Err(Failure::value(format!(
                        "out has {} rows, the tensors gave {total} (written to its first rows)",
                        out.shape.first().copied().unwrap_or(0)
                    )));
                }
                return Ok(Encoded::Counts(counts));
            }
            match self.device {
                Device::Cuda(_) => {
                    let rows = model.encode_tensors_device(&set, dtype).map_err(failed)?;
                    Ok(Encoded::Rows(ImageRows::on_device(rows, None)))
                }
                _ => {
                    let rows = model.encode_tensors(&set).map_err(failed)?;
                    let width = rows.width;
                    Ok(Encoded::Rows(
                        rows.per_image
                            .into_iter()
                            .map(|r| ImageRows::on_host(r, width, None))
                            .collect(),
                    ))
                }
            }
        })?;
        encoded.into_pyobject(py)
    }

    /// The plan of one video from its metadata and its frames' size alone (raw frames: the
    /// width and height; encoded frames: the sampled frames' headers; nothing decoded): a dict
    /// with `rows`, `frames_indices` (the sampled frames), `timestamps`, `video_grid_thw`,
    /// `target`, `content`, `width`, `height`, `family`, `processor`, `prompt` (the pieces in
    /// order: a token run a `(token_id, count, embeds)` tuple, text a `str` for the tokenizer),
    /// `prompt_tokens` (each piece's token text, None for text), `prompt_runs` (`(token_id,
    /// count)` of the runs alone) and `is_embed` (one bool per token of those runs). Takes what
    /// `encode_video` takes.
    #[pyo3(signature = (frames, *, fps=None, total_num_frames=None, duration=None, width=None,
                        height=None, sample_fps=None, num_frames=None, max_frames=None,
                        max_soft_tokens=None, min_image_tokens=None, max_image_tokens=None))]
    #[allow(clippy::too_many_arguments)]
    fn plan_video<'py>(
        &self,
        py: Python<'py>,
        frames: &Bound<'py, PyAny>,
        fps: Option<f64>,
        total_num_frames: Option<u64>,
        duration: Option<f64>,
        width: Option<u32>,
        height: Option<u32>,
        sample_fps: Option<f64>,
        num_frames: Option<u64>,
        max_frames: Option<u64>,
        max_soft_tokens: Option<u32>,
        min_image_tokens: Option<u64>,
        max_image_tokens: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let objs = video::frame_list(frames)?;
        let args = video::args(
            frames,
            &objs,
            Described {
                fps,
                total_num_frames,
                duration,
                width,
                height,
            },
            Sampling {
                sample_fps,
                num_frames,
                max_frames,
                max_soft_tokens,
                min_image_tokens,
                max_image_tokens,
            },
        )?;
        let model = self.model.clone();
        let planned = detached(py, move || {
            video::with_video(&model, &args, |pre, v| {
                pre.plan(v).map_err(|source| {
                    vision_towers::ModelError::Prep(vision_towers::PrepOpenError::Prep {
                        path: model.path().to_path_buf(),
                        source,
                    })
                })
            })
        })?;
        plan::video_to_dict(py, &planned)
    }

    /// Encodes one video (glm5_next and gemma4; docs/VIDEO.md) and returns its rows as one
    /// `ImageRows` (`[plan rows, width]`, the frames' rows in prompt order; `.plan` is the
    /// video's plan, as `plan_video` gives it): float32 host rows for a CPU model, rows left on
    /// the device in `dtype` for a CUDA model (exported through `__dlpack__` as `encode`'s).
    ///
    /// `frames`: every frame of the video, in order: a list of encoded images (bytes,
    /// bytearray, memoryview, paths or `data:` URIs; only the sampled frames are read), raw RGB
    /// frames back to back in a bytes-like object with `width` and `height`, or a uint8 array
    /// `[frames, height, width, 3]` exporting `__dlpack__` (NumPy, PyTorch CPU). `fps`: the
    /// video's frame rate (glm5_next needs it); `total_num_frames` (default: the frames given)
    /// and `duration` (seconds): the rest of its metadata. The metadata budgets (frames, pixels
    /// of the sampled frames, bytes) are checked before any frame is read: `BadImageError`
    /// (kind `prep:VideoOverBudget`). Sampling settings override the model's video processor
    /// config: `sample_fps` (glm5_next target rate), `num_frames` (gemma4), `max_frames`,
    /// `max_soft_tokens` (gemma4, per frame), `min_image_tokens` / `max_image_tokens`
    /// (glm5_next, the whole video); one out of range raises ValueError. A family without a
    /// video path raises `UnsupportedError` (kind `prep:NoVideoPath`).
    #[pyo3(signature = (frames, *, fps=None, total_num_frames=None, duration=None, width=None,
                        height=None, sample_fps=None, num_frames=None, max_frames=None,
                        max_soft_tokens=None, min_image_tokens=None, max_image_tokens=None,
                        dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn encode_video(
        &self,
        py: Python<'_>,
        frames: &Bound<'_, PyAny>,
        fps: Option<f64>,
        total_num_frames: Option<u64>,
        duration: Option<f64>,
        width: Option<u32>,
        height: Option<u32>,
        sample_fps: Option<f64>,
        num_frames: Option<u64>,
        max_frames: Option<u64>,
        max_soft_tokens: Option<u32>,
        min_image_tokens: Option<u64>,
        max_image_tokens: Option<u64>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<ImageRows> {
        let objs = video::frame_list(frames)?;
        let args = video::args(
            frames,
            &objs,
            Described {
                fps,
                total_num_frames,
                duration,
                width,
                height,
            },
            Sampling {
                sample_fps,
                num_frames,
                max_frames,
                max_soft_tokens,
                min_image_tokens,
                max_image_tokens,
            },
        )?;
        let asked = input::dtype(dtype)?;
        let dtype = self.rows_dtype(asked).map_err(|f| f.into_pyerr(py))?;
        let model = self.model.clone();
        let device = self.device;
        detached(py, move || {
            video::with_video(&model, &args, |pre, v| match device {
                Device::Cuda(_) => {
                    let d = model.encode_video_device(pre, v, dtype)?;
                    let plan = Arc::new(PlanInfo::Video(d.plan));
                    Ok(ImageRows::on_device_whole(d.rows, Some(plan)))
                }
                _ => {
                    let e = model.encode_video_with(pre, v)?;
                    let plan = Arc::new(PlanInfo::Video(e.plan));
                    Ok(ImageRows::on_host(e.rows, e.width, Some(plan)))
                }
            })
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Model({:?}, family={}, device={}, precision={}, width={})",
            self.model.path().display().to_string(),
            self.family,
            self.device,
            self.precision,
            self.width
        )
    }
}
