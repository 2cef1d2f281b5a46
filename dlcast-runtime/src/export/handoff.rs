//! Hand-off to a framework (`returns = numpy`, `torch`, `jax`, ...): each
//! framework's importer, and the conversion of a function's result
//! ([`convert_result`], [`into_py_result`]).

use super::array::{delete_versioned, make_capsule, make_managed, Array, BUFFER_PROTOCOL};
use super::tensor::Tensor;
use crate::device::Device;
use crate::error::ExportError;
use crate::facts::{FrameworkFacts, Handover, Layout};
pub use crate::framework::Framework;
use crate::import::Dims;
use crate::layout;
use dlpack_rs::ffi::DLManagedTensorVersioned;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

impl Framework {
    /// The function that takes this framework's arrays (the `handover`
    /// column's), looked up once.
    fn importer<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // One slot per row of the framework table, indexed like it.
        static CACHE: [PyOnceLock<Py<PyAny>>; crate::facts::FRAMEWORKS.len()] =
            [const { PyOnceLock::new() }; crate::facts::FRAMEWORKS.len()];
        let (module, attr) = self.facts().handover.importer();
        CACHE[self as usize]
            .get_or_try_init(py, || Ok(py.import(module)?.getattr(attr)?.unbind()))
            .map(|f| f.bind(py).clone())
    }

    /// Hands one exported array to the framework, as its row of the
    /// framework table says: a dtype the framework lacks (the dtype
    /// table's `absent_from` column) refused; NumPy's C API first where
    /// the row's hand-over is through it; then its refusals (device memory,
    /// read-only data, negative strides), then the copy its `read_only` and
    /// `layout` columns ask for, then the hand-over itself (a copy to a
    /// `from_dlpack` through [`OneShotCopy`]).
    fn convert<'py>(self, arr: &Bound<'py, Array>) -> PyResult<Bound<'py, PyAny>> {
        let py = arr.py();
        let f = self.facts();
        let dtype = arr.get().inner.dtype;
        if dtype.facts().is_some_and(|d| d.absent_from.contains(&self)) {
            return Err(ExportError::DtypeAbsent {
                option: f.option,
                name: f.name,
                dtype,
            }
            .into());
        }
        if let Handover::NumpyCApi { .. } = f.handover {
            // NumPy's C API first; the importer only where that cannot be
            // used (looked up only then).
            if let Some(out) = numpy_from_array(arr)? {
                return Ok(out);
            }
        }
        let device = arr.get().inner.device;
        if f.host_only && !device.is_host_accessible() {
            return Err(ExportError::HostOnly {
                option: f.option,
                name: f.name,
                device,
            }
            .into());
        }
        let importer = self.importer(py)?;
        let (array, fresh) = layout_for(arr, f)?;
        match f.handover {
            // A capsule is taken once: read-only data reaches it only as a
            // copy (`layout_for`), which the capsule alone then holds.
            Handover::LegacyCapsule { .. } => {
                importer.call1((make_capsule(py, &array, false, None)?,))
            }
            Handover::TorchExchange { .. } => torch_from_array(py, &importer, &array),
            // Below abi3-py311 `dlcast.Array` has no buffer protocol: the
            // memoryview is NumPy's, over the same memory (NumPy keeps the
            // array alive as its base).
            Handover::Buffer { .. } if !BUFFER_PROTOCOL => {
                let np = py.import(pyo3::intern!(py, "numpy"))?;
                let view = np.call_method1(pyo3::intern!(py, "asarray"), (array,))?;
                importer.call1((view,))
            }
            // A copy made for this hand-over (read-only data, memory an
            // object may still write, a layout the framework cannot take)
            // goes through a consumer that gives it once: the importer is a
            // module attribute that Python code can replace, and whoever
            // holds the consumer afterwards gets nothing of the memory the
            // framework's array now owns.
            Handover::FromDlpack { .. } if fresh => {
                importer.call1((Bound::new(py, OneShotCopy::new(array))?,))
            }
            Handover::FromDlpack { .. } | Handover::NumpyCApi { .. } | Handover::Buffer { .. } => {
                importer.call1((array,))
            }
        }
    }
}

// A framework whose importer takes only a capsule (a legacy one, which
// cannot say read-only) must have immutable arrays, whose read-only data
// `layout_for` copies first: with read-only data marked (`ReadOnly::Marked`)
// its capsule would be of the read-only memory itself.
const _: () = {
    let mut i = 0;
    while i < crate::facts::FRAMEWORKS.len() {
        let f = &crate::facts::FRAMEWORKS[i];
        assert!(
            !matches!(f.handover, Handover::LegacyCapsule { .. }) || f.read_only.arrays_immutable()
        );
        i += 1;
    }
};

/// What the framework's `read_only` and `layout` columns make of `array`:
/// refused (read-only device memory for a framework without read-only
/// arrays or an immutable one; negative strides), copied (into an aligned
/// C-order buffer that the framework takes without a copy of its own;
/// writable for a framework without read-only arrays; then `true`), or
/// handed over as it is (`false`).
fn layout_for<'py>(
    array: &Bound<'py, Array>,
    f: &FrameworkFacts,
) -> PyResult<(Bound<'py, Array>, bool)> {
    let py = array.py();
    let e = &array.get().inner;
    if f.read_only.arrays_always_writable() && e.requires_grad {
        return Err(ExportError::RequiresGrad {
            how: f.returns,
            name: f.name,
        }
        .into());
    }
    let host = e.device.is_host_accessible();
    // A framework without read-only arrays gets read-only host memory as a
    // writable copy of its own (see `writable_copy`); device memory, which
    // dlcast does not copy, is refused.
    if f.read_only.arrays_always_writable() && e.read_only {
        if !host {
            return Err(ExportError::ReadOnlyRefused {
                option: f.option,
                name: f.name,
            }
            .into());
        }
        return Ok((writable_copy(array, f.returns)?, true));
    }
    let immutable = f.read_only.arrays_immutable();
    // An immutable framework's importer asks for a legacy capsule, which
    // cannot say read-only: read-only data goes to it as a copy (below), as
    // a legacy request of a read-only `dlcast.Array` does. Device memory
    // cannot be copied here, and a capsule of it as it is could be written
    // by any code the importer (a module attribute) hands it to.
    if immutable && e.read_only && !host {
        return Err(ExportError::ReadOnlyImmutableOnDevice {
            option: f.option,
            name: f.name,
            device: e.device,
        }
        .into());
    }
    // An immutable framework's array must never change, and its re-exports
    // (legacy capsules) carry no read-only mark: read-only memory (which
    // must not be written through them) and memory an object may still
    // write (an `ArrayBuffer`'s, with `set`, `with_mut` or a writable view)
    // go as a copy, whatever the layout column says. Whether read-only
    // memory is the framework's own (a view of its input, which it already
    // hands out in legacy capsules) is not known from anything Python code
    // cannot fake (the input's type names its module), so it is copied too.
    let must_copy = immutable && host && (e.read_only || e.py_owner.is_some());
    let copy = must_copy
        || match f.layout {
            Layout::AsIs => false,
            Layout::NegativeStridesRefused => {
                refuse_negative_strides(array, f)?;
                false
            }
            // MLX takes no negative strides.
            Layout::NegativeStridesCopied => host && e.strides.iter().any(|&s| s < 0),
            Layout::CompactCopy => host && !takes_as_is(e),
        };
    if !copy {
        return Ok((array.clone(), false));
    }
    Ok((Array::new(py, e.aligned_copy(py, f.returns)?)?, true))
}

/// Read-only host memory as a framework without read-only arrays (PyTorch,
/// PaddlePaddle) takes it: a new aligned C-order buffer holding its
/// elements (overlapping windows materialised), made as a read in the
/// borrow registry (`aligned_copy`), and marked writable: the buffer is
/// fresh and the framework's tensor its only owner, so writes through it
/// reach no memory but its own. `what` names the copy in errors.
fn writable_copy<'py>(
    array: &Bound<'py, Array>,
    what: &'static str,
) -> PyResult<Bound<'py, Array>> {
    let mut copy = array.get().inner.aligned_copy(array.py(), what)?;
    copy.read_only = false;
    Array::new(array.py(), copy)
}

/// For [`Layout::CompactCopy`] (JAX, jaxlib 0.10, CPU): whether the
/// framework may take host memory as it is:
/// - JAX takes a buffer without a copy only if it is 64-byte aligned; it
///   copies others asynchronously yet calls the producer's deleter before
///   that copy has finished, so freeing the buffer then can crash;
/// - JAX refuses layouts that are not compact (slices with steps, negative
///   strides);
/// - JAX arrays are immutable: memory an object may still write (an
///   `ArrayBuffer`'s) goes as a copy.
fn takes_as_is(e: &super::alloc::Exported) -> bool {
    let (shape, strides) = (e.shape_usize(), e.strides_isize());
    let compact =
        layout::is_c_contiguous(&shape, strides) || layout::is_f_contiguous(&shape, strides);
    let aligned = (e.data as usize) % Tensor::<u8>::ALIGN == 0;
    let shared = e.py_owner.is_some();
    compact && aligned && !shared
}

/// An `ndarray` over a host array's memory through NumPy's C API (see
/// [`crate::npapi`]); `None` where only `numpy.from_dlpack` applies.
fn numpy_from_array<'py>(array: &Bound<'py, Array>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let e = &array.get().inner;
    if e.device != Device::CPU {
        return Ok(None);
    }
    crate::npapi::ndarray(
        array.as_any(),
        &crate::npapi::HostArray {
            data: e.data,
            shape: &e.shape,
            byte_strides: &e.byte_strides,
            dtype: e.dtype,
            read_only: e.read_only,
        },
    )
}

/// For [`Layout::NegativeStridesRefused`] (PyTorch, PaddlePaddle): a
/// negative stride of a dimension with more than one index, which such
/// tensors cannot have, is refused with what to do instead, before anything
/// is handed over (the export is then freed by the caller, as for any
/// error).
fn refuse_negative_strides(array: &Bound<'_, Array>, f: &FrameworkFacts) -> PyResult<()> {
    let e = &array.get().inner;
    let negative = e.strides.iter().any(|&s| s < 0);
    let shape = if negative {
        e.shape_usize()
    } else {
        Dims::new()
    };
    if let Some(axis) = (0..shape.len())
        .find(|&d| e.strides.get(d).is_some_and(|&s| s < 0) && !layout::stride_unused(&shape, d))
    {
        return Err(ExportError::NegativeStride {
            option: f.option,
            name: f.name,
            stride: e.strides[axis],
            axis,
            strides: e.strides.to_vec(),
        }
        .into());
    }
    Ok(())
}

/// [`Handover::TorchExchange`]: hands an array to PyTorch through
/// `torch.Tensor`'s DLPack C exchange API
/// (`managed_tensor_to_py_object_no_sync`: no capsule, no Python-level
/// `from_dlpack`), or `torch.from_dlpack` where the API is missing or for
/// device memory (the exchange is for host memory only: there is no stream
/// to synchronise).
fn torch_from_array<'py>(
    py: Python<'py>,
    from_dlpack: &Bound<'py, PyAny>,
    array: &Bound<'py, Array>,
) -> PyResult<Bound<'py, PyAny>> {
    static TO_TORCH: PyOnceLock<usize> = PyOnceLock::new();
    // PyTorch's own table, checked to be its C code (whatever sits on
    // `torch.Tensor.__dlpack_c_exchange_api__`): the call below relies on
    // how PyTorch's function treats the tensor it is handed.
    let to_torch = *TO_TORCH.get_or_init(py, || {
        crate::import::exchange::torch_table(py)
            .and_then(|a| a.managed_tensor_to_py_object_no_sync)
            .map_or(0, |f| f as usize)
    });
    let e = &array.get().inner;
    if to_torch == 0 || !e.device.is_host_accessible() {
        return from_dlpack.call1((array,));
    }
    // SAFETY: `to_torch` is the non-NULL `managed_tensor_to_py_object_no_sync`
    // of PyTorch's process-lifetime exchange table.
    let to_torch: unsafe extern "C" fn(*mut DLManagedTensorVersioned, *mut *mut c_void) -> c_int =
        unsafe { std::mem::transmute::<usize, _>(to_torch) };
    let deleted = Arc::new(AtomicBool::new(false));
    let managed =
        make_managed(array, true, None, Some(deleted.clone()))?.cast::<DLManagedTensorVersioned>();
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `managed` is an owning versioned tensor whose ownership the
    // call takes ("stolen", per the header); `out` receives a new reference,
    // or the call fails with an exception set.
    let rc = unsafe { to_torch(managed, &mut out) };
    if rc != 0 || out.is_null() {
        let err = PyErr::take(py).unwrap_or_else(|| ExportError::TorchNoTensor.into());
        if !deleted.load(Ordering::SeqCst) {
            // SAFETY: PyTorch's implementation (`ManagedTensorToPyObjectNoSync`
            // in torch/csrc/Module.cpp) is `at::fromDLPackVersioned` then
            // `THPVariable_Wrap`, inside a try block: once a tensor exists,
            // its storage calls our deleter when it is destroyed, which on
            // failure happens before the call returns (the flag is then
            // set). A failure before that point (a refused dtype, device or
            // layout) destroys the deleter closure without calling it, and
            // nothing in PyTorch refers to `managed` any more. So with the
            // flag unset the tensor is still ours, and freeing it here is
            // its one deleter call (without this, every refused call leaked
            // the export and the input it keeps alive).
            // SAFETY: as above, `managed` is ours and freed once, here.
            unsafe { delete_versioned(managed) };
        }
        return Err(err);
    }
    // SAFETY: `out` is a new reference to a torch.Tensor.
    Ok(unsafe { Bound::from_owned_ptr(py, out.cast()) })
}

/// Replaces every `dlcast.Array` in a function's result (the result
/// itself, or the items of a tuple or list) by `framework`'s array.
#[doc(hidden)]
pub fn convert_result(out: Bound<'_, PyAny>, framework: Option<Framework>) -> PyResult<Py<PyAny>> {
    let Some(fw) = framework else {
        return Ok(out.unbind());
    };
    Ok(map_arrays(&out, &mut |array| fw.convert(array))?
        .unwrap_or(out)
        .unbind())
}

/// How many levels of tuples and lists [`map_arrays`] looks into: far more
/// than a Rust result's type nests them, far less than a thread's stack
/// holds (a result built by Python code may nest them without end).
const RESULT_NESTING: u32 = 32;

/// `out` with every `dlcast.Array` in it (itself, or an item of its tuples
/// and lists, `RESULT_NESTING` levels deep) replaced by `f`'s value; `None`
/// where nothing was replaced: then `out` itself is the result, so a tuple
/// or list without arrays (built by Python code, a cycle or a subclass
/// included) is returned as it is, not rebuilt. Each tuple or list is
/// looked into once (a cycle ends there, and one shared twice is converted
/// once); the ones looked into are kept alive until the end, so that an
/// address names one object throughout (`f` may run Python code).
fn map_arrays<'py>(
    out: &Bound<'py, PyAny>,
    f: &mut dyn FnMut(&Bound<'py, Array>) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    type Seen<'py> = std::collections::HashMap<*mut pyo3::ffi::PyObject, Memo<'py>>;
    type Memo<'py> = (Bound<'py, PyAny>, Option<Bound<'py, PyAny>>);
    fn walk<'py>(
        out: &Bound<'py, PyAny>,
        depth: u32,
        seen: &mut Seen<'py>,
        f: &mut dyn FnMut(&Bound<'py, Array>) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if let Ok(array) = out.cast::<Array>() {
            return f(array).map(Some);
        }
        let tuple = out.cast::<PyTuple>().ok();
        let items: Vec<Bound<'py, PyAny>> = match (&tuple, out.cast::<PyList>()) {
            (Some(t), _) => t.iter().collect(),
            (None, Ok(l)) => l.iter().collect(),
            (None, Err(_)) => return Ok(None),
        };
        if depth == 0 {
            return Ok(None);
        }
        if let Some((_, done)) = seen.get(&out.as_ptr()) {
            return Ok(done.clone());
        }
        // On the path from here down: unchanged (a cycle ends here).
        seen.insert(out.as_ptr(), (out.clone(), None));
        let mut changed = false;
        let mut new = Vec::with_capacity(items.len());
        for x in items {
            match walk(&x, depth - 1, seen, f)? {
                Some(y) => {
                    changed = true;
                    new.push(y);
                }
                None => new.push(x),
            }
        }
        let done = match (changed, tuple) {
            (false, _) => None,
            (true, Some(_)) => Some(PyTuple::new(out.py(), new)?.into_any()),
            (true, None) => Some(PyList::new(out.py(), new)?.into_any()),
        };
        seen.insert(out.as_ptr(), (out.clone(), done.clone()));
        Ok(done)
    }
    walk(out, RESULT_NESTING, &mut Seen::new(), f)
}

/// Converts a `#[dlpack_fn]` function's result to Python, handing exported
/// arrays to `framework` when `returns = ...` names one.
#[doc(hidden)]
pub fn into_py_result<'py, R: IntoPyObject<'py>>(
    py: Python<'py>,
    result: R,
    framework: Option<Framework>,
) -> PyResult<Py<PyAny>> {
    let out = pyo3::IntoPyObjectExt::into_bound_py_any(result, py)?;
    convert_result(out, framework)
}

/// Converts a function's result to Python without `returns = ...`: every
/// exported array goes to `like` (the first array argument's framework),
/// or to NumPy where that is `None`; an array that framework does not take
/// (read-only device memory for PyTorch, device memory for NumPy, NumPy not
/// installed) stays a `dlcast.Array`, and read-only host memory goes to
/// PyTorch as a copy, so the default fails a call only for a view of a
/// tensor that requires grad going back to PyTorch, or a copy that cannot
/// be made (see `convert_default`).
#[doc(hidden)]
pub fn into_py_default<'py, R: IntoPyObject<'py>>(
    py: Python<'py>,
    result: R,
    like: Option<Framework>,
) -> PyResult<Py<PyAny>> {
    let out = pyo3::IntoPyObjectExt::into_bound_py_any(result, py)?;
    convert_default(out, like.unwrap_or(Framework::Numpy))
}

/// How errors of [`convert_default`] name the conversion.
const DEFAULT_RETURN: &str = "the default return (like the first array argument)";

/// [`convert_result`] for [`into_py_default`]: a refused hand-over keeps
/// the `dlcast.Array` (only `Exception`s: an interrupt still propagates),
/// except where a framework without read-only tensors (PyTorch) is
/// concerned: a view of a tensor that requires grad raises as under
/// `returns = torch`, naming `x.detach()` (a read-only `dlcast.Array` in
/// its place would fail only at its first in-place write, far from the
/// call; a writable tensor would let writes bypass autograd), and other
/// read-only host memory goes as a writable copy, as under `returns =
/// torch`, so that a PyTorch argument gives a `torch.Tensor` back whatever
/// the view (a `dlcast.Array` there would turn the next call's result into
/// NumPy).
fn convert_default<'py>(out: Bound<'py, PyAny>, fw: Framework) -> PyResult<Py<PyAny>> {
    let py = out.py();
    let f = fw.facts();
    let mut hand = |array: &Bound<'py, Array>| -> PyResult<Bound<'py, PyAny>> {
        if f.read_only.arrays_always_writable() && array.get().inner.requires_grad {
            return Err(ExportError::RequiresGrad {
                how: DEFAULT_RETURN,
                name: f.name,
            }
            .into());
        }
        // Read-only host memory for a framework without read-only arrays
        // (of a dtype it has): the copy `returns = torch` makes, made here
        // so that its failure (no memory for it; a writable view of the
        // memory live in a call still running) raises rather than leaves a
        // `dlcast.Array` (torch in, torch out, in every such corner).
        let e = &array.get().inner;
        let copied = if f.read_only.arrays_always_writable()
            && e.read_only
            && e.device.is_host_accessible()
            && !e.dtype.facts().is_some_and(|d| d.absent_from.contains(&fw))
        {
            Some(writable_copy(array, DEFAULT_RETURN)?)
        } else {
            None
        };
        match fw.convert(copied.as_ref().unwrap_or(array)) {
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyException>(py) => {
                Ok(array.clone().into_any())
            }
            r => r,
        }
    };
    Ok(map_arrays(&out, &mut hand)?.unwrap_or(out).unbind())
}

/// A copy that [`Framework::convert`] made for the hand-over to a
/// framework's `from_dlpack` (JAX, MLX: read-only data, memory an object
/// may still write, a layout the framework cannot take), given to the
/// first `__dlpack__` call only, as a legacy capsule (what those importers
/// ask for; the copy is no one else's, so a consumer may even write it).
/// Later calls get `BufferError`: the importer is a module attribute that
/// Python code can replace, and code that keeps this object must get no
/// alias of the memory the framework's (immutable) array owns.
#[pyclass(module = "dlcast", frozen)]
struct OneShotCopy {
    /// The copy, until the first `__dlpack__` takes it.
    array: std::sync::Mutex<Option<Py<Array>>>,
    device: Device,
}

impl OneShotCopy {
    fn new(array: Bound<'_, Array>) -> Self {
        let device = array.get().inner.device;
        OneShotCopy {
            array: std::sync::Mutex::new(Some(array.unbind())),
            device,
        }
    }
}

#[pymethods]
impl OneShotCopy {
    /// The copy as a legacy capsule, once. The arguments are those of the
    /// protocol, and change nothing: the copy is host memory (no stream to
    /// wait for), already made (whatever `copy` asks), on its own device.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version, dl_device, copy);
        // Taken under the lock, which nothing else holds while it runs
        // Python code (`take` runs none).
        let taken = self
            .array
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let array = taken.ok_or(ExportError::HandedOnce)?;
        make_capsule(py, array.bind(py), false, None)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.device.device_type, self.device.device_id)
    }
}
