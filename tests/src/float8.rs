//! The float8 element types (`microfloat`'s `f8e4m3fn`, `f8e5m2`, ...):
//! typed views of PyTorch's and JAX's float8 arrays, their bits, their
//! values, copies returned to each framework, and the conversions a
//! read-only float8 or `f32` parameter makes (tests/python/test_float8.py).

use dlcast_runtime::prelude::*;
use microfloat::{
    f8e3m4, f8e4m3, f8e4m3b11fnuz, f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f8e8m0fnu,
};
use pyo3::prelude::*;

/// A float8 element type: its raw byte and its value.
trait Float8: Element {
    /// The raw byte.
    fn bits(self) -> u8;
    /// The value as an `f32` (exact: every float8 value is an `f32`).
    fn value(self) -> f32;
}

macro_rules! float8 {
    ($($t:ty),*) => {$(
        impl Float8 for $t {
            fn bits(self) -> u8 { self.to_bits() }
            fn value(self) -> f32 { self.to_f32() }
        }
    )*};
}
float8!(
    f8e3m4,
    f8e4m3,
    f8e4m3b11fnuz,
    f8e4m3fn,
    f8e4m3fnuz,
    f8e5m2,
    f8e5m2fnuz,
    f8e8m0fnu
);

/// The dtype's name and the raw bytes in C order, through the typed view of
/// whichever float8 type the argument has.
#[dlpack_fn]
#[pyfunction]
fn f8_bits<T: Float8>(
    #[dtype(
        f8e3m4,
        f8e4m3,
        f8e4m3b11fnuz,
        f8e4m3fn,
        f8e4m3fnuz,
        f8e5m2,
        f8e5m2fnuz,
        f8e8m0fnu
    )]
    x: TensorRef<'_, T>,
) -> PyResult<(String, Vec<u8>)> {
    let bits = x.to_vec()?.into_iter().map(Float8::bits).collect();
    Ok((T::DTYPE.to_string(), bits))
}

/// The values of a `float8_e4m3fn` argument as `f32` (through `microfloat`),
/// C order; a read-only parameter, so other float dtypes convert to it.
#[dlpack_fn]
#[pyfunction]
fn f8e4m3fn_values(x: TensorRef<'_, f8e4m3fn>) -> PyResult<Vec<f32>> {
    Ok(x.to_vec()?.into_iter().map(Float8::value).collect())
}

/// The values of any float8 argument as `f32`, C order (never converts: the
/// dtype is the dispatch).
#[dlpack_fn]
#[pyfunction]
fn f8_values<T: Float8>(
    #[dtype(
        f8e3m4,
        f8e4m3,
        f8e4m3b11fnuz,
        f8e4m3fn,
        f8e4m3fnuz,
        f8e5m2,
        f8e5m2fnuz,
        f8e8m0fnu
    )]
    x: TensorRef<'_, T>,
) -> PyResult<Vec<f32>> {
    Ok(x.to_vec()?.into_iter().map(Float8::value).collect())
}

/// Writes `bits[i % len]` into each element of a writable `float8_e5m2`
/// argument, in C order.
#[dlpack_fn]
#[pyfunction]
fn f8e5m2_fill(mut x: TensorMut<'_, f8e5m2>, bits: Vec<u8>) -> PyResult<()> {
    if bits.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err("no bits"));
    }
    let Some(s) = x.as_slice_mut() else {
        return Err(pyo3::exceptions::PyValueError::new_err("not contiguous"));
    };
    for (i, v) in s.iter_mut().enumerate() {
        *v = f8e5m2::from_bits(bits[i % bits.len()]);
    }
    Ok(())
}

/// Functions returning a Rust-owned copy of a float8 argument, one per
/// `returns = ...` (the parameter's name passed in: `like(x)` names it).
macro_rules! copies {
    ($x:ident; $($name:ident => ($($returns:tt)*)),* $(,)?) => {$(
        /// A Rust-owned copy of the float8 argument (same dtype and shape).
        #[dlpack_fn($($returns)*)]
        #[pyfunction]
        fn $name<T: Float8>(
            #[dtype(
                f8e3m4, f8e4m3, f8e4m3b11fnuz, f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz,
                f8e8m0fnu
            )]
            $x: TensorRef<'_, T>,
        ) -> PyResult<Tensor<T>> {
            Ok(Tensor::from_vec($x.to_vec()?, $x.shape())?)
        }
    )*};
}
copies!(x;
    f8_copy => (returns = dlcast),
    f8_copy_torch => (returns = torch),
    f8_copy_jax => (returns = jax),
    f8_copy_numpy => (returns = numpy),
    f8_copy_like => (returns = like(x)),
);

/// A `float8_e4m3fn` array made in Rust from its values (`f32`, rounded by
/// `microfloat`), handed to PyTorch.
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn f8e4m3fn_from_f32(values: Vec<f32>) -> PyResult<Tensor<f8e4m3fn>> {
    let n = values.len();
    Ok(Tensor::from_vec(
        values.into_iter().map(f8e4m3fn::from_f32).collect(),
        &[n],
    )?)
}

/// Registers this file's functions.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        f8_bits,
        f8e4m3fn_values,
        f8_values,
        f8e5m2_fill,
        f8_copy,
        f8_copy_torch,
        f8_copy_jax,
        f8_copy_numpy,
        f8_copy_like,
        f8e4m3fn_from_f32,
    );
    Ok(())
}
