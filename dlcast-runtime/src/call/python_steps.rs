//! The Python steps a phase-2 pass asks for ([`PythonStep`]): an argument read
//! again through `__dlpack__`, rust-numpy's holds acquired again, and the
//! conversions of read-only arguments, each of which copies what phase 2
//! read while that read is held in the borrow registry.

use super::*;

impl<const N: usize> CallContext<N> {
    /// Runs the Python step a pass asked for, for slot `index`.
    #[cold]
    #[inline(never)]
    pub(super) fn work(&mut self, index: usize, work: PythonStep) -> PyResult<()> {
        let py = self.py();
        if let PythonStep::Recheck = work {
            return crate::borrow::rust_numpy::check(py);
        }
        let Some(obj) = self.slots[index].obj.as_ref().map(|o| o.clone_ref(py)) else {
            return Ok(());
        };
        let obj = obj.bind(py);
        match work {
            PythonStep::Dlpack => {
                self.slots[index].via_dlpack = true;
                match self.prepare_slot(index, obj, false) {
                    Err(e) => self.convert_via_numpy(index, obj, e),
                    ok => ok,
                }
            }
            PythonStep::ViaNumpy(e) => self.convert_via_numpy(index, obj, e),
            PythonStep::Rehold => self.pre_hold(index),
            PythonStep::Recheck => Ok(()),
            PythonStep::Convert {
                target,
                what,
                host,
                ndim,
            } => {
                let (tmp, hold) = self.convert_read(index, obj, host, ndim, target, &what)?;
                self.prepare_slot(index, &tmp, true).map_err(|cause| {
                    PyErr::from(CallError::CopyUnreadable {
                        func: self.spec.name,
                        param: self.spec.params[index].name,
                        what,
                        cause,
                    })
                })?;
                // The copy has finished: the original may be written again.
                drop(hold);
                if let Some((keep, _)) = &mut self.slots[index].converted {
                    *keep = tmp.unbind();
                }
                Ok(())
            }
        }
    }

    /// The conversion of slot `index` (argument `obj`) that a pass asked
    /// for, and the read entry in the borrow registry it holds: the memory
    /// the pass read, read again (no Python code ran since), is entered as
    /// read before the conversion starts, and the entry is returned to be
    /// kept until the copy has finished (NumPy's casts and PyTorch's ops
    /// release the GIL while they copy, and the conversion's own Python
    /// code may run first: no writable view may begin meanwhile). The
    /// copy is made from what was read: host memory through a NumPy array
    /// over exactly that read (see [`crate::convert::numpy_view`]), whoever
    /// produced it; device memory and dtypes NumPy lacks from a PyTorch
    /// tensor's private alias (by `TensorBase`'s own methods), else by the
    /// argument's own framework, from the argument.
    #[cold]
    #[allow(clippy::type_complexity)]
    fn convert_read<'py>(
        &mut self,
        index: usize,
        obj: &Bound<'py, PyAny>,
        host: bool,
        ndim: usize,
        target: Target,
        what: &str,
    ) -> PyResult<(Bound<'py, PyAny>, Option<crate::borrow::Borrow>)> {
        let py = obj.py();
        let param = &self.spec.params[index];
        // Python code (imports, the first time), before the read.
        let _ = crate::npapi::table(py);
        let raw =
            import::read(py, &self.slots[index].source).map_err(|e| self.import_error(param, e))?;
        let hold = match self.view_request(param, &raw, false) {
            Some(req) => self.probe_held(param, &req)?,
            None => None,
        };
        let from = match &self.slots[index].source {
            // Host memory NumPy can view, whoever produced it (a PyTorch
            // tensor's alias too): no producer code runs on the way.
            _ if crate::convert::numpy_can_convert(py, &raw, target.dtype) => {
                let owner = import::into_owner(&mut self.slots[index].source);
                match crate::convert::numpy_view(py, &raw, owner)? {
                    Some(view) => view,
                    None => {
                        let why = crate::error::Unconvertible::NotViewable;
                        return Err(self.unconvertible(param, what, why));
                    }
                }
            }
            // The alias that was read (the caller's tensor may have changed
            // since), which no one else can reach.
            Source::Torch { tensor, .. }
            | Source::Managed {
                private: Some(tensor),
                ..
            } => tensor.clone_ref(py).into_bound(py),
            _ => obj.clone(),
        };
        // The framework's conversion may run the argument's Python code (a
        // method of its class), which may call dlcast again.
        let _nested = depth::Nested::enter(self.spec.name)?;
        let tmp = self.convert(index, &from, host, ndim, target, what)?;
        Ok((tmp, hold))
    }

    /// An argument that dlcast's imports refused (`refused`) but NumPy reads:
    /// a NumPy array (or subclass) that DLPack cannot describe (byte-swapped,
    /// strides that are not whole elements), a buffer with such a format or
    /// strides. For a typed read-only parameter that converts, a native,
    /// aligned NumPy copy in the parameter's order; for one that does not
    /// (writable, `#[noconvert]`, untyped), the `TypeError` that says why it
    /// is not read in place; otherwise the refusal stands.
    #[cold]
    pub(super) fn convert_via_numpy(
        &mut self,
        index: usize,
        obj: &Bound<'_, PyAny>,
        refused: PyErr,
    ) -> PyResult<()> {
        let py = obj.py();
        // NumPy's conversion may run the argument's Python code.
        let _nested = depth::Nested::enter(self.spec.name)?;
        let Some(in_place_only) = self.numpy_may_read(index, &refused) else {
            return Err(refused);
        };
        let Some(reads) = what_numpy_reads(&self.slots[index], obj)? else {
            return Err(refused);
        };
        if in_place_only {
            // Only what dlcast itself read and could not describe: a buffer
            // it never held (the limited API below 3.11 has no buffer
            // protocol; an exporter that raised) keeps its own refusal,
            // which says why.
            if !(reads.ndarray_like || reads.held.is_some()) {
                return Err(refused);
            }
            let slot = &self.slots[index];
            let because = match (slot.writable, slot.dtype) {
                (true, _) => NoCopy::Writable,
                (false, None) => NoCopy::Untyped,
                (false, Some(_)) => NoCopy::NoConvert,
            };
            return Err(self.not_in_place(&self.spec.params[index], obj, refused, because));
        }
        let Some(dtype) = self.slots[index].dtype else {
            return Err(refused);
        };
        let array = match private_numpy_array(py, reads.held.as_ref().unwrap_or(obj)) {
            Ok(array) => array,
            Err(e) if checks::no_fault_of_argument(py, &e) => return Err(e),
            Err(_) => return Err(refused),
        };
        let shape: SmallVec<[usize; 4]> = match array.getattr(pyo3::intern!(py, "shape")) {
            Ok(s) => s.extract::<Vec<usize>>()?.into_iter().collect(),
            Err(_) => return Err(refused),
        };
        self.check_castable(index, &array, dtype, reads.buffer)?;
        self.copy_via_numpy(index, array, shape, dtype, &refused, reads.held)
    }

    /// Whether NumPy may read the argument of slot `index` that dlcast's
    /// imports refused (`refused`): `None` where the refusal stands (a
    /// writable parameter, or one that does not convert, unless the
    /// producer refused and the parameter's own `TypeError` says why);
    /// else whether the argument is only looked at to say why it is not
    /// read in place (`true`) or converted (`false`).
    fn numpy_may_read(&self, index: usize, refused: &PyErr) -> Option<bool> {
        let (slot, param) = (&self.slots[index], &self.spec.params[index]);
        // A writable parameter never converts: the producer's refusal (a
        // `BufferError`) becomes the `TypeError` of every other writable
        // refusal, naming why, where NumPy reads the argument (below).
        // So does a read-only one that does not convert (`#[noconvert]`,
        // an untyped view): the refusal is about the parameter, a
        // `TypeError` with the fix, like a dtype that does not fit.
        let producer_refused = refused.is_instance_of::<pyo3::exceptions::PyBufferError>(self.py());
        let converts = slot.dtype.is_some() && param.convert && slot.converted.is_none();
        let in_place_only = producer_refused && slot.converted.is_none() && !converts;
        if !in_place_only && (slot.writable || !converts) {
            return None;
        }
        Some(in_place_only)
    }

    /// The checks NumPy's copy of slot `index` (`array`, NumPy's own over
    /// the argument) must pass before it is made: raw bytes never convert
    /// as byte values, and the cast to `dtype` is same-kind in NumPy's
    /// words (`buffer`: the argument is a buffer-protocol object).
    fn check_castable(
        &self,
        index: usize,
        array: &Bound<'_, PyAny>,
        dtype: crate::dtype::DType,
        buffer: bool,
    ) -> PyResult<()> {
        let py = array.py();
        let param = &self.spec.params[index];
        // The same-kind rule of every conversion, in NumPy's words.
        let (np, name) = (
            py.import(pyo3::intern!(py, "numpy"))?,
            dtype.name().unwrap_or("?"),
        );
        let from = array.getattr(pyo3::intern!(py, "dtype"))?;
        // Raw bytes that dlcast did not read itself (a buffer of format `B`
        // with suboffsets; any buffer but bytes and bytearray below
        // abi3-py311) are refused here as where dlcast reads them (see
        // `checks::mismatch`): never converted as byte values.
        if buffer
            && dtype != crate::dtype::DType::UINT8
            && from
                .getattr(pyo3::intern!(py, "char"))
                .and_then(|c| c.extract::<pyo3::pybacked::PyBackedStr>())
                .is_ok_and(|c| &*c == "B")
        {
            return Err(CallError::RawBytes {
                func: self.spec.name,
                param: param.name,
                want: dtype,
                converts: true,
            }
            .into());
        }
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("casting", "same_kind")?;
        let castable = np
            .call_method("can_cast", (&from, name), Some(&kwargs))
            .and_then(|v| v.is_truthy())
            .unwrap_or(false);
        if !castable {
            return Err(CallError::NotCastable {
                func: self.spec.name,
                param: param.name,
                want: dtype,
                got: from.to_string(),
            }
            .into());
        }
        Ok(())
    }

    /// NumPy's copy of `array` (NumPy's private array over the argument of
    /// slot `index`, of shape `shape`) as `dtype` in the parameter's order,
    /// made while its memory is held as read in the borrow registry, and
    /// prepared in the argument's place; `held`, the memoryview NumPy read
    /// a held buffer through, is released once the copy is made.
    fn copy_via_numpy(
        &mut self,
        index: usize,
        array: Bound<'_, PyAny>,
        shape: SmallVec<[usize; 4]>,
        dtype: crate::dtype::DType,
        refused: &PyErr,
        held: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = array.py();
        let param = &self.spec.params[index];
        // NumPy reads the memory to convert it: not while a writable view
        // (of this call or another) holds any of its bytes.
        let read = self.probe_bytes(&array, param)?;
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
        let tmp = self.convert(index, &array, true, ndim, target, &what)?;
        drop(read);
        // The held buffer is released with the slot's source (below): the
        // memoryview over it must be released first. Only NumPy's private
        // arrays, dropped here, held exports of it; if anything still does,
        // the buffer is kept for the process rather than released under it.
        drop(array);
        if let Some(mv) = held {
            if mv.call_method0(pyo3::intern!(py, "release")).is_err() {
                std::mem::forget(import::into_owner(&mut self.slots[index].source));
            }
        }
        self.prepare_slot(index, &tmp, true)?;
        if let Some((keep, _)) = &mut self.slots[index].converted {
            *keep = tmp.unbind();
        }
        Ok(())
    }
}

/// How NumPy would read an argument dlcast refused.
struct NumpyReads<'py> {
    /// A memoryview of the buffer dlcast holds, for a buffer that phase 2
    /// could not describe.
    held: Option<Bound<'py, PyAny>>,
    /// An instance of `numpy.ndarray` or a subclass (by its type).
    ndarray_like: bool,
    /// A buffer-protocol object.
    buffer: bool,
}

/// How NumPy would read `obj`, the argument of `slot`; `None` where it does
/// not without running other producers' code.
fn what_numpy_reads<'py>(
    slot: &ArgSlot,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<NumpyReads<'py>>> {
    let py = obj.py();
    // Only what NumPy reads without running other producers' code: its
    // own arrays (subclasses included) and buffer-protocol objects. The
    // object's type decides, not `isinstance` (which believes a
    // `__class__` property: an object that is neither would have NumPy
    // run its `__array__` or `__array_interface__`).
    // A buffer that phase 2 could not describe is read by NumPy through
    // a memoryview of the buffer dlcast holds: the object is never asked
    // again (it might hand out other memory the second time).
    let held = match &slot.source {
        Source::Buffer(owner) => import::buffer_protocol::memoryview_of(py, owner)?,
        _ => None,
    };
    let ndarray_like = held.is_none()
        && py
            .import(pyo3::intern!(py, "numpy"))
            .and_then(|np| np.getattr(pyo3::intern!(py, "ndarray")))
            .is_ok_and(|t| obj.get_type().is_subclass(&t).unwrap_or(false));
    // (A memoryview, made and dropped: every abi3 level has it.)
    let buffer = held.is_some() || !ndarray_like && pyo3::types::PyMemoryView::from(obj).is_ok();
    // SAFETY: `obj` is a live object; the check reads only its type.
    let capsule = unsafe { pyo3::ffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0;
    if capsule || !(ndarray_like || buffer) {
        return Ok(None);
    }
    Ok(Some(NumpyReads {
        held,
        ndarray_like,
        buffer,
    }))
}

/// NumPy's own array over `obj`'s memory, private to dlcast.
/// `numpy.asarray` gives NumPy's own array over the argument's memory
/// (the argument itself, for an exact `numpy.ndarray`); `view()` a new
/// array over the same memory that no one else can reach, so no Python
/// code run before NumPy copies (imports, the conversion's own steps) can
/// change what the copy reads from what is probed.
fn private_numpy_array<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    py.import(pyo3::intern!(py, "numpy"))
        .and_then(|np| np.call_method1(pyo3::intern!(py, "asarray"), (obj,)))
        .and_then(|arr| {
            if numpy::is_ndarray(&arr) {
                arr.call_method0(pyo3::intern!(py, "view"))
            } else {
                Ok(arr)
            }
        })
}
