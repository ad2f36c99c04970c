//! The exception hierarchy and the one mapping from a [`Failure`] to a Python exception.

use pyo3::exceptions::{PyBufferError, PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::{create_exception, PyErr};

use crate::failure::{Class, Failure};

create_exception!(
    vision_towers,
    VisionTowersError,
    PyException,
    "Base of every error vision_towers raises. `kind` is the error class (e.g. \
     `prep:OverBudget`, `safetensors:InvalidJson`, `out_of_memory`), `index` the image it is \
     about (or None); the message is the command line's."
);
create_exception!(
    vision_towers,
    BadImageError,
    VisionTowersError,
    "An image was refused: not an image, over the decode budget, truncated or corrupt, an \
     unreadable file, a refused URI scheme, over the pass ceiling. `index`: its position."
);
create_exception!(
    vision_towers,
    BadModelError,
    VisionTowersError,
    "The weight file, its configs or its tokenizer files were refused."
);
create_exception!(
    vision_towers,
    BadInputError,
    VisionTowersError,
    "Processor tensors given to encode_prepared were refused (missing, misshapen, mistyped)."
);
create_exception!(
    vision_towers,
    NoDeviceError,
    VisionTowersError,
    "The CUDA device asked for does not open."
);
create_exception!(
    vision_towers,
    OutOfMemoryError,
    VisionTowersError,
    "The device ran out of memory; the model stays usable (retry with fewer images)."
);
create_exception!(
    vision_towers,
    UnsupportedError,
    VisionTowersError,
    "A device, precision, dtype or output this model cannot give (e.g. bfloat16 on the CPU)."
);
create_exception!(
    vision_towers,
    DeviceError,
    VisionTowersError,
    "Any other CUDA failure (driver, launch, cuBLASLt)."
);

impl Failure {
    /// The Python exception: its class, message, `kind` and `index`.
    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let msg = self.message;
        let err = match self.class {
            Class::BadImage => BadImageError::new_err(msg),
            Class::BadModel => BadModelError::new_err(msg),
            Class::BadInput => BadInputError::new_err(msg),
            Class::NoDevice => NoDeviceError::new_err(msg),
            Class::OutOfMemory => OutOfMemoryError::new_err(msg),
            Class::Unsupported => UnsupportedError::new_err(msg),
            Class::Device => DeviceError::new_err(msg),
            Class::Internal => VisionTowersError::new_err(msg),
            Class::Value => return PyValueError::new_err(msg),
            Class::Type => return PyTypeError::new_err(msg),
            Class::Buffer => return PyBufferError::new_err(msg),
        };
        let value = err.value(py);
        // Setting two attributes on a fresh exception object cannot fail short of memory
        // exhaustion; the exception itself is still raised then.
        let _ = value.setattr("kind", self.kind);
        let _ = value.setattr("index", self.index);
        err
    }
}

/// Adds the exception types to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("VisionTowersError", py.get_type::<VisionTowersError>())?;
    m.add("BadImageError", py.get_type::<BadImageError>())?;
    m.add("BadModelError", py.get_type::<BadModelError>())?;
    m.add("BadInputError", py.get_type::<BadInputError>())?;
    m.add("NoDeviceError", py.get_type::<NoDeviceError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    Ok(())
}

/// Runs `f` without the GIL (every Python input already extracted), catching a panic at the
/// boundary, and raises its failure.
pub fn detached<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce() -> Result<T, Failure> + Send,
    T: Send,
{
    let r = py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(f)) => Err(f.into_pyerr(py)),
        Err(payload) => Err(Failure::panic(payload.as_ref()).into_pyerr(py)),
    }
}
