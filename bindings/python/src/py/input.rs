//! Python inputs turned into Rust values while the GIL is held: images (bytes, a path, a `data:`
//! URI), processor tensors (any DLPack producer on the CPU), the `out=` buffer and its stream,
//! and the rows' dtype. Nothing here runs the model.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyMemoryView, PyString};

use vision_towers::vision_prep::{ImageSource, PrepError};
use vision_towers::{
    read_image_arg, ImageArg, PrepOpenError, ProcessorTensors, RowsDtype, MAX_IMAGE_FILE_BYTES,
};

use crate::dlpack::{
    Borrowed, DLDataType, KDL_BFLOAT, KDL_BOOL, KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_FLOAT,
    KDL_INT, KDL_UINT,
};
use crate::failure::Failure;
use crate::py::capsule;

/// One image argument, extracted: a `bytes` object is read in place (it is immutable and the
/// caller's list keeps it alive), anything else is owned.
pub enum Image<'a> {
    /// A `bytes` object's contents.
    Bytes(&'a [u8]),
    /// A copy of a `bytearray` or `memoryview`.
    Owned(Vec<u8>),
    /// A `str`: a `data:` URI, a refused scheme, or a path, exactly as `vtower` reads its
    /// image arguments.
    Arg(String),
    /// An `os.PathLike`: always a path.
    Path(PathBuf),
}

/// An image's bytes once read (files are read without the GIL).
pub enum Read<'a> {
    /// Bytes in memory.
    Bytes(&'a [u8]),
    /// Bytes read from a file, and its path.
    Owned(Vec<u8>, Option<PathBuf>),
    /// A `data:` URI.
    Uri(String),
}

impl Read<'_> {
    /// The source vision-prep takes.
    pub fn source(&self) -> ImageSource<'_> {
        match self {
            Read::Bytes(b) => ImageSource::Bytes(b),
            Read::Owned(b, _) => ImageSource::Bytes(b),
            Read::Uri(u) => ImageSource::DataUri(u),
        }
    }

    /// How `vtower plan` names this image in a message (its path or URI; none for bytes).
    pub fn label(&self) -> Option<String> {
        match self {
            Read::Bytes(_) | Read::Owned(_, None) => None,
            Read::Owned(_, Some(p)) => Some(p.display().to_string()),
            Read::Uri(u) => Some(ImageArg::Uri(u.clone()).label().display().to_string()),
        }
    }
}

/// Extracts one image argument.
pub fn image<'a>(obj: &'a Bound<'_, PyAny>, index: usize) -> PyResult<Image<'a>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Image::Bytes(b.as_bytes()));
    }
    if obj.cast::<PyString>().is_ok() {
        return Ok(Image::Arg(obj.extract::<String>()?));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Image::Owned(b.to_vec()));
    }
    if obj.cast::<PyMemoryView>().is_ok() {
        let b = obj.call_method0("tobytes")?;
        return Ok(Image::Owned(b.cast::<PyBytes>()?.as_bytes().to_vec()));
    }
    if obj.hasattr("__fspath__")? {
        return Ok(Image::Path(obj.extract::<PathBuf>()?));
    }
    Err(Failure::type_error(format!(
        "image {index}: expected bytes, bytearray, memoryview, a path (str or os.PathLike) or a \
         data: URI string, got {}",
        obj.get_type().name()?
    ))
    .into_pyerr(obj.py()))
}

/// Extracts a list (or any iterable but a single image) of image arguments.
pub fn images<'py>(list: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if list.cast::<PyBytes>().is_ok()
        || list.cast::<PyString>().is_ok()
        || list.cast::<PyByteArray>().is_ok()
        || list.hasattr("__fspath__")?
    {
        return Err(Failure::type_error(
            "encode takes a list of images; put a single image in a list",
        )
        .into_pyerr(list.py()));
    }
    list.try_iter()?.collect()
}

/// Reads image `index` (its file, if it is a path).
pub fn read<'b>(img: &'b Image<'_>, index: Option<usize>) -> Result<Read<'b>, Failure> {
    match img {
        Image::Bytes(b) => Ok(Read::Bytes(b)),
        Image::Owned(b) => Ok(Read::Bytes(b)),
        Image::Arg(s) => match read_image_arg(s) {
            Ok(ImageArg::Bytes(b, p)) => Ok(Read::Owned(b, Some(p))),
            Ok(ImageArg::Uri(u)) => Ok(Read::Uri(u)),
            Err(e) => Err(Failure::image_read(&e, index)),
        },
        Image::Path(p) => read_path(p)
            .map(|b| Read::Owned(b, Some(p.clone())))
            .map_err(|e| Failure::image_read(&e, index)),
    }
}

/// An image file, as `vtower` reads one: refused over [`MAX_IMAGE_FILE_BYTES`] before reading.
fn read_path(path: &Path) -> Result<Vec<u8>, PrepOpenError> {
    let io = |source| PrepOpenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_IMAGE_FILE_BYTES {
        return Err(PrepOpenError::TooLarge {
            path: path.to_path_buf(),
            len,
        });
    }
    std::fs::read(path).map_err(io)
}

/// A failure of vision-prep on a read image while planning, named as `vtower plan` names it.
pub fn plan_failure(e: &PrepError, read: &Read<'_>) -> Failure {
    Failure::image_prep(e, read.label().as_deref(), None)
}

/// The rows' dtype from `None`, a string (`"float32"`, `"bfloat16"`, `"bf16"`, `"float16"`, …)
/// or anything whose `str()` is one (`torch.bfloat16`, `torch.float16`, `numpy.dtype("float32")`).
pub fn dtype(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<RowsDtype>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let text: String = match obj.cast::<PyString>() {
        Ok(s) => s.extract()?,
        Err(_) => obj.str()?.extract()?,
    };
    let t = text.trim();
    let t = t.strip_prefix("torch.").unwrap_or(t);
    match t.to_ascii_lowercase().as_str() {
        "float32" | "float" | "f32" | "fp32" => Ok(Some(RowsDtype::F32)),
        "bfloat16" | "bf16" => Ok(Some(RowsDtype::Bf16)),
        "float16" | "half" | "f16" | "fp16" => Ok(Some(RowsDtype::F16)),
        _ => Err(Failure::value(format!(
            "dtype must be float32, bfloat16 or float16 (a string or a torch dtype), got {text:?}"
        ))
        .into_pyerr(obj.py())),
    }
}

/// A raw `CUstream` from `None` (the legacy default stream), an int, or a stream object
/// (`torch.cuda.Stream`'s `cuda_stream`, CuPy's `ptr`).
pub fn stream(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let raw = if let Ok(v) = obj.extract::<i64>() {
        v
    } else if obj.hasattr("cuda_stream")? {
        obj.getattr("cuda_stream")?.extract::<i64>()?
    } else if obj.hasattr("ptr")? {
        obj.getattr("ptr")?.extract::<i64>()?
    } else {
        return Err(Failure::type_error(format!(
            "out_stream must be an int (a CUstream) or a stream object, got {}",
            obj.get_type().name()?
        ))
        .into_pyerr(obj.py()));
    };
    u64::try_from(raw).map(Some).map_err(|_| {
        Failure::value(format!("out_stream {raw} is not a CUstream")).into_pyerr(obj.py())
    })
}

/// The caller's output buffer.
#[derive(Debug, Clone)]
pub struct Out {
    /// Address of its first element.
    pub addr: u64,
    /// Extents.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: RowsDtype,
    /// CUDA device ordinal, when the producer said it.
    pub ordinal: Option<usize>,
    /// The stream its producer named (`__cuda_array_interface__` v3 `stream`).
    pub stream: Option<u64>,
}

/// Reads `out` (a CUDA tensor exporting `__dlpack__` or `__cuda_array_interface__`): its
/// address, extents and dtype; contiguity and device checked.
pub fn out(obj: &Bound<'_, PyAny>) -> Result<Out, Failure> {
    let py = obj.py();
    let err = |e: PyErr| Failure::type_error(format!("out: {}", e.value(py)));
    if obj.hasattr("__dlpack__").map_err(err)? {
        // stream=-1: no synchronisation; the rows are ordered with `out_stream` instead.
        let kwargs = PyDict::new(py);
        kwargs.set_item("stream", -1).map_err(err)?;
        let cap = obj
            .call_method("__dlpack__", (), Some(&kwargs))
            .or_else(|_| obj.call_method0("__dlpack__"))
            .map_err(err)?;
        let t = capsule::read(&cap, "out")?;
        if t.device.device_type != KDL_CUDA {
            return Err(Failure::unsupported(format!(
                "out: a tensor on DLPack device type {} (out= takes a CUDA tensor)",
                t.device.device_type
            )));
        }
        if !t.is_contiguous() {
            return Err(Failure::value(format!(
                "out: strides {:?} for shape {:?} are not contiguous",
                t.strides, t.shape
            )));
        }
        let dtype = match t.dtype {
            DLDataType::F32 => RowsDtype::F32,
            DLDataType::BF16 => RowsDtype::Bf16,
            DLDataType::F16 => RowsDtype::F16,
            other => {
                return Err(Failure::value(format!(
                    "out: dtype {} (float32, bfloat16 or float16 rows)",
                    other.name()
                )))
            }
        };
        return Ok(Out {
            addr: t.addr,
            shape: t.shape,
            dtype,
            ordinal: usize::try_from(t.device.device_id).ok(),
            stream: None,
        });
    }
    if obj.hasattr("__cuda_array_interface__").map_err(err)? {
        let cai = obj.getattr("__cuda_array_interface__").map_err(err)?;
        let get = |k: &str| cai.get_item(k).ok().filter(|v| !v.is_none());
        let (addr, _readonly): (u64, bool) = get("data")
            .ok_or_else(|| Failure::type_error("out: __cuda_array_interface__ has no data"))?
            .extract()
            .map_err(err)?;
        let shape: Vec<usize> = get("shape")
            .ok_or_else(|| Failure::type_error("out: __cuda_array_interface__ has no shape"))?
            .extract()
            .map_err(err)?;
        let typestr: String = get("typestr")
            .ok_or_else(|| Failure::type_error("out: __cuda_array_interface__ has no typestr"))?
            .extract()
            .map_err(err)?;
        let dtype = match typestr.as_str() {
            "<f4" => RowsDtype::F32,
            "<f2" => RowsDtype::F16,
            other => {
                return Err(Failure::value(format!(
                    "out: typestr {other:?} (float32 or float16 rows; bfloat16 through __dlpack__)"
                )))
            }
        };
        if let Some(strides) = get("strides") {
            let strides: Vec<i64> = strides.extract().map_err(err)?;
            let b = Borrowed {
                addr,
                device: crate::dlpack::DLDevice {
                    device_type: KDL_CUDA,
                    device_id: 0,
                },
                dtype: DLDataType::F32,
                shape: shape.clone(),
                strides: strides.iter().map(|s| s / 4).collect(),
            };
            if strides.iter().any(|s| s % 4 != 0) || !b.is_contiguous() {
                return Err(Failure::value(format!(
                    "out: byte strides {strides:?} for shape {shape:?} are not contiguous"
                )));
            }
        }
        let stream = match get("stream") {
            Some(s) => Some(s.extract::<u64>().map_err(err)?),
            None => None,
        };
        return Ok(Out {
            addr,
            shape,
            dtype,
            ordinal: None,
            stream,
        });
    }
    Err(Failure::type_error(format!(
        "out must be a CUDA tensor exporting __dlpack__ or __cuda_array_interface__, got {}",
        obj.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    )))
}

/// The processor's tensors from a mapping of upstream names to CPU arrays (anything exporting
/// `__dlpack__`: NumPy arrays, PyTorch CPU tensors): floats as f32, integers and booleans as i64.
pub fn tensors(map: &Bound<'_, PyAny>) -> Result<ProcessorTensors, Failure> {
    let py = map.py();
    let err = |e: PyErr| Failure::type_error(format!("tensors: {}", e.value(py)));
    let items = map.call_method0("items").map_err(|_| {
        Failure::type_error("encode_prepared takes a mapping of tensor names to arrays")
    })?;
    let mut set = ProcessorTensors::new();
    for item in items.try_iter().map_err(err)? {
        let (name, value): (String, Bound<'_, PyAny>) =
            item.map_err(err)?.extract().map_err(err)?;
        if !value.hasattr("__dlpack__").map_err(err)? {
            return Err(Failure::type_error(format!(
                "tensor {name}: {} does not export __dlpack__ (pass NumPy arrays or PyTorch \
                 CPU tensors)",
                value.get_type().name().map_err(err)?
            )));
        }
        // A versioned capsule where the producer makes one (it can say read-only: NumPy
        // refuses a read-only array as a legacy capsule); we only read.
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 0)).map_err(err)?;
        let cap = match value.call_method("__dlpack__", (), Some(&kwargs)) {
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
                value.call_method0("__dlpack__")
            }
            other => other,
        }
        .map_err(|e| {
            Failure::new(
                crate::failure::Class::BadInput,
                "inputs",
                format!("tensor {name}: __dlpack__ failed: {}", e.value(py)),
            )
        })?;
        let what = format!("tensor {name}");
        let t = capsule::read(&cap, &what)?;
        if t.device.device_type != KDL_CPU && t.device.device_type != KDL_CUDA_HOST {
            return Err(bad_input(format!(
                "{what}: on DLPack device type {}; pass the processor's CPU tensors",
                t.device.device_type
            )));
        }
        // SAFETY: `cap` (unconsumed) keeps the producer's memory alive while it is read, and a
        // CPU DLPack tensor's elements lie at `addr + Σ index·stride·size`.
        let values = unsafe { gather(&t) }.map_err(|e| bad_input(format!("{what}: {e}")))?;
        let inserted = match values {
            Values::F32(v) => set.insert_f32(&name, t.shape.clone(), v),
            Values::I64(v) => set.insert_i64(&name, t.shape.clone(), v),
        };
        inserted.map_err(|e| bad_input(e.to_string()))?;
        drop(cap);
    }
    Ok(set)
}

fn bad_input(message: String) -> Failure {
    Failure::new(crate::failure::Class::BadInput, "inputs", message)
}

/// A tensor's values, widened.
enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

/// Copies a host tensor's elements in row-major order, converted: floats to f32, integers and
/// booleans to i64.
///
/// # Safety
/// `t` must describe live host memory: every element `addr + Σ index·stride·size` readable.
unsafe fn gather(t: &Borrowed) -> Result<Values, String> {
    let n = t.numel();
    let d = t.dtype;
    if d.lanes != 1 {
        return Err(format!("dtype {} has lanes", d.name()));
    }
    let size = match (d.code, d.bits) {
        (KDL_FLOAT, 16 | 32 | 64) | (KDL_BFLOAT, 16) => usize::from(d.bits / 8),
        (KDL_INT | KDL_UINT, 8 | 16 | 32 | 64) | (KDL_BOOL, 8) => usize::from(d.bits / 8),
        _ => {
            return Err(format!(
                "dtype {} is not a float, integer or bool",
                d.name()
            ))
        }
    };
    // The byte offset of every element, row-major (computed only for a strided tensor).
    let strided = (!t.is_contiguous()).then(|| element_offsets(&t.shape, &t.strides, size as i64));
    let offset = |k: usize| match &strided {
        Some(o) => o[k],
        None => (k * size) as i64,
    };
    let at = |k: usize| (t.addr as i64).wrapping_add(offset(k)) as usize as *const u8;
    macro_rules! read_as {
        ($ty:ty) => {
            (0..n).map(|k| {
                // SAFETY: the caller's contract; unaligned reads allowed.
                unsafe { std::ptr::read_unaligned(at(k).cast::<$ty>()) }
            })
        };
    }
    let mut f = Vec::new();
    let mut i = Vec::new();
    match (d.code, d.bits) {
        (KDL_FLOAT, 32) => f = read_as!(f32).collect(),
        (KDL_FLOAT, 64) => f = read_as!(f64).map(|v| v as f32).collect(),
        (KDL_FLOAT, 16) => {
            f = read_as!(u16)
                .map(|b| half::f16::from_bits(b).to_f32())
                .collect()
        }
        (KDL_BFLOAT, 16) => {
            f = read_as!(u16)
                .map(|b| half::bf16::from_bits(b).to_f32())
                .collect()
        }
        (KDL_INT, 8) => i = read_as!(i8).map(i64::from).collect(),
        (KDL_INT, 16) => i = read_as!(i16).map(i64::from).collect(),
        (KDL_INT, 32) => i = read_as!(i32).map(i64::from).collect(),
        (KDL_INT, 64) => i = read_as!(i64).collect(),
        (KDL_UINT, 8) | (KDL_BOOL, 8) => i = read_as!(u8).map(i64::from).collect(),
        (KDL_UINT, 16) => i = read_as!(u16).map(i64::from).collect(),
        (KDL_UINT, 32) => i = read_as!(u32).map(i64::from).collect(),
        (KDL_UINT, 64) => {
            i = read_as!(u64)
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
                .collect()
        }
        _ => unreachable!("checked above"),
    }
    debug_assert!(f.len() == n || i.len() == n);
    Ok(if d.code == KDL_FLOAT || d.code == KDL_BFLOAT {
        Values::F32(f)
    } else {
        Values::I64(i)
    })
}

/// Byte offsets of every element of `shape` under element `strides`, in row-major order.
fn element_offsets(shape: &[usize], strides: &[i64], size: i64) -> Vec<i64> {
    let n = shape.iter().product::<usize>();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut index = vec![0usize; shape.len()];
    for _ in 0..n {
        let off: i64 = index
            .iter()
            .zip(strides)
            .map(|(&i, &s)| (i as i64).wrapping_mul(s))
            .fold(0i64, i64::wrapping_add);
        out.push(off.wrapping_mul(size));
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}
