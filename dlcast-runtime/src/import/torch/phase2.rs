//! What phase 2 checks of a tensor, and what phase 1 notes for it: the
//! class's read-only declaration and what it was decided from
//! ([`Declared`]), and a writable parameter's refusals (requires grad,
//! inference outside inference mode, a swapped tensor: [`WriteCheck`]),
//! through PyTorch's C getters called directly, with no Python code and no
//! object the garbage collector tracks.

#[allow(unused_imports)]
use super::*;
use crate::import::torch_handles::CDef;

/// What a tensor's read-only declaration was decided from in phase 1 (its
/// type, its MRO, and what each class holds under `__dlpack__` and
/// `__dlpack_c_exchange_api__`, the names [`TypeFlags::declared_read_only`]
/// and [`declared_by_class`] consult), noted before the decision. Python
/// code run later in phase 1 (another argument's `__dlpack__`) can change
/// any of them (`x.__class__ = ReadOnlyTensorWrapper`, a class attribute
/// set), and the decision cannot be made again in phase 2 (it runs the
/// class's `__dlpack__`): phase 2 reads the tensor read-only unless all of
/// them are unchanged ([`Declared::holds`]), so a writable parameter
/// refuses it and a read-only parameter's view is exported read-only.
pub(crate) struct Declared {
    /// The caller's tensor.
    original: Py<PyAny>,
    /// `None` where the MRO could not be read: then never unchanged.
    entries: Option<crate::trust::ClassEntries>,
}

impl Declared {
    /// Phase 1 (reading the MRO may ready the type).
    pub(super) fn note(obj: &Bound<'_, PyAny>) -> Self {
        let py = obj.py();
        let names = [
            intern!(py, "__dlpack__"),
            intern!(py, "__dlpack_c_exchange_api__"),
        ];
        Declared {
            original: obj.clone().unbind(),
            entries: crate::trust::ClassEntries::note(obj, &names),
        }
    }

    /// Phase 2: whether the declaration decided in phase 1 still holds (see
    /// [`crate::trust::ClassEntries::unchanged`]: no Python code, no
    /// allocation).
    pub(crate) fn holds(&self, py: Python<'_>) -> bool {
        self.entries
            .as_ref()
            .is_some_and(|e| e.unchanged(self.original.bind(py)))
    }
}

/// Whether `obj`'s class declares it read-only in a way dlcast's read of
/// the alias would not see: through an exchange table of another producer
/// (its `managed_tensor_from_py_object_no_sync` export carries DLPack's
/// `READ_ONLY` flag), or through its own `__dlpack__` (its capsule does).
/// PyTorch's own read-only table is recognised by the type alone
/// ([`TypeFlags::declared_read_only`]). Each is asked only where the class
/// has one of its own (an exact `torch.Tensor`, and a subclass that
/// inherits `torch.Tensor`'s `__dlpack__`, have none), for every
/// parameter; an answer can only add the mark: a class that
/// claims writable undoes no declaration. Python code (phase 1); an error
/// of the class's own code refuses the tensor.
///
/// The second answer says whether the class declares nothing on its own
/// (it inherits `torch.Tensor`'s `__dlpack__` and has no other producer's
/// exchange table): then no code of the class was asked, and the answer
/// holds for every instance while the class is unchanged (see
/// `direct::note_class`).
pub(super) fn declared_by_class<'py>(obj: &Bound<'py, PyAny>) -> Result<(bool, bool), ImportError> {
    let py = obj.py();
    if exchange::is_exactly_torch_tensor(obj) {
        return Ok((false, true));
    }
    // What the instance's own look-ups find (the class's real MRO and
    // dictionaries), not what the class answers: a metaclass can answer
    // `type(obj).__dlpack__` and the table's name for its classes, hiding a
    // base's declaration. Where the MRO cannot be read, refused as read-only.
    let tp = obj.get_type();
    let lookup = |name: &Bound<'py, pyo3::types::PyString>| {
        crate::trust::class_lookup(&tp, name).ok_or_else(|| {
            ImportError::Unreadable(format!(
                "dlcast cannot read the MRO of {} from CPython, so it cannot tell whether the \
                 class declares its tensors read-only; pass a plain tensor",
                type_name(obj)
            ))
        })
    };
    let table =
        lookup(intern!(py, "__dlpack_c_exchange_api__"))?.and_then(|c| exchange::table_of(&c));
    let pytorchs = |t: Option<&'static dlpack_rs::ffi::DLPackExchangeAPI>, a| {
        t.is_some_and(|t| std::ptr::eq(t, a))
    };
    let mut foreign = false;
    if let Some(api) = table.filter(|&a| {
        !pytorchs(exchange::torch_table(py), a) && !pytorchs(exchange::torch_const_table(py), a)
    }) {
        if let Some(owner) = exchange::owning(obj, api)? {
            if capsule::read(&owner, ImportPath::ExchangeApi)?.read_only {
                return Ok((true, false));
            }
        }
        foreign = true;
    }
    let name = intern!(py, "__dlpack__");
    let own = lookup(name)?;
    let tensors = exchange::torch_tensor_class(py)
        .and_then(|t| crate::trust::class_lookup(&t, name))
        .flatten();
    let inherited = match (&own, &tensors) {
        (Some(own), Some(tensors)) => own.is(tensors),
        (None, _) => true,
        (Some(_), None) => false,
    };
    if inherited {
        return Ok((false, !foreign));
    }
    // Memory on a device with streams is not synchronised for this look
    // (`stream=-1`): only the flag is read.
    let Some(cap) = capsule::call_dlpack(obj, Some(-1))? else {
        return Ok((false, false));
    };
    let owner = capsule::take(&cap)?;
    Ok((capsule::read(&owner, ImportPath::Dlpack)?.read_only, false))
}

/// What a writable parameter's tensor must still be when it is read
/// (phase 2, [`check_write`]); noted in phase 1.
pub(crate) struct WriteCheck {
    /// The caller's tensor.
    pub(super) original: Py<PyAny>,
    /// The address of the `TensorImpl` it held when the alias was made
    /// (`_cdata`): the one whose storage the body writes, whose autograd
    /// state covers it. (An address only: once that `TensorImpl` is freed,
    /// another can be made at it, so the version bump never relies on it.)
    pub(super) tensor_impl: usize,
    /// The alias is an inference tensor (no one can change that: see
    /// [`prepare`]).
    pub(super) inference: bool,
}

/// Phase 2, in every read pass (the last one, after the version bumps,
/// decides): refuses a tensor that requires grad (autograd cannot see the
/// write, PyTorch forbids untracked in-place changes), an inference tensor
/// outside `torch.inference_mode()` (PyTorch refuses in-place writes to it
/// there), and a tensor whose `TensorImpl` was swapped for another since
/// the alias was made (`torch.utils.swap_tensors`): `requires_grad` and the
/// version counter of the caller's tensor would then be another tensor's,
/// not those of the storage written. (`x.set_()` and `x.data = ...` keep
/// the `TensorImpl`, with its autograd state and version counter, which
/// also cover the views of the storage the alias holds.)
///
/// Runs no Python code and allocates no object the collector tracks: the
/// getters are `TensorBase`'s own C functions, called directly, which
/// consult `__torch_function__` only for a subclass or with a function mode
/// on the stack; there they run inside [`FunctionOff`]. They answer
/// `True`/`False` and an integer, and `torch.is_inference_mode_enabled`
/// reads a thread-local flag; none releases the GIL.
pub(crate) fn check_write(py: Python<'_>, w: &WriteCheck) -> Result<(), ImportError> {
    let h = handles(py)?;
    let x = w.original.bind(py);
    if !is_tensor(x, h) {
        // A tensor's class can only be changed to another tensor class.
        return Err(ImportError::Invalid(format!(
            "{} is not a tensor",
            type_name(x)
        )));
    }
    let ask = || -> Result<(usize, bool), ImportError> {
        let grad = call_getter(h.requires_grad_def, x)
            .and_then(|v| is_true(&v))
            .map_err(|e| producer_error("x.requires_grad", e, py))?;
        Ok((tensor_impl(x, h)?, grad))
    };
    let (tensor_impl, grad) = if exchange::is_exactly_torch_tensor(x) && no_function_modes(py, h)? {
        ask()?
    } else {
        let _off = FunctionOff::enter(py, h)?;
        ask()?
    };
    if tensor_impl != w.tensor_impl {
        return Err(ImportError::Unreadable(
            "Python code swapped the tensor for another (torch.utils.swap_tensors) while the \
             call's arguments were taken, so the memory dlcast holds is no longer this \
             tensor's and a write would escape its autograd state; the call is refused"
                .into(),
        ));
    }
    if grad {
        return Err(ImportError::Param(
            "the tensor requires grad, and autograd cannot see writes through a writable \
             parameter; pass x.detach() to write into its data"
                .into(),
        ));
    }
    if w.inference {
        let in_mode = h
            .inference_mode
            .call(py)
            .and_then(|v| is_true(&v))
            .map_err(|e| producer_error("torch.is_inference_mode_enabled", e, py))?;
        if !in_mode {
            return Err(ImportError::Param(
                "the tensor is an inference tensor, which PyTorch lets no one write in place \
                 outside torch.inference_mode(); call this function inside \
                 torch.inference_mode(), or pass x.clone()"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// The address of `obj`'s `TensorImpl` (`TensorBase._cdata`'s getter,
/// called directly: an integer, which the collector does not track). Where
/// the getter is not PyTorch's own, refused (writable parameters, the only
/// ones that ask, cannot tell a swapped tensor without it). No Python code
/// where [`plain`] holds or inside the regions.
pub(super) fn tensor_impl(obj: &Bound<'_, PyAny>, h: &Handles) -> Result<usize, ImportError> {
    let Some(def) = h.cdata_def else {
        return Err(not_torchs_own("torch._C.TensorBase._cdata"));
    };
    call_getter(def, obj)
        .and_then(|v| v.extract::<usize>())
        .map_err(|e| producer_error("x._cdata", e, obj.py()))
}

/// `x.detach()` through `TensorBase`'s own method (a subclass's `detach` is
/// not asked): a new plain tensor over `x`'s storage that shares its
/// version counter. Where the method is not PyTorch's own, refused
/// (writable parameters, the only ones that ask, bump its counter).
pub(super) fn detach<'py>(
    obj: &Bound<'py, PyAny>,
    h: &Handles,
) -> Result<Bound<'py, PyAny>, ImportError> {
    let py = obj.py();
    let Some(detach) = &h.detach else {
        return Err(not_torchs_own("torch._C.TensorBase.detach"));
    };
    detach
        .bind(py)
        .call1((obj,))
        .map_err(|e| producer_error("x.detach", e, py))
}

/// Calls the C getter of a `getset_descriptor` checked in [`handles`] on
/// `obj` (an instance of `TensorBase`: the caller checked), as the
/// descriptor would, without making a bound method or an argument tuple.
fn call_getter<'py>(
    def: CDef<pyo3::ffi::PyGetSetDef>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let def = def.0;
    let Some(get) = def.get else {
        return Err(ImportFault::TorchMissing("a getter of torch._C.TensorBase").into());
    };
    // SAFETY: `get` is the C getter of one of `TensorBase`'s own getset
    // descriptors (checked in `handles`), called with an instance of
    // `TensorBase` (the descriptor's own type check, done by the caller)
    // and the definition's closure, as CPython calls it; it returns a new
    // reference, or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(obj.py(), get(obj.as_ptr(), def.closure)) }
}

/// `torch._C.DisableTorchFunction` entered, for phase 2: no
/// `__torch_function__`, of a mode or a subclass, runs inside (PyTorch's
/// C getters then skip their lookup of it, which is Python code for a
/// subclass). Entered and exited with no Python code and no object the
/// collector tracks: an instance of the static type (untracked: checked)
/// and its C methods called directly with no arguments (`__exit__` with the
/// shared empty tuple). Torch-function state only: the getters phase 2
/// asks dispatch no operator, so Python dispatch does not concern them.
struct FunctionOff<'py> {
    guard: Bound<'py, PyAny>,
    exit: CDef<pyo3::ffi::PyMethodDef>,
}

impl<'py> FunctionOff<'py> {
    fn enter(py: Python<'py>, h: &'static Handles) -> Result<Self, ImportError> {
        let Some(defs) = &h.function_off else {
            return Err(not_torchs_own("torch._C.DisableTorchFunction"));
        };
        // The type's own `tp_new` and `tp_init` (slots of a static type,
        // which Python code cannot change).
        let guard = h
            .disable
            .bind(py)
            .call0()
            .map_err(|e| producer_error("torch._C.DisableTorchFunction", e, py))?;
        call_method(defs.enter, &guard)
            .map_err(|e| producer_error("torch._C.DisableTorchFunction", e, py))?;
        Ok(FunctionOff {
            guard,
            exit: defs.exit,
        })
    }
}

impl Drop for FunctionOff<'_> {
    fn drop(&mut self) {
        // Restores the state saved by `__enter__`; cannot fail in PyTorch.
        let _ = call_method(self.exit, &self.guard);
    }
}

/// Calls a method definition checked by `FunctionOffDefs::find` on
/// `obj`, an instance of its type, with no arguments.
fn call_method<'py>(
    def: CDef<pyo3::ffi::PyMethodDef>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let (py, def) = (obj.py(), def.0);
    // `PyTuple_New(0)`: the interpreter's shared empty tuple.
    let empty = pyo3::types::PyTuple::empty(py);
    let args = if def.ml_flags == pyo3::ffi::METH_NOARGS {
        std::ptr::null_mut()
    } else {
        empty.as_ptr()
    };
    // SAFETY: `ml_meth` of a `METH_NOARGS` or `METH_VARARGS` definition
    // (checked) is a `PyCFunction`; called as CPython calls it, with an
    // instance of the method's type and NULL (no arguments) or a tuple; it
    // returns a new reference, or NULL with an exception set.
    unsafe {
        let f = def.ml_meth.PyCFunction;
        Bound::from_owned_ptr_or_err(py, f(obj.as_ptr(), args))
    }
}
