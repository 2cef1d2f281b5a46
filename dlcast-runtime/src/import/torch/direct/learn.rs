//! Learning the direct read's layout, once per process, in phase 1 of the
//! first call that prepares a PyTorch argument.
//!
//! Nothing here trusts what Python code can replace. The probe tensors are
//! made from Rust with fixed arguments by PyTorch builtins checked by
//! identity (C functions of `TensorBase`'s image, of their name), inside the
//! regions that turn torch-function and Python-dispatch modes off. A Python
//! kernel registered for one of those operators (`torch.library`) could
//! still return any tensor, so each probe is then checked through PyTorch's
//! own C answers (its class, lazy bits and inference flag through
//! `TensorBase`'s own attributes; device, shape, strides, dtype and data
//! pointer through PyTorch's exchange table). Each offset of the chosen
//! [`Known`] layout must then hold an **exact** value PyTorch's C code
//! reports for that very probe — the `TensorImpl` pointer `_cdata` gives,
//! the key set `_dispatch_keys(t).raw_repr()` gives, the addresses of the
//! exchange table's shape and strides, its data pointer, the version
//! `_version` gives — or behave as PyTorch's own code makes it behave (a
//! `.data` alias adds one storage reference and gives it back; a
//! requires-grad setter makes autograd state; `_increment_version` moves
//! the counter), and every vtable must be the one libc10 (or libtorch)
//! exports under that class's name. A value is never inferred from
//! agreement with a few samples. Any failure leaves the direct read off.

use super::OFF;
use super::*;
use crate::import::fast_read::STRONG;
use crate::import::torch::{get, is_true, phase2::tensor_impl, NoTorchFunction};
use crate::import::torch_handles::{handles, Handles};
use dlpack_rs::ffi::DLTensor;
use pyo3::types::{PyDict, PyTuple};

/// Learns the layout once (see the module documentation); later calls, and
/// calls made while it learns (a probe's kernel calling back into dlcast,
/// another thread while PyTorch left the GIL), return at once. Phase 1:
/// runs Python code.
pub(crate) fn learn(py: Python<'_>) {
    static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if LAYOUT.get().is_some() || inference_mode(py) || STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let off = std::env::var("DLCAST_TORCH_DIRECT").is_ok_and(|v| v == "off" || v == "0");
    OFF.store(off, Ordering::Relaxed);
    let verdict = verify(py);
    // A probe that failed half-way leaves no error behind.
    drop(PyErr::take(py));
    let _ = LAYOUT.set(verdict);
}

/// Whether `torch.inference_mode()` is on (its probes would be inference
/// tensors, whose key sets are not plain): learning waits for a call made
/// outside it. PyTorch's own C function (see `Handles::inference_mode`).
fn inference_mode(py: Python<'_>) -> bool {
    handles(py)
        .ok()
        .and_then(|h| h.inference_mode.call(py).ok())
        .is_some_and(|v| is_true(&v).unwrap_or(true))
}

/// What the exchange table says of a probe.
struct Seen {
    data: usize,
    shape: usize,
    strides: usize,
}

/// The layout [`KNOWN`] has for this PyTorch, verified on probes.
fn verify(py: Python<'_>) -> Result<Layout, &'static str> {
    let h = handles(py).map_err(|_| "PyTorch's C attributes are not its own")?;
    let torch = py.import("torch").map_err(|_| "torch cannot be imported")?;
    let version: String = torch
        .getattr("__version__")
        .and_then(|v| v.str())
        .map(|v| v.to_string())
        .map_err(|_| "torch.__version__ cannot be read")?;
    let release = version.split('+').next().unwrap_or_default();
    let at = KNOWN
        .iter()
        .find(|k| k.versions.contains(&release))
        .ok_or("this PyTorch release has no known layout")?
        .at;
    let _off = NoTorchFunction::enter(py, h).map_err(|_| "the disabled regions")?;
    let b = Builtins::find(py, h)?;
    let probes = Probes::make(py, &b, &torch)?;
    probes.check(h)?;
    let impls = probes.check_impls(at, h, &b)?;
    // The probes are still what PyTorch's C answers said, now that their
    // key sets were read (a finalizer run by an allocation in between could
    // have changed one).
    probes.check(h)?;
    let (impl_vtable, plain_keys) = impls;
    let storage_vtable = probes.check_storages(at, h, &b, &torch)?;
    probes.check_writes(at, h, &b, &torch)?;
    let scalar_types = scalar_types(py, at, &b, &torch)?;
    Ok(Layout {
        at,
        impl_vtable,
        storage_vtable,
        plain_keys,
        scalar_types,
    })
}

/// The PyTorch builtins the probes are made and checked with, each checked
/// by identity.
struct Builtins<'py> {
    zeros: Bound<'py, PyAny>,
    narrow: Bound<'py, PyAny>,
    neg_view: Bound<'py, PyAny>,
    lazy_clone: Bound<'py, PyAny>,
    dispatch_keys: Bound<'py, PyAny>,
    raw_repr: Bound<'py, PyAny>,
    version: Bound<'py, PyAny>,
    requires_grad_: Bound<'py, PyAny>,
}

impl<'py> Builtins<'py> {
    fn find(py: Python<'py>, h: &Handles) -> Result<Self, &'static str> {
        let image = h.base.as_ptr().cast::<std::ffi::c_void>().cast_const();
        let c = py
            .import("torch._C")
            .map_err(|_| "torch._C cannot be imported")?;
        let functions = c
            .getattr("_VariableFunctionsClass")
            .map_err(|_| "torch._C._VariableFunctionsClass is missing")?;
        if !crate::trust::is_static_type(&functions, image)
            || crate::trust::static_type_name(&functions).as_deref()
                != Some("torch._C._VariableFunctionsClass")
        {
            return Err("torch._C._VariableFunctionsClass is not PyTorch's own");
        }
        let builtin = |owner: &Bound<'py, PyAny>, name: &str| {
            owner
                .getattr(name)
                .ok()
                .filter(|f| crate::trust::is_builtin(f, name, image))
                .ok_or("a PyTorch builtin the probes use is not PyTorch's own")
        };
        // pybind11's functions: a builtin of PyTorch's image whose
        // signature (`ml_doc`, which Python code cannot change) is `sig`.
        let pybind = |f: Bound<'py, PyAny>, name: &str, sig: &str| {
            let f = crate::trust::instancemethod_function(&f).unwrap_or(f);
            let doc =
                crate::trust::builtin_doc(&f).map(|d| d.to_bytes().starts_with(sig.as_bytes()));
            (crate::trust::is_builtin(&f, name, image) && doc == Some(true))
                .then_some(f)
                .ok_or("torch._C._dispatch_keys is not PyTorch's own")
        };
        let dispatch_keys = pybind(
            c.getattr("_dispatch_keys")
                .map_err(|_| "no torch._C._dispatch_keys")?,
            "_dispatch_keys",
            "_dispatch_keys(arg0: torch.Tensor) -> torch._C.DispatchKeySet",
        )?;
        let raw_repr = c
            .getattr("DispatchKeySet")
            .and_then(|k| k.getattr("__dict__"))
            .and_then(|d| d.get_item("raw_repr"))
            .map_err(|_| "no torch._C.DispatchKeySet.raw_repr")?;
        let raw_repr = pybind(
            raw_repr,
            "raw_repr",
            "raw_repr(self: torch._C.DispatchKeySet) -> int",
        )?;
        let base_dict = h
            .base
            .bind(py)
            .getattr("__dict__")
            .map_err(|_| "torch._C.TensorBase has no __dict__")?;
        let own = |name: &str| {
            base_dict
                .get_item(name)
                .ok()
                .filter(|e| crate::trust::is_own_descriptor(e, h.base.bind(py), name))
                .ok_or("a TensorBase attribute the probes use is not PyTorch's own")
        };
        Ok(Builtins {
            zeros: builtin(&functions, "zeros")?,
            narrow: builtin(&functions, "narrow")?,
            neg_view: builtin(&functions, "_neg_view")?,
            lazy_clone: builtin(&functions, "_lazy_clone")?,
            dispatch_keys,
            raw_repr,
            version: own("_version")?,
            requires_grad_: own("requires_grad_")?,
        })
    }

    /// `zeros(shape, dtype=dtype, device="cpu")`.
    fn zeros(
        &self,
        shape: impl IntoPyObject<'py>,
        dtype: &Bound<'py, PyAny>,
    ) -> Result<Bound<'py, PyAny>, &'static str> {
        let py = self.zeros.py();
        let kw = PyDict::new(py);
        kw.set_item("dtype", dtype).map_err(|_| "a probe")?;
        kw.set_item("device", "cpu").map_err(|_| "a probe")?;
        self.zeros
            .call((shape,), Some(&kw))
            .map_err(|_| "a probe tensor cannot be made")
    }

    /// `_dispatch_keys(t).raw_repr()`: the key set PyTorch's C code reports.
    fn keys(&self, t: &Bound<'py, PyAny>) -> Result<u64, &'static str> {
        self.dispatch_keys
            .call1((t,))
            .and_then(|k| self.raw_repr.call1((k,)))
            .and_then(|v| v.extract::<u64>())
            .map_err(|_| "the key set cannot be read")
    }

    /// `t._version`, through `TensorBase`'s own getter.
    fn version(&self, t: &Bound<'py, PyAny>) -> Result<u64, &'static str> {
        get(&self.version.clone().unbind(), t)
            .and_then(|v| v.extract::<u64>())
            .map_err(|_| "the version cannot be read")
    }
}

/// The probe tensors: `a = zeros((3,), float64)`, `b = zeros((2, 3),
/// float32)`, `c = narrow(a, 0, 1, 2)`, `n = _neg_view(a)`.
struct Probes<'py> {
    a: Bound<'py, PyAny>,
    b: Bound<'py, PyAny>,
    c: Bound<'py, PyAny>,
    n: Bound<'py, PyAny>,
}

/// What each probe must be: ndim, shape, strides, storage offset, numel,
/// dtype bits, negative.
struct Expected {
    shape: &'static [i64],
    strides: &'static [i64],
    offset: u64,
    numel: u64,
    bits: u8,
    negative: bool,
}

const EXPECTED: [Expected; 4] = [
    Expected {
        shape: &[3],
        strides: &[1],
        offset: 0,
        numel: 3,
        bits: 64,
        negative: false,
    },
    Expected {
        shape: &[2, 3],
        strides: &[3, 1],
        offset: 0,
        numel: 6,
        bits: 32,
        negative: false,
    },
    Expected {
        shape: &[2],
        strides: &[1],
        offset: 1,
        numel: 2,
        bits: 64,
        negative: false,
    },
    Expected {
        shape: &[3],
        strides: &[1],
        offset: 0,
        numel: 3,
        bits: 64,
        negative: true,
    },
];

impl<'py> Probes<'py> {
    fn make(
        py: Python<'py>,
        b: &Builtins<'py>,
        torch: &Bound<'py, PyAny>,
    ) -> Result<Self, &'static str> {
        let dtype = |name| {
            torch
                .getattr(name)
                .map_err(|_| "a dtype of torch is missing")
        };
        let a = b.zeros((3,), &dtype("float64")?)?;
        let probe_b = b.zeros((2, 3), &dtype("float32")?)?;
        let c = b.narrow.call1((&a, 0, 1, 2)).map_err(|_| "narrow")?;
        let n = b.neg_view.call1((&a,)).map_err(|_| "_neg_view")?;
        let _ = py;
        Ok(Probes {
            a,
            b: probe_b,
            c,
            n,
        })
    }

    fn all(&self) -> [&Bound<'py, PyAny>; 4] {
        [&self.a, &self.b, &self.c, &self.n]
    }

    /// Each probe is what was asked, by PyTorch's C answers; returns the
    /// class PyTorch's C code makes tensors of.
    fn check(&self, h: &Handles) -> Result<Bound<'py, pyo3::types::PyType>, &'static str> {
        let py = self.a.py();
        // A tensor PyTorch's C code just made (`.data`, no Python dispatch):
        // an instance of the class PyTorch registered as `torch.Tensor`.
        let alias = get(&h.data, &self.a).map_err(|_| "x.data")?;
        let tensor_type = alias.get_type();
        drop(alias);
        if crate::import::exchange::torch_tensor_class(py).is_some_and(|t| !t.is(&tensor_type)) {
            return Err("torch.Tensor is not the class PyTorch made earlier tensors of");
        }
        let api = crate::import::exchange::torch_table(py).ok_or("no PyTorch exchange table")?;
        let yes_no = |m: &Py<PyAny>, t: &Bound<'py, PyAny>| {
            m.bind(py)
                .call1((t,))
                .and_then(|v| is_true(&v))
                .map_err(|_| "a C answer")
        };
        let mut data = [0usize; 4];
        for (k, (t, e)) in self.all().into_iter().zip(&EXPECTED).enumerate() {
            let plain = t.get_type().is(&tensor_type)
                && !get(&h.python_dispatch, t)
                    .and_then(|v| is_true(&v))
                    .map_err(|_| "a C answer")?
                && yes_no(&h.is_neg, t)? == e.negative
                && !yes_no(&h.is_conj, t)?
                && !yes_no(&h.is_zerotensor, t)?
                && !yes_no(&h.is_inference, t)?;
            let seen = exchange_read(t, api)?;
            if !plain || seen.0.ndim != e.shape.len() as i32 {
                return Err("a probe tensor is not what was asked");
            }
            let d = &seen.0;
            // SAFETY: the table filled `d` for `t`, which is alive and
            // unchanged (no Python code since); `ndim` entries each.
            let (shape, strides) = unsafe {
                (
                    std::slice::from_raw_parts(d.shape, e.shape.len()),
                    std::slice::from_raw_parts(d.strides, e.shape.len()),
                )
            };
            if shape != e.shape
                || strides != e.strides
                || d.device.device_type as i32 != crate::device::kind::CPU
                || d.dtype.code != dlpack_rs::ffi::DLDataTypeCode::kDLFloat as u8
                || d.dtype.bits != e.bits
                || d.dtype.lanes != 1
                || d.byte_offset != 0
                || d.data.is_null()
            {
                return Err("a probe tensor is not what was asked");
            }
            data[k] = seen.1.data;
        }
        // c starts one float64 after a; n is a's memory; b is its own.
        if data[2] != data[0] + 8 || data[3] != data[0] || data[1] == data[0] {
            return Err("a probe tensor is not what was asked");
        }
        Ok(tensor_type)
    }

    /// The `TensorImpl` fields: returns its vtable and the plain key set.
    fn check_impls(
        &self,
        at: Offsets,
        h: &Handles,
        b: &Builtins<'py>,
    ) -> Result<(u64, u64), &'static str> {
        let py = self.a.py();
        let api = crate::import::exchange::torch_table(py).ok_or("no PyTorch exchange table")?;
        let bad = |what| -> Result<(), &'static str> { Err(what) };
        let mut vtable = None;
        let mut keys = [0u64; 4];
        for (k, (t, e)) in self.all().into_iter().zip(&EXPECTED).enumerate() {
            let tensor = tensor_impl(t, h).map_err(|_| "_cdata")?;
            // SAFETY: `t` is a live tensor of the class checked above (a
            // `THPVariable`, 40 bytes: the `cdata` offset under test lies
            // within), and `tensor` its live `TensorImpl` (PyTorch's
            // `_cdata`), at least the 176 bytes of a `c10::TensorImpl`, in
            // which every offset of `KNOWN` lies.
            let (object, p) = unsafe {
                (
                    Object::new(t.as_ptr().cast()).ok_or("a probe")?,
                    Object::new(tensor as *const u8).ok_or("_cdata")?,
                )
            };
            if object.word(at.cdata) != tensor as u64 {
                bad("the TensorImpl is not where the layout says")?;
            }
            let (_, seen) = exchange_read(t, api)?;
            let v = p.word(0);
            if *vtable.get_or_insert(v) != v
                || !vtable_of(v, "_ZTVN3c1010TensorImplE", Some("libc10"))
            {
                bad("a TensorImpl's vtable is not c10::TensorImpl's")?;
            }
            let (rank, offset, numel, dtype) = (
                p.word(at.rank),
                p.word(at.storage_offset),
                p.word(at.numel),
                p.half(at.dtype),
            );
            let name = if e.bits == 64 { "float64" } else { "float32" };
            let code = SCALAR_TYPES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, c)| *c);
            if rank != e.shape.len() as u64
                || seen.shape != p.field(at.sizes) as usize
                || seen.strides != p.field(at.strides) as usize
                || offset != e.offset
                || numel != e.numel
                || Some(dtype) != code
            {
                bad("a TensorImpl field is not where the layout says")?;
            }
            keys[k] = p.word(at.key_set);
            if keys[k] != b.keys(t)? {
                bad("the key set is not where the layout says")?;
            }
        }
        let [a, bk, c, n] = keys;
        if a != bk || a != c || (a ^ n).count_ones() != 1 {
            bad("the probes' key sets are not those of plain tensors")?;
        }
        Ok((vtable.unwrap_or_default(), a))
    }

    /// The `StorageImpl` fields: returns its vtable.
    fn check_storages(
        &self,
        at: Offsets,
        h: &Handles,
        b: &Builtins<'py>,
        torch: &Bound<'py, PyAny>,
    ) -> Result<u64, &'static str> {
        let py = self.a.py();
        let api = crate::import::exchange::torch_table(py).ok_or("no PyTorch exchange table")?;
        let storage_of = |t: &Bound<'py, PyAny>| -> Result<Object, &'static str> {
            let p = tensor_impl(t, h).map_err(|_| "_cdata")? as *const u8;
            // SAFETY: `t`'s live `TensorImpl` (verified by `check_impls`),
            // and what its `storage_` points to: NULL or its live
            // `StorageImpl`, at least 96 bytes (every storage offset of
            // `KNOWN` lies within), whose vtable is checked before anything
            // read of it is trusted.
            let s = unsafe { Object::new(p).and_then(|p| p.at(at.storage)) };
            match s {
                Some(s) if vtable_of(s.word(0), "_ZTVN3c1011StorageImplE", Some("libc10")) => Ok(s),
                _ => Err("a StorageImpl is not where the layout says"),
            }
        };
        let [sa, sb, sc, sn] = [&self.a, &self.b, &self.c, &self.n].map(storage_of);
        let (sa, sb) = (sa?, sb?);
        let same = |x: Object, y: Object| x.field(0) == y.field(0);
        if !same(sc?, sa) || !same(sn?, sa) || same(sb, sa) {
            return Err("the probes' storages are not where the layout says");
        }
        for (s, t) in [(sa, &self.a), (sb, &self.b)] {
            let (data, size, check) = (
                s.word(at.data),
                s.word(at.size_bytes),
                s.byte(at.mutable_check),
            );
            if data != exchange_read(t, api)?.1.data as u64 || size != 24 || check != 0 {
                return Err("a StorageImpl field is not where the layout says");
            }
        }
        // A `.data` alias takes one reference to the storage and gives it
        // back when freed.
        let count = || sa.word(at.storage_refcount) & STRONG;
        let before = count();
        let alias = get(&h.data, &self.a).map_err(|_| "x.data")?;
        let with = count();
        drop(alias);
        if with != before + 1 || count() != before || before == 0 {
            return Err("the storage's reference count is not where the layout says");
        }
        // Copy-on-write (`_lazy_clone`) marks both storages for checks.
        let w = b.zeros((3,), &torch.getattr("float64").map_err(|_| "float64")?)?;
        let sw = storage_of(&w)?;
        let plain = sw.byte(at.mutable_check);
        let k = b.lazy_clone.call1((&w,)).map_err(|_| "_lazy_clone")?;
        let sk = storage_of(&k)?;
        let marked = (sw.byte(at.mutable_check), sk.byte(at.mutable_check));
        if plain != 0 || marked != (1, 1) {
            return Err("the storage's check byte is not where the layout says");
        }
        Ok(sa.word(0))
    }

    /// Autograd state and the version counter.
    fn check_writes(
        &self,
        at: Offsets,
        h: &Handles,
        b: &Builtins<'py>,
        torch: &Bound<'py, PyAny>,
    ) -> Result<(), &'static str> {
        let py = self.a.py();
        let impl_of = |t: &Bound<'py, PyAny>| {
            let p = tensor_impl(t, h).map_err(|_| "_cdata")? as *const u8;
            // SAFETY: `t`'s live `TensorImpl` (PyTorch's `_cdata`), whose
            // layout `check_impls` verified.
            unsafe { Object::new(p) }.ok_or("_cdata")
        };
        let g = b.zeros((3,), &torch.getattr("float64").map_err(|_| "float64")?)?;
        let pg = impl_of(&g)?;
        let before = pg.word(at.autograd_meta);
        b.requires_grad_
            .call1((&g, true))
            .map_err(|_| "requires_grad_")?;
        // SAFETY: what `autograd_meta_` points to: NULL or `g`'s live
        // autograd metadata, of which only the first word (the vtable) is
        // read.
        let meta = unsafe { pg.at(at.autograd_meta) };
        let autograd =
            |m: Object| vtable_of(m.word(0), "_ZTVN5torch8autograd12AutogradMetaE", None);
        if before != 0 || !meta.is_some_and(autograd) {
            return Err("autograd state is not where the layout says");
        }
        let pa = impl_of(&self.a)?;
        let counter_class = |c: &Object| {
            vtable_of(
                c.word(0),
                "_ZTVN3c1015VariableVersion14VersionCounterE",
                None,
            )
        };
        // SAFETY: what `version_counter_` points to: NULL or `a`'s live
        // `VersionCounter` (24 bytes), whose vtable is checked before
        // anything else of it is used.
        let counter = unsafe { pa.at(at.version_counter) }
            .filter(counter_class)
            .ok_or("the version counter is not where the layout says")?;
        // SAFETY: `version_` of that counter (its class checked): an
        // aligned 32-bit atomic, live while `a` is.
        let version = unsafe { &*counter.field(at.version).cast::<AtomicU32>() };
        let v0 = b.version(&self.a)?;
        let tuple = PyTuple::new(py, [&self.a]).map_err(|_| "a tuple")?;
        h.increment_version
            .bind(py)
            .call1((tuple,))
            .map_err(|_| "_increment_version")?;
        let v1 = u64::from(version.load(Ordering::SeqCst));
        version.fetch_add(1, Ordering::SeqCst);
        if v1 != v0 + 1 || b.version(&self.a)? != v0 + 2 {
            return Err("the version counter is not where the layout says");
        }
        Ok(())
    }
}

/// The `TypeMeta` index of each dtype PyTorch has, each checked on a probe
/// of that dtype against the exchange table's dtype and [`SCALAR_TYPES`]; a
/// dtype this PyTorch lacks stays unverified (`u16::MAX`: the general path).
fn scalar_types<'py>(
    py: Python<'py>,
    at: Offsets,
    b: &Builtins<'py>,
    torch: &Bound<'py, PyAny>,
) -> Result<[u16; crate::facts::DTYPES.len()], &'static str> {
    let api = crate::import::exchange::torch_table(py).ok_or("no PyTorch exchange table")?;
    let h = handles(py).map_err(|_| "handles")?;
    let mut out = [u16::MAX; crate::facts::DTYPES.len()];
    for (row, d) in crate::facts::DTYPES.iter().enumerate() {
        let Some(&(_, code)) = SCALAR_TYPES.iter().find(|(n, _)| *n == d.name) else {
            continue;
        };
        let Ok(dtype) = torch.getattr(d.name) else {
            continue;
        };
        let t = b.zeros((1,), &dtype)?;
        let Ok((dl, _)) = exchange_read(&t, api) else {
            continue;
        };
        let p = tensor_impl(&t, h).map_err(|_| "_cdata")? as *const u8;
        // SAFETY: `t`'s live `TensorImpl` (PyTorch's `_cdata`), at the
        // layout verified on the probes.
        let p = unsafe { Object::new(p) }.ok_or("_cdata")?;
        let (vtable, index) = (p.word(0), p.half(at.dtype));
        if dl.dtype.code != d.code
            || dl.dtype.bits != d.bits
            || dl.dtype.lanes != 1
            || index != code
            || !vtable_of(vtable, "_ZTVN3c1010TensorImplE", Some("libc10"))
        {
            return Err("a dtype's ScalarType is not what the table says");
        }
        out[row] = code;
    }
    Ok(out)
}

/// `t` as PyTorch's exchange table describes it (`t` of its class: the
/// caller checked), with the addresses of its data, shape and strides.
fn exchange_read(
    t: &Bound<'_, PyAny>,
    api: &'static dlpack_rs::ffi::DLPackExchangeAPI,
) -> Result<(DLTensor, Seen), &'static str> {
    let read = api
        .dltensor_from_py_object_no_sync
        .ok_or("no exchange read")?;
    // SAFETY: DLTensor is plain data; all-zero is a valid value to overwrite.
    let mut d: DLTensor = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a live tensor of PyTorch's class; the table fills `d`
    // and returns 0, or returns -1 with an exception set (taken by `learn`).
    if unsafe { read(t.as_ptr().cast(), &mut d) } != 0 {
        return Err("the exchange table cannot describe a probe");
    }
    let seen = Seen {
        data: d.data as usize,
        shape: d.shape as usize,
        strides: d.strides as usize,
    };
    Ok((d, seen))
}

/// Whether `v` is the address point (the exported symbol + 16) of the
/// vtable named `symbol`, in a library whose file name starts with
/// `library` where one is given (the dynamic loader's answer, which Python
/// code cannot change).
fn vtable_of(v: u64, symbol: &str, library: Option<&str>) -> bool {
    #[cfg(unix)]
    {
        if v == 0 {
            return false;
        }
        // SAFETY: `Dl_info` is four pointers, for which all zeroes is valid.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `dladdr` only reads the loader's tables; `info` is a valid
        // out pointer, written on success.
        if unsafe { libc::dladdr(v as *const std::ffi::c_void, &mut info) } == 0
            || info.dli_sname.is_null()
            || info.dli_fname.is_null()
        {
            return false;
        }
        // SAFETY: non-NULL C strings of the loader's, alive while the
        // library is loaded (it is: `v` lies in it).
        let (name, file) = unsafe {
            (
                std::ffi::CStr::from_ptr(info.dli_sname),
                std::ffi::CStr::from_ptr(info.dli_fname),
            )
        };
        let file = file.to_string_lossy();
        let base = file.rsplit('/').next().unwrap_or_default();
        name.to_bytes() == symbol.as_bytes()
            && info.dli_saddr as u64 + 16 == v
            && library.is_none_or(|l| base.starts_with(l))
    }
    #[cfg(not(unix))]
    {
        let _ = (v, symbol, library);
        false
    }
}
