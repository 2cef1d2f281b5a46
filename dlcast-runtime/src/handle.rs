//! An array kept beyond the call that passed it: [`ArrayHandle`], which a
//! `#[pyclass]` stores and borrows again, checked, in later calls.
//!
//! A handle holds the Python object only (a strong reference), never a read
//! of it: between two calls Python code may resize a NumPy array
//! (`a.resize(..., refcheck=False)`), give it another shape or dtype
//! (`a.shape = ..`, `a.dtype = ..`), make it read-only, or resize a PyTorch
//! tensor (`t.resize_(..)`), swap its storage (`t.set_(..)`, `t.data =
//! ..`), or make it require grad. Each borrow is therefore a call of its
//! own, with one array argument: it runs the whole import of that
//! argument (`CallContext::prepare`: every step that may run Python code) and
//! then its reads and checks (`CallContext::finish`: dtype, device, order,
//! writability, PyTorch's rules, the entry in the borrow registry), exactly
//! as a `#[dlpack_fn]` parameter of the same view type would, and hands out
//! the view that call makes. The view is the guard: its registry entry, and
//! what keeps its memory alive, end when it drops; its lifetime is tied to
//! the handle, so that the handle cannot be cleared or replaced meanwhile,
//! and to the GIL token, so that it is dropped (its producer's memory
//! released: C-API calls) while the GIL is held.

use crate::call::CallContext;
use crate::device::DeviceSpec;
use crate::dtype::Element;
use crate::spec::{FnSpec, Order, ParamSpec};
use crate::view::{TensorMut, TensorRef, DYN};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use std::marker::PhantomData;

/// The one parameter of a handle's borrows: any shape and order, CPU
/// memory (as a `#[dlpack_fn]` parameter without `#[device]`), never
/// converted (a stored array that no longer fits is refused, not copied).
const fn handle_param() -> ParamSpec {
    ParamSpec {
        name: "array",
        shape: None,
        devices: &[DeviceSpec::CPU],
        order: Order::Any,
        convert: false,
        aligned: false,
        dtypes: &[],
        shares_dtype: None,
    }
}

/// The spec of [`ArrayHandle::borrow`] (its name is what errors show).
static BORROW: FnSpec = FnSpec {
    name: "ArrayHandle.borrow",
    dim_names: &[],
    params: &[handle_param()],
};

/// The spec of [`ArrayHandle::borrow_mut`].
static BORROW_MUT: FnSpec = FnSpec {
    name: "ArrayHandle.borrow_mut",
    dim_names: &[],
    params: &[handle_param()],
};

/// The spec of [`ArrayHandle::check`] (and so of [`ArrayHandle::checked`]).
static CHECK: FnSpec = FnSpec {
    name: "ArrayHandle.check",
    dim_names: &[],
    params: &[handle_param()],
};

/// An array argument kept beyond the call: an owned, storable handle to a
/// Python array of any DLPack producer (NumPy, PyTorch, ...), borrowed
/// again, checked, whenever it is used.
///
/// A handle holds a strong reference to the object and nothing else; it is
/// `Send + Sync` (a `#[pyclass]` field needs no `unsendable`). Every
/// [`borrow`](ArrayHandle::borrow) or [`borrow_mut`](ArrayHandle::borrow_mut)
/// imports the object again and checks it as a `#[dlpack_fn]` parameter of
/// type `TensorRef<'_, T>` or `TensorMut<'_, T>` would be (with the
/// handle's [`FnSpec`], by default any shape, CPU, no conversion), so a
/// borrow sees what Python code changed since the handle was made — a
/// NumPy array resized or reshaped, a PyTorch tensor resized or given
/// another storage — or is refused: another dtype, a read-only array or a
/// tensor that requires grad for `borrow_mut`, memory a live writable view
/// holds (of any call, or of another borrow). The view returned is the
/// guard: its borrow-registry entry ends when it drops.
///
/// The const parameter `N` is the number of dimensions, as for
/// [`TensorRef`]: [`DYN`] (the default) for any, or a fixed rank, which
/// every borrow checks and whose views have the rank-typed accessors
/// (`ArrayHandle<f32, 2>` borrows as `TensorRef<'_, f32, 2>`).
///
/// A handle is made with [`ArrayHandle::new`] or [`ArrayHandle::with_spec`]
/// (no check runs), with [`ArrayHandle::checked`] (checked once now, as a
/// borrow would be), or extracted by PyO3 from an argument (`fn new(a:
/// ArrayHandle<f32>)` in a plain `#[pymethods]` block: no check runs). A
/// parameter of a `#[dlcast::pymethods]` method or a dlcast function that
/// carries `#[shape(..)]`, `#[device(..)]` or `#[order(..)]`, or fixes the
/// rank (`ArrayHandle<f32, 2>`), is checked when the argument is passed
/// and at every borrow, and its errors name the class or function and the
/// parameter. A `#[pyclass]` that stores one takes part in Python's
/// garbage collection by forwarding its `__traverse__` and `__clear__` to
/// [`ArrayHandle::traverse`] and [`ArrayHandle::clear`]; a cleared handle's
/// borrows raise `ValueError`. A DLPack capsule can be read once: store the
/// array that made it, not the capsule.
///
/// ```
/// # use dlcast_runtime::prelude::*;
/// # use dlcast_runtime::ArrayHandle;
/// # use pyo3::prelude::*;
/// # use pyo3::{PyTraverseError, PyVisit};
/// /// Weights set once, read by every later call.
/// #[pyclass]
/// struct Layer {
///     weights: ArrayHandle<f32>,
/// }
///
/// #[pymethods]
/// impl Layer {
///     #[new]
///     fn new(weights: ArrayHandle<f32>) -> Self {
///         Layer { weights }
///     }
///
///     /// The sum of the weights, as they are now.
///     fn total(&self, py: Python<'_>) -> PyResult<f32> {
///         let w = self.weights.borrow(py)?;
///         Ok(w.iter()?.sum())
///     }
///
///     /// Sets every weight to `value`, in place.
///     fn reset(&self, py: Python<'_>, value: f32) -> PyResult<()> {
///         let mut w = self.weights.borrow_mut(py)?;
///         w.fill(value)?;
///         Ok(())
///     }
///
///     fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
///         self.weights.traverse(&visit)
///     }
///
///     fn __clear__(&mut self) {
///         self.weights.clear();
///     }
/// }
/// ```
pub struct ArrayHandle<T: Element, const N: usize = DYN> {
    /// The array; `None` once cleared.
    obj: Option<Py<PyAny>>,
    /// The constraints every borrow checks, and the names its errors show.
    spec: Option<&'static FnSpec>,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Element, const N: usize> ArrayHandle<T, N> {
    /// A handle to `obj`, any object a `#[dlpack_fn]` parameter accepts
    /// (checked at each borrow, not now; [`ArrayHandle::checked`] checks
    /// now too).
    pub fn new(obj: &Bound<'_, PyAny>) -> Self {
        ArrayHandle {
            obj: Some(obj.clone().unbind()),
            spec: None,
            _elem: PhantomData,
        }
    }

    /// A handle whose borrows check `spec`'s one parameter (its shape,
    /// devices, order) and name `spec`'s function and parameter in their
    /// errors. A `spec` of any other number of parameters makes every
    /// borrow fail (`BufferError`).
    pub fn with_spec(obj: &Bound<'_, PyAny>, spec: &'static FnSpec) -> Self {
        ArrayHandle {
            obj: Some(obj.clone().unbind()),
            spec: Some(spec),
            _elem: PhantomData,
        }
    }

    /// A handle to `obj`, checked now as a read-only borrow would be (and
    /// at each borrow): dtype, rank, CPU memory; errors name
    /// `ArrayHandle.check()`.
    ///
    /// # Errors
    /// What [`ArrayHandle::check`] raises.
    pub fn checked(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let handle = Self::new(obj);
        handle.check(obj.py())?;
        Ok(handle)
    }

    /// Checks the array as it is now, as a read-only borrow would (a
    /// borrow made and dropped at once: the whole import and every check of
    /// the handle's spec, its dtype and rank), so that a handle can be
    /// refused when it is made rather than at its first use. Python code may
    /// change the array later: each borrow checks again.
    ///
    /// # Errors
    /// What [`ArrayHandle::borrow`] raises now, naming the handle's
    /// function and parameter (`ArrayHandle.check()` and `'array'` for a
    /// handle without a spec); `BufferError` too while a writable view of
    /// the memory lives.
    pub fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.read(py, &CHECK).map(drop)
    }

    /// The stored object (`None` once cleared), e.g. to hand it back to
    /// Python.
    pub fn object<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.obj.as_ref().map(|o| o.bind(py).clone())
    }

    /// A second handle to the same object, with the same spec.
    pub fn clone_ref(&self, py: Python<'_>) -> Self {
        ArrayHandle {
            obj: self.obj.as_ref().map(|o| o.clone_ref(py)),
            spec: self.spec,
            _elem: PhantomData,
        }
    }

    /// Visits the stored object: call from the `__traverse__` of the
    /// `#[pyclass]` that holds the handle, so that reference cycles through
    /// it (an array whose attribute refers back to the object) are
    /// collected.
    ///
    /// # Errors
    /// What `visit` returns.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.obj)
    }

    /// Drops the reference to the stored object: call from the `__clear__`
    /// of the `#[pyclass]` that holds the handle. Later borrows raise
    /// `ValueError`.
    pub fn clear(&mut self) {
        self.obj = None;
    }

    /// Whether [`ArrayHandle::clear`] ran.
    pub fn is_cleared(&self) -> bool {
        self.obj.is_none()
    }

    /// A read-only view of the array as it is now: imported and checked
    /// again, entered in the borrow registry until the view drops.
    ///
    /// The view lives no longer than the handle's borrow nor the GIL token
    /// `py` (one lifetime `'v`, the shorter of the two): dropping a view
    /// releases its producer's memory (a DLPack deleter, a buffer release,
    /// a reference drop: C-API calls that need the GIL), so it must never
    /// be carried out of `Python::attach` or past the method that holds
    /// the GIL.
    ///
    /// # Errors
    /// What a `#[dlpack_fn]` parameter of type `TensorRef<'_, T>` would
    /// raise for the object now (another dtype: `TypeError`; memory a live
    /// writable view holds: `BufferError`; ...), naming the handle's
    /// function and parameter; `ValueError` for a cleared handle.
    pub fn borrow<'v>(&'v self, py: Python<'v>) -> PyResult<TensorRef<'v, T, N>> {
        self.read(py, &BORROW)
    }

    /// [`ArrayHandle::borrow`], naming `default` where the handle has no
    /// spec of its own.
    fn read<'v>(
        &'v self,
        py: Python<'v>,
        default: &'static FnSpec,
    ) -> PyResult<TensorRef<'v, T, N>> {
        let spec = self.spec.unwrap_or(default);
        let obj = self.obj.as_ref().ok_or_else(|| cleared(spec))?.bind(py);
        let mut cx = CallContext::<1>::new(spec);
        cx.prepare::<TensorRef<'_, T, N>>(0, obj)?;
        cx.finish()?;
        let view: TensorRef<'_, T, N> = cx.take(0)?;
        // Why the lifetime may change, from the call context's borrow to
        // `'v`, which ends no later than the handle's borrow and the GIL
        // token `py` (a view's drop releases its owner with C-API calls: it
        // must happen while the GIL is held, as inside a call). A typed view
        // owns everything it reads through: `View::from_raw` for `TensorRef`
        // keeps the read (its owner, which holds the array or the producer's
        // capsule, and its registry entry) and uses its `ReadSlot` for the
        // spec's names only; `from_fast` takes its own reference to the
        // array and the registry entry out of the context (`fast_raw`).
        // Nothing of the view refers to `cx`, which drops at the end of this
        // function; the view's `'a` only keeps it from outliving the
        // argument, which the handle holds for as long as it is borrowed
        // (`&self`: not cleared or replaced meanwhile), and from leaving the
        // GIL (views are neither `Send` nor `Sync`, and `'v` ends with `py`).
        // SAFETY: only the lifetime changes, to `'v`, which the view may have
        // (above: it owns what it reads, and `'v` ends with the GIL token).
        Ok(unsafe { std::mem::transmute::<TensorRef<'_, T, N>, TensorRef<'v, T, N>>(view) })
    }

    /// A writable view of the array as it is now: imported and checked
    /// again (writable, and for a PyTorch tensor not requiring grad; its
    /// version counter is bumped), entered in the borrow registry as a
    /// writable view until the view drops. A second writable borrow while
    /// the first lives is refused, as any other view of that memory is. As
    /// for [`borrow`](ArrayHandle::borrow), the view lives no longer than
    /// the handle's borrow nor the GIL token `py`.
    ///
    /// # Errors
    /// What a `#[dlpack_fn]` parameter of type `TensorMut<'_, T>` would
    /// raise for the object now, naming the handle's function and
    /// parameter; `ValueError` for a cleared handle.
    pub fn borrow_mut<'v>(&'v self, py: Python<'v>) -> PyResult<TensorMut<'v, T, N>> {
        let spec = self.spec.unwrap_or(&BORROW_MUT);
        let obj = self.obj.as_ref().ok_or_else(|| cleared(spec))?.bind(py);
        let mut cx = CallContext::<1>::new(spec);
        cx.prepare::<TensorMut<'_, T, N>>(0, obj)?;
        cx.finish()?;
        let view: TensorMut<'_, T, N> = cx.take(0)?;
        // SAFETY: as in `borrow`: `TensorMut`'s `from_raw` and `from_fast`
        // make the `TensorRef` it wraps, which owns its read and registry
        // entry; nothing of it refers to `cx`; `'v` ends with the handle's
        // borrow and with `py`.
        Ok(unsafe { std::mem::transmute::<TensorMut<'_, T, N>, TensorMut<'v, T, N>>(view) })
    }
}

/// The refusal of a borrow of a cleared handle.
#[cold]
fn cleared(spec: &FnSpec) -> PyErr {
    PyValueError::new_err(format!(
        "{}(): the array handle was cleared (by its object's __clear__, during garbage \
         collection); store a new array before borrowing it",
        spec.name
    ))
}

impl<T: Element, const N: usize> std::fmt::Debug for ArrayHandle<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayHandle")
            .field("dtype", &T::DTYPE)
            .field("ndim", &(N != DYN).then_some(N))
            .field("cleared", &self.obj.is_none())
            .finish()
    }
}

/// A `#[pyfunction]` or `#[pymethods]` parameter of type `ArrayHandle<T>`
/// takes the argument as it is (only `None` is refused, `TypeError`); the
/// checks run at each borrow. `Option<ArrayHandle<T>>` takes `None` too.
/// (dlcast's attributes check an annotated or rank-typed handle parameter
/// when it is passed: see [`ArrayHandle`].)
impl<'a, 'py, T: Element, const N: usize> FromPyObject<'a, 'py> for ArrayHandle<T, N> {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_none() {
            return Err(PyTypeError::new_err(
                "ArrayHandle: expected an array (any DLPack producer), got None",
            ));
        }
        Ok(ArrayHandle::new(&obj))
    }
}
