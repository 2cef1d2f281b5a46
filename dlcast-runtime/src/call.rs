//! The per-call context the macro drives: import each array argument, check
//! it against its [`ParamSpec`], then check what spans parameters (named
//! extents, overlapping memory) once before the body runs.
//!
//! Error messages are formatted only when a check fails.

use crate::convert::{self, ConvertError, Target};
use crate::device::Device;
use crate::dtype::DType;
use crate::fast::ImportPath;
use crate::import::{self, ImportError, RawTensor};
use crate::layout;
use crate::spec::{match_shape, FnSpec, Order, ParamSpec, ShapeDisplay, TupleDisplay};
use crate::view::View;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use smallvec::SmallVec;

/// An argument imported by [`CallCx::peek`], not yet checked, with the
/// [`CallCx::epoch`] just after its import.
#[doc(hidden)]
pub struct Peeked(RawTensor, u32);

impl Peeked {
    /// The argument's dtype, for the dispatch of a dtype-generic function.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.0.dtype
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

/// State of one call of a `#[dlpack_fn]` function. Created by the generated
/// code, one per call, on the stack.
#[doc(hidden)]
pub struct CallCx {
    spec: &'static FnSpec,
    names: SmallVec<[Option<Binding>; 4]>,
    /// This call's id in the borrow registry (see [`crate::borrow`]).
    call: u64,
    /// The stream GPU inputs are asked for (see [`crate::stream`]); set by
    /// the generated code before the first `arg`.
    pub(crate) stream: crate::stream::StreamRequest,
    /// PyTorch tensors taken by writable parameters: their version counters
    /// are bumped once every argument has passed its checks.
    written: SmallVec<[Py<PyAny>; 1]>,
    /// Tensors read through `__dlpack__` or the exchange API, and what their
    /// views describe: checked again by [`CallCx::finish`] (see
    /// [`crate::fast::still_describes`]).
    recheck: SmallVec<[Recheck; 1]>,
    /// Counts the steps of this call that may have run Python code (an
    /// import other than NumPy's fields, a conversion, a `requires_grad`
    /// lookup, ...): a tensor needs no second read if none ran after its
    /// first.
    epoch: std::cell::Cell<u32>,
}

/// What a view of a mutable tensor was made of.
struct Recheck {
    param: u8,
    obj: Py<PyAny>,
    data: *mut u8,
    shape: crate::import::Dims<usize>,
    strides: crate::import::Dims<isize>,
    /// The [`CallCx::epoch`] at the tensor's read, if no Python code ran
    /// after it within its own import; `None`: always read again.
    read_at: Option<u32>,
}

impl CallCx {
    /// Starts a call of the function described by `spec`.
    #[inline]
    pub fn new(spec: &'static FnSpec) -> Self {
        CallCx {
            spec,
            names: smallvec::smallvec![None; spec.dim_names.len()],
            call: crate::borrow::new_call_id(),
            stream: crate::stream::StreamRequest::Producer,
            written: SmallVec::new(),
            recheck: SmallVec::new(),
            epoch: std::cell::Cell::new(0),
        }
    }

    /// Notes that Python code may run from here on (see [`CallCx::epoch`]).
    fn python_may_run(&self) {
        self.epoch.set(self.epoch.get().wrapping_add(1));
    }

    /// Imports and checks the array argument of parameter `index`,
    /// converting a read-only argument whose dtype or order does not fit
    /// where the parameter allows it (see [`crate::convert`]).
    #[inline(always)]
    pub fn arg<'a, V: View<'a>>(&mut self, index: usize, obj: &'a Bound<'a, PyAny>) -> PyResult<V> {
        // The registry is found (or published: Python code, once per
        // process) before any raw read.
        crate::borrow::api(obj.py())?;
        // NumPy's fields straight into the check and the view (no
        // `Result` re-wrapping on the way: each would copy the view).
        if let Some(raw) = crate::fast::numpy(obj) {
            return self.checked(index, obj, raw, None);
        }
        self.arg_generic(index, obj)
    }

    /// [`CallCx::arg`] by the other import paths.
    #[inline(never)]
    fn arg_generic<'a, V: View<'a>>(
        &mut self,
        index: usize,
        obj: &'a Bound<'a, PyAny>,
    ) -> PyResult<V> {
        let raw = self.import_generic(index, obj)?;
        self.checked(index, obj, raw, Some(self.epoch.get()))
    }

    /// Imports the argument of the parameter that decides a dtype-generic
    /// function's type parameter, without checking it; the generated code
    /// dispatches on [`Peeked::dtype`] and then calls [`CallCx::arg_peeked`].
    pub fn peek(&mut self, index: usize, obj: &Bound<'_, PyAny>) -> PyResult<Peeked> {
        crate::borrow::api(obj.py())?;
        let raw = self.import(index, obj)?;
        Ok(Peeked(raw, self.epoch.get()))
    }

    /// Checks an argument imported by [`CallCx::peek`], as [`CallCx::arg`].
    pub fn arg_peeked<'a, V: View<'a>>(
        &mut self,
        index: usize,
        obj: &'a Bound<'a, PyAny>,
        peeked: Peeked,
    ) -> PyResult<V> {
        self.checked(index, obj, peeked.0, Some(peeked.1))
    }

    /// The error for a dtype-generic parameter whose dtype is not listed in
    /// its `#[dtype(..)]`.
    #[cold]
    pub fn unlisted_dtype(&self, index: usize, peeked: &Peeked) -> PyErr {
        let param = &self.spec.params[index];
        let mut names: Vec<String> = param.dtypes.iter().map(|d| d.to_string()).collect();
        let last = names.pop().unwrap_or_default();
        let listed = if names.is_empty() {
            last
        } else {
            format!("{} or {last}", names.join(", "))
        };
        self.fail(
            param,
            format_args!("expected dtype {listed}, got {}", peeked.0.dtype),
        )
    }

    fn import(&self, index: usize, obj: &Bound<'_, PyAny>) -> PyResult<RawTensor> {
        match crate::fast::numpy(obj) {
            Some(raw) => Ok(raw),
            None => self.import_generic(index, obj),
        }
    }

    /// [`CallCx::import`] by every path but NumPy's fields.
    fn import_generic(&self, index: usize, obj: &Bound<'_, PyAny>) -> PyResult<RawTensor> {
        // Python code may run before the read (the exchange API path asks
        // `is_neg` first) or after it (`__dlpack__` paths).
        self.python_may_run();
        let param = &self.spec.params[index];
        let sx = import::StreamCx {
            request: self.stream,
            may_need: crate::stream::may_need_stream(param.devices),
        };
        import::import_generic(obj, sx).map_err(|e| self.import_error(obj.py(), param, e))
    }

    /// Checks `raw` against parameter `index`; on a dtype or order mismatch
    /// that may convert, converts `obj` and checks the result. `read_at` is
    /// the [`CallCx::epoch`] just after the import (later steps of the call,
    /// another argument's import, may have run Python code since), or
    /// `None` for arrays read from NumPy's fields, which skip the PyTorch
    /// bookkeeping below.
    #[inline(always)]
    fn checked<'a, V: View<'a>>(
        &mut self,
        index: usize,
        obj: &'a Bound<'a, PyAny>,
        raw: RawTensor,
        read_at: Option<u32>,
    ) -> PyResult<V> {
        let param = &self.spec.params[index];
        match self.check(index, param, &raw, V::DTYPE, V::WRITABLE) {
            Ok(()) if read_at.is_none() => {
                let mut raw = raw;
                self.register(obj.py(), param, &mut raw, V::WRITABLE)?;
                Ok(V::from_raw(raw))
            }
            Ok(()) => {
                let mut raw = raw;
                self.register(obj.py(), param, &mut raw, V::WRITABLE)?;
                // A writable view of a PyTorch tensor is guarded whatever
                // read it: a tensor subclass may publish an exchange table
                // of its own.
                if V::WRITABLE {
                    self.guard_write(param, obj)?;
                }
                // Read again at the end of the call: PyTorch tensors, mutable
                // containers read without holding their storage's layout
                // fixed, when read through PyTorch's own exchange API table
                // or `__dlpack__` (its capsule holds the tensor, whose
                // storage `set_` can still swap). Another producer's table
                // answers for what it describes, as its capsules do.
                let recheck = match raw.path {
                    ImportPath::ExchangeApi => raw.read_through_torch_table(),
                    ImportPath::Dlpack => crate::fast::is_torch_type(obj),
                    _ => false,
                };
                if recheck {
                    // The exchange API path runs no Python code after the
                    // read but `is_conj()` for complex tensors; the
                    // `__dlpack__` path runs the producer's code after it.
                    let read_at = read_at.filter(|_| {
                        raw.path == ImportPath::ExchangeApi
                            && raw.dtype.code != crate::dtype::code::COMPLEX
                    });
                    self.recheck.push(Recheck {
                        param: index as u8,
                        obj: obj.clone().unbind(),
                        data: raw.data,
                        shape: SmallVec::from_slice(&raw.shape),
                        strides: SmallVec::from_slice(&raw.strides),
                        read_at,
                    });
                }
                Ok(V::from_raw(raw))
            }
            Err(refusal) => self.refused(index, obj, raw, refusal),
        }
    }

    /// After `check` refused `raw`: the error, or, for a dtype or order
    /// that may convert, the converted argument checked again.
    #[cold]
    #[inline(never)]
    fn refused<'a, V: View<'a>>(
        &mut self,
        index: usize,
        obj: &'a Bound<'a, PyAny>,
        raw: RawTensor,
        refusal: Refusal,
    ) -> PyResult<V> {
        let param = &self.spec.params[index];
        match refusal {
            Refusal::Error(e) => Err(e),
            Refusal::Convert(target, what) => {
                let host = raw.device.is_host_accessible();
                let shape = raw.shape.clone();
                drop(raw);
                let mut raw = self.convert(index, obj, host, shape.len(), target, &what)?;
                if raw.shape != shape {
                    return Err(self.fail(
                        param,
                        format_args!(
                            "{what}; converting it gave shape {}, not {}",
                            TupleDisplay(&raw.shape),
                            TupleDisplay(&shape)
                        ),
                    ));
                }
                // Writes into the temporary would never reach the caller's
                // array: a view of it (returned to Python, say) is read-only.
                raw.read_only = true;
                match self.check(index, param, &raw, V::DTYPE, V::WRITABLE) {
                    Ok(()) => {
                        self.register(obj.py(), param, &mut raw, V::WRITABLE)?;
                        Ok(V::from_raw(raw))
                    }
                    Err(Refusal::Error(e)) => Err(e),
                    Err(Refusal::Convert(..)) => Err(self.fail(
                        param,
                        format_args!(
                            "{what}; converting it gave dtype {} with strides {}, \
                             which still does not fit",
                            raw.dtype,
                            TupleDisplay(&raw.strides)
                        ),
                    )),
                }
            }
        }
    }

    /// Before a writable view of a PyTorch tensor: refuse a tensor that
    /// requires grad (autograd cannot see the write, PyTorch forbids
    /// untracked in-place changes), and note the tensor, whose version
    /// counter [`CallCx::finish`] bumps.
    fn guard_write(&mut self, param: &ParamSpec, obj: &Bound<'_, PyAny>) -> PyResult<()> {
        // The type's MRO and `requires_grad` are Python lookups.
        self.python_may_run();
        if !crate::fast::is_torch_type(obj) {
            return Ok(());
        }
        let py = obj.py();
        if obj
            .getattr(pyo3::intern!(py, "requires_grad"))?
            .is_truthy()?
        {
            return Err(self.fail(
                param,
                format_args!(
                    "the tensor requires grad, and autograd cannot see writes through a \
                     writable parameter; pass x.detach() to write into its data"
                ),
            ));
        }
        self.written.push(obj.clone().unbind());
        Ok(())
    }

    /// The check of [`crate::fast::still_describes`] for every tensor read
    /// through `__dlpack__` or the exchange API.
    fn recheck_tensors(&self, py: Python<'_>) -> PyResult<()> {
        for r in &self.recheck {
            if r.read_at == Some(self.epoch.get()) {
                // No Python code ran since the tensor was read.
                continue;
            }
            if !crate::fast::still_describes(r.obj.bind(py), r.data, &r.shape, &r.strides) {
                return Err(PyBufferError::new_err(format!(
                    "{}(): argument '{}': the tensor changed (its storage, shape or strides) \
                     while the call's arguments were read; its view would read memory it no \
                     longer owns",
                    self.spec.name,
                    self.param_name(r.param)
                )));
            }
        }
        Ok(())
    }

    /// Bumps the version counter of each PyTorch tensor a writable parameter
    /// took (`torch.autograd.graph.increment_version`), so that a graph that
    /// saved one for backward raises instead of using changed data.
    #[cold]
    fn bump_versions(&self, py: Python<'_>) -> PyResult<()> {
        self.python_may_run();
        static INCREMENT: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
        let increment = INCREMENT.get_or_try_init(py, || {
            py.import("torch.autograd.graph")?
                .getattr("increment_version")
                .map(Bound::unbind)
        })?;
        for t in &self.written {
            increment.call1(py, (t,))?;
        }
        Ok(())
    }

    #[cold]
    fn convert(
        &self,
        index: usize,
        obj: &Bound<'_, PyAny>,
        host: bool,
        ndim: usize,
        target: Target,
        what: &str,
    ) -> PyResult<RawTensor> {
        let param = &self.spec.params[index];
        self.python_may_run();
        match convert::convert(obj, host, ndim, target) {
            Ok(tmp) => self.import(index, &tmp).map_err(|e| {
                let err = self.fail(
                    param,
                    format_args!("{what}, and its converted copy could not be read: {e}"),
                );
                err.set_cause(obj.py(), Some(e));
                err
            }),
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

    /// As [`CallCx::arg`] for an `Option<..>` parameter: Python's `None` is
    /// `None`.
    pub fn opt_arg<'a, V: View<'a>>(
        &mut self,
        index: usize,
        obj: Option<&'a Bound<'a, PyAny>>,
    ) -> PyResult<Option<V>> {
        match obj {
            Some(o) if !o.is_none() => self.arg(index, o).map(Some),
            _ => Ok(None),
        }
    }

    /// Checks that span parameters; call after every `arg`, before the body.
    pub fn finish(&self) -> PyResult<()> {
        // The version counters first: `increment_version` is Python code,
        // after which the tensors are read again.
        if !self.written.is_empty() {
            // The GIL is held (the generated code runs inside a PyO3 call).
            Python::attach(|py| self.bump_versions(py))?;
        }
        if self
            .recheck
            .iter()
            .any(|r| r.read_at != Some(self.epoch.get()))
        {
            // The GIL is held (the generated code runs inside a PyO3 call).
            // Attaching may run PyO3's deferred decrefs (`__del__`, Python
            // code): every tensor is then read again, none skipped.
            Python::attach(|py| {
                self.python_may_run();
                self.recheck_tensors(py)
            })?;
        }
        Ok(())
    }

    /// Enters the view of `raw` in the borrow registry (see
    /// [`crate::borrow`]): refused if it meets a writable borrow, or is
    /// writable and meets any borrow, of this call's other arguments
    /// (`TypeError`) or of another call still running (`BufferError`).
    /// Empty arrays touch no memory and are not entered.
    fn register(
        &self,
        py: Python<'_>,
        param: &ParamSpec,
        raw: &mut RawTensor,
        writable: bool,
    ) -> PyResult<()> {
        let Some(e) = raw.extent else {
            return Ok(());
        };
        let base = raw.data as usize;
        // The import checked that host spans do not wrap; a device span
        // that wraps describes no real memory: not entered.
        let (Some(lo), Some(hi)) = (base.checked_add_signed(e.lo), base.checked_add_signed(e.hi))
        else {
            return Ok(());
        };
        let req = crate::borrow::request(
            raw.device,
            lo,
            hi,
            base,
            &raw.shape,
            &raw.strides,
            raw.dtype.itemsize().unwrap_or(1),
            writable,
            self.call,
            self.spec.name,
            param.name,
        );
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
            ImportError::Stream(msg) => PyTypeError::new_err(format!("{prefix}: {msg}")),
            ImportError::Buffer(e) => {
                let py_err = PyBufferError::new_err(format!(
                    "{prefix}: the buffer protocol refused: {e}"
                ));
                py_err.set_cause(py, Some(e));
                py_err
            }
        }
    }

    fn check(
        &mut self,
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
            self.check_shape(index, param, dims, &raw.shape)?;
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
                             got shape {} with strides {}",
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
                },
                what,
            );
        };
        self.fail(param, format_args!("{what}{why_not}")).into()
    }

    fn device_error(&self, param: &ParamSpec, got: Device) -> PyErr {
        let want: Vec<String> = param.devices.iter().map(|d| d.to_string()).collect();
        self.fail(
            param,
            format_args!("expected device {}, got {got}", want.join(" or ")),
        )
    }

    fn check_shape(
        &mut self,
        index: usize,
        param: &ParamSpec,
        dims: &'static [crate::spec::Dim],
        shape: &[usize],
    ) -> PyResult<()> {
        let mut conflict: Option<(u8, Binding, usize)> = None;
        let names = &mut self.names;
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
