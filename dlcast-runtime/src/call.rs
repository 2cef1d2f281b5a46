//! The per-call driver the macro emits calls to, in two phases:
//!
//! 1. **Python steps** ([`CallCx::prepare`], [`CallCx::peek`]): for every
//!    array argument, in order, every step that may run Python code —
//!    `__dlpack__`, `__dlpack_device__`, the buffer protocol, type lookups,
//!    PyTorch's alias and checks (the `torch` module).
//! 2. **Reads** ([`CallCx::finish`]): for every argument, the raw read
//!    ([`crate::import::read`]), the checks against its [`ParamSpec`]
//!    (device, shape and named extents, dtype, order, writability) and its
//!    entry in the borrow registry ([`crate::borrow`]), with no Python code
//!    from the first read to the body. A read that needs Python code after
//!    all (a conversion, a NumPy array its fields cannot describe, version
//!    counters to bump once every check passed) stops the reads, drops them,
//!    runs that step, and reads every argument again; each such step runs
//!    at most once per argument, so this ends.
//!
//! Then [`CallCx::take`] hands each view its read and its owner. Error
//! messages are formatted only when a check fails.

use crate::convert::{self, ConvertError, Target};
use crate::device::Device;
use crate::dtype::DType;
use crate::import::{self, exchange, numpy, ImportError, RawTensor, Source, StreamCx};
use crate::layout;
use crate::spec::{match_shape, FnSpec, Order, ParamSpec, ShapeDisplay, TupleDisplay};
use crate::stream::{StreamArg, StreamRequest};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use smallvec::SmallVec;

/// What the call context needs to know of a parameter's view type.
/// Implemented by the view types only (in the `view` module), each for its own
/// lifetime `'a`: the call context can then only make a view that borrows
/// the Python argument, never one that outlives it (`TensorRef<'static, _>`
/// does not implement `View<'a>` for a shorter `'a`).
#[doc(hidden)]
pub trait View<'a>: Sized {
    /// The element type, or `None` for the untyped views.
    const DTYPE: Option<DType>;
    /// Whether the view writes.
    const WRITABLE: bool;
    /// The number of dimensions the view type fixes (`TensorRef<'_, T, 2>`,
    /// `ArrayView2`, `&[T]`), or `None` for any.
    const NDIM: Option<usize>;
    /// Makes the view of `raw`, a read that passed every check of the
    /// parameter's [`ParamSpec`]. A view that owns its read keeps `raw`; one
    /// that borrows it (a slice, an `ndarray` view) hands it to `keep`,
    /// which holds it in the call context for `'a`.
    ///
    /// # Errors
    /// What the type needs that the read does not give (a rank, values a
    /// `bool` may hold), named by `keep`.
    #[doc(hidden)]
    fn from_raw(raw: RawTensor, keep: Keep<'a>) -> PyResult<Self>;
}

/// Where a view that borrows its read (a slice, an `ndarray` view) leaves
/// it: the call context's slot, which the view's lifetime `'a` borrows, so
/// the read (its owner, its borrow-registry entry) outlives the view.
#[doc(hidden)]
pub struct Keep<'a> {
    slot: &'a std::cell::Cell<Option<RawTensor>>,
    /// The function and the parameter (`spec.params[index]`), for errors.
    pub(crate) spec: &'static FnSpec,
    pub(crate) index: usize,
    pub(crate) func: &'static str,
    pub(crate) param: &'static str,
}

impl Keep<'_> {
    /// Holds `raw` until the call context drops.
    pub(crate) fn hold(self, raw: RawTensor) {
        self.slot.set(Some(raw));
    }

    /// A `TypeError` naming the function and the parameter.
    #[cold]
    pub(crate) fn error(&self, msg: std::fmt::Arguments<'_>) -> PyErr {
        PyTypeError::new_err(format!("{}(): argument '{}': {msg}", self.func, self.param))
    }
}

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

impl<const N: usize> Drop for CallCx<N> {
    fn drop(&mut self) {
        // The reads kept here (slices, ndarray views) and every owner not
        // handed to a view are released now, not at the end of an enclosing
        // call's body (see `import::undeferred`). Only reads whose release
        // runs a producer's code are ever held back: without one, the slots
        // drop as they are.
        let defers = self.slots.iter_mut().any(|s| {
            s.raw
                .get_mut()
                .as_ref()
                .is_some_and(RawTensor::defers_release)
        });
        if defers {
            import::undeferred(|| {
                for slot in &mut self.slots {
                    *slot = Slot::absent();
                }
            });
        }
    }
}

/// Why a check refused an argument.
enum Refusal {
    /// The argument does not fit and cannot be converted.
    Error(PyErr),
    /// The argument fits but for its dtype or order (described by the
    /// text), and may be converted.
    Convert(Target, String),
}

impl From<PyErr> for Refusal {
    fn from(e: PyErr) -> Self {
        Refusal::Error(e)
    }
}

/// A named extent's value and the parameter that set it.
#[derive(Clone, Copy)]
struct Binding {
    extent: usize,
    param: u8,
}

/// One array argument of the call.
struct Slot {
    /// The caller's argument; `None` for an absent optional one.
    obj: Option<Py<PyAny>>,
    /// What phase 1 made of it.
    source: Source,
    /// The view type's element type and writability.
    dtype: Option<DType>,
    writable: bool,
    /// The read of the current phase-2 pass; after [`CallCx::take`], what a
    /// borrowing view keeps (see [`Keep`]).
    raw: std::cell::Cell<Option<RawTensor>>,
    /// Whether [`CallCx::take`] ran for this slot.
    taken: std::cell::Cell<bool>,
    /// The converted temporary the source reads, and the shape the
    /// argument had before (a conversion must keep it).
    converted: Option<(Py<PyAny>, SmallVec<[usize; 4]>)>,
    /// A NumPy array sent through `__dlpack__` once already.
    via_dlpack: bool,
}

impl Slot {
    #[inline(always)]
    const fn absent() -> Slot {
        Slot {
            obj: None,
            source: Source::Empty,
            dtype: None,
            writable: false,
            raw: std::cell::Cell::new(None),
            taken: std::cell::Cell::new(false),
            converted: None,
            via_dlpack: false,
        }
    }
}

/// Python code a phase-2 pass asked for (see the module documentation).
enum Work {
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
}

/// Why a phase-2 pass stopped.
enum Stop {
    Error(PyErr),
    Work(usize, Work),
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
pub struct CallCx<const N: usize> {
    /// The function and this call's id; the checks and errors are its
    /// methods (reached through `Deref`).
    who: Who,
    names: SmallVec<[Option<Binding>; 4]>,
    /// The stream GPU inputs are asked for (see [`crate::stream`]); set by
    /// the generated code before the first `prepare`.
    stream: StreamRequest,
    slots: [Slot; N],
    /// PyTorch tensors taken by writable parameters: their version counters
    /// are bumped once every argument has passed its checks.
    /// (A `Vec`: empty, as for every call without such a parameter, it
    /// allocates nothing and drops in a test.)
    bump: Vec<Py<PyAny>>,
    bumped: bool,
    /// Whether [`CallCx::finish`] succeeded: from then on no argument is
    /// prepared again, and views may be taken.
    finished: bool,
    /// Whether a view of this call, dropped in the body, would run a
    /// producer's code (see [`RawTensor::defers_release`]): only then does
    /// the body need a [`import::BodyGuard`]. Set by `finish`.
    defers: bool,
}

impl<const N: usize> std::ops::Deref for CallCx<N> {
    type Target = Who;
    fn deref(&self) -> &Who {
        &self.who
    }
}

impl<const N: usize> CallCx<N> {
    /// Starts a call of the function described by `spec`, which has `N`
    /// array parameters. Infallible, so that the context is built where the
    /// generated code keeps it: a `spec` that does not describe `N`
    /// parameters (only code that drives the context by hand can get this
    /// wrong) is refused by every `prepare`, `peek` and `finish`.
    #[inline(always)]
    pub fn new(spec: &'static FnSpec) -> Self {
        CallCx {
            who: Who {
                spec,
                call: crate::borrow::new_call_id(),
            },
            names: smallvec::smallvec![None; spec.dim_names.len()],
            stream: StreamRequest::Producer,
            slots: std::array::from_fn(|_| Slot::absent()),
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
            Err(v) => Err(PyTypeError::new_err(format!(
                "{func}(): argument '{param}': expected a stream handle (an integer >= 0, \
                 or -1 for no synchronisation), got {v}"
            ))),
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
        // table still in place: a look-up, see `borrow::rnp::check`).
        if numpy::is_ndarray(obj) {
            crate::borrow::rnp::check(obj.py())?;
            self.slots[index].source = Source::Numpy(obj.clone().unbind());
            return Ok(());
        }
        match self.prepare_slot(index, obj, true) {
            Err(e) => self.convert_via_numpy(index, obj, e),
            ok => ok,
        }
    }

    /// As [`CallCx::prepare`] for an `Option<..>` parameter: Python's `None`
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
    /// [`CallCx::prepare`] for it like for the others).
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
        let raw = raw.map_err(|e| self.import_error(py, param, e))?;
        Ok(Peeked(raw.dtype))
    }

    /// The error for a dtype-generic parameter whose dtype is not listed in
    /// its `#[dtype(..)]`.
    #[cold]
    pub fn unlisted_dtype(&self, index: usize, peeked: &Peeked) -> PyErr {
        let Some(param) = self.spec.params.get(index) else {
            return misuse();
        };
        let mut names: Vec<String> = param.dtypes.iter().map(|d| d.to_string()).collect();
        let last = names.pop().unwrap_or_default();
        let listed = if names.is_empty() {
            last
        } else {
            format!("{} or {last}", names.join(", "))
        };
        self.fail(
            param,
            format_args!("expected dtype {listed}, got {}", peeked.0),
        )
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
        let (source, bump) = prepared.map_err(|e| self.import_error(py, param, e))?;
        if matches!(source, Source::Numpy(_)) {
            crate::borrow::rnp::check(py)?;
        }
        self.slots[index].source = source;
        if let Some(t) = bump {
            if self.bump.try_reserve(1).is_err() {
                return Err(pyo3::exceptions::PyMemoryError::new_err(
                    "dlcast: no memory for the call's version counters",
                ));
            }
            self.bump.push(t);
        }
        Ok(())
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
        // Each round runs one step of Python code that a pass asked for; each
        // step happens at most twice per argument (`Dlpack`, then `Convert`)
        // plus one round of version bumps, so the bound is never reached
        // by a call that ends.
        let bound = 2 * self.slots.len() + 2;
        for _ in 0..bound {
            match self.read_pass() {
                Ok(()) if self.bump.is_empty() || self.bumped => {
                    // Each read owns what keeps its memory alive from here.
                    for slot in &mut self.slots {
                        if let Some(raw) = slot.raw.get_mut() {
                            raw.set_owner(import::into_owner(&mut slot.source));
                            self.defers |= raw.defers_release();
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
                Err(Stop::Work(index, work)) => {
                    self.clear_reads();
                    self.work(index, work)?;
                }
            }
        }
        Err(PyBufferError::new_err(format!(
            "{}(): the arguments kept changing while they were read",
            self.spec.name
        )))
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
            let param = &who.spec.params[index];
            let (dtype, writable) = (slot.dtype, slot.writable);
            let out = slot.raw.get_mut();
            match import::read_into(py, &slot.source, out) {
                Ok(()) => {}
                Err(ImportError::NeedsDlpack) if !slot.via_dlpack => {
                    return Err(Stop::Work(index, Work::Dlpack))
                }
                Err(e @ ImportError::Invalid(_))
                    if matches!(slot.source, Source::Buffer(_)) && slot.converted.is_none() =>
                {
                    let e = who.import_error(py, param, e);
                    return Err(Stop::Work(index, Work::ViaNumpy(e)));
                }
                Err(e) => return Err(Stop::Error(who.import_error(py, param, e))),
            }
            let Some(raw) = out.as_mut() else {
                return Err(Stop::Error(misuse()));
            };
            if let Some((_, shape)) = &slot.converted {
                // Writes into the temporary would never reach the caller's
                // array: the view of it is read-only in the body. Returned,
                // it is the caller's new array (see `export_view`).
                raw.converted = Some(raw.read_only);
                raw.read_only = true;
                if raw.shape.as_slice() != shape.as_slice() {
                    return Err(Stop::Error(who.fail(
                        param,
                        format_args!(
                            "converting it gave shape {}, not {}",
                            TupleDisplay(&raw.shape),
                            TupleDisplay(shape)
                        ),
                    )));
                }
            }
            match who.check(names, index, param, raw, dtype, writable) {
                Ok(()) => {}
                Err(Refusal::Error(e)) => return Err(Stop::Error(e)),
                Err(Refusal::Convert(target, what)) => {
                    if slot.converted.is_some() {
                        return Err(Stop::Error(who.fail(
                            param,
                            format_args!(
                                "{what}; its converted copy has dtype {} with strides {}, \
                                 which still does not fit",
                                raw.dtype,
                                TupleDisplay(&raw.strides)
                            ),
                        )));
                    }
                    // The conversion reads the memory: not while a writable
                    // view of another call holds it.
                    if let Some(req) = who.view_request(param, raw, false) {
                        who.probe(param, &req)?;
                    }
                    let (host, ndim) = (raw.device.is_host_accessible(), raw.shape.len());
                    let shape = SmallVec::from_slice(&raw.shape);
                    *out = None;
                    slot.converted = Some((py.None(), shape));
                    let work = Work::Convert {
                        target,
                        what,
                        host,
                        ndim,
                    };
                    return Err(Stop::Work(index, work));
                }
            }
            who.register(py, param, raw, writable)?;
            // A Rust reference to a `bool` must see 0 or 1: checked in phase
            // 2, once the memory is this call's, before any version counter
            // is bumped.
            if param.aligned && !raw.holds_valid_bools() {
                return Err(Stop::Error(pyo3::exceptions::PyValueError::new_err(
                    format!(
                        "{}(): argument '{}': the array holds bytes that are not valid bool \
                     values (a bool must be 0 or 1)",
                        who.spec.name, param.name
                    ),
                )));
            }
            if let Some(shared) = crate::borrow::rnp::foreign() {
                let source = (&slot.source, slot.converted.is_some());
                who.hold_rust_numpy(shared, index, source, raw, writable)?;
            }
        }
        Ok(())
    }

    /// Runs the Python step a pass asked for, for slot `index`.
    #[cold]
    #[inline(never)]
    fn work(&mut self, index: usize, work: Work) -> PyResult<()> {
        let py = self.py();
        let Some(obj) = self.slots[index].obj.as_ref().map(|o| o.clone_ref(py)) else {
            return Ok(());
        };
        let obj = obj.bind(py);
        match work {
            Work::Dlpack => {
                self.slots[index].via_dlpack = true;
                match self.prepare_slot(index, obj, false) {
                    Err(e) => self.convert_via_numpy(index, obj, e),
                    ok => ok,
                }
            }
            Work::ViaNumpy(e) => self.convert_via_numpy(index, obj, e),
            Work::Convert {
                target,
                what,
                host,
                ndim,
            } => {
                // A PyTorch tensor converts from the alias that was read (the
                // caller's tensor may have changed since).
                let read = match &self.slots[index].source {
                    Source::Torch { tensor, .. }
                    | Source::Managed {
                        private: Some(tensor),
                        ..
                    } => tensor.clone_ref(py).into_bound(py),
                    _ => obj.clone(),
                };
                let tmp = self.convert(index, &read, host, ndim, target, &what)?;
                self.prepare_slot(index, &tmp, true).map_err(|e| {
                    let err = self.fail(
                        &self.spec.params[index],
                        format_args!("{what}, and its converted copy could not be read: {e}"),
                    );
                    err.set_cause(py, Some(e));
                    err
                })?;
                if let Some((keep, _)) = &mut self.slots[index].converted {
                    *keep = tmp.unbind();
                }
                Ok(())
            }
        }
    }

    /// An argument that dlcast's imports refused (`refused`) but NumPy reads:
    /// a NumPy array (or subclass) that DLPack cannot describe (byte-swapped,
    /// strides that are not whole elements), a buffer with such a format or
    /// strides. For a typed read-only parameter that converts, a native,
    /// aligned NumPy copy in the parameter's order; otherwise the refusal
    /// stands.
    #[cold]
    fn convert_via_numpy(
        &mut self,
        index: usize,
        obj: &Bound<'_, PyAny>,
        refused: PyErr,
    ) -> PyResult<()> {
        let py = obj.py();
        let (slot, param) = (&self.slots[index], &self.spec.params[index]);
        let Some(dtype) = slot.dtype else {
            return Err(refused);
        };
        if slot.writable || !param.convert || slot.converted.is_some() {
            return Err(refused);
        }
        // Only what NumPy reads without running other producers' code: its
        // own arrays (subclasses included) and buffer-protocol objects.
        let ndarray_like = py
            .import(pyo3::intern!(py, "numpy"))
            .and_then(|np| np.getattr(pyo3::intern!(py, "ndarray")))
            .is_ok_and(|t| obj.is_instance(&t).unwrap_or(false));
        // (A memoryview, made and dropped: every abi3 level has it.)
        let buffer = !ndarray_like && pyo3::types::PyMemoryView::from(obj).is_ok();
        // SAFETY: `obj` is a live object; the check reads only its type.
        let capsule = unsafe { pyo3::ffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0;
        if capsule || !(ndarray_like || buffer) {
            return Err(refused);
        }
        let Ok(obj) = py
            .import(pyo3::intern!(py, "numpy"))
            .and_then(|np| np.call_method1(pyo3::intern!(py, "asarray"), (obj,)))
        else {
            return Err(refused);
        };
        let obj = &obj;
        let shape: SmallVec<[usize; 4]> = match obj.getattr(pyo3::intern!(py, "shape")) {
            Ok(s) => s.extract::<Vec<usize>>()?.into_iter().collect(),
            Err(_) => return Err(refused),
        };
        // The same-kind rule of every conversion, in NumPy's words.
        let (np, name) = (
            py.import(pyo3::intern!(py, "numpy"))?,
            dtype.name().unwrap_or("?"),
        );
        let from = obj.getattr(pyo3::intern!(py, "dtype"))?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("casting", "same_kind")?;
        let castable = np
            .call_method("can_cast", (&from, name), Some(&kwargs))
            .and_then(|v| v.is_truthy())
            .unwrap_or(false);
        if !castable {
            return Err(self.fail(
                param,
                format_args!(
                    "expected dtype {dtype}, got {from} (which dlcast cannot read in place), and \
                     it does not convert to {dtype} implicitly (only same-kind casts do)"
                ),
            ));
        }
        // NumPy reads the memory to convert it: not while a writable view
        // (of this call or another) holds any of its bytes.
        let read = self.probe_bytes(obj, param)?;
        let text = refused.to_string();
        let what = format!(
            "dlcast cannot read the array in place ({})",
            text.lines().next().unwrap_or_default()
        );
        let ndim = shape.len();
        self.slots[index].converted = Some((py.None(), shape));
        let target = Target {
            dtype,
            order: param.order,
            copy: true,
        };
        let tmp = self.convert(index, obj, true, ndim, target, &what)?;
        drop(read);
        self.prepare_slot(index, &tmp, true)?;
        if let Some((keep, _)) = &mut self.slots[index].converted {
            *keep = tmp.unbind();
        }
        Ok(())
    }

    /// Hands the view of parameter `index` its read (which owns what keeps
    /// the memory alive). Call after [`CallCx::finish`] succeeded, once per
    /// parameter; the view borrows the context, so it cannot outlive it.
    #[inline(always)]
    pub fn take<'a, V: View<'a>>(&'a self, index: usize) -> PyResult<V> {
        let slot = &self.slots[index];
        if !self.finished || slot.taken.replace(true) {
            return Err(misuse());
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
                Keep {
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
        if !self.defers && !import::in_body() {
            return f();
        }
        let _guard = import::BodyGuard::enter();
        f()
    }

    /// As [`CallCx::take`] for an `Option<..>` parameter.
    pub fn take_opt<'a, V: View<'a>>(&'a self, index: usize) -> PyResult<Option<V>> {
        if self.slots[index].obj.is_some() {
            self.take(index).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// What a call's errors and registry entries name: the function, and this
/// call's id in the borrow registry. Copied out of the call context in phase
/// 2, so that the checks run while a slot's read is borrowed in place.
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct Who {
    spec: &'static FnSpec,
    /// This call's id in the borrow registry (see [`crate::borrow`]).
    call: u64,
}

impl Who {
    /// As [`CallCx::py`].
    fn py(&self) -> Python<'static> {
        // SAFETY: a `Who` is used only inside the call context's methods,
        // which the generated code calls inside the PyO3 function it wraps,
        // where the GIL is held; the token is used for this call only.
        unsafe { Python::assume_attached() }
    }

    /// Refuses (as [`CallCx::register`] would a read-only view) a NumPy
    /// array whose bytes meet a writable view's: for arrays DLPack cannot
    /// describe, before NumPy reads them to convert them. The bytes come
    /// from the array's own fields ([`import::numpy::byte_bounds`]), never
    /// from a Python function; an object that is not exactly NumPy's array
    /// type is refused (its bytes cannot be told). The read is held in the
    /// registry until the returned guard drops: keep it while NumPy reads
    /// (a cast may release the GIL, and another thread then start a call).
    #[cold]
    fn probe_bytes(
        &self,
        obj: &Bound<'_, PyAny>,
        param: &ParamSpec,
    ) -> PyResult<Option<crate::borrow::Borrow>> {
        let Some(span) = import::numpy::byte_bounds(obj) else {
            let got = obj
                .get_type()
                .fully_qualified_name()
                .map_or_else(|_| "?".to_string(), |n| n.to_string());
            return Err(self.fail(
                param,
                format_args!(
                    "dlcast cannot tell which bytes converting it would read: numpy.asarray \
                     gave a {got}, not a numpy.ndarray"
                ),
            ));
        };
        let Some((lo, hi)) = span else {
            return Ok(None);
        };
        let req = crate::borrow::request(
            Device::CPU,
            lo,
            hi,
            lo,
            &[hi - lo],
            &[1],
            1,
            false,
            self.call,
            self.spec.name,
            param.name,
        );
        self.probe_held(param, &req)
    }

    /// Whether a read-only view of `req` could be entered in the borrow
    /// registry now, ignoring this call's own entries (a conversion runs
    /// before any view of this call exists): `BufferError` if a writable
    /// view of another call holds the memory.
    #[cold]
    fn probe(&self, param: &ParamSpec, req: &crate::borrow::BorrowReq) -> PyResult<()> {
        self.probe_held(param, req).map(drop)
    }

    /// As [`Who::probe`], keeping the read entered (`None` where only this
    /// call's own entries met it) until the returned guard drops.
    #[cold]
    fn probe_held(
        &self,
        param: &ParamSpec,
        req: &crate::borrow::BorrowReq,
    ) -> PyResult<Option<crate::borrow::Borrow>> {
        let api = crate::borrow::api(self.py())?;
        match crate::borrow::acquire_with(api, req) {
            Ok(b) => Ok(Some(b)),
            Err(crate::borrow::Refused::Conflict(other))
                if crate::borrow::same_call(req, &other) =>
            {
                Ok(None)
            }
            Err(refused) => Err(self.borrow_error(param, req, refused)),
        }
    }

    #[cold]
    fn convert<'py>(
        &self,
        index: usize,
        obj: &Bound<'py, PyAny>,
        host: bool,
        ndim: usize,
        target: Target,
        what: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let param = &self.spec.params[index];
        match convert::convert(obj, host, ndim, target) {
            Ok(tmp) => Ok(tmp),
            Err(ConvertError::Unsupported(why)) => Err(self.fail(
                param,
                format_args!("{what}, and it cannot be converted: {why}"),
            )),
            // Not an error of the argument: propagates unchanged, as the
            // import paths do (KeyboardInterrupt, MemoryError, ...).
            Err(ConvertError::Raised(_, cause))
                if !cause.is_instance_of::<pyo3::exceptions::PyException>(obj.py())
                    || cause.is_instance_of::<pyo3::exceptions::PyMemoryError>(obj.py()) =>
            {
                Err(cause)
            }
            Err(ConvertError::Raised(call, cause)) => {
                let e = self.fail(
                    param,
                    format_args!("{what}, and converting it with {call}() raised {cause}"),
                );
                e.set_cause(obj.py(), Some(cause));
                Err(e)
            }
        }
    }

    /// The borrow-registry request for a view of `raw`: `None` for an empty
    /// array (it touches no memory) and for a span that wraps (the import
    /// checked that host spans do not; a device span that wraps describes
    /// no real memory).
    #[inline(always)]
    fn view_request(
        &self,
        param: &ParamSpec,
        raw: &RawTensor,
        writable: bool,
    ) -> Option<crate::borrow::BorrowReq> {
        let e = raw.extent?;
        let base = raw.data as usize;
        let (lo, hi) = (
            base.checked_add_signed(e.lo)?,
            base.checked_add_signed(e.hi)?,
        );
        Some(crate::borrow::request(
            raw.device,
            lo,
            hi,
            base,
            &raw.shape,
            &raw.strides,
            // The bytes of one element as DLPack counts them, `bits * lanes`
            // rounded up to whole bytes: `DType::itemsize` for every dtype
            // dlcast names, without the lookup of the name, and the true
            // element size of the others a `TensorDyn` may read.
            (usize::from(raw.dtype.bits) * usize::from(raw.dtype.lanes))
                .div_ceil(8)
                .max(1),
            writable,
            self.call,
            self.spec.name,
            param.name,
        ))
    }

    /// Enters the view of `raw` in the borrow registry (see
    /// [`crate::borrow`]): refused if it meets a writable borrow, or is
    /// writable and meets any borrow, of this call's other arguments
    /// (`TypeError`) or of another call still running (`BufferError`).
    /// Empty arrays touch no memory and are not entered.
    #[inline(always)]
    fn register(
        &self,
        py: Python<'_>,
        param: &ParamSpec,
        raw: &mut RawTensor,
        writable: bool,
    ) -> PyResult<()> {
        let Some(req) = self.view_request(param, raw, writable) else {
            return Ok(());
        };
        // Looked up before this call's first read; a cached load here.
        let api = crate::borrow::api(py)?;
        match crate::borrow::acquire_with(api, &req) {
            Ok(b) => {
                raw.borrow = Some(b);
                Ok(())
            }
            Err(refused) => Err(self.borrow_error(param, &req, refused)),
        }
    }

    #[cold]
    fn borrow_error(
        &self,
        param: &ParamSpec,
        req: &crate::borrow::BorrowReq,
        refused: crate::borrow::Refused,
    ) -> PyErr {
        use crate::borrow::{name, same_call, Refused};
        let other = match refused {
            Refused::NoMemory => {
                return pyo3::exceptions::PyMemoryError::new_err(
                    "dlcast's borrow registry could not grow",
                )
            }
            Refused::Conflict(other) => other,
        };
        if name(other.function, other.function_len) == crate::borrow::rnp::RUST_NUMPY {
            let theirs = if other.writable != 0 {
                "a PyReadwriteArray"
            } else {
                "a PyReadonlyArray"
            };
            return self.rust_numpy_refusal(param, req.writable != 0, theirs);
        }
        let other_param = name(other.param, other.param_len);
        if same_call(req, &other) {
            // The earlier argument first when it is writable, as it is read first.
            let (w, o) = if other.writable != 0 {
                (other_param, param.name)
            } else {
                (param.name, other_param)
            };
            return PyTypeError::new_err(format!(
                "{}(): arguments '{w}' and '{o}' share memory, and '{w}' is writable",
                self.spec.name,
            ));
        }
        let (mine, theirs) = match (req.writable != 0, other.writable != 0) {
            (true, true) => ("writable", "writable"),
            (true, false) => ("writable", "read-only"),
            _ => ("read-only", "writable"),
        };
        PyBufferError::new_err(format!(
            "{}(): argument '{}': the array's memory is in use by another call still running \
             (argument '{other_param}' of {}(), a {theirs} view; a nested call, a callback or \
             another thread), and this {mine} view may not share it",
            self.spec.name,
            param.name,
            name(other.function, other.function_len),
        ))
    }

    /// Where rust-numpy's registry is not dlcast's (see [`crate::borrow::rnp`]):
    /// the view of slot `index`, entered in dlcast's registry as `raw`, is
    /// also acquired there if it reads an exact `numpy.ndarray` from its
    /// fields (not a converted copy; empty arrays are not entered), until
    /// its borrow ends. `BufferError` if rust-numpy's registry refuses.
    #[cold]
    #[inline(never)]
    fn hold_rust_numpy(
        &self,
        shared: &'static crate::borrow::rnp::Foreign,
        index: usize,
        (source, converted): (&Source, bool),
        raw: &RawTensor,
        writable: bool,
    ) -> PyResult<()> {
        let (Source::Numpy(array), false, Some(borrow)) = (source, converted, &raw.borrow) else {
            return Ok(());
        };
        crate::borrow::rnp::hold(shared, array.bind(self.py()), writable, borrow)
            .map_err(|_| self.rust_numpy_error(&self.spec.params[index], writable))
    }

    /// A view refused by rust-numpy's own registry.
    #[cold]
    fn rust_numpy_error(&self, param: &ParamSpec, writable: bool) -> PyErr {
        let theirs = if writable {
            "a PyReadonlyArray or PyReadwriteArray"
        } else {
            "a PyReadwriteArray"
        };
        self.rust_numpy_refusal(param, writable, theirs)
    }

    #[cold]
    fn rust_numpy_refusal(&self, param: &ParamSpec, writable: bool, theirs: &str) -> PyErr {
        let mine = if writable { "writable" } else { "read-only" };
        PyBufferError::new_err(format!(
            "{}(): argument '{}': the array is borrowed by a rust-numpy extension still \
             running ({theirs}), and this {mine} view may not share it",
            self.spec.name, param.name,
        ))
    }

    fn param_name(&self, index: u8) -> &'static str {
        self.spec.params[index as usize].name
    }

    fn fail(&self, param: &ParamSpec, msg: std::fmt::Arguments<'_>) -> PyErr {
        PyTypeError::new_err(format!(
            "{}(): argument '{}': {msg}",
            self.spec.name, param.name
        ))
    }

    fn import_error(&self, py: Python<'_>, param: &ParamSpec, e: ImportError) -> PyErr {
        let prefix = format!("{}(): argument '{}'", self.spec.name, param.name);
        match e {
            ImportError::NotAnArray(t) => PyTypeError::new_err(format!(
                "{prefix}: expected an array (an object with __dlpack__, a DLPack capsule \
                 or a buffer), got {t}"
            )),
            ImportError::Producer(what, cause) => {
                // The first line only (PyTorch appends C++ backtraces); the
                // whole exception is the `__cause__`.
                let text = cause.to_string();
                let first = text.lines().next().unwrap_or_default();
                let more = if text.contains('\n') { " [...]" } else { "" };
                let py_err = PyBufferError::new_err(format!(
                    "{prefix}: the producer's {what}() raised {first}{more}"
                ));
                py_err.set_cause(py, Some(cause));
                py_err
            }
            ImportError::Propagate(e) => e,
            ImportError::NotACapsule(t) => PyBufferError::new_err(format!(
                "{prefix}: __dlpack__() returned {t}, not a DLPack capsule"
            )),
            ImportError::UsedCapsule => PyBufferError::new_err(format!(
                "{prefix}: the DLPack capsule was already consumed (a capsule can be used once)"
            )),
            ImportError::CapsuleName(n) => PyBufferError::new_err(format!(
                "{prefix}: a capsule named {n:?} is not a DLPack capsule \
                 (expected \"dltensor\" or \"dltensor_versioned\")"
            )),
            ImportError::Version(major, minor) => PyBufferError::new_err(format!(
                "{prefix}: unsupported DLPack version {major}.{minor} (dlcast reads major version 1)"
            )),
            ImportError::Unreadable(why) => PyBufferError::new_err(format!("{prefix}: {why}")),
            ImportError::Invalid(what) => PyBufferError::new_err(format!(
                "{prefix}: the producer described an invalid array: {what}"
            )),
            ImportError::DType(d) => PyTypeError::new_err(format!(
                "{prefix}: unsupported dtype (code={}, bits={}, lanes={})",
                d.code, d.bits, d.lanes
            )),
            ImportError::Device(d) => PyTypeError::new_err(format!(
                "{prefix}: unsupported device (device_type={}, device_id={})",
                d.device_type, d.device_id
            )),
            ImportError::Stream(msg) | ImportError::Param(msg) => {
                PyTypeError::new_err(format!("{prefix}: {msg}"))
            }
            ImportError::NeedsDlpack => PyBufferError::new_err(format!(
                "{prefix}: NumPy's fields do not describe the array, and neither did __dlpack__()"
            )),
            ImportError::Buffer(e) => {
                let py_err = PyBufferError::new_err(format!(
                    "{prefix}: the buffer protocol refused: {e}"
                ));
                py_err.set_cause(py, Some(e));
                py_err
            }
        }
    }

    #[inline(always)]
    fn check(
        &self,
        names: &mut [Option<Binding>],
        index: usize,
        param: &ParamSpec,
        raw: &RawTensor,
        dtype: Option<DType>,
        writable: bool,
    ) -> Result<(), Refusal> {
        if !param.devices.iter().any(|d| d.matches(raw.device)) {
            return Err(self.device_error(param, raw.device).into());
        }
        if let Some(dims) = param.shape {
            self.check_shape(names, index, param, dims, &raw.shape)?;
        }
        let dtype_ok = dtype.is_none_or(|want| raw.dtype == want);
        let order_ok = match param.order {
            Order::Any => true,
            Order::C => layout::is_c_contiguous(&raw.shape, &raw.strides),
            Order::F => layout::is_f_contiguous(&raw.shape, &raw.strides),
            Order::Contiguous => {
                layout::is_c_contiguous(&raw.shape, &raw.strides)
                    || layout::is_f_contiguous(&raw.shape, &raw.strides)
            }
        };
        if !(dtype_ok && order_ok) {
            return Err(self.mismatch(param, raw, dtype.unwrap_or(raw.dtype), writable, dtype_ok));
        }
        if param.aligned && raw.extent.is_some() {
            let align = raw.dtype.align().unwrap_or(1);
            if raw.data as usize % align != 0 {
                return Err(self.misaligned(param, raw, align, writable));
            }
        }
        if writable {
            if raw.read_only {
                return Err(self
                    .fail(
                        param,
                        format_args!("the array is read-only, but the parameter is writable"),
                    )
                    .into());
            }
            if layout::may_self_overlap(&raw.shape, &raw.strides) {
                return Err(self
                    .fail(
                        param,
                        format_args!(
                            "a writable array must not reach one element from two indices, \
                             and dlcast cannot rule that out for shape {} with strides {} \
                             (its test is conservative for interleaved strides); pass a \
                             compact copy, e.g. numpy.ascontiguousarray(x)",
                            TupleDisplay(&raw.shape),
                            TupleDisplay(&raw.strides)
                        ),
                    )
                    .into());
            }
        }
        Ok(())
    }

    /// A dtype or memory-order mismatch: a conversion where the parameter
    /// allows one, else the error that says why not.
    #[cold]
    fn mismatch(
        &self,
        param: &ParamSpec,
        raw: &RawTensor,
        want: DType,
        writable: bool,
        dtype_ok: bool,
    ) -> Refusal {
        if let (false, Some(shared)) = (dtype_ok, param.shares_dtype) {
            return PyTypeError::new_err(format!(
                "{}(): arguments '{}' and '{}' must have the same dtype (both are `{}`), \
                 got {} and {}",
                self.spec.name,
                self.param_name(shared.decided_by),
                param.name,
                shared.type_param,
                want,
                raw.dtype
            ))
            .into();
        }
        let what = if dtype_ok {
            format!(
                "expected a {} array, got shape {} with strides {}",
                param.order.describe(),
                TupleDisplay(&raw.shape),
                TupleDisplay(&raw.strides)
            )
        } else {
            format!("expected dtype {want}, got {}", raw.dtype)
        };
        let why_not = if writable {
            "; a writable parameter never converts (writes into a converted copy would be lost)"
                .to_string()
        } else if !param.convert {
            String::new()
        } else if !dtype_ok && !convert::same_kind(raw.dtype, want) {
            format!(
                "; {} does not convert to {want} implicitly (only same-kind casts do, \
                 as NumPy's can_cast(..., casting=\"same_kind\"))",
                raw.dtype
            )
        } else {
            return Refusal::Convert(
                Target {
                    dtype: want,
                    order: param.order,
                    copy: false,
                },
                what,
            );
        };
        self.fail(param, format_args!("{what}{why_not}")).into()
    }

    /// Data not aligned for a parameter whose type hands out references: a
    /// fresh copy where the parameter converts, else the error.
    #[cold]
    fn misaligned(
        &self,
        param: &ParamSpec,
        raw: &RawTensor,
        align: usize,
        writable: bool,
    ) -> Refusal {
        let what = format!(
            "the data (at address {:#x}) is not aligned to {align} bytes for {}, which this \
             parameter's type needs",
            raw.data as usize, raw.dtype
        );
        if writable {
            let e = format!(
                "{what}; a writable parameter never converts (writes into an aligned copy \
                 would be lost): pass an aligned array, e.g. numpy.require(x, requirements=\"A\")"
            );
            return self.fail(param, format_args!("{e}")).into();
        }
        if !param.convert {
            return self.fail(param, format_args!("{what}")).into();
        }
        Refusal::Convert(
            Target {
                dtype: raw.dtype,
                order: param.order,
                copy: true,
            },
            what,
        )
    }

    fn device_error(&self, param: &ParamSpec, got: Device) -> PyErr {
        let want: Vec<String> = param.devices.iter().map(|d| d.to_string()).collect();
        self.fail(
            param,
            format_args!("expected device {}, got {got}", want.join(" or ")),
        )
    }

    fn check_shape(
        &self,
        names: &mut [Option<Binding>],
        index: usize,
        param: &ParamSpec,
        dims: &'static [crate::spec::Dim],
        shape: &[usize],
    ) -> PyResult<()> {
        let mut conflict: Option<(u8, Binding, usize)> = None;
        let fits = match_shape(dims, shape, |k, n| match names[k as usize] {
            None => {
                names[k as usize] = Some(Binding {
                    extent: n,
                    param: index as u8,
                });
                true
            }
            Some(b) if b.extent == n => true,
            Some(b) => {
                conflict = Some((k, b, n));
                false
            }
        });
        if fits {
            return Ok(());
        }
        match conflict {
            Some((k, b, n)) if b.param as usize != index => Err(PyTypeError::new_err(format!(
                "{}(): dimension '{}' is {} in '{}' but {} in '{}'",
                self.spec.name,
                self.spec.dim_names[k as usize],
                b.extent,
                self.param_name(b.param),
                n,
                param.name
            ))),
            _ => Err(self.fail(
                param,
                format_args!(
                    "expected shape {}, got {}",
                    ShapeDisplay {
                        dims,
                        names: self.spec.dim_names
                    },
                    TupleDisplay(shape)
                ),
            )),
        }
    }
}

/// The call context's methods called out of order (only code that drives
/// `CallCx` by hand can: the generated code calls each once, in order).
#[cold]
fn misuse() -> PyErr {
    PyBufferError::new_err(
        "dlcast: the call context was driven out of order (prepare, finish, take per \
         parameter with the same view type, then body)",
    )
}

/// Debug builds only: marks the stretch of phase 2 where arguments are
/// read, so that tests can call Python code from every hook dlcast
/// consults and check that none of it runs there
/// ([`raw_reads_in_progress`]).
#[cfg(debug_assertions)]
mod tripwire {
    use std::cell::Cell;

    thread_local! {
        static ACTIVE: Cell<bool> = const { Cell::new(false) };
    }

    /// Inside a read pass while alive (restores the previous state on drop).
    pub(super) struct Reads(bool);

    impl Reads {
        pub(super) fn enter() -> Self {
            Reads(ACTIVE.with(|a| a.replace(true)))
        }
    }

    impl Drop for Reads {
        fn drop(&mut self) {
            ACTIVE.with(|a| a.set(self.0));
        }
    }

    pub(super) fn active() -> bool {
        ACTIVE.with(Cell::get)
    }
}

/// Whether this thread is reading a `#[dlpack_fn]` call's arguments (phase
/// 2, from the first raw read to the last check), where no Python code may
/// run: `Some(..)` in debug builds, `None` in release builds, which do not
/// track it. For tests: Python code that dlcast may reach (a producer's
/// methods, a replaced attribute) asks it and records a `Some(true)`.
#[doc(hidden)]
pub fn raw_reads_in_progress() -> Option<bool> {
    #[cfg(debug_assertions)]
    return Some(tripwire::active());
    #[cfg(not(debug_assertions))]
    None
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
    Err(pyo3::exceptions::PyRuntimeError::new_err(
        "dlcast functions do not run on free-threaded CPython without the GIL yet: run \
         Python with PYTHON_GIL=1 (or -X gil=1)",
    ))
}
