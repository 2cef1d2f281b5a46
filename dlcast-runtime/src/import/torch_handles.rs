//! PyTorch's own C-level attributes ([`Handles`]), looked up and checked
//! once, the first time a tensor is prepared (phase 1): what every part of
//! the `torch` module calls, and what the exchange module checks PyTorch's
//! tables against (`tensor_base`: the image of PyTorch's C extension).
//! Beside the `torch` module rather than in it: both it and the exchange
//! module build on these, and the `torch` module builds on the exchange
//! module, so this file depends on neither.

use crate::import::{producer_error, ImportError};
use pyo3::intern;
use pyo3::prelude::*;

/// PyTorch's own C-level attributes, looked up and checked once (see
/// [`handles`]): `TensorBase`'s `data`, `requires_grad` and
/// `_python_dispatch` getters and its `is_inference`, `is_neg`, `is_conj`
/// and `_is_zerotensor` methods, PyTorch's builtins, and the two contexts
/// that disable torch-function and Python dispatch (under them, neither a
/// `__torch_function__` nor a `__torch_dispatch__` mode or subclass
/// override sees dlcast's calls, so they run no Python code and cannot be
/// lied to).
pub(super) struct Handles {
    /// `torch._C.TensorBase`, a static type: PyTorch's C extension image.
    pub(super) base: Py<PyAny>,
    pub(super) data: Py<PyAny>,
    pub(super) requires_grad: Py<PyAny>,
    /// The getters of `requires_grad` and `_cdata` (the `TensorImpl`'s
    /// address), called directly by [`check_write`](super::torch::check_write) (phase 2). `_cdata`
    /// and `detach` are needed by writable parameters only: without
    /// PyTorch's own (replaced through the garbage collector), those refuse
    /// every tensor, naming the attribute ([`not_torchs_own`]); read-only
    /// parameters do not use them.
    pub(super) requires_grad_def: CDef<pyo3::ffi::PyGetSetDef>,
    pub(super) cdata_def: Option<CDef<pyo3::ffi::PyGetSetDef>>,
    /// `TensorBase.detach` (a C method): for a writable parameter, the
    /// tensor whose version counter is bumped (see [`prepare`](super::torch::prepare)).
    pub(super) detach: Option<Py<PyAny>>,
    pub(super) is_inference: Py<PyAny>,
    /// `torch.is_inference_mode_enabled` (a `METH_NOARGS` C function of
    /// `torch._C` that answers `True` or `False` from a thread-local flag:
    /// no Python code, no allocation, the GIL kept).
    pub(super) inference_mode: NoArgs,
    pub(super) increment_version: Py<PyAny>,
    /// `torch._C.DisableTorchFunction`, a static type of PyTorch's image.
    pub(super) disable: Py<PyAny>,
    /// Its `__enter__` and `__exit__`, for the region phase 2 enters
    /// (`FunctionOff` (`torch/phase2.rs`)); `None` where they are not what dlcast knows.
    pub(super) function_off: Option<FunctionOffDefs>,
    /// `torch._C._DisableTorchDispatch`'s own C functions.
    pub(super) disable_dispatch: DispatchGuard,
    /// `TensorBase._python_dispatch`'s getter (`is_python_dispatch()`).
    pub(super) python_dispatch: Py<PyAny>,
    /// `TensorBase.is_neg` and `TensorBase.is_conj` (C methods without
    /// arguments).
    pub(super) is_neg: Py<PyAny>,
    pub(super) is_conj: Py<PyAny>,
    /// `TensorBase._is_zerotensor` (a C method without arguments).
    pub(super) is_zerotensor: Py<PyAny>,
    /// `torch._C._len_torch_function_stack` and `_len_torch_dispatch_stack`
    /// (C functions without arguments); `None` in a PyTorch without them,
    /// which then always takes the disabled regions.
    pub(super) mode_stacks: Option<(NoArgs, NoArgs)>,
    /// `torch._C._to_dlpack_versioned` (else `_to_dlpack`), checked: the C
    /// export behind `Tensor.__dlpack__`, for host tensors read without the
    /// exchange table (`Tensor.__dlpack__` itself is Python code of the
    /// `torch.Tensor` class, which Python code can replace). `None` in a
    /// PyTorch without either.
    pub(super) to_dlpack: Option<Py<PyAny>>,
}

/// A C definition of PyTorch's (a getter's or a method's): static data of
/// its image, which nothing writes once the module is made.
#[derive(Clone, Copy)]
pub(super) struct CDef<T: 'static>(pub(super) &'static T);

// SAFETY: a `CDef` only reads static data no one writes (see above), and
// calls its functions with the GIL held.
unsafe impl<T> Sync for CDef<T> {}
// SAFETY: as above.
unsafe impl<T> Send for CDef<T> {}

/// `torch._C._DisableTorchDispatch`, a pybind11 class: a heap type, whose
/// class attributes (`__init__`, `__enter__`, `__exit__`, `__new__`) Python
/// code can replace. So its C functions are taken once, each checked
/// (see [`DispatchGuard::find`]), and called directly, never looked up
/// through the class again.
pub(super) struct DispatchGuard {
    /// The class (an instance is made of it with `new`).
    class: Py<PyAny>,
    /// Its `tp_new` slot as it was checked (pybind11's allocator).
    new: pyo3::ffi::newfunc,
    /// The builtins behind `__init__`, `__enter__` and `__exit__`.
    init: Py<PyAny>,
    enter: Py<PyAny>,
    exit: Py<PyAny>,
}

/// The class PyTorch's dispatch guard is registered as, which pybind11 writes
/// into the signature (`ml_doc`) of each of its methods.
const DISPATCH_GUARD: &str = "torch._C._DisableTorchDispatch";

impl DispatchGuard {
    /// `_DisableTorchDispatch`'s C functions, checked against `image`
    /// (`TensorBase`'s): its `tp_new` and `tp_dealloc` slots lie in it, or
    /// are pybind11's own, inherited from its base type (a `__new__` set
    /// from Python, or a Python subclass, has CPython's slot functions
    /// instead), and each of `__init__`, `__enter__` and
    /// `__exit__` is a builtin of that name whose C function lies in it and
    /// whose signature, which Python code cannot change, names
    /// `self: torch._C._DisableTorchDispatch` (pybind11 checks `self`
    /// against the C++ class that signature was made for, so the method of
    /// another PyTorch class, or an instance of another class, fails).
    fn find(class: &Bound<'_, PyAny>, image: *const std::ffi::c_void) -> Option<Self> {
        use pyo3::ffi;
        let py = class.py();
        // SAFETY: `class` is live; PyType_Check reads its type's flags.
        if unsafe { ffi::PyType_Check(class.as_ptr()) } == 0 {
            return None;
        }
        let tp = class.as_ptr().cast::<ffi::PyTypeObject>();
        // SAFETY: `tp` is a type object (checked above); PyType_GetSlot reads
        // a slot of a heap type (NULL with an error set for a static type
        // before 3.10, cleared below).
        let (new, dealloc) = unsafe {
            (
                ffi::PyType_GetSlot(tp, ffi::Py_tp_new),
                ffi::PyType_GetSlot(tp, ffi::Py_tp_dealloc),
            )
        };
        let _ = PyErr::take(py);
        // pybind11 classes inherit both slots from pybind11's own base type,
        // made by the first pybind11 module the process loaded: PyTorch's, or
        // another library's (TensorFlow, imported first). So a slot is
        // PyTorch's own if it lies in PyTorch's image, or is the base type's
        // slot and that lies in a library that is not CPython (a `__new__`
        // set from Python, or a Python base, has CPython's slot functions).
        // SAFETY: `tp` is a heap type (pybind11's classes are); its
        // `tp_base` slot is a type object or NULL.
        let base = unsafe { ffi::PyType_GetSlot(tp, ffi::Py_tp_base) }.cast::<ffi::PyTypeObject>();
        let _ = PyErr::take(py);
        let inherited = |slot: std::ffi::c_int, value: *mut std::ffi::c_void| {
            if base.is_null() {
                return false;
            }
            // SAFETY: `base` is a live type object (the class holds it).
            let theirs = unsafe { ffi::PyType_GetSlot(base, slot) };
            let _ = PyErr::take(py);
            theirs == value
                && crate::trust::image_base(value).is_some()
                && !crate::trust::same_image(value, crate::trust::python_image())
        };
        let own = |slot, value: *mut std::ffi::c_void| {
            crate::trust::same_image(value, image) || inherited(slot, value)
        };
        if !own(ffi::Py_tp_new, new) || !own(ffi::Py_tp_dealloc, dealloc) {
            return None;
        }
        // SAFETY: `new` is not NULL (`same_image` is false for NULL), and a
        // `Py_tp_new` slot is a `newfunc`.
        let new: ffi::newfunc = unsafe { std::mem::transmute::<*mut std::ffi::c_void, _>(new) };
        let dict = class.getattr(intern!(py, "__dict__")).ok()?;
        let method = |name: &str| -> Option<Py<PyAny>> {
            let entry = dict.get_item(name).ok()?;
            // pybind11 wraps each method in an `instancemethod`; the function
            // and its signature text are read from their C structs.
            let f = crate::trust::instancemethod_function(&entry).unwrap_or(entry);
            let doc = crate::trust::builtin_doc(&f)?.to_bytes();
            let signed = format!("{name}(self: {DISPATCH_GUARD}");
            (crate::trust::is_builtin(&f, name, image) && doc.starts_with(signed.as_bytes()))
                .then(|| f.unbind())
        };
        Some(DispatchGuard {
            class: class.clone().unbind(),
            new,
            init: method("__init__")?,
            enter: method("__enter__")?,
            exit: method("__exit__")?,
        })
    }

    /// A new guard object, initialised and entered.
    pub(super) fn enter<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let args = pyo3::types::PyTuple::empty(py);
        // SAFETY: `new` is the class's own `tp_new` as checked in `find`
        // (pybind11's allocator, which ignores its arguments): called with
        // the class, an empty tuple and no keywords, as `type.__call__`
        // would; it returns a new reference or NULL with an exception set.
        let guard = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                (self.new)(
                    self.class.as_ptr().cast(),
                    args.as_ptr(),
                    std::ptr::null_mut(),
                ),
            )?
        };
        self.init.bind(py).call1((&guard,))?;
        self.enter.bind(py).call1((&guard,))?;
        Ok(guard)
    }

    /// Leaves a guard made by [`DispatchGuard::enter`] (the caller then
    /// frees it: see `NoTorchFunction`'s `drop`).
    pub(super) fn exit(&self, guard: &Bound<'_, PyAny>) {
        let py = guard.py();
        // Restores the state saved by `__enter__`; cannot fail in PyTorch.
        let _ = self
            .exit
            .bind(py)
            .call1((guard, py.None(), py.None(), py.None()));
    }
}

/// Refuses PyTorch when one of its C-level attributes is not its own.
pub(super) fn not_torchs_own(what: &str) -> ImportError {
    ImportError::Unreadable(format!(
        "{what} is not PyTorch's own (it was replaced, or this PyTorch is not one dlcast \
         knows), so dlcast cannot tell whether Python code would run while it reads the \
         tensor; restore it (or import torch afresh) to pass tensors"
    ))
}

/// PyTorch's attributes, found and checked the first time (phase 1):
/// `torch._C.TensorBase` must be the static type of that name, whose
/// attributes Python code cannot change and whose object lies in the
/// image of PyTorch's C extension; each builtin must be that image's C
/// function of its name (`crate::trust::is_builtin`), and the contexts
/// PyTorch's own types. Whatever fails is refused (the replaced attribute is
/// named): a look-alike could run Python code where dlcast reads a tensor,
/// or answer for PyTorch. Once found, nothing is looked up again.
pub(super) fn handles(py: Python<'_>) -> Result<&'static Handles, ImportError> {
    static HANDLES: pyo3::sync::PyOnceLock<Handles> = pyo3::sync::PyOnceLock::new();
    HANDLES.get_or_try_init(py, || find(py))
}

/// An error of a look-up in `torch._C`.
fn lookup_error(py: Python<'_>) -> impl Fn(PyErr) -> ImportError + '_ {
    move |e| producer_error("PyTorch's C API (torch._C)", e, py)
}

/// See [`handles`]: the look-ups and checks, in this order, each refusal
/// naming what failed.
fn find(py: Python<'_>) -> Result<Handles, ImportError> {
    let lookup = lookup_error(py);
    let torch = py.import("torch").map_err(&lookup)?;
    let c = torch.getattr("_C").map_err(&lookup)?;
    let base = c.getattr("TensorBase").map_err(&lookup)?;
    if crate::trust::static_type_name(&base).as_deref() != Some("torch._C.TensorBase") {
        return Err(not_torchs_own("torch._C.TensorBase"));
    }
    let own = Own::new(base)?;
    let mode_stacks = mode_stacks(&c, &own)?;
    let disable = c.getattr("DisableTorchFunction").map_err(&lookup)?;
    if !crate::trust::is_static_type(&disable, own.image)
        || crate::trust::static_type_name(&disable).as_deref()
            != Some("torch._C.DisableTorchFunction")
    {
        return Err(not_torchs_own("torch._C.DisableTorchFunction"));
    }
    let function_off = FunctionOffDefs::find(&disable);
    let disable_dispatch = c.getattr("_DisableTorchDispatch").map_err(&lookup)?;
    let disable_dispatch = DispatchGuard::find(&disable_dispatch, own.image)
        .ok_or_else(|| not_torchs_own("torch._C._DisableTorchDispatch"))?;
    let to_dlpack = ["_to_dlpack_versioned", "_to_dlpack"]
        .into_iter()
        .find(|name| c.hasattr(*name).unwrap_or(false))
        .map(|name| own.builtin(&c, name, "torch._C._to_dlpack_versioned"))
        .transpose()?;
    let (requires_grad, requires_grad_def) = own.getset("requires_grad")?;
    let cdata_def = own.getset("_cdata").ok().map(|(_, def)| def);
    let detach = own.get("detach").ok();
    Ok(Handles {
        to_dlpack,
        data: own.get("data")?,
        requires_grad,
        requires_grad_def,
        cdata_def,
        detach,
        is_inference: own.get("is_inference")?,
        inference_mode: NoArgs::new(own.builtin(
            &torch,
            "is_inference_mode_enabled",
            "torch.is_inference_mode_enabled",
        )?),
        function_off,
        increment_version: own.builtin(&c, "_increment_version", "torch._C._increment_version")?,
        disable: disable.unbind(),
        disable_dispatch,
        python_dispatch: own.get("_python_dispatch")?,
        is_neg: own.get("is_neg")?,
        is_conj: own.get("is_conj")?,
        is_zerotensor: own.get("_is_zerotensor")?,
        mode_stacks,
        base: own.base.unbind(),
    })
}

/// `torch._C.TensorBase` (checked to be the static type of that name), the
/// image of PyTorch's C extension it lies in, and its `__dict__`, whose
/// entries [`Own::get`] checks.
struct Own<'py> {
    base: Bound<'py, PyAny>,
    image: *const std::ffi::c_void,
    dict: Bound<'py, PyAny>,
}

impl<'py> Own<'py> {
    fn new(base: Bound<'py, PyAny>) -> Result<Self, ImportError> {
        let image = base.as_ptr().cast::<std::ffi::c_void>().cast_const();
        let dict = base.getattr("__dict__").map_err(lookup_error(base.py()))?;
        Ok(Own { base, image, dict })
    }

    /// An entry of the static type's `__dict__`, checked to be
    /// `TensorBase`'s own C attribute of that name (Python code can change
    /// what the dictionary holds, through the garbage collector).
    fn get(&self, name: &str) -> Result<Py<PyAny>, ImportError> {
        let entry = self
            .dict
            .get_item(name)
            .map_err(lookup_error(self.base.py()))?;
        if crate::trust::is_own_descriptor(&entry, &self.base, name) {
            Ok(entry.unbind())
        } else {
            Err(not_torchs_own(&format!("torch._C.TensorBase.{name}")))
        }
    }

    /// `owner.name`, checked to be the image's C function of that name;
    /// refused as `what`.
    fn builtin(
        &self,
        owner: &Bound<'_, PyAny>,
        name: &str,
        what: &str,
    ) -> Result<Py<PyAny>, ImportError> {
        let f = owner.getattr(name).map_err(lookup_error(self.base.py()))?;
        if crate::trust::is_builtin(&f, name, self.image) {
            Ok(f.unbind())
        } else {
            Err(not_torchs_own(what))
        }
    }

    /// A getter of `TensorBase`'s (see [`Own::get`]) and its C definition.
    fn getset(&self, name: &str) -> Result<(Py<PyAny>, CDef<pyo3::ffi::PyGetSetDef>), ImportError> {
        let entry = self.get(name)?;
        match crate::trust::getset_def(entry.bind(self.base.py())) {
            Some(def) if def.get.is_some() => Ok((entry, CDef(def))),
            _ => Err(not_torchs_own(&format!("torch._C.TensorBase.{name}"))),
        }
    }
}

/// `torch._C`'s two mode stack lengths, checked, where it has both.
fn mode_stacks(
    c: &Bound<'_, PyAny>,
    own: &Own<'_>,
) -> Result<Option<(NoArgs, NoArgs)>, ImportError> {
    Ok(
        match (
            c.hasattr("_len_torch_function_stack"),
            c.hasattr("_len_torch_dispatch_stack"),
        ) {
            (Ok(true), Ok(true)) => Some((
                NoArgs::new(own.builtin(
                    c,
                    "_len_torch_function_stack",
                    "torch._C._len_torch_function_stack",
                )?),
                NoArgs::new(own.builtin(
                    c,
                    "_len_torch_dispatch_stack",
                    "torch._C._len_torch_dispatch_stack",
                )?),
            )),
            _ => None,
        },
    )
}

/// `torch._C.TensorBase`, checked (see [`handles`]): its object lies in the
/// image of PyTorch's C extension, where PyTorch's own C functions and
/// tables lie. Looked up the first time (Python code: phase 1 only).
pub(crate) fn tensor_base(py: Python<'_>) -> Result<&'static Py<PyAny>, ImportError> {
    handles(py).map(|h| &h.base)
}

/// `torch._C.DisableTorchFunction`'s `__enter__` and `__exit__` method
/// definitions, checked, for `FunctionOff` (`torch/phase2.rs`).
pub(super) struct FunctionOffDefs {
    pub(super) enter: CDef<pyo3::ffi::PyMethodDef>,
    pub(super) exit: CDef<pyo3::ffi::PyMethodDef>,
}

impl FunctionOffDefs {
    /// The definitions, where `disable` (the static type, checked by the
    /// caller) does not have its instances tracked by the collector and
    /// `__enter__`/`__exit__` are its own C methods without arguments (or,
    /// for `__exit__`, ignoring a tuple of them: PyTorch's takes `*args`).
    pub(super) fn find(disable: &Bound<'_, PyAny>) -> Option<Self> {
        use pyo3::ffi;
        // SAFETY: `disable` is a type object (a static type: checked by the
        // caller); reading its flags.
        let flags = unsafe { ffi::PyType_GetFlags(disable.as_ptr().cast()) };
        if flags & ffi::Py_TPFLAGS_HAVE_GC != 0 {
            return None;
        }
        let dict = disable.getattr(intern!(disable.py(), "__dict__")).ok()?;
        let def = |name: &str, flags: &[std::ffi::c_int]| {
            let entry = dict.get_item(name).ok()?;
            if !crate::trust::is_own_descriptor(&entry, disable, name) {
                return None;
            }
            crate::trust::method_def(&entry)
                .filter(|d| flags.contains(&d.ml_flags))
                .map(CDef)
        };
        Some(FunctionOffDefs {
            enter: def("__enter__", &[ffi::METH_NOARGS])?,
            exit: def("__exit__", &[ffi::METH_NOARGS, ffi::METH_VARARGS])?,
        })
    }
}

/// A builtin without arguments, checked to be PyTorch's own (see
/// [`handles`]), with its C function when it is a `METH_NOARGS` one: that
/// is called directly, as CPython would call it, without going through the
/// generic call machinery.
pub(super) struct NoArgs {
    builtin: Py<PyAny>,
    function: Option<pyo3::ffi::PyCFunction>,
}

impl NoArgs {
    /// `builtin` must be exactly a builtin function (`is_builtin` holds).
    pub(super) fn new(builtin: Py<PyAny>) -> Self {
        use pyo3::ffi;
        let f = builtin.as_ptr();
        // SAFETY: both calls: `f` is exactly a builtin function (checked by
        // the caller with `is_builtin`), as they require.
        let function = unsafe {
            (ffi::PyCFunction_GetFlags(f) == ffi::METH_NOARGS)
                .then(|| ffi::PyCFunction_GetFunction(f))
                .flatten()
        };
        NoArgs { builtin, function }
    }

    /// `builtin()`.
    pub(super) fn call<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(function) = self.function else {
            return self.builtin.bind(py).call0();
        };
        // SAFETY: `function` is the `METH_NOARGS` C function of the builtin
        // kept in `self` (see `new`): called as CPython calls it, with the
        // builtin's `self` (borrowed from the builtin, which holds it) and
        // NULL; it returns a new reference or NULL with an exception set.
        unsafe {
            let module = pyo3::ffi::PyCFunction_GetSelf(self.builtin.as_ptr());
            Bound::from_owned_ptr_or_err(py, function(module, std::ptr::null_mut()))
        }
    }
}
