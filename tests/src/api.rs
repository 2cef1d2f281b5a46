//! Conversion, dtype-generic functions, methods and signatures.

use dlcast_runtime::prelude::*;
use half::f16;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// Layout seen by Rust: `(dtype, shape, strides)`.
macro_rules! layout {
    ($x:expr) => {
        (
            $x.dtype().to_string(),
            $x.shape().to_vec(),
            $x.strides().to_vec(),
        )
    };
}

/// `(dtype, shape, strides, values)` as the body saw them.
type Seen<T> = (String, Vec<usize>, Vec<isize>, Vec<T>);

/// The elements of a writable view as one slice.
fn slice_mut<'s, T: Element>(x: &'s mut TensorMut<'_, T>) -> PyResult<&'s mut [T]> {
    x.as_slice_mut()
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not contiguous"))
}

/// A float32 read-only parameter that converts (the default).
#[dlpack_fn]
#[pyfunction]
fn seen_f32(x: TensorRef<'_, f32>) -> PyResult<Seen<f32>> {
    let (dt, shape, strides) = layout!(x);
    Ok((dt, shape, strides, x.to_vec()?))
}

/// An int32 read-only parameter that converts.
#[dlpack_fn]
#[pyfunction]
fn seen_i32(x: TensorRef<'_, i32>) -> PyResult<Vec<i32>> {
    Ok(x.to_vec()?)
}

/// C order, converting: returns the layout the body saw.
#[dlpack_fn]
#[pyfunction]
fn seen_c(#[order(c)] x: TensorRef<'_, f64>) -> PyResult<Seen<f64>> {
    let (dt, shape, strides) = layout!(x);
    Ok((dt, shape, strides, x.to_vec()?))
}

/// F order, converting (any dtype, so only the order changes).
#[dlpack_fn]
#[pyfunction]
fn seen_f(#[order(f)] x: TensorDyn<'_>) -> (String, Vec<usize>, Vec<isize>) {
    layout!(x)
}

/// float32 in F order: dtype and order change in one conversion.
#[dlpack_fn]
#[pyfunction]
fn seen_f32_f(#[order(f)] x: TensorRef<'_, f32>) -> PyResult<(String, Vec<isize>, Vec<f32>)> {
    Ok((x.dtype().to_string(), x.strides().to_vec(), x.to_vec()?))
}

/// `#[noconvert]` on the parameter.
#[dlpack_fn]
#[pyfunction]
fn strict_c(
    #[noconvert]
    #[order(c)]
    x: TensorRef<'_, f64>,
) -> usize {
    x.len()
}

/// `#[dlpack_fn(noconvert)]` on the function; `y` would convert otherwise.
#[dlpack_fn(noconvert)]
#[pyfunction]
fn strict_pair(x: TensorRef<'_, f32>, y: TensorRef<'_, f32>) -> usize {
    x.len() + y.len()
}

/// A writable parameter never converts.
#[dlpack_fn]
#[pyfunction]
fn fill_c_f32(#[order(c)] mut x: TensorMut<'_, f32>, value: f32) -> PyResult<()> {
    slice_mut(&mut x)?.fill(value);
    Ok(())
}

/// Shape and device constraints never convert.
#[dlpack_fn]
#[pyfunction]
fn triple_f32(#[shape(3)] x: TensorRef<'_, f32>) -> usize {
    x.len()
}

/// Numbers a test can compute with, for the generic functions below.
trait Real: Element {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl Real for f32 {
    fn to_f64(self) -> f64 {
        self.into()
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Real for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

impl Real for f16 {
    fn to_f64(self) -> f64 {
        self.into()
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

/// Multiplies `x` in place: one Python function, three instances.
#[dlpack_fn]
#[pyfunction]
fn scale<T: Real>(#[dtype(f32, f64, f16)] mut x: TensorMut<'_, T>, factor: f64) -> PyResult<()> {
    for v in slice_mut(&mut x)? {
        *v = T::from_f64(v.to_f64() * factor);
    }
    Ok(())
}

/// `out = a + b`; all three share `T`, so all must have one dtype.
#[dlpack_fn]
#[pyfunction]
fn add_into<T: Real>(
    #[dtype(f32, f64)]
    #[shape(n)]
    a: TensorRef<'_, T>,
    #[shape(n)] b: TensorRef<'_, T>,
    #[shape(n)] mut out: TensorMut<'_, T>,
) -> PyResult<()> {
    let (a, b) = (a.to_vec()?, b.to_vec()?);
    for ((o, x), y) in slice_mut(&mut out)?.iter_mut().zip(a).zip(b) {
        *o = T::from_f64(x.to_f64() + y.to_f64());
    }
    Ok(())
}

/// The Rust type of the instance that ran, for every dtype dlcast knows.
#[dlpack_fn]
#[pyfunction]
fn instance<T: Element>(
    #[dtype(
        bool, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, c64, c128
    )]
    x: TensorRef<'_, T>,
) -> &'static str {
    let _ = x;
    std::any::type_name::<T>()
}

/// Two type parameters: a cross product of instances.
#[dlpack_fn]
#[pyfunction]
fn instance_pair<A: Element, B: Element>(
    #[dtype(f32, i64)] a: TensorRef<'_, A>,
    b: Option<TensorRef<'_, B>>,
    #[dtype(f64, u8)] _c: TensorRef<'_, B>,
) -> (&'static str, &'static str, bool) {
    let _ = a;
    (
        std::any::type_name::<A>(),
        std::any::type_name::<B>(),
        b.is_some(),
    )
}

/// A generic function returning a tensor of its own dtype, read-only input
/// with an order constraint (which still converts the layout).
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn doubled<T: Real>(
    #[dtype(f32, f64)]
    #[order(c)]
    x: TensorRef<'_, T>,
) -> PyResult<Tensor<T>> {
    let v: Vec<T> = x
        .to_vec()?
        .into_iter()
        .map(|v| T::from_f64(v.to_f64() * 2.0))
        .collect();
    Ok(Tensor::from_vec(v, x.shape())?)
}

/// Plain PyO3 arguments in any order around an array.
#[dlpack_fn]
#[pyfunction]
fn mixed(
    label: &Bound<'_, PyAny>,
    py: Python<'_>,
    #[shape(n)] x: TensorRef<'_, f64>,
    k: usize,
) -> PyResult<String> {
    let _ = py;
    Ok(format!("{}:{}:{}", label.str()?, x.len(), k))
}

/// Positional-only, defaults, keyword-only and an optional array.
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (x, /, y = None, *, scale = 2.0, name = "sum"))]
fn with_signature(
    #[shape(n)] x: TensorRef<'_, f32>,
    #[shape(n)] y: Option<TensorRef<'_, f32>>,
    scale: f64,
    name: &str,
) -> PyResult<(String, f64)> {
    let mut total: f64 = x.to_vec()?.into_iter().map(f64::from).sum();
    if let Some(y) = y {
        total += y.to_vec()?.into_iter().map(f64::from).sum::<f64>();
    }
    Ok((name.to_string(), total * scale))
}

/// A class whose methods take arrays.
#[pyclass(module = "dlcast_testext")]
struct Accumulator {
    total: f64,
}

#[dlpack_fn]
#[pymethods]
impl Accumulator {
    #[new]
    fn new() -> Self {
        Accumulator { total: 0.0 }
    }

    /// Adds the sum of `x`; returns the running total.
    fn add(&mut self, #[shape(n)] x: TensorRef<'_, f64>) -> PyResult<f64> {
        self.total += x.to_vec()?.into_iter().sum::<f64>();
        Ok(self.total)
    }

    /// A plain method: untouched by dlcast.
    fn total(&self) -> f64 {
        self.total
    }

    /// Weighted sum with PyO3 signature features.
    #[pyo3(signature = (x, *, weights = None, scale = 1.0))]
    fn weighted(
        &self,
        #[shape(n)] x: TensorRef<'_, f64>,
        #[shape(n)] weights: Option<TensorRef<'_, f64>>,
        scale: f64,
    ) -> PyResult<f64> {
        let x = x.to_vec()?;
        let w = match weights {
            Some(w) => w.to_vec()?,
            None => vec![1.0; x.len()],
        };
        Ok(self.total + scale * x.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>())
    }

    /// Euclidean norm, no instance needed.
    #[staticmethod]
    fn norm(#[order(c)] x: TensorRef<'_, f64>) -> PyResult<f64> {
        Ok(x.to_vec()?.iter().map(|v| v * v).sum::<f64>().sqrt())
    }

    /// An accumulator that starts at the sum of `x`.
    #[classmethod]
    fn starting_at(_cls: &Bound<'_, PyType>, x: TensorRef<'_, f64>) -> PyResult<Self> {
        Ok(Accumulator {
            total: x.to_vec()?.into_iter().sum(),
        })
    }

    /// Scales `x` in place by the running total: a generic method.
    fn scale_by_total<T: Real>(&self, #[dtype(f32, f64)] mut x: TensorMut<'_, T>) -> PyResult<()> {
        for v in slice_mut(&mut x)? {
            *v = T::from_f64(v.to_f64() * self.total);
        }
        Ok(())
    }

    /// Returns a view of `x` as NumPy (method-level options).
    #[dlpack_fn(returns = numpy, noconvert)]
    fn echo<'a>(&self, x: TensorRef<'a, f32>) -> TensorRef<'a, f32> {
        x
    }
}

/// A `mut` plain parameter, raw identifiers, and a Python name.
#[dlpack_fn]
#[pyfunction]
#[pyo3(name = "renamed")]
fn rust_name(
    #[shape(n)] r#type: TensorRef<'_, f32>,
    #[shape(n)] r#in: TensorRef<'_, f32>,
    mut k: usize,
) -> usize {
    k += r#type.len() + r#in.len();
    k
}

/// Name and signature given in `#[pyfunction(..)]`.
#[dlpack_fn]
#[pyfunction(name = "nice_name", signature = (x, k = 2))]
fn ugly_name(#[shape(3)] x: TensorRef<'_, f64>, k: usize) -> usize {
    x.len() * k
}

/// The module comes first and is not an argument.
#[dlpack_fn]
#[pyfunction]
#[pyo3(pass_module)]
fn module_and_array(m: &Bound<'_, PyModule>, x: TensorRef<'_, f32>) -> PyResult<(String, usize)> {
    Ok((m.name()?.to_string(), x.len()))
}

/// Element types from a `macro_rules` fragment and an alias.
type Real32 = f32;
macro_rules! fragment_fn {
    ($name:ident, $v:ty, $e:ty) => {
        /// A view type from a macro fragment.
        #[dlpack_fn]
        #[pyfunction]
        fn $name(a: $v, b: TensorRef<'_, $e>) -> usize {
            a.len() + b.len()
        }
    };
}
fragment_fn!(fragments, TensorRef<'_, i16>, Real32);

/// Special methods and a setter take arrays too.
#[pyclass(module = "dlcast_testext")]
struct Bag {
    total: f64,
}

#[dlpack_fn]
#[pymethods]
impl Bag {
    #[new]
    fn new() -> Self {
        Bag { total: 0.0 }
    }

    fn __iadd__(&mut self, x: TensorRef<'_, f64>) -> PyResult<()> {
        self.total += x.to_vec()?.into_iter().sum::<f64>();
        Ok(())
    }

    fn __contains__(&self, x: TensorRef<'_, f64>) -> PyResult<bool> {
        Ok(x.to_vec()?.contains(&self.total))
    }

    fn __call__(&self, x: TensorRef<'_, f64>) -> PyResult<f64> {
        Ok(self.total * x.to_vec()?.into_iter().sum::<f64>())
    }

    #[setter]
    fn set_values(&mut self, x: TensorRef<'_, f64>) -> PyResult<()> {
        self.total = x.to_vec()?.into_iter().sum();
        Ok(())
    }

    #[getter]
    fn total(&self) -> f64 {
        self.total
    }

    /// A `PyRefMut<Self>` receiver with a `mut` binding.
    fn drain(mut slf: PyRefMut<'_, Self>, #[shape(_)] x: TensorRef<'_, f64>) -> f64 {
        let before = slf.total;
        slf.total -= x.len() as f64;
        before
    }
}

pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        seen_f32,
        seen_i32,
        seen_c,
        seen_f,
        seen_f32_f,
        strict_c,
        strict_pair,
        fill_c_f32,
        triple_f32,
        scale,
        add_into,
        instance,
        instance_pair,
        doubled,
        mixed,
        with_signature,
        rust_name,
        ugly_name,
        module_and_array,
        fragments,
    );
    m.add_class::<Bag>()?;
    m.add_class::<Accumulator>()
}
