//! The Python module `vision_towers._vision_towers` (built with the `python` feature).

mod capsule;
mod errors;
mod input;
mod model;
mod plan;
mod rows;
mod video;

use pyo3::prelude::*;

/// The extension module; `vision_towers/__init__.py` re-exports it.
#[pymodule]
fn _vision_towers(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<model::PyModel>()?;
    m.add_class::<rows::ImageRows>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
