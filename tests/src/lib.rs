use pyo3::prelude::*;
#[pymodule]
fn dlcast_testext(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
