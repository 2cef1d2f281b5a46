//! The checks of phase 2 ([`CallIdentity`]): an argument's read against its
//! parameter's [`ParamSpec`] (device, shape and named extents, dtype,
//! order, writability, alignment), the borrow-registry and rust-numpy
//! probes; what they refuse is a `CallError` (in `crate::error`).

use super::Binding;
use crate::convert::{self, ConvertError, Target};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{CallError, ImportRefusal, NoCopy, NotInPlace, WhyNot};
use crate::import::{self, ImportError, ImportPath, RawTensor};
use crate::layout;
use crate::spec::{match_shape, FnSpec, Order, ParamSpec, TupleDisplay};
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
pub struct CallIdentity {
    pub(super) spec: &'static FnSpec,
    /// This call's id in the borrow registry (see [`crate::borrow`]).
    pub(super) call: u64,
}

impl CallIdentity {
    /// As [`CallContext::py`].
    fn py(&self) -> Python<'static> {
        // SAFETY: a `CallIdentity` is used only inside the call context's methods,
        // which the generated code calls inside the PyO3 function it wraps,
        // where the GIL is held; the token is used for this call only.
        unsafe { Python::assume_attached() }
    }

    /// Refuses (as [`CallContext::register`] would a read-only view) a NumPy
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
            return Err(CallError::UnknownBytes {
                func: self.spec.name,
                param: param.name,
                got,
            }
            .into());
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

    /// Enters a read-only view of `req` in the borrow registry, ignoring
    /// this call's own entries (a conversion runs before any view of this
    /// call exists), and holds it until the returned guard drops (`None`
    /// where only this call's own entries met it): `BufferError` if a
    /// writable view of another call holds the memory.
    #[cold]
    pub(super) fn probe_held(
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

    /// The refusal of an argument no conversion applies to.
    #[cold]
    pub(super) fn unconvertible(
        &self,
        param: &ParamSpec,
        what: &str,
        why: crate::error::Unconvertible,
    ) -> PyErr {
        CallError::Unconvertible {
            func: self.spec.name,
            param: param.name,
            what: what.to_owned(),
            why,
        }
        .into()
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
            Err(ConvertError::Unsupported(why)) => Err(self.unconvertible(param, what, why)),
            // Not an error of the argument: propagates unchanged, as the
            // import paths do (KeyboardInterrupt, MemoryError, ...).
            Err(ConvertError::Raised(_, cause))
                if !cause.is_instance_of::<pyo3::exceptions::PyException>(obj.py())
                    || cause.is_instance_of::<pyo3::exceptions::PyMemoryError>(obj.py()) =>
            {
                Err(cause)
            }
            Err(ConvertError::Raised(call, cause)) => Err(CallError::ConvertRaised {
                func: self.spec.name,
                param: param.name,
                what: what.to_owned(),
                call,
                cause,
            }
            .into()),
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
        // Where `data` is an opaque handle, element 0 is `byte_offset` into
        // its buffer: the handle plus the offset keys the registry, as the
        // address of element 0 does elsewhere (`byte_offset` is 0 there).
        let base = (raw.data as usize).wrapping_add(raw.byte_offset);
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
            Refused::NoMemory => return CallError::RegistryFull.into(),
            Refused::Conflict(other) => other,
        };
        if name(other.function, other.function_len) == crate::borrow::rust_numpy::RUST_NUMPY {
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
            return CallError::SharedMemory {
                func: self.spec.name,
                writable: w,
                other: o,
            }
            .into();
        }
        let (mine, theirs) = match (req.writable != 0, other.writable != 0) {
            (true, true) => ("writable", "writable"),
            (true, false) => ("writable", "read-only"),
            _ => ("read-only", "writable"),
        };
        CallError::InUse {
            func: self.spec.name,
            param: param.name,
            other_param,
            other_func: name(other.function, other.function_len),
            theirs,
            mine,
        }
        .into()
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
    fn rust_numpy_refusal(&self, param: &ParamSpec, writable: bool, theirs: &'static str) -> PyErr {
        CallError::RustNumpy {
            func: self.spec.name,
            param: param.name,
            theirs,
            mine: if writable { "writable" } else { "read-only" },
        }
        .into()
    }

    fn param_name(&self, index: u8) -> &'static str {
        // (A hand-written spec may name a parameter it does not have.)
        self.spec.params.get(index as usize).map_or("?", |p| p.name)
    }

    /// `import`'s refusal of the argument of `param`, with the function
    /// and the parameter named (an exception that must propagate, unchanged).
    #[cold]
    pub(super) fn import_error(&self, param: &ParamSpec, e: ImportError) -> PyErr {
        let why = match e {
            ImportError::Propagate(e) => return e,
            ImportError::NotAnArray(t) => ImportRefusal::NotAnArray(t),
            ImportError::Producer(what, cause) => {
                // The first line only (PyTorch appends C++ backtraces); the
                // whole exception is the `__cause__`.
                let text = cause.to_string();
                let first = text.lines().next().unwrap_or_default().to_owned();
                let more = if text.contains('\n') { " [...]" } else { "" };
                ImportRefusal::Producer {
                    what,
                    first,
                    more,
                    cause,
                }
            }
            ImportError::NotACapsule(t) => ImportRefusal::NotACapsule(t),
            ImportError::UsedCapsule => ImportRefusal::UsedCapsule,
            ImportError::CapsuleName(n) => ImportRefusal::CapsuleName(n),
            ImportError::Version(major, minor) => ImportRefusal::Version(major, minor),
            ImportError::Unreadable(why) => ImportRefusal::Unreadable(why),
            ImportError::Invalid(what) => ImportRefusal::Invalid(what),
            ImportError::DType(d) => ImportRefusal::DType(d),
            ImportError::Device(d) => ImportRefusal::Device(d),
            ImportError::Stream(msg) | ImportError::Param(msg) => ImportRefusal::Text(msg),
            ImportError::NeedsDlpack => ImportRefusal::NeedsDlpack,
            ImportError::Buffer(e) => ImportRefusal::Buffer(e),
        };
        CallError::Import {
            func: self.spec.name,
            param: param.name,
            why,
        }
        .into()
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
        // Every typed view hands out references to its elements (`as_slice`,
        // `as_ndarray`, Rust's own slices and `ndarray` views): its host
        // memory is aligned for the element type, so that no accessor of an
        // accepted argument fails on alignment. Device memory is read by no
        // accessor, and aligned only where the parameter's type needs it.
        let aligned = param.aligned || dtype.is_some() && raw.device.is_host_accessible();
        if aligned && raw.extent.is_some() {
            let align = raw.dtype.align().unwrap_or(1);
            if raw.data as usize % align != 0 {
                return Err(self.misaligned(param, raw, align, writable));
            }
        }
        if writable {
            if raw.read_only {
                return Err(self.read_only(param, raw));
            }
            if layout::may_self_overlap(&raw.shape, &raw.strides) {
                return Err(self.self_overlap(param, raw));
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
            return PyErr::from(CallError::SharedDType {
                func: self.spec.name,
                decided_by: self.param_name(shared.decided_by),
                param: param.name,
                type_param: shared.type_param,
                want,
                got: raw.dtype,
            })
            .into();
        }
        // Raw bytes (a buffer-protocol object of format `B`: `bytes`,
        // `bytearray`, `mmap`, ...) are not numbers of another type: a
        // `wave.readframes()` read as byte values would compute silently
        // on the wrong numbers. Refused with both explicit ways to ask.
        if !dtype_ok && raw.path == ImportPath::Buffer && raw.dtype == DType::UINT8 {
            return PyErr::from(CallError::RawBytes {
                func: self.spec.name,
                param: param.name,
                want,
                converts: !writable && param.convert,
            })
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
            WhyNot::Writable
        } else if !param.convert {
            WhyNot::NoConvert
        } else if !dtype_ok && !convert::same_kind(raw.dtype, want) {
            WhyNot::Kind {
                from: raw.dtype,
                to: want,
            }
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
        self.misfit(param, what, why_not)
    }

    /// A dtype, order or alignment that does not fit (`what`), not converted
    /// (`why_not`).
    #[cold]
    fn misfit(&self, param: &ParamSpec, what: String, why_not: WhyNot) -> Refusal {
        PyErr::from(CallError::Misfit {
            func: self.spec.name,
            param: param.name,
            what,
            why_not,
        })
        .into()
    }

    /// The refusal of an argument that NumPy reads but dlcast cannot read in
    /// place, for a parameter that does not convert it (`because`; `refused`:
    /// the producer's `BufferError`, kept as the `__cause__`): a `TypeError`
    /// naming why
    /// (byte order, dtype, strides), from the attributes of NumPy's array of
    /// it; `refused` itself where none of them is why. Call it only for NumPy's
    /// own arrays and buffer-protocol objects (`numpy.asarray` runs no other
    /// producer's code). Python code, run in phase 1: what it reads words
    /// the message only, the argument is refused whatever it says.
    #[cold]
    pub(super) fn not_in_place(
        &self,
        param: &ParamSpec,
        obj: &Bound<'_, PyAny>,
        refused: PyErr,
        because: NoCopy,
    ) -> PyErr {
        let py = obj.py();
        let arr = py
            .import(pyo3::intern!(py, "numpy"))
            .and_then(|np| np.call_method1(pyo3::intern!(py, "asarray"), (obj,)));
        // Any other refusal (the borrow registry's, rust-numpy's) stands;
        // an interrupt raised meanwhile propagates.
        let why = match arr.and_then(|a| why_not_in_place(&a)) {
            // A dtype NumPy cannot export (object, ml_dtypes' bfloat16 and
            // float8) is no fault of a read-only parameter's: NumPy's
            // refusal stands there (the README's BufferError).
            Ok(Some(NotInPlace::DType(_))) if !matches!(because, NoCopy::Writable) => {
                return refused
            }
            Ok(Some(why)) => why,
            Err(e) if no_fault_of_argument(py, &e) => return e,
            _ => return refused,
        };
        CallError::NotInPlace {
            func: self.spec.name,
            param: param.name,
            why,
            because,
            cause: refused,
        }
        .into()
    }

    /// A read-only array for a writable parameter (one read-only only
    /// because it came in a legacy capsule: saying so, and what to pass).
    #[cold]
    fn read_only(&self, param: &ParamSpec, raw: &RawTensor) -> Refusal {
        let (func, param) = (self.spec.name, param.name);
        PyErr::from(if raw.legacy {
            CallError::ReadOnlyLegacy {
                func,
                param,
                how: if raw.path == ImportPath::Capsule {
                    "passed as a legacy DLPack capsule"
                } else {
                    "exported by its producer as a legacy DLPack capsule"
                },
            }
        } else {
            CallError::ReadOnly { func, param }
        })
        .into()
    }

    /// A writable array whose strides may reach one element twice.
    #[cold]
    fn self_overlap(&self, param: &ParamSpec, raw: &RawTensor) -> Refusal {
        PyErr::from(CallError::SelfOverlap {
            func: self.spec.name,
            param: param.name,
            shape: raw.shape.to_vec(),
            strides: raw.strides.to_vec(),
        })
        .into()
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
            return self.misfit(param, what, WhyNot::WritableAligned);
        }
        if !param.convert {
            return self.misfit(param, what, WhyNot::NoConvert);
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

    #[cold]
    fn device_error(&self, param: &ParamSpec, got: Device) -> PyErr {
        CallError::Device {
            func: self.spec.name,
            param: param.name,
            want: param.devices,
            got,
        }
        .into()
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
        // A name the spec does not list (a spec written by hand, for
        // `ArrayHandle::with_spec`) fits nothing: the shape is refused.
        let fits = match_shape(dims, shape, |k, n| match names.get_mut(k as usize) {
            None => false,
            Some(slot @ None) => {
                *slot = Some(Binding {
                    extent: n,
                    param: index as u8,
                });
                true
            }
            Some(Some(b)) if b.extent == n => true,
            Some(Some(b)) => {
                conflict = Some((k, *b, n));
                false
            }
        });
        if fits {
            return Ok(());
        }
        match conflict {
            Some((k, b, n)) if b.param as usize != index => Err(CallError::Extent {
                func: self.spec.name,
                dim: self.spec.dim_names.get(k as usize).copied().unwrap_or("?"),
                first: b.extent,
                first_param: self.param_name(b.param),
                second: n,
                param: param.name,
            }
            .into()),
            _ => Err(CallError::Shape {
                func: self.spec.name,
                param: param.name,
                dims,
                names: self.spec.dim_names,
                got: shape.to_vec(),
            }
            .into()),
        }
    }
}

/// Whether `e` is no fault of the argument whose step raised it
/// (`KeyboardInterrupt`, `SystemExit`, `MemoryError`, ...): it propagates
/// unchanged, never replaced by the refusal of the argument.
pub(super) fn no_fault_of_argument(py: Python<'_>, e: &PyErr) -> bool {
    !e.is_instance_of::<pyo3::exceptions::PyException>(py)
        || e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py)
}

/// Why DLPack cannot describe NumPy's array `arr` (byte order, a dtype
/// without a DLPack code, byte strides that are not whole elements), from
/// its Python attributes; `None` when none of them is the reason.
fn why_not_in_place(arr: &Bound<'_, PyAny>) -> PyResult<Option<NotInPlace>> {
    let py = arr.py();
    let dtype = arr.getattr(pyo3::intern!(py, "dtype"))?;
    if !dtype.getattr(pyo3::intern!(py, "isnative"))?.is_truthy()? {
        let s: String = dtype.getattr(pyo3::intern!(py, "str"))?.extract()?;
        return Ok(Some(NotInPlace::ByteOrder(s)));
    }
    let kind: String = dtype.getattr(pyo3::intern!(py, "kind"))?.extract()?;
    if !matches!(kind.as_str(), "b" | "i" | "u" | "f" | "c") {
        return Ok(Some(NotInPlace::DType(dtype.str()?.to_string())));
    }
    let itemsize: isize = arr.getattr(pyo3::intern!(py, "itemsize"))?.extract()?;
    let strides: Vec<isize> = arr.getattr(pyo3::intern!(py, "strides"))?.extract()?;
    if itemsize > 0 && strides.iter().any(|s| s % itemsize != 0) {
        return Ok(Some(NotInPlace::Strides {
            strides,
            itemsize: itemsize.unsigned_abs(),
        }));
    }
    Ok(None)
}
