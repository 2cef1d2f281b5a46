//! PyTorch's own rules, in one place: the private alias, the lazy
//! negative and conjugate bits, grad, inference tensors, version counters
//! and Python dispatch.
//!
//! PyTorch tensors are mutable containers: Python code can swap a tensor's
//! storage (`x.set_(...)`, `x.data = ...`, `torch.utils.swap_tensors`),
//! resize it, or change its dtype in place, freeing the memory a view was
//! made of even while a DLPack export of the tensor is alive (the export
//! holds the tensor, not its storage). So dlcast never reads the caller's
//! tensor object itself. Phase 1 takes **a private alias**, `x.data`: a new
//! plain `torch.Tensor` over the same storage, which holds that storage
//! alive, and which no one else has a reference to. Every PyTorch call of
//! phase 1 goes through `TensorBase`'s own C attributes with torch-function
//! and Python dispatch disabled, so no `__torch_function__` or
//! `__torch_dispatch__` mode or subclass override sees the alias, runs, or
//! answers for PyTorch. The regions are skipped only where they change
//! nothing: a tensor whose type is exactly `torch.Tensor` while both mode
//! stacks are empty, for which PyTorch's C code calls no Python code
//! anyway (see `plain`); that saves two context objects entered and exited
//! per argument. Phase 2 checks that the
//! alias is still private all the same (reference count 1, no weak
//! references) and reads it through PyTorch's own exchange table, which
//! runs no Python code.
//! Each of these (`TensorBase` and its attributes, PyTorch's builtins and
//! contexts, its exchange table, the class `torch.Tensor` itself) is taken
//! from C-level state checked once, never from an attribute Python code
//! can replace: `TensorBase` must be the static type of that name, the
//! builtins and the table PyTorch's own C code (in `TensorBase`'s image),
//! and `torch.Tensor` is the class PyTorch's C code makes the alias of
//! (see `handles`); what is not PyTorch's own is refused.
//! A view of the alias then stays valid whatever Python code does to the
//! caller's tensor during the call, on this thread or another, with one
//! exception that no object reference can prevent: the storage's own
//! memory moved (`x.resize_()` past its capacity,
//! `x.untyped_storage().resize_()`, `x.share_memory_()`), which moves the
//! memory of every tensor on it (the README's safety section).
//!
//! The values: a tensor with its negative or conjugate bit set holds the
//! raw memory of a lazily negated / conjugated tensor, which reads wrong;
//! such tensors are refused (the conjugate bit only where the dtype is
//! complex: a real number is its own conjugate). The bits are asked of the
//! alias itself (`is_neg()`, `is_conj()`), which no one else can change.
//! The Python dispatch key (also refused) is read from the caller's tensor
//! (`_python_dispatch`) just before the alias is made from it: `x.data`
//! itself would run the tensor's `__torch_dispatch__`.
//! Writable parameters refuse tensors that require grad (autograd
//! cannot see the writes) and inference tensors outside
//! `torch.inference_mode()` (PyTorch forbids in-place writes to them), and
//! once every check passed bump the version counter of the memory written:
//! that of `x.detach()`, taken in phase 1 with the alias made from it
//! (it shares the counter of `x`'s views and detached copies), never that
//! of whatever tensor the caller's object holds by then.
//! Both refusals are decided in phase 2, at every read ([`check_write`]),
//! since Python code run later in phase 1 can set `requires_grad` or leave
//! inference mode; so is whether the caller's tensor still holds the
//! `TensorImpl` the alias was made from (`torch.utils.swap_tensors`; an
//! address, which a new `TensorImpl` can take once the first is freed:
//! the bump never relies on it). Without PyTorch's own `_cdata` or `detach`
//! writable parameters refuse every tensor.
//!
//! A tensor whose class declares it read-only (PyTorch's
//! `torch.utils.dlpack.ReadOnlyTensorWrapper` publishes PyTorch's read-only
//! exchange table; another class may export read-only through its own
//! `__dlpack__` or exchange table) is read read-only, whatever path reads
//! it: writable parameters refuse it.

use crate::device::kind;
use crate::error::ImportFault;
use crate::import::{
    capsule, exchange, exchange::TypeFlags, producer_error, type_name, ImportError, ImportPath,
    Source, StreamCx,
};
use crate::stream::{self, StreamKind, StreamRequest};
use dlpack_rs::ffi::DLPackExchangeAPI;
use pyo3::intern;
use pyo3::prelude::*;

pub(crate) mod direct;
mod phase2;
use super::torch_handles::{handles, not_torchs_own, Handles, NoArgs};
pub(crate) use phase2::{check_write, Declared, WriteCheck};
use phase2::{declared_by_class, detach, tensor_impl};

/// Whether `obj` has PyTorch's Python dispatch key: `TensorBase`'s own
/// `_python_dispatch` getter (`TensorImpl::is_python_dispatch()`), which
/// consults no `__torch_function__`, keeps the GIL and returns a bool (no
/// object is allocated), so no Python code runs between it and the next
/// PyTorch call, on this thread or another.
///
/// `is_python_dispatch()` tests `Python` together with `PythonTLSSnapshot`
/// (`c10::python_ks`): PyTorch sets and clears the two only together
/// (`TensorImpl::set_python_dispatch`; shallow copies keep or drop both),
/// so for a tensor PyTorch made it is the `Python` key's own bit.
fn python_dispatch(obj: &Bound<'_, PyAny>, h: &Handles) -> Result<bool, ImportError> {
    get(&h.python_dispatch, obj)
        .and_then(|v| is_true(&v))
        .map_err(|e| producer_error("x._python_dispatch", e, obj.py()))
}

/// The lazy bits of `alias` (dlcast's private alias): `is_neg()`, and
/// `is_conj()` where the dtype is complex (`complex`; the conjugate of a
/// real number is itself, so a real tensor's memory holds its values
/// whatever that bit says). `TensorBase`'s own methods, which consult no
/// `__torch_function__` here (an exact `torch.Tensor` without modes, or
/// inside the disabled regions: see [`plain`]). They release the GIL while
/// they run, so other threads may run Python code: they cannot reach the
/// private alias, whose bits are the ones read.
fn lazy_bits(alias: &Bound<'_, PyAny>, h: &Handles, complex: bool) -> Result<Lazy, ImportError> {
    let py = alias.py();
    let bit = |method: &Py<PyAny>, what: &'static str| {
        method
            .bind(py)
            .call1((alias,))
            .and_then(|v| is_true(&v))
            .map_err(|e| producer_error(what, e, py))
    };
    Ok(Lazy {
        negative: bit(&h.is_neg, "x.is_neg")?,
        conjugate: complex && bit(&h.is_conj, "x.is_conj")?,
        zero: bit(&h.is_zerotensor, "x._is_zerotensor")?,
    })
}

/// A PyTorch answer that must be a bool: `True` or `False` (compared with
/// the two singletons), else a `TypeError`.
fn is_true(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = v.py();
    if v.is(pyo3::types::PyBool::new(py, true)) {
        Ok(true)
    } else if v.is(pyo3::types::PyBool::new(py, false)) {
        Ok(false)
    } else {
        Err(ImportFault::NotABool(type_name(v)).into())
    }
}

/// Whether `obj` is an instance of `TensorBase` (exactly `torch.Tensor`,
/// a pointer comparison, or a subclass). Runs no Python code.
fn is_tensor(obj: &Bound<'_, PyAny>, h: &Handles) -> bool {
    exchange::is_exactly_torch_tensor(obj)
        // SAFETY: both are live objects, `h.base` a type.
        || unsafe { pyo3::ffi::PyObject_TypeCheck(obj.as_ptr(), h.base.as_ptr().cast()) } != 0
}

/// A tensor's lazy bits (`is_neg()`, `is_conj()`).
#[derive(Clone, Copy)]
struct Lazy {
    negative: bool,
    conjugate: bool,
    /// `_is_zerotensor()`: an efficient zero tensor (`ZeroTensor` key) has
    /// no memory; its data pointer is NULL plus the storage offset, which
    /// a slice makes non-NULL (an address to read or write, not its values).
    zero: bool,
}

/// Whether no `__torch_function__` mode and no `__torch_dispatch__` mode is
/// on this thread's stacks (`torch._C._len_torch_function_stack() == 0`
/// and `_len_torch_dispatch_stack() == 0`: the stacks PyTorch's C code
/// consults, infrastructure modes included). `false` where PyTorch cannot
/// say. Allocates nothing (small integers are shared), so no Python code
/// runs in it.
fn no_modes(py: Python<'_>, h: &Handles) -> Result<bool, ImportError> {
    let Some((_, dispatch)) = &h.mode_stacks else {
        return Ok(false);
    };
    Ok(no_function_modes(py, h)? && stack_empty(py, dispatch)?)
}

/// Whether no `__torch_function__` mode is on this thread's stack (all
/// that a C attribute that dispatches no operator consults, such as
/// `is_neg()`); `false` where PyTorch cannot say. Allocates nothing.
fn no_function_modes(py: Python<'_>, h: &Handles) -> Result<bool, ImportError> {
    match &h.mode_stacks {
        Some((function, _)) => stack_empty(py, function),
        None => Ok(false),
    }
}

/// Whether `len` (one of `torch._C`'s mode stack lengths) answers 0.
fn stack_empty(py: Python<'_>, len: &NoArgs) -> Result<bool, ImportError> {
    len.call(py)
        .and_then(|n| n.extract::<i64>())
        .map(|n| n == 0)
        .map_err(|e| producer_error("torch._C._len_torch_function_stack", e, py))
}

/// `torch._C.DisableTorchFunction()` and `torch._C._DisableTorchDispatch()`
/// entered (no `__torch_function__` and no `__torch_dispatch__`, of modes or
/// subclasses, runs inside); exited, in reverse order, on drop.
struct NoTorchFunction<'py> {
    function: Bound<'py, PyAny>,
    dispatch: Option<Bound<'py, PyAny>>,
    h: &'static Handles,
}

impl<'py> NoTorchFunction<'py> {
    fn enter(py: Python<'py>, h: &'static Handles) -> Result<Self, ImportError> {
        // `DisableTorchFunction` is a static type (checked in `handles`):
        // calling it and its instance's `__enter__` run its C code.
        let function = h
            .disable
            .bind(py)
            .call0()
            .and_then(|c| c.call_method0(intern!(py, "__enter__")).map(|_| c))
            .map_err(|e| producer_error("torch._C.DisableTorchFunction", e, py))?;
        let mut region = NoTorchFunction {
            function,
            dispatch: None,
            h,
        };
        region.dispatch = Some(
            h.disable_dispatch
                .enter(py)
                .map_err(|e| producer_error("torch._C._DisableTorchDispatch", e, py))?,
        );
        Ok(region)
    }
}

impl Drop for NoTorchFunction<'_> {
    fn drop(&mut self) {
        let py = self.function.py();
        // Restore the states saved by `__enter__`; cannot fail in PyTorch.
        // The dispatch guard object is freed here too, before the other
        // region ends: some PyTorch versions hold the guard from `__init__`
        // until the object is freed, with `__enter__`/`__exit__` doing
        // nothing.
        if let Some(d) = self.dispatch.take() {
            self.h.disable_dispatch.exit(&d);
            drop(d);
        }
        let _ = self
            .function
            .call_method1(intern!(py, "__exit__"), (py.None(), py.None(), py.None()));
    }
}

/// Whether `requires_grad` is set on `obj` (`TensorBase`'s own getter: a
/// subclass's property is not asked), for an export of a view of it.
pub(crate) fn requires_grad(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = obj.py();
    let h = handles(py).map_err(|_| ImportFault::TorchMissing("torch._C.TensorBase"))?;
    let missing = |_| PyErr::from(ImportFault::TorchMissing("torch._C"));
    // No region where it changes nothing (see `plain`).
    let _off = if plain(obj, h).map_err(missing)? {
        None
    } else {
        Some(NoTorchFunction::enter(py, h).map_err(missing)?)
    };
    get(&h.requires_grad, obj)?.is_truthy()
}

/// `descr.__get__(obj, type(obj))` for one of `TensorBase`'s own getters
/// (`data`, `requires_grad`): through the descriptor type's
/// `tp_descr_get` slot where the full API allows it (no bound
/// `__get__` method-wrapper is made), else the `__get__` method.
fn get<'py>(descr: &Py<PyAny>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    #[cfg(not(Py_LIMITED_API))]
    {
        // SAFETY: `descr` is a live object (held by `Handles`); its type's
        // slot is read under the GIL.
        let slot = unsafe { (*pyo3::ffi::Py_TYPE(descr.as_ptr())).tp_descr_get };
        if let Some(get) = slot {
            // SAFETY: the slot's contract (`__get__(instance, owner)`):
            // borrowed `descr`, `obj` and its type, all live; it returns a
            // new reference, or NULL with an exception set, which
            // `from_owned_ptr_or_err` takes.
            return unsafe {
                let owner = pyo3::ffi::Py_TYPE(obj.as_ptr()).cast();
                Bound::from_owned_ptr_or_err(py, get(descr.as_ptr(), obj.as_ptr(), owner))
            };
        }
    }
    descr.bind(py).call_method1(intern!(py, "__get__"), (obj,))
}

/// What phase 1 made of a PyTorch tensor.
pub(crate) struct Prepared {
    pub(crate) source: Source,
    /// For a writable parameter, `x.detach()` taken in phase 1 (see
    /// [`prepare`]): its version counter, the one of the memory the body
    /// writes, is bumped once every argument passed its checks.
    pub(crate) bump: Option<Py<PyAny>>,
}

/// Phase 1 for a tensor (any object whose type comes from the `torch`
/// package): the checks that need Python code, then the private alias,
/// which phase 2 reads (see the module documentation).
///
/// The fast path: when `obj` is exactly a `torch.Tensor` and no
/// `__torch_function__` or `__torch_dispatch__` mode is on the stacks, the
/// calls below run no Python code without the disabled regions either, so
/// they are not entered (see [`plain`], [`region`]).
///
/// A writable parameter's refusals are decided in phase 2 ([`check_write`]),
/// after the last Python code of the call: Python code run later in phase 1
/// (another argument's `__dlpack__`) can set `requires_grad` or leave
/// `torch.inference_mode()`. Phase 1 only notes what no one can change:
/// whether the alias is an inference tensor (the alias is private, and a
/// `TensorImpl`'s inference-ness is fixed when it is made) and which
/// `TensorImpl` the alias was made from.
pub(crate) fn prepare(
    obj: &Bound<'_, PyAny>,
    flags: TypeFlags,
    sx: StreamCx,
    writable: bool,
) -> Result<Prepared, ImportError> {
    let py = obj.py();
    refuse_py_dispatch(flags)?;
    // What the read-only declaration below is decided from, noted before
    // anything of this call's decides it (`flags` were looked up just
    // before): phase 2 reads the tensor read-only unless it is unchanged.
    let tag = direct::class_tags(obj);
    let declared = Declared::note(obj);
    let h = handles(py)?;
    // The direct read's layout, learnt at the first PyTorch argument (later
    // calls read plain tensors directly: `direct`).
    direct::learn(py);
    let api = exchange::torch_table(py);
    crate::import::ready_private_check(py)?;

    let mut off = region(obj, h)?;
    let Alias {
        alias,
        keep,
        tensor_impl,
    } = take_alias(obj, h, writable, &mut off)?;
    if api.is_some() && !exchange::is_exactly_torch_tensor(&alias) {
        return Err(ImportError::Unreadable(format!(
            "x.data gave {}, not a plain tensor",
            type_name(&alias)
        )));
    }
    let described = describe_alias(&alias, api)?;
    let (bits, inference) = lazy_state(&alias, h, described, writable, &mut off)?;
    refuse_lazy_bits(bits)?;
    drop(off);

    let read_only = read_only_by_class(obj, flags, h, tag)?;
    // Inference tensors track no version: they are not bumped.
    let bump = keep.filter(|_| !inference).map(Bound::unbind);
    let write = tensor_impl.map(|tensor_impl| WriteCheck {
        original: obj.clone().unbind(),
        tensor_impl,
        inference,
    });
    let Some((api, exchange::Described { device, .. })) = described else {
        // No exchange table (a PyTorch without it, or one that failed its
        // checks): the alias exported by PyTorch's C code.
        return via_dlpack(alias, None, sx, bump, h, (read_only, declared), write);
    };
    match stream_for_table(py, api, device, sx)? {
        Some(stream) => Ok(Prepared {
            source: Source::Torch {
                tensor: alias.unbind(),
                api,
                original: obj.clone().unbind(),
                stream,
                read_only,
                declared,
                write,
            },
            bump,
        }),
        None => via_dlpack(
            alias,
            Some(device),
            sx,
            bump,
            h,
            (read_only, declared),
            write,
        ),
    }
}

/// What [`take_alias`] made: the private alias, for a writable parameter
/// the tensor whose version counter is bumped (`x.detach()`), and the
/// address of the `TensorImpl` both were made from.
struct Alias<'py> {
    alias: Bound<'py, PyAny>,
    keep: Option<Bound<'py, PyAny>>,
    tensor_impl: Option<usize>,
}

/// The private alias of `obj` (see [`prepare`]), inside the regions `off`
/// holds (entered here where an allocation may have entered a mode).
fn take_alias<'py>(
    obj: &Bound<'py, PyAny>,
    h: &'static Handles,
    writable: bool,
    off: &mut Option<NoTorchFunction<'py>>,
) -> Result<Alias<'py>, ImportError> {
    let py = obj.py();
    // A tensor with the Python dispatch key makes PyTorch run Python code
    // (`x.data` itself would, through its `__torch_dispatch__`), and a class
    // can hide its `__torch_dispatch__` from the type check above: refused.
    // Nothing runs between this read and the alias's shallow copy (see
    // [`python_dispatch`]; the `TensorImpl`'s address is a C getter that
    // allocates an integer, which the collector does not track).
    if python_dispatch(obj, h)? {
        return Err(py_dispatch_refusal());
    }
    let tensor_impl = match writable {
        true => Some(tensor_impl(obj, h)?),
        false => None,
    };
    // A writable parameter bumps the version counter of the memory it
    // writes, not of whatever tensor the caller's object holds by then:
    // `keep = x.detach()`, a new tensor of PyTorch's C code over the same
    // storage that shares `x`'s version counter (and so that of every view
    // and detached copy of it, such as those autograd saved), taken here,
    // and the alias made from it, so both are of one `TensorImpl` whatever
    // a finalizer run by keep's allocation does to `x`. The `TensorImpl`
    // address noted above can be reused once that `TensorImpl` is freed, so
    // the swap check of phase 2 (an address comparison) cannot be what
    // names the counter. `detach` dispatches an operator: no Python code,
    // as for `x.data`, where `plain` holds or inside the regions, and `x`
    // has no Python dispatch key (checked just above).
    let keep = match writable {
        true => Some(detach(obj, h)?),
        false => None,
    };
    if keep.is_some() && off.is_none() && !no_modes(py, h)? {
        // keep's allocation may have run a finalizer that entered a mode,
        // which `x.data` below would consult.
        *off = Some(NoTorchFunction::enter(py, h)?);
    }
    // `TensorBase.data`'s getter itself: a subclass's `data` property is
    // not asked, and the alias is a plain `torch.Tensor`.
    let alias =
        get(&h.data, keep.as_ref().unwrap_or(obj)).map_err(|e| producer_error("x.data", e, py))?;
    if off.is_some() {
        // Made by PyTorch's C code with no Python dispatch: an instance of
        // the class PyTorch registered as `torch.Tensor`.
        exchange::learn_torch_tensor(&alias);
    }
    Ok(Alias {
        alias,
        keep,
        tensor_impl,
    })
}

/// A look at the alias's device and dtype through PyTorch's exchange
/// table `api` (no Python code); `None` without a table.
fn describe_alias(
    alias: &Bound<'_, PyAny>,
    api: Option<&'static DLPackExchangeAPI>,
) -> Result<Option<(&'static DLPackExchangeAPI, exchange::Described)>, ImportError> {
    let Some(api) = api else {
        return Ok(None);
    };
    match exchange::describe(alias, api)? {
        Some(d) => Ok(Some((api, d))),
        None => Err(ImportError::Invalid(
            "the exchange API cannot describe a tensor".into(),
        )),
    }
}

/// The lazy bits of the alias, and for a writable parameter whether it is
/// an inference tensor, which no one else can change: asked of PyTorch's
/// own methods, inside the regions `off` holds (entered here where a mode
/// may have been entered since).
fn lazy_state<'py>(
    alias: &Bound<'py, PyAny>,
    h: &'static Handles,
    described: Option<(&'static DLPackExchangeAPI, exchange::Described)>,
    writable: bool,
    off: &mut Option<NoTorchFunction<'py>>,
) -> Result<(Lazy, bool), ImportError> {
    let py = alias.py();
    let complex = described.is_none_or(|(_, d)| d.complex);
    // The alias was allocated (a collection may have run a finalizer, which
    // may have entered a mode): the fast path asks again for the function
    // modes, the only ones `is_neg()` / `is_conj()` / `is_inference()`
    // consult (they dispatch no operator).
    if off.is_none() && !no_function_modes(py, h)? {
        *off = Some(NoTorchFunction::enter(py, h)?);
    }
    let bits = lazy_bits(alias, h, complex)?;
    // `is_inference()` releases the GIL: other threads may run, but cannot
    // reach the private alias it is asked of.
    let inference = writable
        && h.is_inference
            .bind(py)
            .call1((alias,))
            .and_then(|v| is_true(&v))
            .map_err(|e| producer_error("x.is_inference", e, py))?;
    Ok((bits, inference))
}

/// Whether `obj` is read read-only by its class's declaration: PyTorch's
/// read-only table (`flags`), or the class's own (Python code of the class:
/// after the alias, outside the regions, as any producer's is run), for
/// every parameter: a read-only parameter's view is exported read-only. A
/// class that declares nothing is noted for the direct read, from what it
/// held when its tags were `tag`.
fn read_only_by_class(
    obj: &Bound<'_, PyAny>,
    flags: TypeFlags,
    h: &Handles,
    tag: (u32, u32),
) -> Result<bool, ImportError> {
    let (by_class, class_declares_nothing) = declared_by_class(obj)?;
    let read_only = flags.declared_read_only() || by_class;
    if !read_only && class_declares_nothing && is_tensor(obj, h) {
        direct::note_class(obj, tag);
    }
    Ok(read_only)
}

/// The stream the alias's memory is read on through the exchange table:
/// `Some` when the table may read it (`Some(None)`: no stream), `None`
/// when the alias's `__dlpack__` must synchronise instead. CUDA/ROCm
/// memory is taken as it is on the producer's current work stream (no
/// synchronisation, see `crate::stream`), unless the function names a
/// stream: then, and for other devices but the CPU, the alias's
/// `__dlpack__` synchronises with it.
fn stream_for_table(
    py: Python<'_>,
    api: &'static DLPackExchangeAPI,
    device: crate::device::Device,
    sx: StreamCx,
) -> Result<Option<Option<i64>>, ImportError> {
    Ok(match stream::stream_kind(device.device_type) {
        StreamKind::None if device.device_type == kind::CPU => Some(None),
        StreamKind::None => None,
        _ if sx.request != StreamRequest::Producer => None,
        _ => match exchange::current_stream(py, api, device)? {
            Some(h) => {
                Some(stream::resolve(device, sx.request, Some(h)).map_err(ImportError::Stream)?)
            }
            None => None,
        },
    })
}

/// The disabled regions, unless [`plain`] says they change nothing.
fn region<'py>(
    obj: &Bound<'py, PyAny>,
    h: &'static Handles,
) -> Result<Option<NoTorchFunction<'py>>, ImportError> {
    if plain(obj, h)? {
        Ok(None)
    } else {
        NoTorchFunction::enter(obj.py(), h).map(Some)
    }
}

/// Whether the disabled regions may be skipped for `obj`: its type is
/// exactly `torch.Tensor` and no mode is on either stack ([`no_modes`]).
///
/// Why this is the same as being inside them: PyTorch's C attributes ask
/// `check_has_torch_function(obj)` before doing their work, which is true
/// only if a torch-function mode is enabled (stack non-empty, not all
/// disabled) or the type is *not* exactly `Tensor`/`Parameter` and has a
/// `__torch_function__`; so for an exact `torch.Tensor` with an empty
/// stack it is false whatever `torch.Tensor.__torch_function__` has been
/// set to, and whatever `DisableTorchFunction(Subclass)` state is current.
/// `x.data` (`shallow_copy_and_detach`) calls Python only if a dispatch
/// mode is on the stack or the tensor has the Python dispatch key (refused
/// before). `_python_dispatch` handles neither. Nothing between this check
/// and `x.data` allocates an object the garbage collector tracks, so no
/// finalizer can enter a mode in between; the alias's own allocation can,
/// so [`prepare`] asks again before the calls that follow it.
fn plain(obj: &Bound<'_, PyAny>, h: &Handles) -> Result<bool, ImportError> {
    Ok(exchange::is_exactly_torch_tensor(obj) && no_modes(obj.py(), h)?)
}

/// The alias as a capsule (device memory that needs a stream handed over,
/// or no exchange table): a capsule that holds the alias's tensor, read in
/// phase 2 while the alias stays private. Inside the disabled regions, so
/// that no mode sees or answers the export. Memory taken as it is on the
/// producer's stream (the default) goes through PyTorch's C export
/// (`Handles::to_dlpack`); memory that needs a stream handed over through
/// the alias's `__dlpack__`, the only interface PyTorch offers for that
/// (see the README's Safety section).
fn via_dlpack(
    alias: Bound<'_, PyAny>,
    device: Option<crate::device::Device>,
    sx: StreamCx,
    bump: Option<Py<PyAny>>,
    h: &'static Handles,
    (read_only, declared): (bool, Declared),
    write: Option<WriteCheck>,
) -> Result<Prepared, ImportError> {
    let py = alias.py();
    let _off = NoTorchFunction::enter(py, h)?;
    if let (Some(export), StreamRequest::Producer) = (&h.to_dlpack, sx.request) {
        // Taken as it is on the producer's stream, as the exchange table's
        // read would.
        let cap = export
            .bind(py)
            .call1((&alias,))
            .map_err(|e| producer_error("torch._C._to_dlpack_versioned", e, py))?;
        return Ok(Prepared {
            source: Source::Managed {
                owner: capsule::take(&cap)?,
                path: ImportPath::Dlpack,
                stream: None,
                // A read-only declaration of the caller's class holds; the
                // alias itself is PyTorch's own tensor (made by its C code),
                // whose legacy exports are PyTorch's mutable memory.
                immutable: read_only,
                legacy_writable: crate::facts::Framework::Torch.facts().legacy_writable,
                said: device,
                private: Some(alias.unbind()),
                declared: Some(declared),
                write,
            },
            bump,
        });
    }
    let device = match device {
        Some(d) => Some(d),
        None if sx.may_need => capsule::dlpack_device(&alias)?,
        None => None,
    };
    let stream = match device {
        Some(d) => stream::resolve(d, sx.request, None).map_err(ImportError::Stream)?,
        None => None,
    };
    let cap = capsule::call_dlpack(&alias, stream)?
        .ok_or_else(|| ImportError::NotAnArray(type_name(&alias)))?;
    let owner = capsule::take(&cap)?;
    Ok(Prepared {
        source: Source::Managed {
            owner,
            path: ImportPath::Dlpack,
            stream,
            immutable: read_only,
            legacy_writable: crate::facts::Framework::Torch.facts().legacy_writable,
            said: device,
            private: Some(alias.unbind()),
            declared: Some(declared),
            write,
        },
        bump,
    })
}

/// Refuses a tensor whose type has its own `__torch_dispatch__` (see
/// [`TypeFlags`]): reading its sizes, strides or data can run its Python
/// code, so no read of it could be trusted to stay true until the body
/// runs. The verdict is cached per type only while the type is unchanged.
fn refuse_py_dispatch(flags: TypeFlags) -> Result<(), ImportError> {
    if flags.py_dispatch() {
        return Err(py_dispatch_refusal());
    }
    Ok(())
}

fn py_dispatch_refusal() -> ImportError {
    ImportError::Unreadable(
        "the tensor's type defines __torch_dispatch__ (PyTorch's Python dispatch key is set), \
         which PyTorch may run (Python code) whenever the tensor's layout is read, so dlcast \
         cannot check that its memory stays put; pass a plain tensor"
            .into(),
    )
}

/// Runs `f` inside the disabled regions ([`NoTorchFunction`]: no
/// `__torch_function__` or `__torch_dispatch__`, of a mode or a subclass,
/// runs or answers inside), for PyTorch calls dlcast makes on its private
/// alias outside the reads: the conversion of a read-only argument
/// (`crate::convert`), which a mode would otherwise see, and could change
/// (`x.set_()` on the alias) so that the copy reads memory dlcast never
/// checked. Phase 1 only (entering the regions is Python-level work).
pub(crate) fn in_disabled_regions<R>(
    py: Python<'_>,
    f: impl FnOnce() -> PyResult<R>,
) -> PyResult<R> {
    let to_err = |e: ImportError| match e {
        ImportError::Producer(_, e) | ImportError::Propagate(e) => e,
        _ => ImportFault::TorchMissing("torch._C.DisableTorchFunction").into(),
    };
    let h = handles(py).map_err(to_err)?;
    let _off = NoTorchFunction::enter(py, h).map_err(to_err)?;
    f()
}

/// Refuses a tensor with one of the lazy bits PyTorch keeps on a tensor
/// (`is_neg()`: any dtype, `z.conj().imag`; `is_conj()`: complex only): its
/// memory does not hold its values. The exchange API hands out the raw
/// memory, and so does `__dlpack__` for the negative bit (it refuses only
/// the conjugate bit). Also refuses an efficient zero tensor, which has no
/// memory at all (both hand out NULL plus its storage offset).
fn refuse_lazy_bits(bits: Lazy) -> Result<(), ImportError> {
    if bits.zero {
        return Err(ImportError::Unreadable(
            "the tensor is an efficient zero tensor (PyTorch's ZeroTensor), which has no \
             memory: its data pointer is not an address of its values; pass x.clone()"
                .into(),
        ));
    }
    let what = match (bits.negative, bits.conjugate) {
        (false, false) => return Ok(()),
        (true, false) => "negative",
        (false, true) => "conjugate",
        (true, true) => "negative and conjugate",
    };
    Err(ImportError::Unreadable(format!(
        "the tensor has its {what} bit set (PyTorch's lazy {what}), so its memory \
         does not hold its values; pass x.resolve_conj().resolve_neg()"
    )))
}

/// Bumps the version counter of each tensor a writable parameter took (the
/// `x.detach()` of each, see [`prepare`]; `torch._C._increment_version`, what
/// `torch.autograd.graph.increment_version` calls), so that a graph that
/// saved one for backward raises instead of using changed data. It
/// allocates a tuple (which can start the cyclic GC, and so finalizers):
/// the call reads every argument again afterwards.
pub(crate) fn bump_versions(py: Python<'_>, tensors: &[Py<PyAny>]) -> PyResult<()> {
    let h = handles(py).map_err(|_| ImportFault::TorchMissing("torch._C._increment_version"))?;
    let tensors = pyo3::types::PyTuple::new(py, tensors)?;
    h.increment_version.bind(py).call1((tensors,))?;
    Ok(())
}

/// `TensorBase`'s own `detach`, `to`, `contiguous` and `permute`: method
/// descriptors from its immutable `__dict__`, each checked to be its own C
/// method of that name (as [`handles`] checks its getters), for dlcast's
/// conversions of tensors. Called with the tensor as first argument, never
/// looked up on `torch.Tensor`, whose attributes Python code can replace
/// (a replaced `detach` would receive the private alias, and could point it
/// at memory the conversion then copies without holding it).
pub(crate) struct Methods {
    pub(crate) detach: Py<PyAny>,
    pub(crate) to: Py<PyAny>,
    pub(crate) contiguous: Py<PyAny>,
    pub(crate) permute: Py<PyAny>,
}

/// The checked [`Methods`], found once.
pub(crate) fn methods(py: Python<'_>) -> PyResult<&'static Methods> {
    static METHODS: pyo3::sync::PyOnceLock<Methods> = pyo3::sync::PyOnceLock::new();
    METHODS.get_or_try_init(py, || {
        let missing = |_| PyErr::from(ImportFault::TorchMissing("torch._C.TensorBase"));
        let base = handles(py).map_err(missing)?.base.bind(py);
        let dict = base.getattr(intern!(py, "__dict__"))?;
        let get = |name: &'static str| -> PyResult<Py<PyAny>> {
            let entry = dict.get_item(name)?;
            if crate::trust::is_own_descriptor(&entry, base, name) {
                Ok(entry.unbind())
            } else {
                Err(ImportFault::TorchMissing("torch._C.TensorBase's conversion methods").into())
            }
        };
        Ok(Methods {
            detach: get("detach")?,
            to: get("to")?,
            contiguous: get("contiguous")?,
            permute: get("permute")?,
        })
    })
}
