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
//! handling disabled, so no `__torch_function__` mode or subclass override
//! sees the alias, runs, or answers for PyTorch. Phase 2 checks that the
//! alias is still private all the same (reference count 1, no weak
//! references) and reads it through PyTorch's own exchange table, which
//! runs no Python code.
//! A view of the alias then stays valid whatever Python code does to the
//! caller's tensor during the call, on this thread or another, with one
//! exception that no object reference can prevent: the storage's own
//! memory moved (`x.resize_()` past its capacity,
//! `x.untyped_storage().resize_()`, `x.share_memory_()`), which moves the
//! memory of every tensor on it (the README's safety section).
//!
//! The values: a tensor with its negative or conjugate bit set holds the
//! raw memory of a lazily negated / conjugated tensor, which reads wrong;
//! both bits are asked of the alias (Python method calls) and such tensors
//! refused. Writable parameters refuse tensors that require grad (autograd
//! cannot see the writes) and inference tensors outside
//! `torch.inference_mode()` (PyTorch forbids in-place writes to them), and
//! bump the caller's tensor's version counter once every check passed.

use crate::device::kind;
use crate::dtype::code;
use crate::import::{
    capsule, exchange, exchange::TypeFlags, producer_error, type_name, ImportError, ImportPath,
    Source, StreamCx,
};
use crate::stream::{self, StreamKind, StreamRequest};
use pyo3::intern;
use pyo3::prelude::*;

/// PyTorch's own C-level attributes, looked up once: `TensorBase`'s `data`
/// and `requires_grad` getters, `is_neg`, `is_conj`, `is_inference`
/// (`TensorBase` is a C type, so these cannot be replaced from Python), and
/// the `DisableTorchFunction` context: under it, neither a
/// `__torch_function__` mode nor a subclass override sees dlcast's calls, so
/// they run no Python code and cannot be lied to.
struct Handles {
    data: Py<PyAny>,
    requires_grad: Py<PyAny>,
    is_neg: Py<PyAny>,
    is_conj: Py<PyAny>,
    is_inference: Py<PyAny>,
    is_inference_mode_enabled: Py<PyAny>,
    increment_version: Py<PyAny>,
    disable: Py<PyAny>,
    disable_dispatch: Py<PyAny>,
    dispatch_keys: Py<PyAny>,
    python_key: Py<PyAny>,
}

fn handles(py: Python<'_>) -> Result<&'static Handles, ImportError> {
    static HANDLES: pyo3::sync::PyOnceLock<Handles> = pyo3::sync::PyOnceLock::new();
    HANDLES
        .get_or_try_init(py, || -> PyResult<Handles> {
            let c = py.import("torch")?.getattr("_C")?;
            let base = c.getattr("TensorBase")?;
            let dict = base.getattr("__dict__")?;
            let get = |name: &str| -> PyResult<Py<PyAny>> { Ok(dict.get_item(name)?.unbind()) };
            Ok(Handles {
                data: get("data")?,
                requires_grad: get("requires_grad")?,
                is_neg: base.getattr("is_neg")?.unbind(),
                is_conj: base.getattr("is_conj")?.unbind(),
                is_inference: base.getattr("is_inference")?.unbind(),
                is_inference_mode_enabled: py
                    .import("torch")?
                    .getattr("is_inference_mode_enabled")?
                    .unbind(),
                increment_version: c.getattr("_increment_version")?.unbind(),
                disable: c.getattr("DisableTorchFunction")?.unbind(),
                disable_dispatch: c.getattr("_DisableTorchDispatch")?.unbind(),
                dispatch_keys: c.getattr("_dispatch_keys")?.unbind(),
                python_key: c.getattr("DispatchKey")?.getattr("Python")?.unbind(),
            })
        })
        .map_err(|e| producer_error("PyTorch's C API (torch._C)", e, py))
}

/// `torch._C.DisableTorchFunction()` and `torch._C._DisableTorchDispatch()`
/// entered (no `__torch_function__` and no `__torch_dispatch__`, of modes or
/// subclasses, runs inside); exited, in reverse order, on drop.
struct NoTorchFunction<'py>(Bound<'py, PyAny>, Option<Bound<'py, PyAny>>);

impl<'py> NoTorchFunction<'py> {
    fn enter(py: Python<'py>, h: &Handles) -> Result<Self, ImportError> {
        let enter = |ctx: &Py<PyAny>| {
            ctx.bind(py)
                .call0()
                .and_then(|c| c.call_method0(intern!(py, "__enter__")).map(|_| c))
                .map_err(|e| producer_error("torch._C.DisableTorchFunction", e, py))
        };
        let mut region = NoTorchFunction(enter(&h.disable)?, None);
        region.1 = Some(enter(&h.disable_dispatch)?);
        Ok(region)
    }
}

impl Drop for NoTorchFunction<'_> {
    fn drop(&mut self) {
        let py = self.0.py();
        let none = || (py.None(), py.None(), py.None());
        // Restore the states saved by `__enter__`; cannot fail in PyTorch.
        if let Some(d) = self.1.take() {
            let _ = d.call_method1(intern!(py, "__exit__"), none());
        }
        let _ = self.0.call_method1(intern!(py, "__exit__"), none());
    }
}

/// Whether `requires_grad` is set on `obj` (`TensorBase`'s own getter: a
/// subclass's property is not asked), for an export of a view of it.
pub(crate) fn requires_grad(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = obj.py();
    let h = handles(py)
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("torch._C.TensorBase is missing"))?;
    let _off = NoTorchFunction::enter(py, h)
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("torch._C is missing"))?;
    h.requires_grad
        .bind(py)
        .call_method1(intern!(py, "__get__"), (obj,))?
        .is_truthy()
}

/// What phase 1 made of a PyTorch tensor.
pub(crate) struct Prepared {
    pub(crate) source: Source,
    /// The caller's tensor, when a writable parameter took it: its version
    /// counter is bumped once every argument passed its checks.
    pub(crate) bump: Option<Py<PyAny>>,
}

/// Phase 1 for a tensor (any object whose type comes from the `torch`
/// package): the checks that need Python code, then the private alias,
/// which phase 2 reads (see the module documentation).
pub(crate) fn prepare(
    obj: &Bound<'_, PyAny>,
    flags: TypeFlags,
    sx: StreamCx,
    writable: bool,
) -> Result<Prepared, ImportError> {
    let py = obj.py();
    refuse_py_dispatch(flags)?;
    let api = exchange::torch_table(py);
    let h = handles(py)?;
    let off = NoTorchFunction::enter(py, h)?;
    // The tensor's own dispatch keys decide whether PyTorch runs Python
    // code for it (a class can hide its `__torch_dispatch__` from the type
    // check above): such tensors are refused.
    let python_key = h
        .dispatch_keys
        .bind(py)
        .call1((obj,))
        .and_then(|k| k.call_method1(intern!(py, "has"), (&h.python_key,)))
        .and_then(|v| v.is_truthy())
        .map_err(|e| producer_error("torch._C._dispatch_keys", e, py))?;
    if python_key {
        return Err(py_dispatch_refusal());
    }
    // Inference tensors track no version: they are not bumped.
    let bump = writable && guard_write(obj, h)?;
    // `TensorBase.data`'s getter itself: a subclass's `data` property is
    // not asked, and the alias is a plain `torch.Tensor`.
    let alias = h
        .data
        .bind(py)
        .call_method1(intern!(py, "__get__"), (obj,))
        .map_err(|e| producer_error("x.data", e, py))?;
    if api.is_some() && !exchange::is_exactly_torch_tensor(&alias) {
        return Err(ImportError::Unreadable(format!(
            "x.data gave {}, not a plain tensor",
            type_name(&alias)
        )));
    }
    torch_bit(&alias, TorchBit::Negative, h)?;
    let bump = bump.then(|| obj.clone().unbind());
    let Some(api) = api else {
        // A PyTorch without the exchange API: the alias's own `__dlpack__`.
        drop(off);
        return via_dlpack(alias, None, sx, bump, h);
    };
    // A look at the alias (no Python code): its device, and whether it is
    // complex (only complex tensors can have the conjugate bit).
    let probe = exchange::read_with(&alias, api)?;
    let (device, complex) = (probe.device, probe.dtype.code == code::COMPLEX);
    drop(probe);
    if complex {
        torch_bit(&alias, TorchBit::Conjugate, h)?;
    }
    drop(off);
    // CUDA/ROCm memory is taken as it is on the producer's current work
    // stream (no synchronisation, see `crate::stream`), unless the function
    // names a stream: then, and for other devices but the CPU, the alias's
    // `__dlpack__` synchronises with it.
    let stream = match stream::stream_kind(device.device_type) {
        StreamKind::None if device.device_type == kind::CPU => Some(None),
        StreamKind::None => None,
        _ if sx.request != StreamRequest::Producer => None,
        _ => match exchange::current_stream(py, api, device)? {
            Some(h) => {
                Some(stream::resolve(device, sx.request, Some(h)).map_err(ImportError::Stream)?)
            }
            None => None,
        },
    };
    match stream {
        Some(stream) => Ok(Prepared {
            source: Source::Torch {
                tensor: alias.unbind(),
                api,
                original: obj.clone().unbind(),
                stream,
            },
            bump,
        }),
        None => via_dlpack(alias, Some(device), sx, bump, h),
    }
}

/// The alias through its `__dlpack__` (device memory that needs a stream
/// handed over, or a PyTorch without the exchange API): a capsule that
/// holds the alias's tensor, read in phase 2 while the alias stays private.
fn via_dlpack(
    alias: Bound<'_, PyAny>,
    device: Option<crate::device::Device>,
    sx: StreamCx,
    bump: Option<Py<PyAny>>,
    h: &Handles,
) -> Result<Prepared, ImportError> {
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
    if capsule::read(&owner, ImportPath::Dlpack).is_ok_and(|r| r.dtype.code == code::COMPLEX) {
        let _off = NoTorchFunction::enter(alias.py(), h)?;
        torch_bit(&alias, TorchBit::Conjugate, h)?;
    }
    Ok(Prepared {
        source: Source::Managed {
            owner,
            path: ImportPath::Dlpack,
            stream,
            immutable: false,
            said: device,
            private: Some(alias.unbind()),
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

/// Before a writable view: refuse a tensor that requires grad (autograd
/// cannot see the write, PyTorch forbids untracked in-place changes) and an
/// inference tensor outside `torch.inference_mode()` (PyTorch refuses
/// in-place writes to it there). `Ok(false)` for an inference tensor, whose
/// version PyTorch does not track.
fn guard_write(obj: &Bound<'_, PyAny>, h: &Handles) -> Result<bool, ImportError> {
    let py = obj.py();
    let truthy = |v: PyResult<Bound<'_, PyAny>>, what: &'static str| {
        v.and_then(|v| v.is_truthy())
            .map_err(|e| producer_error(what, e, py))
    };
    let grad = h
        .requires_grad
        .bind(py)
        .call_method1(intern!(py, "__get__"), (obj,));
    if truthy(grad, "x.requires_grad")? {
        return Err(ImportError::Param(
            "the tensor requires grad, and autograd cannot see writes through a writable \
             parameter; pass x.detach() to write into its data"
                .into(),
        ));
    }
    if truthy(h.is_inference.bind(py).call1((obj,)), "x.is_inference")? {
        let in_mode = truthy(
            h.is_inference_mode_enabled.bind(py).call0(),
            "torch.is_inference_mode_enabled",
        )?;
        if !in_mode {
            return Err(ImportError::Param(
                "the tensor is an inference tensor, which PyTorch lets no one write in place \
                 outside torch.inference_mode(); call this function inside \
                 torch.inference_mode(), or pass x.clone()"
                    .into(),
            ));
        }
        return Ok(false);
    }
    Ok(true)
}

/// The lazy bits PyTorch keeps on a tensor: its memory does not hold its
/// values. The exchange API hands out the raw memory, and so does
/// `__dlpack__` for the negative bit (it refuses only the conjugate bit).
#[derive(Clone, Copy)]
pub(crate) enum TorchBit {
    /// `is_neg()`: any dtype (`z.conj().imag`).
    Negative,
    /// `is_conj()`: complex tensors only.
    Conjugate,
}

/// Refuses `obj` if the tensor has `bit` set: `TensorBase`'s own method
/// (about 100 ns of PyTorch's argument parsing), the price of reading
/// PyTorch tensors correctly.
fn torch_bit(obj: &Bound<'_, PyAny>, bit: TorchBit, h: &Handles) -> Result<(), ImportError> {
    let py = obj.py();
    let (method, what) = match bit {
        TorchBit::Negative => (&h.is_neg, "negative"),
        TorchBit::Conjugate => (&h.is_conj, "conjugate"),
    };
    let set = method
        .bind(py)
        .call1((obj,))
        .and_then(|v| v.is_truthy())
        .map_err(|e| producer_error("is_conj/is_neg", e, py))?;
    if set {
        return Err(ImportError::Unreadable(format!(
            "the tensor has its {what} bit set (PyTorch's lazy {what}), so its memory \
             does not hold its values; pass x.resolve_conj().resolve_neg()"
        )));
    }
    Ok(())
}

/// Bumps the version counter of each tensor a writable parameter took
/// (`torch._C._increment_version`, what
/// `torch.autograd.graph.increment_version` calls), so that a graph that
/// saved one for backward raises instead of using changed data. It
/// allocates a tuple (which can start the cyclic GC, and so finalizers):
/// the call reads every argument again afterwards.
pub(crate) fn bump_versions(py: Python<'_>, tensors: &[Py<PyAny>]) -> PyResult<()> {
    let h = handles(py).map_err(|_| {
        pyo3::exceptions::PyRuntimeError::new_err("torch._C._increment_version is missing")
    })?;
    let tensors = pyo3::types::PyTuple::new(py, tensors)?;
    h.increment_version.bind(py).call1((tensors,))?;
    Ok(())
}
