//! The straight-line call: for a function whose array parameters are all
//! required, of one element type each, and read from the producer's own
//! stream (no `#[dtype(..)]` dispatch, no `Option`, no `stream`), the
//! generated code first tries [`FastCallContext::read`]. It takes a call whose every
//! array argument is an exact `numpy.ndarray` the call driver's fast path
//! reads as it is (see [`CallContext`](super::CallContext)'s `fast_pass`), with the
//! same steps in the same order — phase 1 (the registry found, rust-numpy's
//! table found as the last call left it, once per call rather than once
//! per argument), then the
//! reads, checks and registry entries with no Python code — but without the
//! call context's per-argument state (sources, reads, conversions, holds in
//! rust-numpy's registries) that only the general path uses: the arguments
//! stay borrowed from the caller, the reads are plain values. Anything else
//! (any argument or step the fast path would leave to the general path)
//! returns `None` with nothing held, and the generated code runs the
//! general path ([`CallContext`](super::CallContext)) from the start, which stays the
//! one definition of what is accepted and of every message.

use super::{fast_read, fast_switch, misuse, release, Binding, CallIdentity};
use crate::dtype::DType;
use crate::import::numpy::{self, NpRead};
use crate::spec::FnSpec;
use crate::view::{FastKeep, FastNeeds, View};
use pyo3::prelude::*;
use std::cell::Cell;

/// The most named extents a straight-line call binds (more: the general
/// path).
const MAX_NAMES: usize = 8;

/// One array argument of a straight-line call, with what its view type
/// needs ([`FastArg::of`]).
#[doc(hidden)]
pub struct FastArg<'a> {
    obj: &'a Bound<'a, PyAny>,
    needs: Option<FastNeeds>,
    dtype: Option<DType>,
    writable: bool,
}

impl<'a> FastArg<'a> {
    /// The argument `obj` of a parameter of view type `V`.
    #[inline(always)]
    pub fn of<'v, V: View<'v>>(obj: &'a Bound<'a, PyAny>) -> Self {
        FastArg {
            obj,
            needs: V::FAST,
            dtype: V::DTYPE,
            writable: V::WRITABLE,
        }
    }
}

/// A straight-line call whose `N` array arguments were read and registered
/// (see the module documentation): the views borrow it, so it outlives
/// them; dropping it ends the registry entries no view took.
#[doc(hidden)]
pub struct FastCallContext<'a, const N: usize> {
    spec: &'static FnSpec,
    args: [FastArg<'a>; N],
    reads: [Option<NpRead>; N],
    held: [Cell<Option<crate::borrow::Borrow>>; N],
    taken: [Cell<bool>; N],
}

impl<'a, const N: usize> FastCallContext<'a, N> {
    /// Phase 1 and phase 2 of the call of the function described by `spec`
    /// with the array arguments `args`, in order, where the fast path takes
    /// every one of them; `None` otherwise, with nothing held (the general
    /// path then runs the call from the start).
    #[inline(always)]
    pub fn read(spec: &'static FnSpec, args: [FastArg<'a>; N]) -> Option<Self> {
        if N == 0 || spec.params.len() != N || spec.dim_names.len() > MAX_NAMES {
            return None;
        }
        // Phase 1, which for exact `numpy.ndarray` arguments runs Python code
        // only to find the registry or rust-numpy's table the first time (an
        // error: left to the general path, which reports it), and for
        // PyTorch tensors none: their layout is learnt by the general path's
        // phase 1 (`import::torch::direct::learn`), until then they go there.
        // (Whether a tensor's class is read directly is decided at its read.)
        let torch = crate::import::torch::direct::layout().is_some();
        let mut arrays = false;
        for a in &args {
            let array = numpy::is_ndarray(a.obj);
            arrays |= array;
            if a.needs.is_none() || a.dtype.is_none() || !(array || torch) {
                return None;
            }
        }
        if !fast_switch::on() {
            return None;
        }
        let py = args[0].obj.py();
        let api = crate::borrow::api(py).ok()?;
        // rust-numpy's table where phase 1 of an earlier call left it,
        // checked after the last step here that may run Python code (the
        // line above, the first time) and without running any, where the
        // build has version tags (see `borrow::rust_numpy::ready`); otherwise the
        // general path checks it (`borrow::rust_numpy::check`) and reports. And
        // views of NumPy arrays are dlcast's registry's alone.
        // (The general path consults rust-numpy's table for NumPy arrays
        // only, and so does this one.)
        if arrays
            && (!crate::borrow::rust_numpy::ready(py)
                || crate::borrow::rust_numpy::foreign().is_some())
        {
            return None;
        }
        #[cfg(Py_GIL_DISABLED)]
        super::refuse_free_threading(py).ok()?;
        // Phase 2: no Python code from here to the body.
        #[cfg(debug_assertions)]
        let _reads = super::tripwire::Reads::enter();
        let who = CallIdentity {
            spec,
            call: crate::borrow::new_call_id(),
        };
        let mut names = [None::<Binding>; MAX_NAMES];
        let names = &mut names[..spec.dim_names.len()];
        let held: [Cell<Option<crate::borrow::Borrow>>; N] =
            std::array::from_fn(|_| Cell::new(None));
        let mut reads: [Option<NpRead>; N] = std::array::from_fn(|_| None);
        for (index, a) in args.iter().enumerate() {
            let (Some(needs), Some(dtype)) = (a.needs, a.dtype) else {
                return None;
            };
            // A surprise drops what was registered (`held`) on return.
            let (read, borrow) =
                fast_read(api, who, names, index, a.obj, needs, dtype, a.writable)?;
            held[index].set(Some(borrow));
            reads[index] = Some(read);
        }
        // Every argument passed: the version counters of the PyTorch tensors
        // the body may write are bumped, as PyTorch's in-place operations do.
        reads
            .iter()
            .flatten()
            .for_each(crate::import::torch::direct::bump);
        fast_switch::taken();
        Some(FastCallContext {
            spec,
            args,
            reads,
            held,
            taken: std::array::from_fn(|_| Cell::new(false)),
        })
    }

    /// The view of parameter `index`, of the view type `read` was given;
    /// once per parameter; the view borrows the call, so it cannot outlive
    /// it.
    #[inline(always)]
    pub fn take<V: View<'a>>(&'a self, index: usize) -> PyResult<V> {
        let (Some(arg), Some(read), Some(held), Some(taken)) = (
            self.args.get(index),
            self.reads.get(index).and_then(Option::as_ref),
            self.held.get(index),
            self.taken.get(index),
        ) else {
            return Err(misuse());
        };
        // The view type must be the one the read was made for: the checks
        // and the registry entry were made for its dtype and writability.
        if taken.replace(true)
            || V::WRITABLE != arg.writable
            || V::DTYPE != arg.dtype
            || V::FAST != arg.needs
            || V::DTYPE != Some(read.dtype)
        {
            return Err(misuse());
        }
        V::from_fast(
            read,
            FastKeep {
                obj: arg.obj,
                borrow: held,
                spec: self.spec,
                index,
            },
        )
    }

    /// Runs the body `f`, as [`CallContext::body`](super::CallContext::body) does for
    /// a call none of whose views runs a producer's code when dropped.
    #[inline(always)]
    pub fn body<R>(&self, f: impl FnOnce() -> R) -> R {
        if !release::in_body() {
            return f();
        }
        let _guard = release::BodyGuard::enter();
        f()
    }
}

impl FastCallContext<'_, 0> {
    /// The call of a function without array parameters : nothing
    /// to read, no call context; the body runs as in one.
    ///
    /// # Errors
    /// On a free-threaded interpreter running without the GIL, as
    /// [`CallContext::finish`](super::CallContext::finish).
    #[inline(always)]
    pub fn no_arrays(spec: &'static FnSpec) -> PyResult<Self> {
        if !spec.params.is_empty() {
            return Err(misuse());
        }
        #[cfg(Py_GIL_DISABLED)]
        {
            // SAFETY: the generated code calls this inside the PyO3 function
            // it wraps, where the GIL is held.
            let py = unsafe { Python::assume_attached() };
            super::refuse_free_threading(py)?;
        }
        Ok(FastCallContext {
            spec,
            args: [],
            reads: [],
            held: [],
            taken: [],
        })
    }
}
