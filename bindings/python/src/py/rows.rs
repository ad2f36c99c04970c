//! `ImageRows`: one image's rows, exported to any array library through DLPack.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use vision_towers::vision_prep::{Plan, VideoPlan};
use vision_towers::{DeviceRows, RowsDtype, PER_THREAD_DEFAULT_STREAM};

use crate::dlpack::{self, DLDataType, DLDevice, Export2d, KDL_CPU, KDL_CUDA};
use crate::failure::Failure;
use crate::py::errors::detached;
use crate::py::{capsule, plan};

/// Where a request's rows live. Every image's `ImageRows` of one device request shares one
/// `DeviceRows` (one buffer); host rows are one `Vec` per image.
#[derive(Debug)]
pub enum Store {
    /// f32 rows on the host.
    Host(Vec<f32>),
    /// Rows on a CUDA device.
    Device(DeviceRows),
}

/// The plan the rows land on: an image's, or a whole video's.
#[derive(Debug)]
pub enum PlanInfo {
    /// An image's plan (`Model.plan`).
    Image(Plan),
    /// A video's plan (`Model.plan_video`).
    Video(VideoPlan),
}

/// One image's rows `[rows, width]` (or one video's, all its frames), row-major, in the LM's
/// dtype: host float32 for a CPU model, device memory for a CUDA model (zero-copy through
/// `__dlpack__`).
#[pyclass(frozen, module = "vision_towers", name = "ImageRows")]
pub struct ImageRows {
    store: Arc<Store>,
    /// The first row of these rows in the store (an image's place in a shared device buffer).
    start: usize,
    rows: usize,
    width: usize,
    plan: Option<Arc<PlanInfo>>,
}

impl ImageRows {
    /// Host rows of one image.
    pub fn on_host(rows: Vec<f32>, width: usize, plan: Option<Arc<PlanInfo>>) -> ImageRows {
        let n = rows.len() / width.max(1);
        ImageRows {
            store: Arc::new(Store::Host(rows)),
            start: 0,
            rows: n,
            width,
            plan,
        }
    }

    /// One `ImageRows` per image of a device request, all sharing its buffer.
    pub fn on_device(rows: DeviceRows, plans: Option<Vec<Arc<PlanInfo>>>) -> Vec<ImageRows> {
        let width = rows.width();
        let images = rows.images();
        let spans: Vec<std::ops::Range<usize>> = (0..images)
            .map(|i| rows.image_rows(i).unwrap_or(0..0))
            .collect();
        let store = Arc::new(Store::Device(rows));
        spans
            .into_iter()
            .enumerate()
            .map(|(i, r)| ImageRows {
                store: store.clone(),
                start: r.start,
                rows: r.len(),
                width,
                plan: plans.as_ref().and_then(|p| p.get(i).cloned()),
            })
            .collect()
    }

    /// All the rows of a device request as one `ImageRows` (a video's frames, consecutive).
    pub fn on_device_whole(rows: DeviceRows, plan: Option<Arc<PlanInfo>>) -> ImageRows {
        let (width, n) = (rows.width(), rows.rows());
        ImageRows {
            store: Arc::new(Store::Device(rows)),
            start: 0,
            rows: n,
            width,
            plan,
        }
    }

    fn rows_dtype(&self) -> RowsDtype {
        match &*self.store {
            Store::Host(_) => RowsDtype::F32,
            Store::Device(d) => d.dtype(),
        }
    }

    fn dl_device(&self) -> DLDevice {
        match &*self.store {
            Store::Host(_) => DLDevice {
                device_type: KDL_CPU,
                device_id: 0,
            },
            Store::Device(d) => DLDevice {
                device_type: KDL_CUDA,
                device_id: d.ordinal() as i32,
            },
        }
    }

    fn ptr(&self) -> u64 {
        match &*self.store {
            Store::Host(v) => v.as_ptr() as usize as u64,
            Store::Device(d) => {
                d.device_ptr() + (self.start * self.width * d.dtype().size()) as u64
            }
        }
    }

    fn export(
        &self,
        py: Python<'_>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> Result<(Export2d, Box<dyn std::any::Any + Send>, bool), Failure> {
        let device = self.dl_device();
        if let Some((t, id)) = dl_device {
            if (t, id) != (device.device_type, device.device_id) {
                return Err(Failure::buffer(format!(
                    "the rows live on {}; they cannot be exported to DLPack device ({t}, {id})",
                    self.device_name()
                )));
            }
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let shape = [self.rows as i64, self.width as i64];
        let dtype = match self.rows_dtype() {
            RowsDtype::F32 => DLDataType::F32,
            RowsDtype::Bf16 => DLDataType::BF16,
            RowsDtype::F16 => DLDataType::F16,
        };
        match &*self.store {
            Store::Host(v) => {
                if stream.is_some() {
                    return Err(Failure::value(
                        "stream must be None for rows on the CPU (DLPack: no streams on kDLCPU)",
                    ));
                }
                if copy == Some(true) {
                    let copied = Arc::new(v.clone());
                    let e = Export2d {
                        data: copied.as_ptr() as usize as u64,
                        shape,
                        dtype,
                        device,
                        copied: true,
                    };
                    return Ok((e, Box::new(copied), versioned));
                }
                let e = Export2d {
                    data: self.ptr(),
                    shape,
                    dtype,
                    device,
                    copied: false,
                };
                Ok((e, Box::new(self.store.clone()), versioned))
            }
            Store::Device(_) => {
                if copy == Some(true) {
                    return Err(Failure::buffer(
                        "copy=True: rows on a CUDA device are exported without a copy; copy them \
                         with the consumer (torch: .clone())",
                    ));
                }
                // DLPack / array API: None and 1 = the legacy default stream, 2 = the per-thread
                // default stream, -1 = no synchronisation, 0 = ambiguous, else a CUstream.
                let wait = match stream {
                    None | Some(1) => Some(0u64),
                    Some(2) => Some(PER_THREAD_DEFAULT_STREAM),
                    Some(-1) => None,
                    Some(0) => {
                        return Err(Failure::value(
                            "stream 0 is ambiguous in DLPack: pass 1 for the legacy default \
                             stream, 2 for the per-thread one, or the stream's handle",
                        ))
                    }
                    Some(s) if s < 0 => {
                        return Err(Failure::value(format!("stream {s} is not a CUDA stream")))
                    }
                    Some(s) => Some(s as u64),
                };
                if let Some(s) = wait {
                    let store = self.store.clone();
                    let waited = py.detach(move || match &*store {
                        // SAFETY: the consumer passes a live stream of this device's primary
                        // context (the DLPack contract); it must outlive the rows, which holds
                        // for PyTorch's streams (pooled, never destroyed) and the default ones.
                        Store::Device(r) => unsafe { r.wait_on_stream(s) },
                        Store::Host(_) => Ok(()),
                    });
                    waited.map_err(|e| {
                        Failure::new(
                            crate::failure::Class::Device,
                            "gpu",
                            crate::failure::one_line(&e),
                        )
                    })?;
                }
                let e = Export2d {
                    data: self.ptr(),
                    shape,
                    dtype,
                    device,
                    copied: false,
                };
                Ok((e, Box::new(self.store.clone()), versioned))
            }
        }
    }

    fn device_name(&self) -> String {
        match &*self.store {
            Store::Host(_) => "cpu".into(),
            Store::Device(d) => format!("cuda:{}", d.ordinal()),
        }
    }
}

#[pymethods]
impl ImageRows {
    /// `(rows, width)`.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.width)
    }

    /// `"float32"`, `"bfloat16"` or `"float16"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.rows_dtype().name()
    }

    /// `"cpu"` or `"cuda:N"`.
    #[getter]
    fn device(&self) -> String {
        self.device_name()
    }

    /// The address of the first row (a device address for CUDA rows).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.ptr()
    }

    /// Bytes of the rows.
    #[getter]
    fn nbytes(&self) -> usize {
        self.rows * self.width * self.rows_dtype().size()
    }

    /// The image's plan (as `Model.plan` gives it), the video's (as `Model.plan_video` gives
    /// it) for the rows of `encode_video`, or None for rows of processor tensors.
    #[getter]
    fn plan<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.plan
            .as_ref()
            .map(|p| match &**p {
                PlanInfo::Image(plan) => plan::to_dict(py, plan),
                PlanInfo::Video(plan) => plan::video_to_dict(py, plan),
            })
            .transpose()
    }

    /// The rows' bytes, little-endian in their dtype (a copy; for device rows this waits for
    /// them to be written).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        match &*self.store {
            Store::Host(v) => {
                let mut b = Vec::with_capacity(v.len() * 4);
                for x in v {
                    b.extend_from_slice(&x.to_le_bytes());
                }
                Ok(PyBytes::new(py, &b))
            }
            Store::Device(_) => {
                let store = self.store.clone();
                let (r, width) = (self.start..self.start + self.rows, self.width);
                let bytes = detached(py, move || {
                    let Store::Device(d) = &*store else {
                        return Ok(Vec::new());
                    };
                    let all = d.to_host_bytes().map_err(|e| {
                        Failure::new(
                            crate::failure::Class::Device,
                            "gpu",
                            crate::failure::one_line(&e),
                        )
                    })?;
                    let size = d.dtype().size();
                    Ok(all[r.start * width * size..r.end * width * size].to_vec())
                })?;
                Ok(PyBytes::new(py, &bytes))
            }
        }
    }

    /// `(device_type, device_id)`: `(1, 0)` (kDLCPU) or `(2, N)` (kDLCUDA).
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.dl_device();
        (d.device_type, d.device_id)
    }

    /// A DLPack capsule of the rows (no copy). `stream`: the consumer's stream (None or 1: the
    /// legacy default stream, 2: the per-thread default stream, -1: no synchronisation, else a
    /// `CUstream`): it is made to wait for the rows on the device before this returns (the host
    /// is never blocked), and the memory is freed only after that stream's work queued before
    /// the consumer releases it. `max_version >= (1, 0)` gives a versioned capsule.
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (e, owner, versioned) = self
            .export(py, stream, max_version, dl_device, copy)
            .map_err(|f| f.into_pyerr(py))?;
        if versioned {
            capsule::versioned(py, dlpack::export_versioned(&e, owner))
        } else {
            capsule::legacy(py, dlpack::export_legacy(&e, owner))
        }
    }

    fn __len__(&self) -> usize {
        self.rows
    }

    fn __repr__(&self) -> String {
        format!(
            "ImageRows(shape=({}, {}), dtype={}, device={})",
            self.rows,
            self.width,
            self.rows_dtype().name(),
            self.device_name()
        )
    }
}
