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
//! tensor object over the same storage, which holds that storage alive, and
//! which no one else has a reference to. Phase 2 checks that it is still
//! private (reference count 1, no weak references: Python code that kept
//! it, say a `__torch_function__` mode that saw it, could change it) and
//! reads it through PyTorch's own exchange table, which runs no Python code.
//! A view of the alias then stays valid whatever Python code does to the
//! caller's tensor during the call, on this thread or another, with one
//! exception that no object reference can prevent: resizing the storage
//! itself (`x.resize_()` to a larger size, `x.untyped_storage().resize_()`),
//! which moves the memory of every tensor on it (the README's safety
//! section).
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
    // Inference tensors track no version: they are not bumped.
    let bump = writable && guard_write(obj)?;
    let alias = obj
        .getattr(intern!(py, "data"))
        .map_err(|e| producer_error("x.data", e, py))?;
    if api.is_some() && !exchange::is_torch_tensor(&alias) {
        return Err(ImportError::Unreadable(format!(
            "x.data gave {}, not a tensor",
            type_name(&alias)
        )));
    }
    refuse_py_dispatch(exchange::type_info(&alias).1)?;
    torch_bit(&alias, TorchBit::Negative)?;
    let bump = bump.then(|| obj.clone().unbind());
    let Some(api) = api else {
        // A PyTorch without the exchange API: the alias's own `__dlpack__`.
        return via_dlpack(alias, None, sx, bump);
    };
    // A look at the alias (no Python code): its device, and whether it is
    // complex (only complex tensors can have the conjugate bit).
    let probe = exchange::read_with(&alias, api)?;
    let (device, complex) = (probe.device, probe.dtype.code == code::COMPLEX);
    drop(probe);
    if complex {
        torch_bit(&alias, TorchBit::Conjugate)?;
    }
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
        None => via_dlpack(alias, Some(device), sx, bump),
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
        torch_bit(&alias, TorchBit::Conjugate)?;
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
        return Err(ImportError::Unreadable(
            "the tensor's type defines __torch_dispatch__, which PyTorch may run (Python code) \
             whenever the tensor's layout is read, so dlcast cannot check that its memory \
             stays put; pass a plain tensor"
                .into(),
        ));
    }
    Ok(())
}

/// Before a writable view: refuse a tensor that requires grad (autograd
/// cannot see the write, PyTorch forbids untracked in-place changes) and an
/// inference tensor outside `torch.inference_mode()` (PyTorch refuses
/// in-place writes to it there). `Ok(false)` for an inference tensor, whose
/// version PyTorch does not track.
fn guard_write(obj: &Bound<'_, PyAny>) -> Result<bool, ImportError> {
    let py = obj.py();
    let asked = |name: &Bound<'_, pyo3::types::PyString>, call: bool| {
        let v = if call {
            obj.call_method0(name)
        } else {
            obj.getattr(name)
        };
        v.and_then(|v| v.is_truthy())
            .map_err(|e| producer_error("a tensor attribute", e, py))
    };
    if asked(intern!(py, "requires_grad"), false)? {
        return Err(ImportError::Param(
            "the tensor requires grad, and autograd cannot see writes through a writable \
             parameter; pass x.detach() to write into its data"
                .into(),
        ));
    }
    if asked(intern!(py, "is_inference"), true)? {
        let in_mode = py
            .import("torch")
            .and_then(|t| t.call_method0("is_inference_mode_enabled"))
            .and_then(|v| v.is_truthy())
            .map_err(|e| producer_error("torch.is_inference_mode_enabled", e, py))?;
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

/// Refuses `obj` if the tensor has `bit` set. A Python method call (about
/// 100 ns of PyTorch's argument parsing), the price of reading PyTorch
/// tensors correctly.
pub(crate) fn torch_bit(obj: &Bound<'_, PyAny>, bit: TorchBit) -> Result<(), ImportError> {
    let py = obj.py();
    let (method, what) = match bit {
        TorchBit::Negative => (intern!(py, "is_neg"), "negative"),
        TorchBit::Conjugate => (intern!(py, "is_conj"), "conjugate"),
    };
    let set = obj
        .call_method0(method)
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
/// (`torch.autograd.graph.increment_version`), so that a graph that saved
/// one for backward raises instead of using changed data. Python code:
/// the call reads every argument again afterwards.
pub(crate) fn bump_versions(py: Python<'_>, tensors: &[Py<PyAny>]) -> PyResult<()> {
    static INCREMENT: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
    let increment = INCREMENT.get_or_try_init(py, || {
        py.import("torch.autograd.graph")?
            .getattr("increment_version")
            .map(Bound::unbind)
    })?;
    for t in tensors {
        increment.call1(py, (t,))?;
    }
    Ok(())
}
