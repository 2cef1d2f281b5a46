//! Every way a `Tensor` is built from Rust (`zeros`, `from_vec` with spare
//! capacity, F order, negative strides, boxed slices, owned `ndarray` arrays
//! in F order, sliced with a step or with an axis inverted, `from_static`),
//! optionally read-only, returned to every framework; called from
//! tests/python/test_export_constructions.py.

use dlcast_runtime::ndarray::{self, Axis, Dimension, IxDyn, ShapeBuilder, Slice};
use dlcast_runtime::prelude::*;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The C-order flat index of `ix` in `shape`.
fn c_index(ix: &[usize], shape: &[usize]) -> usize {
    ix.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

static STATIC_VALUES: [f64; 24] = {
    let mut v = [0.0; 24];
    let mut i = 0;
    while i < 24 {
        v[i] = i as f64;
        i += 1;
    }
    v
};

/// A `Tensor<f64>` of `shape` whose element at C index `i` is `i`, built
/// the way `kind` names, read-only when asked.
fn build(kind: &str, shape: &[usize], read_only: bool) -> PyResult<Tensor<f64>> {
    let n: usize = shape.iter().product();
    let t = match kind {
        "zeros" => {
            let mut t = Tensor::<f64>::zeros(shape)?;
            if let Some(s) = t.as_slice_mut() {
                for (i, v) in s.iter_mut().enumerate() {
                    *v = i as f64;
                }
            }
            t
        }
        "vec_spare" => {
            // Capacity well above the length: the export frees the whole
            // allocation, with the capacity's layout.
            let mut v = Vec::with_capacity(2 * n + 7);
            v.extend((0..n).map(|i| i as f64));
            Tensor::from_vec(v, shape)?
        }
        "vec_f" => {
            // Memory in F order, values by C index.
            let rev: Vec<usize> = shape.iter().rev().copied().collect();
            let mut v = vec![0.0; n];
            for (f, slot) in v.iter_mut().enumerate() {
                // The F-order flat index `f` is the C index of the reversed shape.
                let mut ix = vec![0; shape.len()];
                let mut rest = f;
                for (d, &m) in rev.iter().enumerate().rev() {
                    ix[d] = rest % m.max(1);
                    rest /= m.max(1);
                }
                ix.reverse();
                *slot = c_index(&ix, shape) as f64;
            }
            Tensor::from_vec_f(v, shape)?
        }
        "boxed" if shape.len() == 1 => {
            let b: Box<[f64]> = (0..n).map(|i| i as f64).collect();
            Tensor::from(b)
        }
        "vec_1d" if shape.len() == 1 => {
            let mut v = Vec::with_capacity(n + 5);
            v.extend((0..n).map(|i| i as f64));
            Tensor::from(v)
        }
        "ndarray_f" => {
            let a = ndarray::Array::from_shape_fn(IxDyn(shape).f(), |ix| {
                c_index(ix.slice(), shape) as f64
            });
            Tensor::from_ndarray(a)
        }
        "ndarray_step" if !shape.is_empty() => {
            let last = shape.len() - 1;
            let mut wide = shape.to_vec();
            wide[last] *= 2;
            let mut a = ndarray::Array::from_shape_fn(IxDyn(&wide), |ix| {
                let mut ix = ix.slice().to_vec();
                if ix[last] % 2 == 1 {
                    return -1.0;
                }
                ix[last] /= 2;
                c_index(&ix, shape) as f64
            });
            a.slice_axis_inplace(Axis(last), Slice::new(0, None, 2));
            Tensor::from_ndarray(a)
        }
        "ndarray_inverted" if !shape.is_empty() => {
            let mut a = ndarray::Array::from_shape_fn(IxDyn(shape), |ix| {
                let mut ix = ix.slice().to_vec();
                ix[0] = shape[0] - 1 - ix[0];
                c_index(&ix, shape) as f64
            });
            a.invert_axis(Axis(0));
            Tensor::from_ndarray(a)
        }
        "static" if n <= STATIC_VALUES.len() => Tensor::from_static(&STATIC_VALUES[..n], shape)?,
        _ => {
            return Err(PyValueError::new_err(format!(
                "no kind {kind} for {shape:?}"
            )))
        }
    };
    Ok(if read_only { t.into_read_only() } else { t })
}

/// The tensor `build` makes, as a `dlcast.Array`.
#[pyfunction]
fn s2_make(kind: &str, shape: Vec<usize>, read_only: bool) -> PyResult<Tensor<f64>> {
    build(kind, &shape, read_only)
}

macro_rules! returned {
    ($($name:ident => $fw:ident),* $(,)?) => {$(
        #[dlpack_fn(returns = $fw)]
        #[pyfunction]
        fn $name(kind: &str, shape: Vec<usize>, read_only: bool) -> PyResult<Tensor<f64>> {
            build(kind, &shape, read_only)
        }
    )*};
}

returned!(
    s2_make_numpy => numpy,
    s2_make_torch => torch,
    s2_make_jax => jax,
    s2_make_memoryview => memoryview,
    s2_make_array_api => array_api,
);

/// `Tensor::<u8>::zeros(shape)` (the odd sizes of the aligned allocation).
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn s2_zeros_u8_numpy(shape: Vec<usize>) -> PyResult<Tensor<u8>> {
    Ok(Tensor::<u8>::zeros(&shape)?)
}

/// `Tensor::<u8>::zeros(shape)` as a `dlcast.Array`.
#[pyfunction]
fn s2_zeros_u8(shape: Vec<usize>) -> PyResult<Tensor<u8>> {
    Ok(Tensor::<u8>::zeros(&shape)?)
}

/// `Tensor::<f32>::zeros(shape)`, returned to PyTorch.
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn s2_zeros_f32_torch(shape: Vec<usize>) -> PyResult<Tensor<f32>> {
    Ok(Tensor::<f32>::zeros(&shape)?)
}

/// Registers the functions (called from the module initialiser).
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        s2_make,
        s2_make_numpy,
        s2_make_torch,
        s2_make_jax,
        s2_make_memoryview,
        s2_make_array_api,
        s2_zeros_u8_numpy,
        s2_zeros_u8,
        s2_zeros_f32_torch,
    );
    Ok(())
}
