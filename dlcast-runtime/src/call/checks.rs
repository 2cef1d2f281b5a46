//! The checks of phase 2 ([`Who`]): an argument's read against its
//! parameter's [`ParamSpec`] (device, shape and named extents, dtype,
//! order, writability, alignment), the borrow-registry and rust-numpy
//! probes, and the messages of what they refuse.

use super::Binding;
use crate::convert::{self, ConvertError, Target};
use crate::device::Device;
use crate::dtype::DType;
use crate::import::{self, ImportError, RawTensor};
use crate::layout;
use crate::spec::{match_shape, FnSpec, Order, ParamSpec, ShapeDisplay, TupleDisplay};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;

/// Why a check refused an argument.
pub(super) enum Refusal {
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

/// What a call's errors and registry entries name: the function, and this
/// call's id in the borrow registry. Copied out of the call context in phase
/// 2, so that the checks run while a slot's read is borrowed in place.
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct Who {
    pub(super) spec: &'static FnSpec,
    /// This call's id in the borrow registry (see [`crate::borrow`]).
    pub(super) call: u64,
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
    pub(super) fn probe_bytes(
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
    pub(super) fn probe(&self, param: &ParamSpec, req: &crate::borrow::BorrowReq) -> PyResult<()> {
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
    pub(super) fn convert<'py>(
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
    pub(super) fn view_request(
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
    pub(super) fn register(
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

    /// A view refused by rust-numpy's own registry.
    #[cold]
    pub(super) fn rust_numpy_error(&self, param: &ParamSpec, writable: bool) -> PyErr {
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

    pub(super) fn fail(&self, param: &ParamSpec, msg: std::fmt::Arguments<'_>) -> PyErr {
        PyTypeError::new_err(format!(
            "{}(): argument '{}': {msg}",
            self.spec.name, param.name
        ))
    }

    pub(super) fn import_error(&self, py: Python<'_>, param: &ParamSpec, e: ImportError) -> PyErr {
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
    pub(super) fn check(
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
