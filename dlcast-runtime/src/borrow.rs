//! The process-wide borrow registry: every live view of a `#[dlpack_fn]`
//! call is registered here, read or write, until it drops.
//!
//! A writable borrow that meets any live borrow of the same memory, and any
//! borrow that meets a live writable one, is refused. This is what makes a
//! `&mut [T]` in a body exclusive across arguments, nested calls, Python
//! callbacks and other threads (a body inside `py.detach`), as Rust's
//! aliasing rules require; rust-numpy keeps a registry of the same kind.
//!
//! **One registry per process.** Every extension module built with dlcast,
//! whatever its dlcast version, must see the others' borrows. The first one
//! to need the registry publishes its own as a capsule named
//! [`CAPSULE_NAME`] under the key [`KEY`] of the interpreter's state
//! dictionary (`PyInterpreterState_GetDict`, C-level state, where pybind11
//! and nanobind keep theirs); every later one finds it there and uses its
//! functions. Finding and publishing are one step under the GIL
//! (`PyDict_SetDefaultRef`), so two extensions cannot both publish.
//!
//! Python code cannot reach that dictionary: no module, type or frame
//! refers to it, and the garbage collector does not list it (a dictionary
//! of strings and capsules, which are not containers, is untracked), so
//! nothing Python code does (to `sys.modules`, to any attribute) makes a
//! later extension miss the registry and start a second one. Only the C
//! API can reach it (`ctypes.pythonapi`, which can write any memory
//! anyway), or another extension that stores a tracked container in the
//! same dictionary. A capsule found there is used only if it is a
//! [`BorrowApi`] of a dlcast build: the capsule's exact name, a version of
//! at least 1, and the table and all its functions in the image of one
//! loaded library (`trust::same_image`), which no table made with
//! `ctypes` is; anything else is refused (`RuntimeError`), never replaced
//! by a second registry. PyO3 refuses to load its modules in
//! subinterpreters, so the interpreter's dictionary is the process's.
//!
//! The capsule holds a [`BorrowApi`], a C struct whose first field is its
//! version: later versions may append fields, never change these. No dlcast
//! version before this one was published, so there is no older place
//! (the `sys.modules` entry of unreleased builds) to stay compatible with.
//!
//! **Overlap.** Borrows are compared per address space (host memory, which
//! CPU, pinned and managed memory share, or one device's memory): two
//! borrows conflict when their byte ranges intersect, unless their elements
//! provably interleave without touching, which is decided cheaply from the
//! greatest common divisor of the byte strides (so `a[::2]` and `a[1::2]`
//! are disjoint). The test is conservative: it may report an overlap of
//! layouts that share no byte, never the reverse.
//!
//! **Locking.** The entries sit behind a mutex, so the registry is sound
//! with or without the GIL; it never calls into Python.
//!
//! **rust-numpy.** Borrows of NumPy arrays by rust-numpy extensions
//! (`PyReadonlyArray`, `PyReadwriteArray`) meet dlcast's views: dlcast
//! publishes this registry as rust-numpy's shared table when there is none
//! yet, else also acquires its views of NumPy arrays in rust-numpy's (the
//! crate-private module `borrow::rnp`).

use crate::device::Device;
use pyo3::prelude::*;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

pub(crate) mod rnp;

/// The key of the interpreter's state dictionary that holds the registry's
/// capsule.
pub const KEY: &str = "dlcast.borrow_registry";
/// The capsule's name.
pub const CAPSULE_NAME: &CStr = c"dlcast.borrow_registry";
/// The version of [`BorrowApi`] this build publishes and reads.
pub const API_VERSION: u64 = 1;

/// One borrow as the registry records it (a C struct: extensions built
/// with other dlcast versions pass it across).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BorrowReq {
    /// The address space: DLPack device type and id (host-accessible memory
    /// is registered as CPU 0).
    pub device_type: i32,
    /// See `device_type`.
    pub device_id: i32,
    /// Lowest byte address touched.
    pub lo: usize,
    /// One past the highest byte address touched.
    pub hi: usize,
    /// Address of element 0.
    pub start: usize,
    /// The greatest common divisor of the byte strides of the dimensions
    /// with more than one index (every element sits at `start` plus a
    /// multiple of it); 0 for a single element.
    pub modulus: usize,
    /// Bytes per element.
    pub itemsize: usize,
    /// 1 for a writable borrow.
    pub writable: u8,
    /// Which call holds the borrow (unique per call in the process).
    pub call: u64,
    /// The function's name (UTF-8, not NUL-terminated, valid for the process).
    pub function: *const u8,
    /// Its length in bytes.
    pub function_len: usize,
    /// The parameter's name, likewise.
    pub param: *const u8,
    /// Its length in bytes.
    pub param_len: usize,
}

// SAFETY: the name pointers point to `'static` strings of an extension
// module (never unloaded); everything else is plain integers.
unsafe impl Send for BorrowReq {}

/// The first field of every [`BorrowApi`]: bytes no other library's data
/// is expected to start a table with, so that a capsule pointing into
/// another library's static data (which lies in a library's image, and
/// whose following words may well point into that library's code) is not
/// taken for a registry.
pub const API_MAGIC: [u8; 16] = *b"dlcast:registry\x01";

/// The registry's C interface, as published in the capsule.
#[repr(C)]
pub struct BorrowApi {
    /// [`API_MAGIC`].
    pub magic: [u8; 16],
    /// [`API_VERSION`] of the publisher.
    pub version: u64,
    /// Registers `*req`; returns its id (non-zero), or 0 and writes the
    /// borrow it conflicts with into `*conflict`.
    pub acquire: unsafe extern "C" fn(req: *const BorrowReq, conflict: *mut BorrowReq) -> u64,
    /// Removes the borrow `id` (no-op for an unknown id).
    pub release: unsafe extern "C" fn(id: u64),
    /// The number of live borrows (for tests).
    pub live: unsafe extern "C" fn() -> usize,
}

struct Entry {
    id: u64,
    req: BorrowReq,
}

static ENTRIES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn entries() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    // A panic cannot happen while the lock is held (plain Vec operations on
    // reserved memory aside), but never let poisoning turn into one.
    ENTRIES.lock().unwrap_or_else(|e| e.into_inner())
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    // The first stride of a request meets `a == 0`: no division for it (a
    // one-dimensional view then needs none).
    if a == 0 {
        return b;
    }
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Whether two borrows may touch a common byte (conservative).
pub fn may_overlap(a: &BorrowReq, b: &BorrowReq) -> bool {
    if (a.device_type, a.device_id) != (b.device_type, b.device_id) {
        return false;
    }
    if a.lo >= b.hi || b.lo >= a.hi {
        return false;
    }
    // Every element of `a` starts at `a.start + k * a.modulus` and covers
    // `a.itemsize` bytes (likewise `b`). Two elements starting at `x` (of
    // `a`) and `y` (of `b`) share a byte iff `x < y + b.itemsize` and
    // `y < x + a.itemsize`, i.e. `-a.itemsize < d < b.itemsize` with
    // `d = x - y`; and `d ≡ a.start - b.start (mod g)`, `g` the gcd of both
    // moduli, so the candidates are `r` and `r - g` with `r` that residue.
    let g = gcd(a.modulus, b.modulus);
    let diff = a.start.wrapping_sub(b.start) as isize;
    let (ia, ib) = (a.itemsize as isize, b.itemsize as isize);
    if g == 0 {
        // Both are single elements: compare them directly.
        return -ia < diff && diff < ib;
    }
    let Ok(gi) = isize::try_from(g) else {
        return true;
    };
    let r = diff.rem_euclid(gi); // 0 <= r < g
    r < ib || gi - r < ia
}

unsafe extern "C" fn acquire(req: *const BorrowReq, conflict: *mut BorrowReq) -> u64 {
    // SAFETY: the caller passes a valid request and a writable out slot.
    let req = unsafe { &*req };
    let mut list = entries();
    if let Some(e) = list
        .iter()
        .find(|e| (e.req.writable != 0 || req.writable != 0) && may_overlap(&e.req, req))
    {
        // SAFETY: as above.
        unsafe { *conflict = e.req };
        return 0;
    }
    if list.try_reserve(1).is_err() {
        // Out of memory: refused like a conflict with nothing; the caller
        // turns an all-zero conflict into `MemoryError`.
        // SAFETY: as above.
        unsafe { *conflict = EMPTY };
        return 0;
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    list.push(Entry { id, req: *req });
    id
}

unsafe extern "C" fn release(id: u64) {
    let mut list = entries();
    if let Some(i) = list.iter().rposition(|e| e.id == id) {
        list.swap_remove(i);
    }
}

unsafe extern "C" fn live() -> usize {
    entries().len()
}

const EMPTY: BorrowReq = BorrowReq {
    device_type: 0,
    device_id: 0,
    lo: 0,
    hi: 0,
    start: 0,
    modulus: 0,
    itemsize: 0,
    writable: 0,
    call: 0,
    function: std::ptr::null(),
    function_len: 0,
    param: std::ptr::null(),
    param_len: 0,
};

/// This build's registry, published if no other extension did so first.
static OWN_API: BorrowApi = BorrowApi {
    magic: API_MAGIC,
    version: API_VERSION,
    acquire,
    release,
    live,
};

/// The registry in use in this process, once found or published.
static API: AtomicPtr<BorrowApi> = AtomicPtr::new(std::ptr::null_mut());

/// The process-wide registry: found in the interpreter's state dictionary
/// or published there (the first time only, in phase 1: before any raw
/// read of an argument).
pub(crate) fn api(py: Python<'_>) -> PyResult<&'static BorrowApi> {
    let p = API.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: only pointers to `'static` tables are stored (ours, or one
        // read from the capsule, whose publisher is never unloaded).
        return Ok(unsafe { &*p });
    }
    let found = find_or_publish(py)?;
    API.store((found as *const BorrowApi).cast_mut(), Ordering::Release);
    Ok(found)
}

#[cold]
fn find_or_publish(py: Python<'_>) -> PyResult<&'static BorrowApi> {
    // SAFETY: the GIL is held, so there is a current interpreter; its
    // dictionary is a borrowed reference that lives as long as it does.
    let dict =
        unsafe { pyo3::ffi::PyInterpreterState_GetDict(pyo3::ffi::PyInterpreterState_Get()) };
    if dict.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "dlcast: the interpreter has no state dictionary to keep the borrow registry in",
            )
        }));
    }
    let key = pyo3::types::PyString::new(py, KEY);
    let ptr = (&OWN_API as *const BorrowApi).cast_mut().cast::<c_void>();
    // SAFETY: `ptr` points to a static, the name is a static C string, and
    // there is no destructor to run.
    let ours = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyCapsule_New(ptr, CAPSULE_NAME.as_ptr(), None),
        )?
    };
    let mut found = std::ptr::null_mut();
    // SAFETY: `dict` is an exact dict and `key` an exact str, so the look-up
    // and the insertion run no Python code (no other thread runs between
    // them: the GIL is held); `found` receives a new reference.
    let rc = unsafe {
        pyo3::ffi::compat::PyDict_SetDefaultRef(dict, key.as_ptr(), ours.as_ptr(), &mut found)
    };
    if rc < 0 || found.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "dlcast: the borrow registry could not be published",
            )
        }));
    }
    // SAFETY: a new reference (above).
    let found = unsafe { Bound::from_owned_ptr(py, found) };
    let api = verify(&found).ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err(format!(
            "dlcast: the interpreter's {KEY:?} entry is not a dlcast borrow registry (a capsule \
             named {CAPSULE_NAME:?} whose table and functions lie in one loaded library); \
             dlcast refuses to run rather than start a second registry"
        ))
    })?;
    // Kept for the process (the table is a static of its publisher).
    std::mem::forget(found);
    Ok(api)
}

/// The registry in `cap`, if it is one a dlcast build published (see the
/// module documentation). Runs no Python code.
fn verify(cap: &Bound<'_, PyAny>) -> Option<&'static BorrowApi> {
    use crate::trust::image_base;
    // SAFETY: `cap` is a live object; CheckExact reads only its type.
    if unsafe { pyo3::ffi::PyCapsule_CheckExact(cap.as_ptr()) } == 0 {
        return None;
    }
    // SAFETY: a capsule; GetPointer checks its name (NULL with an error set
    // on a mismatch).
    let ptr = unsafe { pyo3::ffi::PyCapsule_GetPointer(cap.as_ptr(), CAPSULE_NAME.as_ptr()) };
    if ptr.is_null() {
        drop(PyErr::take(cap.py()));
        return None;
    }
    // Nothing is read from a table outside a library's image.
    let image = image_base(ptr)?;
    // The magic first: the capsule may point at any library's static data
    // (Python code can make a capsule of any address), of which 16 bytes
    // are read, within the image. Only a table that starts with them is
    // read further.
    // SAFETY: `ptr` lies in a loaded library's image (checked above), which
    // is mapped; the 16 bytes are read unaligned, as plain bytes.
    let magic = unsafe { ptr.cast::<[u8; 16]>().read_unaligned() };
    if magic != API_MAGIC || ptr.align_offset(std::mem::align_of::<BorrowApi>()) != 0 {
        return None;
    }
    // SAFETY: an aligned table in a library's image that starts with the
    // magic is the `BorrowApi` static of a dlcast build, valid for the
    // process; every version starts with the fields of version 1.
    let api = unsafe { &*ptr.cast::<BorrowApi>() };
    let functions = [
        api.acquire as *const c_void,
        api.release as *const c_void,
        api.live as *const c_void,
    ];
    let one_image = functions.iter().all(|&f| image_base(f) == Some(image));
    (one_image && api.version >= 1).then_some(api)
}

/// A registered borrow; dropping it releases it.
pub(crate) struct Borrow {
    id: u64,
    api: &'static BorrowApi,
}

impl Drop for Borrow {
    fn drop(&mut self) {
        // SAFETY: the publisher's function, with an id it handed out.
        unsafe { (self.api.release)(self.id) }
        // The same view's borrow in rust-numpy's registry, if any.
        if rnp::foreign().is_some() {
            rnp::release(self.id);
        }
    }
}

/// Why a borrow was refused.
pub(crate) enum Refused {
    /// It meets this live borrow.
    Conflict(BorrowReq),
    /// The registry could not grow.
    NoMemory,
}

/// Registers `req`.
pub(crate) fn acquire_with(api: &'static BorrowApi, req: &BorrowReq) -> Result<Borrow, Refused> {
    let mut conflict = EMPTY;
    // SAFETY: the publisher's function, with a valid request and out slot.
    let id = unsafe { (api.acquire)(req, &mut conflict) };
    if id != 0 {
        return Ok(Borrow { id, api });
    }
    if conflict.function.is_null() {
        return Err(Refused::NoMemory);
    }
    Err(Refused::Conflict(conflict))
}

/// The number of live borrows in the process (for tests).
pub fn live_borrows(py: Python<'_>) -> PyResult<usize> {
    let api = api(py)?;
    // SAFETY: the publisher's function.
    Ok(unsafe { (api.live)() })
}

/// A name recorded in a [`BorrowReq`], as text.
pub(crate) fn name(ptr: *const u8, len: usize) -> &'static str {
    if ptr.is_null() {
        return "?";
    }
    // SAFETY: names in requests point to `'static` UTF-8 strings of an
    // extension module (checked again below, in case another version
    // wrote something else).
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    std::str::from_utf8(bytes).unwrap_or("?")
}

/// A fresh call id, unique among this extension's calls. (Two extensions
/// may hand out the same id; a conflict is within one call only when the
/// ids and the function name's address, a static of the extension, agree.)
pub(crate) fn new_call_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Whether `other` was registered by the same call as `req`.
pub(crate) fn same_call(req: &BorrowReq, other: &BorrowReq) -> bool {
    req.call == other.call && std::ptr::eq(req.function, other.function)
}

/// The request for `len` elements of `itemsize` bytes at `start` with
/// `shape`/`strides` (in elements) spanning `lo..hi`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn request(
    device: Device,
    lo: usize,
    hi: usize,
    start: usize,
    shape: &[usize],
    strides: &[isize],
    itemsize: usize,
    writable: bool,
    call: u64,
    function: &'static str,
    param: &'static str,
) -> BorrowReq {
    let space = if device.is_host_accessible() {
        Device::CPU
    } else {
        device
    };
    let mut modulus = 0usize;
    for (&n, &s) in shape.iter().zip(strides) {
        if n > 1 {
            // An overflowing byte stride cannot come from a validated
            // layout; 1 (every byte) is the conservative answer anyway.
            let b = s.unsigned_abs().checked_mul(itemsize).unwrap_or(1);
            modulus = gcd(modulus, b);
        }
    }
    BorrowReq {
        device_type: space.device_type,
        device_id: space.device_id,
        lo,
        hi,
        start,
        modulus,
        itemsize,
        writable: writable as u8,
        call,
        function: function.as_ptr(),
        function_len: function.len(),
        param: param.as_ptr(),
        param_len: param.len(),
    }
}

// Keep the C types honest: a `c_char` name would be read the same way.
const _: () = assert!(std::mem::size_of::<c_char>() == 1);

#[cfg(test)]
mod tests {
    use super::*;

    fn req(start: usize, n: usize, stride: isize, item: usize, w: bool) -> BorrowReq {
        let hi = start + (n - 1) * stride.unsigned_abs() * item + item;
        request(
            Device::CPU,
            start,
            hi,
            start,
            &[n],
            &[stride],
            item,
            w,
            1,
            "f",
            "x",
        )
    }

    #[test]
    fn interleaved_slices_do_not_overlap() {
        // a[::2] and a[1::2] of f64.
        assert!(!may_overlap(
            &req(1000, 6, 2, 8, true),
            &req(1008, 6, 2, 8, false)
        ));
        // a[:6] and a[4:].
        assert!(may_overlap(
            &req(1000, 6, 1, 8, true),
            &req(1032, 6, 1, 8, false)
        ));
        // Columns 0 and 1 of a (5, 4) f32 array.
        assert!(!may_overlap(
            &req(0x100, 5, 4, 4, true),
            &req(0x104, 5, 4, 4, true)
        ));
        // Misaligned by half an element: they share bytes.
        assert!(may_overlap(
            &req(1000, 6, 2, 8, true),
            &req(1004, 6, 2, 8, false)
        ));
        // Single elements.
        assert!(!may_overlap(
            &req(1000, 1, 1, 8, true),
            &req(1008, 1, 1, 8, true)
        ));
        assert!(may_overlap(
            &req(1000, 1, 1, 8, true),
            &req(1007, 1, 1, 8, true)
        ));
        // Different item sizes: an f64 and the 4th byte of another.
        let f64_at_0 = req(1000, 1, 1, 8, true);
        let byte_at_3 = req(1003, 1, 1, 1, false);
        assert!(may_overlap(&f64_at_0, &byte_at_3));
        assert!(may_overlap(&byte_at_3, &f64_at_0));
        assert!(!may_overlap(&req(1008, 1, 1, 8, true), &byte_at_3));
        // Strided: x[::2] of f64 and bytes 3, 19, 35, ... of the same buffer.
        assert!(may_overlap(
            &req(1000, 4, 2, 8, true),
            &req(1003, 4, 16, 1, false)
        ));
        assert!(may_overlap(
            &req(1003, 4, 16, 1, false),
            &req(1000, 4, 2, 8, true)
        ));
        // ... and bytes 8+3, 24+3, ...: in the odd elements only.
        assert!(!may_overlap(
            &req(1000, 4, 2, 8, true),
            &req(1011, 4, 16, 1, false)
        ));
        // Different spaces never meet.
        let mut cuda = req(1000, 6, 1, 8, true);
        cuda.device_type = 2;
        assert!(!may_overlap(&cuda, &req(1000, 6, 1, 8, true)));
    }

    #[test]
    fn acquire_and_release() {
        let a = req(1 << 20, 4, 1, 8, true);
        let b = req((1 << 20) + 8, 4, 1, 8, false);
        let first = acquire_with(&OWN_API, &a).ok().expect("free");
        assert!(matches!(
            acquire_with(&OWN_API, &b),
            Err(Refused::Conflict(_))
        ));
        drop(first);
        let second = acquire_with(&OWN_API, &b).ok().expect("released");
        // Two readers share.
        let third = acquire_with(&OWN_API, &b).ok().expect("readers share");
        drop((second, third));
    }
}
