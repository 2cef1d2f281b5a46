//! The direct read of a PyTorch CPU tensor: its `TensorImpl` and
//! `StorageImpl` read where PyTorch's C++ keeps them, at a layout verified
//! once per process ([`learn`]), with no PyTorch call and no Python code.
//!
//! Why it is sound. What the general path asks PyTorch through Python-level
//! calls (the Python dispatch key, the negative, conjugate and zero-tensor
//! bits, inference, the device) are all functions of the tensor's
//! dispatch key set: the read compares the whole key set for **equality**
//! with the value of a tensor PyTorch's own C methods verified as plain
//! (never a bit test, so a key PyTorch adds later sends the tensor to the
//! general path), and the `TensorImpl`'s vtable with plain
//! `c10::TensorImpl`'s (every subclass of it — batched, functional,
//! wrapper, nested, sparse, quantized, opaque — has its own). The private
//! alias of the general path is replaced by a reference to the
//! `StorageImpl`, taken by one atomic step of its reference count
//! ([`Hold`]): `x.set_()`, `x.data = ...` and `torch.utils.swap_tensors`
//! change the caller's tensor, not the held storage, and sizes, strides and
//! offset were copied out at the read. The read runs in phase 2, after the
//! last Python code of the call, and no Python code runs between it and
//! the body, so nothing can change what it read in between.
//!
//! What is not read directly goes to the general path, which stays the one
//! definition of what is accepted: another class (but verified subclasses,
//! see [`Layout::accepts`]), another key set or vtable, a rank above
//! [`FAST_DIMS`], a dtype the view does not take, a storage whose accesses
//! PyTorch checks first (copy-on-write, throw-on-access: its
//! `has_mutable_data_ptr_check_` byte), a reference count in a state where
//! taking a reference would not be a plain increment, and for a writable
//! parameter a tensor with autograd state (whether it requires grad takes
//! a PyTorch call).
//!
//! The layout is one of [`KNOWN`], chosen by PyTorch's version and then
//! pinned, field by field, by exact values PyTorch's C code reports for
//! probe tensors (see [`learn`]); any disagreement, an unknown version, or
//! `DLCAST_TORCH_DIRECT=off` in the environment leaves the direct read off
//! for the process: Python code can only make dlcast slower.

use crate::dtype::DType;
use crate::import::fast_read::{Hold, NpRead, TorchRead, FAST_DIMS};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

mod learn;
pub(super) use learn::learn;

/// Where PyTorch keeps what the read needs, in bytes, for one release (one
/// row of [`KNOWN`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offsets {
    /// In the tensor's Python object (`THPVariable`): its `TensorImpl *`.
    pub(crate) cdata: usize,
    /// In `c10::TensorImpl`.
    pub(crate) storage: usize,
    pub(crate) autograd_meta: usize,
    pub(crate) version_counter: usize,
    /// The rank (`SizesAndStrides::size_`), then the inline sizes and the
    /// inline strides ([`INLINE`] each).
    pub(crate) rank: usize,
    pub(crate) sizes: usize,
    pub(crate) strides: usize,
    pub(crate) storage_offset: usize,
    pub(crate) numel: usize,
    /// `caffe2::TypeMeta`'s 16-bit index: `c10::ScalarType` for every
    /// scalar type ([`SCALAR_TYPES`]).
    pub(crate) dtype: usize,
    pub(crate) key_set: usize,
    /// In `c10::StorageImpl`: its combined reference count, the data
    /// pointer, `size_bytes_` and the `has_mutable_data_ptr_check_` byte.
    pub(crate) storage_refcount: usize,
    pub(crate) data: usize,
    pub(crate) size_bytes: usize,
    pub(crate) mutable_check: usize,
    /// In `c10::VariableVersion::VersionCounter`: `version_`.
    pub(crate) version: usize,
}

/// The sizes and strides `SizesAndStrides` keeps inline (more: out of line,
/// not read).
pub(crate) const INLINE: usize = 5;

/// A release's layout: the versions it was verified for, by the headers
/// they ship and by [`learn`] on a machine (`make torch-versions`).
pub(crate) struct Known {
    /// `torch.__version__` up to its local part (`"2.15.0"` of
    /// `"2.15.0+cu132"`).
    pub(crate) versions: &'static [&'static str],
    pub(crate) at: Offsets,
}

/// The layouts dlcast knows. Adding a release: its headers give the
/// offsets (2.14.1's and 2.15.0's are the same, byte for byte), it goes
/// into `scripts/torch-versions.txt`, and `make torch-versions` runs the
/// PyTorch tests under it, `test_torch_direct.py` included (which fails
/// unless its layout is learnt).
pub(crate) const KNOWN: &[Known] = &[Known {
    versions: &["2.15.0", "2.14.1"],
    at: Offsets {
        cdata: 16,
        storage: 16,
        autograd_meta: 24,
        version_counter: 40,
        rank: 56,
        sizes: 64,
        strides: 104,
        storage_offset: 144,
        numel: 152,
        dtype: 160,
        key_set: 168,
        storage_refcount: 8,
        data: 16,
        size_bytes: 48,
        mutable_check: 59,
        version: 16,
    },
}];

/// PyTorch's `c10::ScalarType` number of each dtype of dlcast's table that
/// PyTorch has (the index its `TypeMeta` keeps), by the table's name;
/// each is checked against a probe tensor of that dtype by [`learn`], and
/// against [`crate::facts::DTYPES`] by a test.
pub(crate) const SCALAR_TYPES: &[(&str, u16)] = &[
    ("uint8", 0),
    ("int8", 1),
    ("int16", 2),
    ("int32", 3),
    ("int64", 4),
    ("float16", 5),
    ("float32", 6),
    ("float64", 7),
    ("complex64", 9),
    ("complex128", 10),
    ("bool", 11),
    ("bfloat16", 15),
    ("float8_e5m2", 23),
    ("float8_e4m3fn", 24),
    ("float8_e5m2fnuz", 25),
    ("float8_e4m3fnuz", 26),
    ("uint16", 27),
    ("uint32", 28),
    ("uint64", 29),
    ("float8_e8m0fnu", 44),
];

/// What [`learn`] verified: the layout, and the values a plain tensor
/// carries.
pub(crate) struct Layout {
    pub(crate) at: Offsets,
    /// The vtable address points of `c10::TensorImpl` and
    /// `c10::StorageImpl` (libc10's exported vtables + 16).
    pub(crate) impl_vtable: u64,
    pub(crate) storage_vtable: u64,
    /// The key set of a dense CPU tensor PyTorch verified plain.
    pub(crate) plain_keys: u64,
    /// The `TypeMeta` index of each row of [`crate::facts::DTYPES`]
    /// (`u16::MAX`: none, or not verified).
    pub(crate) scalar_types: [u16; crate::facts::DTYPES.len()],
}

/// The direct read of the process: `None` until [`learn`] ran, then its
/// verdict (the reason it is off, for tests and the guide).
static LAYOUT: std::sync::OnceLock<Result<Layout, &'static str>> = std::sync::OnceLock::new();

/// `DLCAST_TORCH_DIRECT=off` in the environment when the layout was learnt:
/// no tensor is read directly (the layout is still learnt and verified, for
/// the general path's storage check, [`Layout::within_storage`]).
static OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The learnt layout, if the direct read is on (phase 2: loads, no Python
/// code; never learns).
#[inline(always)]
pub(crate) fn layout() -> Option<&'static Layout> {
    verified().filter(|_| !OFF.load(Ordering::Relaxed))
}

/// The learnt layout, whether or not the direct read is on.
#[inline(always)]
pub(crate) fn verified() -> Option<&'static Layout> {
    LAYOUT.get().and_then(|l| l.as_ref().ok())
}

/// For tests: `None` before the first PyTorch argument, then `Ok(())` if
/// tensors are read directly, else why not.
#[doc(hidden)]
pub fn state() -> Option<Result<(), &'static str>> {
    match LAYOUT.get()? {
        Ok(_) if OFF.load(Ordering::Relaxed) => Some(Err("turned off (DLCAST_TORCH_DIRECT=off)")),
        Ok(_) => Some(Ok(())),
        Err(e) => Some(Err(*e)),
    }
}

impl Layout {
    /// Whether `obj`'s class is one whose instances are read directly:
    /// `torch.Tensor` or a subclass, noted by the general path while it
    /// declared nothing, and unchanged since ([`CLASSES`]).
    #[inline(always)]
    pub(crate) fn accepts(&self, obj: &Bound<'_, PyAny>) -> bool {
        class_ok(obj)
    }

    /// Phase 2: the read of `obj` as a view of `want` (`itemsize` bytes an
    /// element) needs it, or `None` for the general path (any object
    /// [`Layout::accepts`] does not accept among them). No Python code, no
    /// allocation, no PyTorch call.
    #[inline(always)]
    pub(crate) fn read(
        &self,
        obj: &Bound<'_, PyAny>,
        want: DType,
        itemsize: usize,
        writable: bool,
    ) -> Option<NpRead> {
        let at = &self.at;
        if !self.accepts(obj) {
            return None;
        }
        let code = *self.scalar_types.get(want.row()?)?;
        if code == u16::MAX || want == DType::BOOL || usize::from(want.bits) != itemsize * 8 {
            return None;
        }
        let (tensor, storage) = self.plain_objects(obj, code)?;

        let rank = usize::try_from(tensor.word(at.rank)).ok()?;
        let offset = isize::try_from(tensor.word(at.storage_offset) as i64).ok()?;
        if rank == 0 || rank > FAST_DIMS.min(INLINE) || offset < 0 {
            return None;
        }
        let data = storage.word(at.data) as *mut u8;
        let size_bytes = isize::try_from(storage.word(at.size_bytes) as i64).ok()?;
        if data.is_null() || size_bytes < 0 {
            return None;
        }
        let version = self.version_to_bump(tensor, writable)?;

        let item = itemsize as isize;
        let mut read = NpRead {
            data,
            ndim: rank,
            dims: [0; FAST_DIMS],
            strides: [0; FAST_DIMS],
            dtype: want,
            read_only: false,
            hi: item,
            torch: None,
        };
        let count = self.sizes_and_strides(tensor, item, &mut read)?;
        // Every byte reached lies in the storage's bytes (a storage resized
        // under the tensor before the call is refused), and is addressable.
        let start = offset.checked_mul(item)?;
        if start.checked_add(read.hi)? > size_bytes || count > isize::MAX as usize {
            return None;
        }
        read.data = (data as usize).checked_add(start as usize)? as *mut u8;
        (read.data as usize).checked_add(read.hi as usize)?;

        read.torch = Some(self.hold(storage, version)?);
        Some(read)
    }

    /// `obj`'s `TensorImpl` and `StorageImpl` where both are of the plain
    /// classes whose fields lie at the verified offsets, the tensor has a
    /// plain tensor's key set and the dtype `code`, and the storage checks
    /// none of its accesses; else `None`.
    #[inline(always)]
    fn plain_objects(&self, obj: &Bound<'_, PyAny>, code: u16) -> Option<(Object, Object)> {
        let at = &self.at;
        // SAFETY: `obj` is an instance of `torch.Tensor` or a subclass
        // (`accepts`, checked by the caller): a `THPVariable`, whose
        // `TensorImpl *` lies at `cdata` (verified by `learn`), a live
        // `TensorImpl` the object holds (the caller holds the object), whose
        // `storage_` is NULL or a live `StorageImpl` it holds.
        let (tensor, storage) = unsafe {
            let tensor = Object::new(obj.as_ptr().cast())?.at(at.cdata)?;
            (tensor, tensor.at(at.storage)?)
        };
        // The vtables are compared first: plain `c10::TensorImpl` and
        // `StorageImpl`, whose fields lie at the verified offsets.
        if tensor.word(0) != self.impl_vtable
            || tensor.word(at.key_set) != self.plain_keys
            || tensor.half(at.dtype) != code
            || storage.word(0) != self.storage_vtable
            || storage.byte(at.mutable_check) != 0
        {
            return None;
        }
        Some((tensor, storage))
    }

    /// For a writable parameter, the `VersionCounter` to bump (`Some(None)`
    /// for a read-only one); `None` (the general path) for a tensor with
    /// autograd state: whether it requires grad is PyTorch's to say.
    #[inline(always)]
    fn version_to_bump(
        &self,
        tensor: Object,
        writable: bool,
    ) -> Option<Option<std::ptr::NonNull<u8>>> {
        let at = &self.at;
        match writable {
            true if tensor.word(at.autograd_meta) != 0 => None,
            true => Some(Some(std::ptr::NonNull::new(
                tensor.word(at.version_counter) as *mut u8,
            )?)),
            false => Some(None),
        }
    }

    /// Copies the `rank` (`read.ndim`) sizes and strides into `read`,
    /// extending `read.hi` by each dimension's reach (`item` bytes an
    /// element); the element count, or `None` (the general path) for an
    /// empty tensor, a negative stride or an overflow.
    #[inline(always)]
    fn sizes_and_strides(&self, tensor: Object, item: isize, read: &mut NpRead) -> Option<usize> {
        let at = &self.at;
        let mut count = 1usize;
        for k in 0..read.ndim {
            let n = tensor.word(at.sizes + 8 * k) as i64;
            let s = tensor.word(at.strides + 8 * k) as i64;
            // Empty tensors and negative strides: the general path.
            let (n, s) = (isize::try_from(n).ok()?, isize::try_from(s).ok()?);
            if n <= 0 || s < 0 {
                return None;
            }
            count = count.checked_mul(n as usize)?;
            read.hi = read
                .hi
                .checked_add((n - 1).checked_mul(s)?.checked_mul(item)?)?;
            read.dims[k] = n as usize;
            read.strides[k] = s;
        }
        Some(count)
    }

    /// What the call holds of a read: a reference to `storage` (if taking
    /// one is a plain increment, else `None`: the general path), and the
    /// address of `version_`, the counter to bump, in `version`.
    #[inline(always)]
    fn hold(&self, storage: Object, version: Option<std::ptr::NonNull<u8>>) -> Option<TorchRead> {
        let at = &self.at;
        // SAFETY: `storage_refcount` is the storage's combined reference
        // count (verified by `learn`), an aligned 64-bit atomic PyTorch
        // updates only atomically; live (as in `plain_objects`).
        let hold = unsafe { Hold::take(storage.field(at.storage_refcount).cast_mut().cast()) }?;
        Some(TorchRead {
            storage: std::cell::Cell::new(Some(hold)),
            version: version.map(|v| {
                // SAFETY: a live `VersionCounter` (held by the `TensorImpl`,
                // as in `plain_objects`); `version_` an aligned 32-bit atomic
                // at a verified offset. Only the address is taken here.
                unsafe { v.add(at.version) }.cast::<AtomicU32>()
            }),
        })
    }
}

impl Layout {
    /// Whether every byte `raw` (a read of `tensor`, an exact tensor PyTorch
    /// made: the general path's private alias) reaches lies in its storage's
    /// bytes; `true` where the `TensorImpl` or the `StorageImpl` is not of
    /// the plain classes whose layout was verified (nothing known). Phase 2:
    /// no Python code.
    pub(crate) fn within_storage(
        &self,
        tensor: &Bound<'_, PyAny>,
        raw: &crate::import::RawTensor,
    ) -> bool {
        let at = &self.at;
        let Some(extent) = raw.extent else {
            return true;
        };
        // SAFETY: as in `plain_objects`: a `THPVariable` (an exact tensor), its live
        // `TensorImpl`, and that one's `StorageImpl`.
        let Some((tensor, storage)) = (unsafe {
            Object::new(tensor.as_ptr().cast())
                .and_then(|t| t.at(at.cdata))
                .and_then(|t| Some((t, t.at(at.storage)?)))
        }) else {
            return true;
        };
        if tensor.word(0) != self.impl_vtable || storage.word(0) != self.storage_vtable {
            return true;
        }
        let (data, size) = (
            storage.word(at.data) as usize,
            storage.word(at.size_bytes) as i64,
        );
        let Ok(size) = usize::try_from(size) else {
            return false;
        };
        let Some(base) = (raw.data as usize).checked_add(raw.byte_offset) else {
            return false;
        };
        let span = base
            .checked_add_signed(extent.lo)
            .zip(base.checked_add_signed(extent.hi));
        span.is_some_and(|(lo, hi)| {
            lo >= data && data.checked_add(size).is_some_and(|end| hi <= end)
        })
    }
}

/// A live PyTorch C++ object whose fields at the verified offsets lie
/// within it: a `c10::TensorImpl` (of that class or a subclass, whose
/// objects start with its fields; at least 176 bytes), a
/// `c10::StorageImpl` (at least 96), a `VersionCounter` or autograd's
/// metadata, or a tensor's Python object (`THPVariable`). Read under the
/// GIL with no Python code and no PyTorch call running on this thread
/// (tensor metadata changes only under the GIL).
#[derive(Clone, Copy)]
pub(crate) struct Object(*const u8);

impl Object {
    /// # Safety
    /// `p` must be such an object (see [`Object`]), alive while the value
    /// is used, and the offsets read those of its verified layout.
    #[inline(always)]
    pub(crate) unsafe fn new(p: *const u8) -> Option<Object> {
        (!p.is_null()).then_some(Object(p))
    }

    /// The aligned 64-bit word at `at`.
    #[inline(always)]
    pub(crate) fn word(self, at: usize) -> u64 {
        // SAFETY: `new`'s contract: a field of the live object.
        unsafe { self.0.add(at).cast::<u64>().read() }
    }

    /// The 16-bit field at `at`.
    #[inline(always)]
    pub(crate) fn half(self, at: usize) -> u16 {
        // SAFETY: as in `word`.
        unsafe { self.0.add(at).cast::<u16>().read() }
    }

    /// The byte at `at`.
    #[inline(always)]
    pub(crate) fn byte(self, at: usize) -> u8 {
        // SAFETY: as in `word`.
        unsafe { self.0.add(at).read() }
    }

    /// The object the pointer at `at` points to, if not NULL.
    ///
    /// # Safety
    /// As [`Object::new`] for what the field points to.
    #[inline(always)]
    pub(crate) unsafe fn at(self, at: usize) -> Option<Object> {
        // SAFETY: the caller's contract.
        unsafe { Object::new(self.word(at) as *const u8) }
    }

    /// The address of the field at `at`.
    #[inline(always)]
    pub(crate) fn field(self, at: usize) -> *const u8 {
        self.0.wrapping_add(at)
    }
}

/// Bumps each version counter a writable direct read noted (see
/// [`TorchRead::version`]): what PyTorch's own `VariableVersion::bump()`
/// does for a tensor with a counter (one atomic increment), so that a graph
/// that saved the tensor raises instead of using changed data. Phase 2,
/// once every argument passed, in the same step as the reads (no Python
/// code in between, so each counter is still its tensor's).
#[inline(always)]
pub(crate) fn bump(read: &NpRead) {
    if let Some(v) = read.torch.as_ref().and_then(|t| t.version) {
        // SAFETY: see `TorchRead::version`: the counter of a `TensorImpl`
        // the caller's object still holds (no Python code ran since the
        // read).
        unsafe { v.as_ref() }.fetch_add(1, Ordering::SeqCst);
    }
}

/// The classes whose instances are read directly: `torch.Tensor` and its
/// subclasses, each noted by the general path once it found, in phase 1,
/// that the class declares nothing (no read-only declaration of its own or
/// planted on it, no `__torch_dispatch__`, `torch.Tensor`'s `__dlpack__`:
/// see [`note_class`]), with the version tags then of the class and, where
/// the metaclass was made in Python (`nn.Parameter`'s), of the metaclass,
/// which can declare for its classes (a property answering
/// `__dlpack_c_exchange_api__`) without moving their tags. A class is
/// accepted while it has the same metaclass and both tags are unchanged
/// (CPython gives a type a new tag whenever an attribute of it or of a base
/// is set or deleted). Builds without version tags (the limited API) read
/// no tensor directly. Written and read under the GIL; atomics so that a
/// read is a few loads.
static CLASSES: [Noted; 8] = [const { Noted::empty() }; 8];

/// One entry of [`CLASSES`]: the class, its tag, its metaclass, and the
/// metaclass's tag (0 for a static metaclass, whose attributes are fixed).
struct Noted {
    class: AtomicUsize,
    tag: AtomicU32,
    meta: AtomicUsize,
    meta_tag: AtomicU32,
}

impl Noted {
    const fn empty() -> Noted {
        Noted {
            class: AtomicUsize::new(0),
            tag: AtomicU32::new(0),
            meta: AtomicUsize::new(0),
            meta_tag: AtomicU32::new(0),
        }
    }

    /// Whether the class noted here still holds what was noted (`tp` is it).
    #[cfg(not(Py_LIMITED_API))]
    #[inline(always)]
    fn holds(&self, tp: *mut pyo3::ffi::PyTypeObject) -> bool {
        let tag = crate::trust::type_version_tag(tp);
        // SAFETY: `tp` is a live type object; reading its type pointer.
        let meta = unsafe { pyo3::ffi::Py_TYPE(tp.cast()) };
        let meta_tag = self.meta_tag.load(Ordering::Relaxed);
        tag != 0
            && tag == self.tag.load(Ordering::Relaxed)
            && meta as usize == self.meta.load(Ordering::Relaxed)
            && (meta_tag == 0 || crate::trust::type_version_tag(meta) == meta_tag)
    }
}

#[inline(always)]
fn class_ok(obj: &Bound<'_, PyAny>) -> bool {
    #[cfg(not(Py_LIMITED_API))]
    {
        // SAFETY: `obj` is live; reading its type pointer.
        let tp = unsafe { pyo3::ffi::Py_TYPE(obj.as_ptr()) };
        let key = tp as usize;
        CLASSES
            .iter()
            .find(|n| n.class.load(Ordering::Relaxed) == key)
            .is_some_and(|n| n.holds(tp))
    }
    #[cfg(Py_LIMITED_API)]
    {
        let _ = obj;
        false
    }
}

/// Notes `obj`'s class as one whose instances may be read directly (see
/// [`CLASSES`]): the general path found, in phase 1, that the class
/// declares nothing, from what it held when the tags were `tags` (read by
/// [`class_tags`] before the look-ups). A class noted, and its metaclass,
/// are kept alive for the process, so their addresses are never another
/// class's; eight at most, a class changed since it was noted making room.
pub(crate) fn note_class(obj: &Bound<'_, PyAny>, tags: (u32, u32)) {
    #[cfg(not(Py_LIMITED_API))]
    {
        let tp = obj.get_type();
        let key = tp.as_ptr() as usize;
        let meta = tp.get_type();
        let (tag, meta_tag) = tags;
        if tag == 0 || verified().is_none() || (meta_tag == 0 && is_heap_type(&meta)) {
            return;
        }
        let meta_key = meta.as_ptr() as usize;
        let slot = CLASSES
            .iter()
            .find(|n| n.class.load(Ordering::Relaxed) == key)
            .or_else(|| {
                // A free slot, else one whose class changed since it was
                // noted (kept alive for good, so its address is its own).
                CLASSES.iter().find(|n| {
                    let class = n.class.load(Ordering::Relaxed);
                    class == 0 || !n.holds(class as *mut pyo3::ffi::PyTypeObject)
                })
            });
        let Some(n) = slot else {
            return;
        };
        if n.class.load(Ordering::Relaxed) != key {
            std::mem::forget(tp.clone().unbind());
            std::mem::forget(meta.clone().unbind());
        }
        n.tag.store(tag, Ordering::Relaxed);
        n.meta.store(meta_key, Ordering::Relaxed);
        n.meta_tag.store(meta_tag, Ordering::Relaxed);
        n.class.store(key, Ordering::Relaxed);
    }
    #[cfg(Py_LIMITED_API)]
    let _ = (obj, tags);
}

/// Whether `tp` was made in Python (a heap type: its attributes can be set).
#[cfg(not(Py_LIMITED_API))]
fn is_heap_type(tp: &Bound<'_, pyo3::types::PyType>) -> bool {
    // SAFETY: `tp` is a live type object; its flags are read.
    unsafe { pyo3::ffi::PyType_GetFlags(tp.as_ptr().cast()) & pyo3::ffi::Py_TPFLAGS_HEAPTYPE != 0 }
}

/// `obj`'s class's version tag and, where its metaclass was made in
/// Python, the metaclass's (0: none, or a static metaclass), read before
/// the general path looks at what the class declares.
pub(crate) fn class_tags(obj: &Bound<'_, PyAny>) -> (u32, u32) {
    #[cfg(not(Py_LIMITED_API))]
    {
        let tp = obj.get_type();
        let meta = tp.get_type();
        let meta_tag = if is_heap_type(&meta) {
            crate::trust::version_tag(&meta)
        } else {
            0
        };
        (crate::trust::version_tag(&tp), meta_tag)
    }
    #[cfg(Py_LIMITED_API)]
    {
        let _ = obj;
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_pytorch_has_has_a_scalar_type() {
        use crate::facts::{Framework, DTYPES};
        for d in DTYPES {
            let has = SCALAR_TYPES.iter().filter(|(n, _)| *n == d.name).count();
            let expected = usize::from(!d.absent_from.contains(&Framework::Torch));
            assert_eq!(has, expected, "{}", d.name);
        }
        assert_eq!(
            SCALAR_TYPES.len(),
            DTYPES
                .iter()
                .filter(|d| !d.absent_from.contains(&Framework::Torch))
                .count()
        );
    }

    #[test]
    fn known_layouts_stay_inside_the_objects() {
        for k in KNOWN {
            let a = k.at;
            // PyTorch static-asserts sizeof(TensorImpl) <= 208 (and the
            // fields read lie in its first 176 bytes).
            for end in [a.key_set + 8, a.strides + 8 * INLINE, a.dtype + 2] {
                assert!(end <= 176, "{:?}", k.versions);
            }
            assert_eq!(a.sizes, a.rank + 8);
            assert_eq!(a.strides, a.sizes + 8 * INLINE);
        }
    }
}
