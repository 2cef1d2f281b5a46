//! Arrays kept beyond the call: a `#[pyclass]` that stores an
//! `ArrayHandle` and borrows it again in later calls; called from
//! tests/python/test_stored_arrays.py.

use dlcast_runtime::__private::{DeviceSpec, Dim, FnSpec, Order, ParamSpec, SharedDType};
use dlcast_runtime::prelude::*;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;

/// A float32 array (NumPy's, PyTorch's, any producer's) stored at
/// construction and borrowed, checked, by each method.
#[pyclass(module = "dlcast_testext", weakref)]
pub struct Stored {
    a: ArrayHandle<f32>,
    /// Any object, to close reference cycles through the store in tests.
    #[pyo3(get, set)]
    extra: Option<Py<PyAny>>,
}

#[pymethods]
impl Stored {
    #[new]
    fn new(a: ArrayHandle<f32>) -> Self {
        Stored { a, extra: None }
    }

    /// Stores another array in place of the first.
    fn store(&mut self, a: ArrayHandle<f32>) {
        self.a = a;
    }

    /// The stored object (`None` once cleared).
    fn array(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.a.object(py).map(Bound::unbind)
    }

    /// `(shape, strides, data address, sum)` of a read-only borrow.
    fn describe(&self, py: Python<'_>) -> PyResult<(Vec<usize>, Vec<isize>, usize, f64)> {
        let v = self.a.borrow(py)?;
        let sum = v.iter()?.map(f64::from).sum();
        Ok((
            v.shape().to_vec(),
            v.strides().to_vec(),
            v.data_ptr() as usize,
            sum,
        ))
    }

    /// The elements, read through a read-only borrow.
    fn values(&self, py: Python<'_>) -> PyResult<Vec<f32>> {
        Ok(self.a.borrow(py)?.to_vec()?)
    }

    /// Writes `value` everywhere through a writable borrow.
    fn fill(&self, py: Python<'_>, value: f32) -> PyResult<()> {
        let mut v = self.a.borrow_mut(py)?;
        v.fill(value)?;
        Ok(())
    }

    /// Holds a read-only borrow while `f()` runs; returns what `f` returned.
    fn hold_and_call(&self, py: Python<'_>, f: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let v = self.a.borrow(py)?;
        let out = f.call0()?;
        drop(v);
        Ok(out.unbind())
    }

    /// Holds a writable borrow while `f()` runs; returns what `f` returned.
    fn hold_mut_and_call(&self, py: Python<'_>, f: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let v = self.a.borrow_mut(py)?;
        let out = f.call0()?;
        drop(v);
        Ok(out.unbind())
    }

    /// Takes a writable borrow, then a second while the first lives (the
    /// registry must refuse it); returns how many borrows were had.
    fn borrow_mut_twice(&self, py: Python<'_>) -> PyResult<usize> {
        let _first = self.a.borrow_mut(py)?;
        let _second = self.a.borrow_mut(py)?;
        Ok(2)
    }

    /// Takes a writable borrow after a read-only one ended: both succeed.
    fn borrow_in_turn(&self, py: Python<'_>) -> PyResult<f32> {
        let first = self.a.borrow(py)?.iter()?.sum::<f32>();
        self.a.borrow_mut(py)?.fill(first)?;
        Ok(first)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.a.traverse(&visit)?;
        visit.call(&self.extra)
    }

    fn __clear__(&mut self) {
        self.a.clear();
        self.extra = None;
    }

    /// Clears the handle as the garbage collector would.
    fn clear(&mut self) {
        self.a.clear();
    }
}

/// Writes `value` into `out`, then sums the array `store` holds: a
/// borrow of the store while the call's writable view of `out` lives.
#[dlpack_fn]
#[pyfunction]
fn fill_then_sum_stored(
    mut out: TensorMut<'_, f32>,
    store: PyRef<'_, Stored>,
    value: f32,
) -> PyResult<f32> {
    out.fill(value)?;
    let py = store.py();
    let v = store.a.borrow(py)?;
    Ok(v.iter()?.sum())
}

/// A handle as a `#[dlpack_fn]` parameter next to a view: the sum of `x`
/// plus the sum of what `h` holds, borrowed in the body while `x`'s view
/// lives.
#[dlpack_fn]
#[pyfunction]
fn sum_with_handle(py: Python<'_>, x: TensorRef<'_, f32>, h: ArrayHandle<f32>) -> PyResult<f32> {
    let own: f32 = x.iter()?.sum();
    let held: f32 = h.borrow(py)?.iter()?.sum();
    Ok(own + held)
}

/// One parameter `m` of shape `(n, n)`: a square matrix.
static SQUARE: FnSpec = FnSpec {
    name: "square",
    dim_names: &["n"],
    params: &[spec_param(Some(&[Dim::Named(0), Dim::Named(0)]), None)],
};

/// A careless spec: a named extent that `dim_names` does not list.
static UNNAMED_EXTENT: FnSpec = FnSpec {
    name: "unnamed_extent",
    dim_names: &[],
    params: &[spec_param(Some(&[Dim::Named(0), Dim::Named(1)]), None)],
};

/// A careless spec: its dtype decided by a parameter it does not have.
static NO_DECIDER: FnSpec = FnSpec {
    name: "no_decider",
    dim_names: &[],
    params: &[spec_param(
        None,
        Some(SharedDType {
            type_param: "T",
            decided_by: 3,
        }),
    )],
};

/// The parameter `m` of the specs above (CPU, any order, no conversion).
const fn spec_param(shape: Option<&'static [Dim]>, shares_dtype: Option<SharedDType>) -> ParamSpec {
    ParamSpec {
        name: "m",
        shape,
        devices: &[DeviceSpec::CPU],
        order: Order::Any,
        convert: false,
        aligned: false,
        dtypes: &[],
        shares_dtype,
    }
}

/// The sum of `a`, borrowed through a handle made with the spec named
/// `spec` (`"square"`, `"unnamed_extent"`, `"no_decider"`).
#[pyfunction]
fn sum_with_spec(py: Python<'_>, a: &Bound<'_, PyAny>, spec: &str) -> PyResult<f32> {
    let spec: &'static FnSpec = match spec {
        "square" => &SQUARE,
        "unnamed_extent" => &UNNAMED_EXTENT,
        _ => &NO_DECIDER,
    };
    let h = ArrayHandle::<f32>::with_spec(a, spec);
    let v = h.borrow(py)?;
    Ok(v.iter()?.sum())
}

/// A matrix kept as a rank-typed handle, `ArrayHandle<f64, 2>`: checked
/// (dtype, rank) when passed to the constructor and at every borrow, whose
/// views have the rank-typed accessors.
#[pyclass(module = "dlcast_testext")]
pub struct StoredMatrix {
    m: ArrayHandle<f64, 2>,
}

#[dlcast::pymethods]
impl StoredMatrix {
    #[new]
    fn new(m: ArrayHandle<f64, 2>) -> Self {
        StoredMatrix { m }
    }

    /// The trace of the matrix as it is now.
    fn trace(&self, py: Python<'_>) -> PyResult<f64> {
        let m = self.m.borrow(py)?;
        let [rows, cols] = m.dims();
        let mut sum = 0.0;
        for i in 0..rows.min(cols) {
            sum += m.get([i, i])?;
        }
        Ok(sum)
    }

    /// Adds `k` to the diagonal, in place.
    fn shift(&self, py: Python<'_>, k: f64) -> PyResult<()> {
        let mut m = self.m.borrow_mut(py)?;
        let [rows, cols] = m.dims();
        for i in 0..rows.min(cols) {
            let v = m.get([i, i])?;
            m.set([i, i], v + k)?;
        }
        Ok(())
    }
}

/// The length of `a`, through a handle made by hand with
/// `ArrayHandle::<f32, 1>::checked`: refused now if `a` is no 1-d float32
/// array on the CPU.
#[pyfunction]
fn checked_handle_len(py: Python<'_>, a: &Bound<'_, PyAny>) -> PyResult<usize> {
    let h = ArrayHandle::<f32, 1>::checked(a)?;
    let v = h.borrow(py)?;
    Ok(v.dims()[0])
}

// The guide's example of a stored array (guide/src/ownership.md, "Keeping
// an array beyond the call"), word for word (tests/python/test_guide.py
// checks it), behind the guide's Python session.

/// `weights @ x` for points `x` of 3 coordinates; `weights` is `(n, 3)`.
#[pyclass]
struct Projection {
    weights: ArrayHandle<f32, 2>,
}

#[dlcast::pymethods]
impl Projection {
    #[new]
    fn new(#[shape(n, 3)] weights: ArrayHandle<f32, 2>) -> Self {
        Projection { weights }
    }

    /// The weights as they are now, applied to `x` (like `x`).
    fn __call__(
        &self,
        py: Python<'_>,
        #[shape(3)] x: TensorRef<'_, f32, 1>,
    ) -> PyResult<Tensor<f32>> {
        let w = self.weights.borrow(py)?;
        Ok(Tensor::from(w.as_array()?.dot(&x.as_array()?)))
    }
}

pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Projection>()?;
    m.add_class::<Stored>()?;
    m.add_class::<StoredMatrix>()?;
    m.add_function(wrap_pyfunction!(checked_handle_len, m)?)?;
    m.add_function(wrap_pyfunction!(fill_then_sum_stored, m)?)?;
    m.add_function(wrap_pyfunction!(sum_with_handle, m)?)?;
    m.add_function(wrap_pyfunction!(sum_with_spec, m)?)
}
