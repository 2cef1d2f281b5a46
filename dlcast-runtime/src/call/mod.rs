//! The per-call driver the macro emits calls to, in two phases:
//!
//! 1. **Python steps** ([`CallContext::prepare`], [`CallContext::peek`]): for every
//!    array argument, in order, every step that may run Python code —
//!    `__dlpack__`, `__dlpack_device__`, the buffer protocol, type lookups,
//!    PyTorch's alias and checks (`import::torch`).
//! 2. **Reads** ([`CallContext::finish`]): for every argument, the raw read
//!    ([`crate::import::read`]), the checks against its [`ParamSpec`]
//!    (device, shape and named extents, dtype, order, writability) and its
//!    entry in the borrow registry ([`crate::borrow`]), with no Python code
//!    from the first read to the body. A read that needs Python code after
//!    all (a conversion, a NumPy array its fields cannot describe, version
//!    counters to bump once every check passed) stops the reads, drops them,
//!    runs that step, and reads every argument again; each such step runs
//!    at most once per argument, so this ends.
//!
//! Then [`CallContext::take`] hands each view its read and its owner (through the
//! [`View`] trait, in the `view` module), and [`CallContext::body`] runs the body.
//! Error messages are formatted only when a check fails.
//!
//! Functions whose array parameters are all required and of one element
//! type each first try the straight-line call of `fast` ([`FastCallContext`]), which
//! takes calls whose every argument is an exact `numpy.ndarray` this
//! driver's fast path would take, without the driver's per-argument state;
//! anything else runs here from the start.
//!
//! Here, the driver ([`CallContext`]); in `checks`, the checks of phase 2
//! ([`CallIdentity`]); in `python_steps`, the Python steps a pass asks for (conversions
//! included); in `release`, when what a call holds is released (the body
//! guard, and `RawTensor`'s `Drop`). What a call refuses, one variant per
//! refusal with its message and exception type, is `CallError` in
//! [`crate::error`].

use crate::convert::Target;
use crate::dtype::DType;
use crate::import::{self, exchange, numpy, ImportError, RawTensor, Source, StreamCx};
use crate::spec::FnSpec;
use crate::stream::{StreamArg, StreamRequest};
use pyo3::prelude::*;
use smallvec::SmallVec;

mod checks;
mod debug;
pub(crate) mod depth;
mod fast;
mod python_steps;
pub(crate) mod release;

use crate::error::{CallError, NoCopy};
use crate::import::numpy::NpRead;
use crate::view::{FastKeep, FastNeeds, ReadSlot, View};
pub use checks::CallIdentity;
use checks::Refusal;
use debug::fast_switch;
#[cfg(debug_assertions)]
use debug::tripwire;
pub use debug::{numpy_fast_path, raw_reads_in_progress};
pub use fast::{FastArg, FastCallContext};

/// The dtype of an argument that decides a dtype-generic function's type
/// parameter, read in phase 1 (it is read again, and checked, in phase 2).
#[doc(hidden)]
pub struct Peeked(DType);

impl Peeked {
    /// The argument's dtype, for the dispatch of a dtype-generic function.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.0
    }
}

/// A named extent's value and the parameter that set it.
#[derive(Clone, Copy)]
struct Binding {
    extent: usize,
    param: u8,
}

/// One array argument of the call.
struct ArgSlot {
    /// The caller's argument; `None` for an absent optional one.
    obj: Option<Py<PyAny>>,
    /// What phase 1 made of it.
    source: Source,
    /// The view type's element type and writability.
    dtype: Option<DType>,
    writable: bool,
    /// The read of the current phase-2 pass; after [`CallContext::take`], what a
    /// borrowing view keeps (see [`ReadSlot`]).
    raw: std::cell::Cell<Option<RawTensor>>,
    /// Whether [`CallContext::take`] ran for this slot.
    taken: std::cell::Cell<bool>,
    /// The converted temporary the source reads, and the shape the
    /// argument had before (a conversion must keep it).
    converted: Option<(Py<PyAny>, SmallVec<[usize; 4]>)>,
    /// A NumPy array sent through `__dlpack__` once already.
    via_dlpack: bool,
    /// Its holds in rust-numpy's registries (an exact `numpy.ndarray`, when
    /// rust-numpy published its own), acquired in phase 1.
    rust_numpy_holds: Option<crate::borrow::rust_numpy::PreHold>,
    /// An exact `numpy.ndarray` left to the fast path (see
    /// [`CallContext::fast_pass`]): what its view type needs; its source stays
    /// empty until the general path takes it back.
    fast: Option<FastNeeds>,
    /// The fast path's read, once it passed every check.
    np: Option<NpRead>,
    /// The fast read's borrow-registry entry (a typed view takes it).
    held: std::cell::Cell<Option<crate::borrow::Borrow>>,
}

impl ArgSlot {
    #[inline(always)]
    const fn absent() -> ArgSlot {
        ArgSlot {
            obj: None,
            source: Source::Empty,
            dtype: None,
            writable: false,
            raw: std::cell::Cell::new(None),
            taken: std::cell::Cell::new(false),
            converted: None,
            via_dlpack: false,
            rust_numpy_holds: None,
            fast: None,
            np: None,
            held: std::cell::Cell::new(None),
        }
    }
}

/// Python code a phase-2 pass asked for (see the module documentation).
enum PythonStep {
    /// Convert the argument (read-only, same kind): its framework makes a
    /// temporary, which is prepared in its place.
    Convert {
        target: Target,
        what: String,
        host: bool,
        ndim: usize,
    },
    /// A NumPy array its fields cannot describe: through `__dlpack__`.
    Dlpack,
    /// An argument dlcast cannot read but NumPy can (a buffer with a
    /// byte-swapped format or strides that are not whole elements): a
    /// NumPy copy, where the parameter converts; else the error.
    ViaNumpy(PyErr),
    /// An exact `numpy.ndarray` whose holds in rust-numpy's registries do
    /// not describe it as read: acquire them again.
    Rehold,
    /// rust-numpy's table is not as phase 1 left it (Python code ran since:
    /// a later argument's phase 1, a conversion): check it again
    /// (`borrow::rust_numpy::check`, which adopts a table rust-numpy published
    /// meanwhile, or refuses NumPy arrays).
    Recheck,
}

/// Why a phase-2 pass stopped.
enum Stop {
    Error(PyErr),
    Step(usize, PythonStep),
}

impl From<PyErr> for Stop {
    fn from(e: PyErr) -> Self {
        Stop::Error(e)
    }
}

/// State of one call of a `#[dlpack_fn]` function with `N` array
/// parameters. Created by the generated code, one per call, on the stack,
/// in place (a fixed array of `N` slots: no copy of unused ones).
#[doc(hidden)]
pub struct CallContext<const N: usize> {
    /// The function and this call's id; the checks and errors are its
    /// methods (reached through `Deref`).
    who: CallIdentity,
    names: SmallVec<[Option<Binding>; 4]>,
    /// The stream GPU inputs are asked for (see [`crate::stream`]); set by
    /// the generated code before the first `prepare`.
    stream: StreamRequest,
    slots: [ArgSlot; N],
    /// PyTorch tensors taken by writable parameters: their version counters
    /// are bumped once every argument has passed its checks.
    /// (A `Vec`: empty, as for every call without such a parameter, it
    /// allocates nothing and drops in a test.)
    bump: Vec<Py<PyAny>>,
    bumped: bool,
    /// Whether [`CallContext::finish`] succeeded: from then on no argument is
    /// prepared again, and views may be taken.
    finished: bool,
    /// Whether a view of this call, dropped in the body, would run a
    /// producer's code (see [`RawTensor::defers_release`]): only then does
    /// the body need a [`BodyGuard`](release::BodyGuard). Set by `finish`.
    defers: bool,
}

impl<const N: usize> std::ops::Deref for CallContext<N> {
    type Target = CallIdentity;
    fn deref(&self) -> &CallIdentity {
        &self.who
    }
}

impl<const N: usize> CallContext<N> {
    /// Starts a call of the function described by `spec`, which has `N`
    /// array parameters. Infallible, so that the context is built where the
    /// generated code keeps it: a `spec` that does not describe `N`
    /// parameters (only code that drives the context by hand can get this
    /// wrong) is refused by every `prepare`, `peek` and `finish`.
    #[inline(always)]
    pub fn new(spec: &'static FnSpec) -> Self {
        CallContext {
            who: CallIdentity {
                spec,
                call: crate::borrow::new_call_id(),
            },
            names: smallvec::smallvec![None; spec.dim_names.len()],
            stream: StreamRequest::Producer,
            slots: std::array::from_fn(|_| ArgSlot::absent()),
            bump: Vec::new(),
            bumped: false,
            finished: false,
            defers: false,
        }
    }

    /// Whether the context may still prepare and read arguments: not after
    /// `finish` succeeded, nor for a spec that does not describe `N`
    /// parameters (every index below `N` then names one of its parameters).
    #[inline(always)]
    fn open(&self) -> bool {
        !self.finished && self.spec.params.len() == N
    }

    /// Sets the stream request of this call, from `#[dlpack_fn(stream =
    /// ...)]`; call before the first `prepare`.
    #[doc(hidden)]
    pub fn set_stream(&mut self, request: StreamRequest) {
        self.stream = request;
    }

    /// Sets the stream request of this call from the value of a `#[stream]`
    /// parameter (`func` and `param` name them in errors); call before the
    /// first `prepare`.
    ///
    /// # Errors
    /// `TypeError` for a negative value other than `-1`.
    #[doc(hidden)]
    pub fn stream_param<V: StreamArg + ?Sized>(
        &mut self,
        func: &str,
        param: &str,
        value: &V,
    ) -> PyResult<()> {
        match value.to_request() {
            Ok(StreamRequest::Producer) => Ok(()),
            Ok(r) => {
                self.stream = r;
                Ok(())
            }
            Err(got) => Err(CallError::StreamHandle {
                func: func.to_owned(),
                param: param.to_owned(),
                got,
            }
            .into()),
        }
    }

    /// Phase 1 for the array argument of parameter `index`, whose view type
    /// is `V`.
    #[inline(always)]
    pub fn prepare<'a, V: View<'a>>(
        &mut self,
        index: usize,
        obj: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if !self.open() {
            return Err(misuse());
        }
        let slot = &mut self.slots[index];
        slot.dtype = V::DTYPE;
        slot.writable = V::WRITABLE;
        if slot.obj.is_some() {
            // Prepared by `peek`.
            return Ok(());
        }
        slot.obj = Some(obj.clone().unbind());
        // The registry is found (or published: Python code, the first time
        // in the process) before any read; after that, an atomic load.
        crate::borrow::api(obj.py())?;
        // An exact `numpy.ndarray` needs no other Python code (rust-numpy's
        // table still in place: a look-up, see `borrow::rust_numpy::check`).
        if numpy::is_ndarray(obj) {
            crate::borrow::rust_numpy::check(obj.py())?;
            // Left to the fast path where the view type has one and views
            // of NumPy arrays are dlcast's registry's alone; phase 1 of the
            // general path for an exact `numpy.ndarray` is the two lines
            // below, run by `fast_pass` itself where it gives up.
            if V::FAST.is_some()
                && fast_switch::on()
                && crate::borrow::rust_numpy::foreign().is_none()
            {
                self.slots[index].fast = V::FAST;
                return Ok(());
            }
            self.slots[index].source = Source::Numpy(obj.clone().unbind());
            return self.pre_hold(index);
        }
        match self.prepare_slot(index, obj, true) {
            Err(e) => self.convert_via_numpy(index, obj, e),
            ok => ok,
        }
    }

    /// As [`CallContext::prepare`] for an `Option<..>` parameter: Python's `None`
    /// is `None`.
    pub fn prepare_opt<'a, V: View<'a>>(
        &mut self,
        index: usize,
        obj: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        match obj {
            Some(o) if !o.is_none() => self.prepare::<V>(index, o),
            _ => Ok(()),
        }
    }

    /// Phase 1 for the argument of the parameter that decides a
    /// dtype-generic function's type parameter, and a first look at its
    /// dtype, on which the generated code dispatches (then calls
    /// [`CallContext::prepare`] for it like for the others).
    pub fn peek(
        &mut self,
        index: usize,
        obj: &Bound<'_, PyAny>,
        writable: bool,
    ) -> PyResult<Peeked> {
        if !self.open() {
            return Err(misuse());
        }
        self.slots[index].obj = Some(obj.clone().unbind());
        self.slots[index].writable = writable;
        self.prepare_slot(index, obj, true)?;
        let py = obj.py();
        #[cfg(Py_GIL_DISABLED)]
        refuse_free_threading(py)?;
        let raw = match import::read(py, &self.slots[index].source) {
            Err(ImportError::NeedsDlpack) => {
                self.prepare_slot(index, obj, false)?;
                import::read(py, &self.slots[index].source)
            }
            r => r,
        };
        let param = &self.spec.params[index];
        let raw = raw.map_err(|e| self.import_error(param, e))?;
        Ok(Peeked(raw.dtype))
    }

    /// The error for a dtype-generic parameter whose dtype is not listed in
    /// its `#[dtype(..)]`.
    #[cold]
    pub fn unlisted_dtype(&self, index: usize, peeked: &Peeked) -> PyErr {
        let Some(param) = self.spec.params.get(index) else {
            return misuse();
        };
        CallError::UnlistedDType {
            func: self.spec.name,
            param: param.name,
            want: param.dtypes,
            got: peeked.0,
        }
        .into()
    }

    /// Phase 1 of slot `index` for `obj` (the argument, or its converted
    /// temporary): the source, and a PyTorch tensor to bump.
    fn prepare_slot(
        &mut self,
        index: usize,
        obj: &Bound<'_, PyAny>,
        numpy_fields: bool,
    ) -> PyResult<()> {
        let py = obj.py();
        // What follows may run Python code that calls dlcast again.
        let _nested = depth::Nested::enter(self.spec.name)?;
        // The registry is found (or published: Python code, once per
        // process) before any read.
        crate::borrow::api(py)?;
        let param = &self.spec.params[index];
        let sx = StreamCx {
            request: self.stream,
            may_need: crate::stream::may_need_stream(param.devices),
        };
        let writable = self.slots[index].writable;
        let prepared = (|| {
            // SAFETY: `obj` is a live object; the check reads only its type.
            let capsule = unsafe { pyo3::ffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0;
            if !(capsule || numpy_fields && numpy::is_ndarray(obj)) {
                let (_, flags) = exchange::type_info(obj);
                if flags.torch_type() {
                    let p = crate::import::torch::prepare(obj, flags, sx, writable)?;
                    return Ok((p.source, p.bump));
                }
            }
            import::prepare(obj, sx, numpy_fields).map(|s| (s, None))
        })();
        let (source, bump) = prepared.map_err(|e| self.import_error(param, e))?;
        let numpy = matches!(source, Source::Numpy(_));
        if numpy {
            crate::borrow::rust_numpy::check(py)?;
        }
        self.slots[index].source = source;
        if numpy {
            self.pre_hold(index)?;
        }
        if let Some(t) = bump {
            if self.bump.try_reserve(1).is_err() {
                return Err(CallError::VersionMemory.into());
            }
            self.bump.push(t);
        }
        Ok(())
    }

    /// Phase 1 for an exact `numpy.ndarray` (not a converted temporary):
    /// its holds in rust-numpy's registries, when rust-numpy published its
    /// own (see `borrow::rust_numpy::PreHold`); earlier holds of the slot are
    /// released first.
    fn pre_hold(&mut self, index: usize) -> PyResult<()> {
        let py = self.py();
        let slot = &mut self.slots[index];
        slot.rust_numpy_holds = None;
        let (Some(foreign), Source::Numpy(array), None) = (
            crate::borrow::rust_numpy::foreign(),
            &slot.source,
            &slot.converted,
        ) else {
            return Ok(());
        };
        let writable = slot.writable;
        match crate::borrow::rust_numpy::pre_hold(foreign, array.bind(py), writable) {
            Ok(held) => {
                self.slots[index].rust_numpy_holds = Some(held);
                Ok(())
            }
            // Not writeable: phase 2 refuses it with dlcast's own message
            // (or, made writable by then, asks for the holds again).
            Err(-2) => Ok(()),
            Err(_) => Err(self.rust_numpy_error(&self.spec.params[index], writable)),
        }
    }

    /// Phase 2: reads and checks every argument, and enters its view in the
    /// borrow registry; see the module documentation. Call after every
    /// `prepare`, before the body.
    pub fn finish(&mut self) -> PyResult<()> {
        if !self.open() {
            return Err(misuse());
        }
        #[cfg(Py_GIL_DISABLED)]
        refuse_free_threading(self.py())?;
        if N == 0 {
            // No array parameter: nothing to read (a constant test).
            self.finished = true;
            return Ok(());
        }
        if self.fast_pass() {
            // Every argument read by the fast path.
            fast_switch::taken();
            self.finished = true;
            return Ok(());
        }
        // Each round runs one step of Python code that a pass asked for; each
        // step happens at most twice per argument (`Dlpack`, then `Convert`)
        // plus one round of version bumps and one of `Recheck` (Python code
        // that keeps changing rust-numpy's table is refused), so the bound
        // is never reached by a call that ends.
        let bound = 2 * self.slots.len() + 3;
        for _ in 0..bound {
            match self.read_pass() {
                Ok(()) if self.bump.is_empty() || self.bumped => {
                    // Each read owns what keeps its memory alive from here,
                    // and its holds in rust-numpy's registries live as long
                    // as its borrow (else until the call ends).
                    for slot in &mut self.slots {
                        if let Some(raw) = slot.raw.get_mut() {
                            raw.set_owner(import::into_owner(&mut slot.source));
                            self.defers |= raw.defers_release();
                            if let (Some(held), Some(borrow)) =
                                (&mut slot.rust_numpy_holds, &raw.borrow)
                            {
                                held.commit(borrow);
                            }
                        }
                    }
                    self.finished = true;
                    return Ok(());
                }
                Ok(()) => {
                    self.clear_reads();
                    self.bumped = true;
                    let py = self.py();
                    crate::import::torch::bump_versions(py, &self.bump)?;
                }
                Err(Stop::Error(e)) => {
                    self.clear_reads();
                    return Err(e);
                }
                Err(Stop::Step(index, work)) => {
                    self.clear_reads();
                    self.work(index, work)?;
                }
            }
        }
        Err(CallError::KeptChanging {
            func: self.spec.name,
        }
        .into())
    }

    /// Phase 2 for calls whose every array argument is an exact
    /// `numpy.ndarray` left to the fast path by `prepare`: each is read
    /// from its fields ([`numpy::read_fast`]), checked against its
    /// parameter's spec and its view type's [`FastNeeds`], and entered in
    /// the borrow registry, with no Python code (and no `RawTensor`,
    /// `Source` or `Owner`: the slot's reference to the array keeps it).
    /// The fast path takes only what the general path takes as it is
    /// (nothing it would convert, refuse or treat specially: see
    /// `read_fast`); on anything else, it drops what it registered, hands
    /// every such argument back to the general path (which stays the one
    /// definition of what is accepted, and of every message) and returns
    /// `false`.
    fn fast_pass(&mut self) -> bool {
        if !self.slots.iter().any(|s| s.fast.is_some()) {
            return false;
        }
        let done = self.fast_reads();
        if !done {
            let py = self.py();
            for slot in &mut self.slots {
                slot.np = None;
                slot.held.set(None);
                if slot.fast.take().is_some() {
                    if let Some(obj) = &slot.obj {
                        slot.source = Source::Numpy(obj.clone_ref(py));
                    }
                }
            }
        }
        done
    }

    /// The reads and checks of [`CallContext::fast_pass`]: `false` at the first
    /// surprise (what was registered stays in the slots, to be dropped).
    #[inline(always)]
    fn fast_reads(&mut self) -> bool {
        let py = self.py();
        #[cfg(debug_assertions)]
        let _reads = tripwire::Reads::enter();
        // Views of NumPy arrays are dlcast's registry's alone (and, once
        // every read passed, rust-numpy's table is still as phase 1 checked
        // it: below).
        if crate::borrow::rust_numpy::foreign().is_some() {
            return false;
        }
        let Ok(api) = crate::borrow::api(py) else {
            return false;
        };
        let who = self.who;
        let names = &mut self.names;
        names.iter_mut().for_each(|n| *n = None);
        for (index, slot) in self.slots.iter_mut().enumerate() {
            let Some(obj) = &slot.obj else {
                continue;
            };
            let (Some(needs), Some(dtype)) = (slot.fast, slot.dtype) else {
                return false;
            };
            let Some((read, borrow)) = fast_read(
                api,
                who,
                names,
                index,
                obj.bind(py),
                needs,
                dtype,
                slot.writable,
            ) else {
                return false;
            };
            slot.held.set(Some(borrow));
            slot.np = Some(read);
        }
        // rust-numpy's table as phase 1 checked it, re-established in phase
        // 2, after the last Python code of the call (a later argument's
        // phase 1 may have deleted it, and a rust-numpy extension published
        // its own). Checked once the reads passed (none runs Python code),
        // so that calls the fast path gives up on do not pay it twice.
        // Else the general path checks again (`PythonStep::Recheck`).
        crate::borrow::rust_numpy::in_place(py)
    }

    /// The `Python` token (`attach` is not used: it may run PyO3's deferred
    /// decrefs, Python code, in the middle of phase 2).
    fn py(&self) -> Python<'static> {
        // SAFETY: the generated code calls the context's methods inside the
        // PyO3 function it wraps, where the GIL is held; the token is used
        // for this call only, never stored.
        unsafe { Python::assume_attached() }
    }

    fn clear_reads(&mut self) {
        for s in &mut self.slots {
            *s.raw.get_mut() = None;
        }
    }

    /// One pass of phase 2 over every argument.
    fn read_pass(&mut self) -> Result<(), Stop> {
        let py = self.py();
        #[cfg(debug_assertions)]
        let _reads = tripwire::Reads::enter();
        // The checks are `who`'s (a copy), so that each read is built and
        // checked in its slot, never moved (see `import::read_into`). A read
        // left in a slot by a pass that stops is dropped by `clear_reads`.
        let who = self.who;
        let names = &mut self.names;
        names.iter_mut().for_each(|n| *n = None);
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.obj.is_none() {
                continue;
            }
            read_slot(py, who, names, index, slot)?;
        }
        // rust-numpy's table, which phase 1 checked for every exact
        // `numpy.ndarray` read from its fields, re-established in phase 2,
        // after the last Python code of the call (no Python code: see
        // `borrow::rust_numpy::in_place`); else back to phase 1, which adopts a
        // table rust-numpy published meanwhile (the next pass then acquires
        // the views there: `PythonStep::Rehold`) or refuses.
        if let Some(index) = self
            .slots
            .iter()
            .position(|s| matches!(s.source, Source::Numpy(_)))
        {
            if !crate::borrow::rust_numpy::in_place(py) {
                return Err(Stop::Step(index, PythonStep::Recheck));
            }
        }
        Ok(())
    }

    /// Hands the view of parameter `index` its read (which owns what keeps
    /// the memory alive). Call after [`CallContext::finish`] succeeded, once per
    /// parameter; the view borrows the context, so it cannot outlive it.
    #[inline(always)]
    pub fn take<'a, V: View<'a>>(&'a self, index: usize) -> PyResult<V> {
        let slot = &self.slots[index];
        if !self.finished || slot.taken.replace(true) {
            return Err(misuse());
        }
        if let (Some(read), Some(obj)) = (&slot.np, &slot.obj) {
            // As below: the view type `prepare` was given.
            if V::WRITABLE != slot.writable || V::DTYPE != Some(read.dtype) {
                return Err(misuse());
            }
            return V::from_fast(
                read,
                FastKeep {
                    obj: obj.bind(self.py()),
                    borrow: &slot.held,
                    spec: self.spec,
                    index,
                },
            );
        }
        match slot.raw.take() {
            // The view type must be the one `prepare` was given: the
            // checks and the registry entry were made for its dtype and
            // writability.
            Some(raw)
                if V::WRITABLE != slot.writable || V::DTYPE.is_some_and(|d| d != raw.dtype) =>
            {
                drop(raw);
                Err(misuse())
            }
            Some(raw) => V::from_raw(
                raw,
                ReadSlot {
                    slot: &slot.raw,
                    spec: self.spec,
                    index,
                    func: self.spec.name,
                    param: self.spec.params[index].name,
                },
            ),
            None => Err(misuse()),
        }
    }

    /// Runs the body `f`: views that drop inside it keep their producer's
    /// memory until it returns (see `BodyGuard`; a closure, so that bodies
    /// nest strictly, whatever the caller does).
    #[inline(always)]
    pub fn body<R>(&self, f: impl FnOnce() -> R) -> R {
        // Without a view whose drop runs a producer's code, a guard would
        // hold back nothing of this call's: the body's views are this call's
        // (views are made by call contexts only, or over Rust data, which
        // releases nothing), and a nested call's own body has its own guard.
        // Inside another call's body (a callback), the guard still starts a
        // frame of its own: otherwise what Python code drops in this body
        // (an export of a third call, say) would wait for the OUTER body to
        // return, not for this one.
        if !self.defers && !release::in_body() {
            return f();
        }
        let _guard = release::BodyGuard::enter();
        f()
    }

    /// As [`CallContext::take`] for an `Option<..>` parameter.
    pub fn take_opt<'a, V: View<'a>>(&'a self, index: usize) -> PyResult<Option<V>> {
        if self.slots[index].obj.is_some() {
            self.take(index).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Phase 2 for the argument of parameter `index` (present): its read, into
/// `slot.raw`, checked against the parameter (named extents bound in
/// `names`) and entered in the borrow registry, or why the pass stops.
/// Runs no Python code and allocates no object the cyclic GC tracks.
#[inline(always)]
fn read_slot(
    py: Python<'_>,
    who: CallIdentity,
    names: &mut [Option<Binding>],
    index: usize,
    slot: &mut ArgSlot,
) -> Result<(), Stop> {
    let param = &who.spec.params[index];
    let (dtype, writable) = (slot.dtype, slot.writable);
    let out = slot.raw.get_mut();
    if let Err(e) = import::read_into(py, &slot.source, out) {
        return Err(read_stop(who, index, slot, e));
    }
    let Some(raw) = out.as_mut() else {
        return Err(Stop::Error(misuse()));
    };
    if let Some((_, shape)) = &slot.converted {
        read_of_converted(who, param, raw, shape)?;
    }
    match who.check(names, index, param, raw, dtype, writable) {
        Ok(()) => {}
        Err(Refusal::Error(e)) => return Err(Stop::Error(e)),
        Err(Refusal::Convert(target, what)) => {
            if slot.converted.is_some() {
                return Err(Stop::Error(
                    CallError::StillMisfits {
                        func: who.spec.name,
                        param: param.name,
                        what,
                        dtype: raw.dtype,
                        strides: raw.strides.to_vec(),
                    }
                    .into(),
                ));
            }
            // The conversion reads the memory: `convert_read` holds
            // it as read in the registry from before the copy
            // starts until it has finished.
            let (host, ndim) = (raw.device.is_host_accessible(), raw.shape.len());
            let shape = SmallVec::from_slice(&raw.shape);
            *out = None;
            slot.converted = Some((py.None(), shape));
            let work = PythonStep::Convert {
                target,
                what,
                host,
                ndim,
            };
            return Err(Stop::Step(index, work));
        }
    }
    who.register(py, param, raw, writable)?;
    // A Rust reference to a `bool` must see 0 or 1: checked in phase
    // 2, once the memory is this call's, before any version counter
    // is bumped.
    if param.aligned && !raw.holds_valid_bools() {
        return Err(Stop::Error(
            CallError::InvalidBool {
                func: who.spec.name,
                param: param.name,
            }
            .into(),
        ));
    }
    // Its holds in rust-numpy's registries, acquired in phase 1, must
    // describe the array as read (no call into them here).
    let registered = raw.borrow.is_some();
    if !rust_numpy_holds_describe(py, slot, registered, writable) {
        return Err(Stop::Step(index, PythonStep::Rehold));
    }
    Ok(())
}

/// Why a pass stops where the read of slot `index` failed with `e`: a
/// NumPy array its fields cannot describe goes through `__dlpack__` (once),
/// a buffer dlcast cannot describe to NumPy (unless it is a conversion's
/// temporary); anything else is the import's error.
#[inline(always)]
fn read_stop(who: CallIdentity, index: usize, slot: &ArgSlot, e: ImportError) -> Stop {
    let param = &who.spec.params[index];
    match e {
        ImportError::NeedsDlpack if !slot.via_dlpack => Stop::Step(index, PythonStep::Dlpack),
        e @ ImportError::Invalid(_)
            if matches!(slot.source, Source::Buffer(_)) && slot.converted.is_none() =>
        {
            let e = who.import_error(param, e);
            Stop::Step(index, PythonStep::ViaNumpy(e))
        }
        e => Stop::Error(who.import_error(param, e)),
    }
}

/// Marks `raw`, the read of a converted temporary, read-only, and checks
/// that the conversion kept the argument's `shape`.
#[inline(always)]
fn read_of_converted(
    who: CallIdentity,
    param: &crate::spec::ParamSpec,
    raw: &mut RawTensor,
    shape: &[usize],
) -> Result<(), Stop> {
    // Writes into the temporary would never reach the caller's
    // array: the view of it is read-only in the body. Returned,
    // it is the caller's new array (see `export_view`).
    raw.converted = Some(raw.read_only);
    raw.read_only = true;
    if raw.shape.as_slice() != shape {
        return Err(Stop::Error(
            CallError::ConvertedShape {
                func: who.spec.name,
                param: param.name,
                got: raw.shape.to_vec(),
                want: shape.to_vec(),
            }
            .into(),
        ));
    }
    Ok(())
}

/// Whether the holds in rust-numpy's registries that phase 1 acquired for
/// `slot` describe the array as read, where they must: an exact
/// `numpy.ndarray` whose read is `registered` in the borrow registry, while
/// rust-numpy publishes its own registries (no call into them here).
#[inline(always)]
fn rust_numpy_holds_describe(
    py: Python<'_>,
    slot: &ArgSlot,
    registered: bool,
    writable: bool,
) -> bool {
    if let (Some(foreign), Source::Numpy(array), None, true) = (
        crate::borrow::rust_numpy::foreign(),
        &slot.source,
        &slot.converted,
        registered,
    ) {
        let array = array.bind(py);
        return slot
            .rust_numpy_holds
            .as_ref()
            .is_some_and(|h| h.matches(array, foreign, writable));
    }
    true
}

/// The fast read of one exact `numpy.ndarray` argument (parameter `index`,
/// view type needs `needs`, element type `dtype`, writable or not), checked
/// against the parameter's spec as `CallIdentity::check` would (each check passed,
/// or the argument left to the general path) and entered in the borrow
/// registry `api`; named extents are bound in `names`. `None` at the first
/// surprise (a conflict included: the general path says which, in its
/// words). Runs no Python code.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn fast_read(
    api: &'static crate::borrow::BorrowApi,
    who: CallIdentity,
    names: &mut [Option<Binding>],
    index: usize,
    obj: &Bound<'_, PyAny>,
    needs: FastNeeds,
    dtype: DType,
    writable: bool,
) -> Option<(NpRead, crate::borrow::Borrow)> {
    let read = match numpy::read_fast(obj, dtype, needs.itemsize) {
        Some(read) => read,
        // A PyTorch tensor, read directly where its layout was learnt (the
        // straight-line call only: `FastCallContext::read` checked its class).
        None => {
            crate::import::torch::direct::layout()?.read(obj, dtype, needs.itemsize, writable)?
        }
    };
    let param = who.spec.params.get(index)?;
    let (shape, strides) = (read.shape(), read.elem_strides());
    let fits = param
        .devices
        .iter()
        .any(|d| d.matches(crate::device::Device::CPU))
        && needs.ndim.is_none_or(|n| n == read.ndim)
        && param.shape.is_none_or(|dims| {
            // Only `_` extents (a slice's spec): the rank decides.
            if dims.len() == shape.len() && dims.iter().all(|d| *d == crate::spec::Dim::Any) {
                return true;
            }
            crate::spec::match_shape(dims, shape, |k, n| match names.get_mut(usize::from(k)) {
                Some(b @ None) => {
                    *b = Some(Binding {
                        extent: n,
                        param: index as u8,
                    });
                    true
                }
                Some(Some(b)) => b.extent == n,
                None => false,
            })
        })
        && if needs.contiguous {
            // One dimension of unit stride (or one element): C- and
            // F-contiguous, so every order accepts it.
            read.ndim == 1 && (strides == [1] || shape == [1])
        } else {
            match param.order {
                crate::spec::Order::Any => true,
                crate::spec::Order::C => crate::layout::is_c_contiguous(shape, strides),
                crate::spec::Order::F => crate::layout::is_f_contiguous(shape, strides),
                crate::spec::Order::Contiguous => {
                    crate::layout::is_c_contiguous(shape, strides)
                        || crate::layout::is_f_contiguous(shape, strides)
                }
            }
        }
        && (!(param.aligned || needs.aligned) || read.data as usize % needs.align == 0)
        && (!writable || !read.read_only && !read.may_self_overlap());
    if !fits {
        return None;
    }
    // `read_fast` checked that `data + hi` does not overflow.
    let base = read.data as usize;
    let req = crate::borrow::request(
        crate::device::Device::CPU,
        base,
        base + read.hi as usize,
        base,
        shape,
        strides,
        needs.itemsize,
        writable,
        who.call,
        who.spec.name,
        param.name,
    );
    let borrow = crate::borrow::acquire_with(api, &req).ok()?;
    Some((read, borrow))
}

/// The call context's methods called out of order (only code that drives
/// `CallContext` by hand can: the generated code calls each once, in order).
#[cold]
fn misuse() -> PyErr {
    CallError::Misuse.into()
}

/// On a free-threaded CPython (3.13t+) running without the GIL, refuses the
/// call: dlcast's checks assume that no other thread runs Python code
/// between an argument's read and the body (the borrow registry has its own
/// lock, but a PyTorch alias or a NumPy array's fields could change under
/// another thread's hands). Runs no Python code once the GIL is known on.
/// `sys._is_gil_enabled` is asked only if it is CPython's own builtin (else
/// the call is refused as if the GIL were off).
#[cfg(Py_GIL_DISABLED)]
fn refuse_free_threading(py: Python<'_>) -> PyResult<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static GIL_ON: AtomicBool = AtomicBool::new(false);
    if GIL_ON.load(Ordering::Relaxed) {
        return Ok(());
    }
    // Asked only of CPython's own builtin (whichever module object holds
    // it): a function put in its place could say "on" while other threads
    // run Python code. Anything else: off.
    let on = py
        .import("sys")
        .and_then(|sys| sys.getattr("_is_gil_enabled"))
        .ok()
        .filter(|f| crate::trust::is_builtin(f, "_is_gil_enabled", crate::trust::python_image()))
        .and_then(|f| f.call0().and_then(|v| v.is_truthy()).ok())
        .unwrap_or(false);
    if on {
        // Once enabled, the GIL stays on for the process.
        GIL_ON.store(true, Ordering::Relaxed);
        return Ok(());
    }
    Err(CallError::FreeThreaded.into())
}
