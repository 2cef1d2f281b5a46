//! Type hints for PyO3's introspection (`maturin generate-stubs`), with the
//! `inspect` feature. PyO3 reads a parameter's hint from
//! `FromPyObject::INPUT_TYPE` of its Rust type and a result's from
//! `IntoPyObject::OUTPUT_TYPE`; the arguments `#[dlpack_fn]` takes are
//! Python objects and its results converted ones, so under this feature the
//! exported function takes each array argument as an [`In`] and returns an
//! [`Out`], whose hint is that of a marker type the macro writes per
//! parameter and result ([`Hint`]). Neither conversion runs Python code:
//! `In` keeps the borrowed argument as it is, `Out` hands over the object.

use core::convert::Infallible;
use core::marker::PhantomData;
use pyo3::inspect::PyStaticExpr;
use pyo3::{Borrowed, Bound, FromPyObject, IntoPyObject, Py, PyAny, Python};

/// A type hint, as a marker type carries it.
pub trait Hint {
    /// The hint.
    const HINT: PyStaticExpr;
}

/// An array argument whose hint `H` gives: the object as passed.
pub struct In<'a, 'py, H>(pub Borrowed<'a, 'py, PyAny>, PhantomData<H>);

impl<'a, 'py, H: Hint> FromPyObject<'a, 'py> for In<'a, 'py, H> {
    type Error = Infallible;
    const INPUT_TYPE: PyStaticExpr = H::HINT;

    #[inline]
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self, Self::Error> {
        Ok(In(obj, PhantomData))
    }
}

impl<'py, H> In<'_, 'py, H> {
    /// The argument.
    #[inline]
    pub fn get(&self) -> &Bound<'py, PyAny> {
        &self.0
    }
}

/// A converted result whose hint `H` gives.
pub struct Out<H>(Py<PyAny>, PhantomData<H>);

impl<H> Out<H> {
    /// Wraps the converted result.
    #[inline]
    pub fn new(obj: Py<PyAny>) -> Self {
        Out(obj, PhantomData)
    }
}

impl<'py, H: Hint> IntoPyObject<'py> for Out<H> {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = Infallible;
    const OUTPUT_TYPE: PyStaticExpr = H::HINT;

    #[inline]
    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(self.0.into_bound(py))
    }
}
