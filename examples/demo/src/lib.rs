//! Placeholder, filled in by the demo work.
use pyo3::prelude::*;

#[pymodule]
fn dlcast_demo(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
