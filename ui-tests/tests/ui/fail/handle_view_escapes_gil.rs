// A view borrowed from an `ArrayHandle` lives no longer than the GIL token it
// was borrowed with: taken out of `Python::attach`, it would be read, and
// dropped (its producer's deleter, a buffer's release, a reference drop: C-API
// calls), on a thread that no longer holds the GIL. Borrow inside `attach`
// and copy out what is needed.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

fn escape(h: &ArrayHandle<f32>) -> TensorRef<'_, f32> {
    Python::attach(|py| h.borrow(py)).unwrap()
}

fn escape_mut(h: &ArrayHandle<f32>) -> TensorMut<'_, f32> {
    Python::attach(|py| h.borrow_mut(py)).unwrap()
}

fn main() {
    let _ = (escape, escape_mut);
}
