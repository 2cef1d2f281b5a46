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
//! [`BorrowApi`] of a dlcast build: the capsule's exact name, the table's
//! [`API_MAGIC`] (whose last byte names the layout of [`BorrowReq`]), a
//! version of at least [`API_VERSION`], and the table and all its
//! functions in the image of one
//! loaded library (`trust::same_image`), which no table made with
//! `ctypes` is; anything else is refused (`RuntimeError`), never replaced
//! by a second registry. PyO3 refuses to load its modules in
//! subinterpreters, so the interpreter's dictionary is the process's.
//!
//! The capsule holds a [`BorrowApi`], a C struct that starts with
//! [`API_MAGIC`] and its version: later versions may append fields, never
//! change these. A build whose [`BorrowReq`] is laid out differently has
//! another magic, so that each refuses the other's table (a `RuntimeError`
//! naming the registry) rather than misread its requests: the layout of
//! version 1 (13 fields, names with lengths of a word) is refused by this
//! one. No dlcast version before these was published, so there is no older
//! place (the `sys.modules` entry of unreleased builds) to stay compatible
//! with.
//!
//! **Overlap.** Borrows are compared per address space (host memory, which
//! CPU, pinned and managed memory share, or one device's memory): two
//! borrows conflict when their byte ranges intersect, unless their elements
//! provably interleave without touching, which is decided cheaply from the
//! greatest common divisor of the byte strides (so `a[::2]` and `a[1::2]`
//! are disjoint). The test is conservative: it may report an overlap of
//! layouts that share no byte, never the reverse.
//!
//! **Locking.** The entries sit behind a one-word lock (an uncontended
//! compare-exchange to take it, a plain release store to give it back), so
//! the registry is sound with or without the GIL; it never calls into
//! Python, and no code that holds the lock waits for anything else. The GIL
//! alone would not do: a borrow may end on a thread that does not hold it
//! (an `ArrayBuffer`'s `BufferRef` is `Send`, and may be dropped inside
//! `py.detach` or on another thread), and a free-threaded build has none.
//! Borrow ids come from a plain counter under the same lock; entries are
//! released from the end first (a view's borrow is usually the last one
//! entered).
//!
//! **rust-numpy.** Borrows of NumPy arrays by rust-numpy extensions
//! (`PyReadonlyArray`, `PyReadwriteArray`) meet dlcast's views: dlcast
//! publishes this registry as rust-numpy's shared table when there is none
//! yet, else also acquires its views of NumPy arrays in rust-numpy's (the
//! crate-private module `borrow::rust_numpy`).

use crate::device::Device;
use crate::error::RegistryError;
use pyo3::prelude::*;
use std::cell::UnsafeCell;
use std::ffi::{c_char, c_void, CStr};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

pub(crate) mod rust_numpy;

/// The key of the interpreter's state dictionary that holds the registry's
/// capsule.
pub const KEY: &str = "dlcast.borrow_registry";
/// The capsule's name.
pub const CAPSULE_NAME: &CStr = c"dlcast.borrow_registry";
/// The version of [`BorrowApi`] this build publishes and reads (2: the
/// compact [`BorrowReq`]).
pub const API_VERSION: u64 = 2;

/// One borrow as the registry records it (a C struct: extensions built
/// with other dlcast versions pass it across). Ten words: the byte ranges
/// and the call first (what every acquire compares), the names only as
/// pointers and short lengths, read when a conflict is reported.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BorrowReq {
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
    /// Which call holds the borrow (unique per call of one extension; see
    /// `same_call`).
    pub call: u64,
    /// The function's name (UTF-8, not NUL-terminated, valid for the
    /// process), `function_len` bytes of it.
    pub function: *const u8,
    /// The parameter's name, likewise.
    pub param: *const u8,
    /// The address space: DLPack device type and id (host-accessible memory
    /// is registered as CPU 0).
    pub device_type: i32,
    /// See `device_type`.
    pub device_id: i32,
    /// Bytes per element.
    pub itemsize: u32,
    /// The length in bytes of `function` (at most its true length: a longer
    /// name is cut, and then read as `?` if the cut splits a character).
    pub function_len: u16,
    /// The length in bytes of `param`, likewise.
    pub param_len: u16,
    /// 1 for a writable borrow.
    pub writable: u8,
}

// SAFETY: the name pointers point to `'static` strings of an extension
// module (never unloaded); everything else is plain integers.
unsafe impl Send for BorrowReq {}

/// The first field of every [`BorrowApi`]: bytes no other library's data
/// is expected to start a table with, so that a capsule pointing into
/// another library's static data (which lies in a library's image, and
/// whose following words may well point into that library's code) is not
/// taken for a registry. The last byte is the layout of [`BorrowReq`] the
/// table's functions read and write (1: the first one, refused here).
pub const API_MAGIC: [u8; 16] = *b"dlcast:registry\x02";

/// The registry's C interface, as published in the capsule. Its functions
/// may be called with or without the GIL (they never call into Python).
#[repr(C)]
pub struct BorrowApi {
    /// [`API_MAGIC`].
    pub magic: [u8; 16],
    /// [`API_VERSION`] of the publisher.
    pub version: u64,
    /// Registers `*req`; returns its id (non-zero), or 0 and writes the
    /// borrow it conflicts with into `*conflict` (one whose `function` is
    /// NULL when the registry could not grow). `*conflict` is written only
    /// when 0 is returned.
    pub acquire: unsafe extern "C" fn(req: *const BorrowReq, conflict: *mut BorrowReq) -> u64,
    /// Removes the borrow `id` (no-op for an unknown id).
    pub release: unsafe extern "C" fn(id: u64),
    /// The number of live borrows (for tests).
    pub live: unsafe extern "C" fn() -> usize,
}

/// A value behind a lock of one byte: taken with one compare-exchange when
/// free (spinning, then yielding the thread, while another thread holds
/// it), given back with a release store. For short critical sections that
/// never block, call into Python or take another lock of this kind that
/// could be waiting for this one; sound with or without the GIL.
pub(crate) struct OneWordLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `LockGuard`, of which the
// lock admits one at a time (`lock` sets `locked` with acquire ordering,
// the guard clears it with release ordering), so it moves between threads
// like a value sent from one to the next: `T: Send` suffices.
unsafe impl<T: Send> Sync for OneWordLock<T> {}

impl<T> OneWordLock<T> {
    /// A free lock around `value`.
    pub(crate) const fn new(value: T) -> Self {
        OneWordLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock (waits while another thread holds it).
    #[inline(always)]
    pub(crate) fn lock(&self) -> LockGuard<'_, T> {
        if self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        LockGuard { lock: self }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 100 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    // The holder may have been descheduled: let it run.
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

/// The held [`OneWordLock`]; dropping it gives the lock back (also when a
/// panic unwinds through it: every value kept here stays valid at every
/// step, so there is nothing to poison).
pub(crate) struct LockGuard<'a, T> {
    lock: &'a OneWordLock<T>,
}

impl<T> std::ops::Deref for LockGuard<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock: no other reference to the value
        // exists while it lives.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for LockGuard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference
        // the guard hands out.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for LockGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// A live borrow: its id and its request.
#[derive(Clone, Copy)]
struct Entry {
    req: BorrowReq,
    id: u64,
}

/// What the lock protects: the live borrows, in the order entered (the last
/// entered last, where a release looks first), and the next id to hand out.
struct Registry {
    entries: Vec<Entry>,
    next_id: u64,
}

static REGISTRY: OneWordLock<Registry> = OneWordLock::new(Registry {
    entries: Vec::new(),
    next_id: 1,
});

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
#[inline]
pub fn may_overlap(a: &BorrowReq, b: &BorrowReq) -> bool {
    if a.lo >= b.hi || b.lo >= a.hi {
        return false;
    }
    if (a.device_type, a.device_id) != (b.device_type, b.device_id) {
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
    // A `u32` fits a 64-bit `isize`; on a 32-bit target a larger item
    // size than `isize` holds (no allocation has one) counts as the most.
    let size = |i: u32| isize::try_from(i).unwrap_or(isize::MAX);
    let (ia, ib) = (size(a.itemsize), size(b.itemsize));
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

/// Whether `a` and `b` may not both be live: one of them writes, and they
/// may share a byte.
#[inline(always)]
fn conflicts(a: &BorrowReq, b: &BorrowReq) -> bool {
    (a.writable | b.writable) != 0 && may_overlap(a, b)
}

/// The out-of-memory answer of `acquire`: no function name.
const NO_MEMORY: BorrowReq = BorrowReq {
    lo: 0,
    hi: 0,
    start: 0,
    modulus: 0,
    call: 0,
    function: std::ptr::null(),
    param: std::ptr::null(),
    device_type: 0,
    device_id: 0,
    itemsize: 0,
    function_len: 0,
    param_len: 0,
    writable: 0,
};

unsafe extern "C" fn acquire(req: *const BorrowReq, conflict: *mut BorrowReq) -> u64 {
    let mut registry = REGISTRY.lock();
    let registry = &mut *registry;
    let entries = &mut registry.entries;
    // SAFETY: the caller passes a valid request and a writable out slot.
    if let Some(e) = unsafe { find_conflict(entries, &*req) } {
        // SAFETY: as above.
        unsafe { conflict.write(e.req) };
        return 0;
    }
    if entries.len() == entries.capacity() && entries.try_reserve(1).is_err() {
        // Out of memory: refused like a conflict with nothing; the caller
        // turns a conflict without a function name into `MemoryError`.
        // SAFETY: as above.
        unsafe { conflict.write(NO_MEMORY) };
        return 0;
    }
    // Ids are never 0 (a refusal); 2^64 borrows do not happen in a process,
    // but a wrap would skip 0 all the same.
    let id = registry.next_id;
    registry.next_id = id.wrapping_add(1).max(1);
    // Written in place (no copy of the entry on the stack around a growth).
    if let Some(slot) = entries.spare_capacity_mut().first_mut() {
        // SAFETY: the caller passes a valid request (read, `Copy`).
        let req = unsafe { *req };
        slot.write(Entry { req, id });
        // SAFETY: the element at `len` was just written, within capacity.
        unsafe { entries.set_len(entries.len() + 1) };
        return id;
    }
    // Unreachable: there is room (reserved above).
    // SAFETY: as above.
    unsafe { conflict.write(NO_MEMORY) };
    0
}

/// The first live borrow that `req` conflicts with, if any (outlined: an
/// empty registry, a call's first view, needs none of its registers).
#[inline]
fn find_conflict<'a>(entries: &'a [Entry], req: &BorrowReq) -> Option<&'a Entry> {
    if entries.is_empty() {
        return None;
    }
    scan(entries, req)
}

#[inline(never)]
fn scan<'a>(entries: &'a [Entry], req: &BorrowReq) -> Option<&'a Entry> {
    entries.iter().find(|e| conflicts(&e.req, req))
}

unsafe extern "C" fn release(id: u64) {
    let mut registry = REGISTRY.lock();
    let entries = &mut registry.entries;
    // The last one entered first: a call's only view, or the innermost of
    // nested calls.
    if entries.last().is_some_and(|e| e.id == id) {
        entries.pop();
    } else if let Some(i) = entries.iter().rposition(|e| e.id == id) {
        entries.swap_remove(i);
    }
}

unsafe extern "C" fn live() -> usize {
    REGISTRY.lock().entries.len()
}

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
/// or published there. The first time in the process (in phase 1 of a call:
/// before any raw read of an argument) this may run Python code: once the
/// registry is known, dlcast's table for rust-numpy is published too when
/// NumPy is already imported (see [`rust_numpy::set_up`]).
#[inline(always)]
pub(crate) fn api(py: Python<'_>) -> PyResult<&'static BorrowApi> {
    let p = API.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: only pointers to `'static` tables are stored (ours, or one
        // read from the capsule, whose publisher is never unloaded).
        return Ok(unsafe { &*p });
    }
    first_api(py)
}

#[cold]
#[inline(never)]
fn first_api(py: Python<'_>) -> PyResult<&'static BorrowApi> {
    let found = find_or_publish(py)?;
    API.store((found as *const BorrowApi).cast_mut(), Ordering::Release);
    rust_numpy::set_up(py);
    Ok(found)
}

fn find_or_publish(py: Python<'_>) -> PyResult<&'static BorrowApi> {
    // SAFETY: the GIL is held, so there is a current interpreter; its
    // dictionary is a borrowed reference that lives as long as it does.
    let dict =
        unsafe { pyo3::ffi::PyInterpreterState_GetDict(pyo3::ffi::PyInterpreterState_Get()) };
    if dict.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| RegistryError::NoStateDict.into()));
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
        return Err(PyErr::take(py).unwrap_or_else(|| RegistryError::NotPublished.into()));
    }
    // SAFETY: a new reference (above).
    let found = unsafe { Bound::from_owned_ptr(py, found) };
    let api = verify(&found).ok_or_else(|| {
        PyErr::from(RegistryError::NotARegistry {
            key: KEY,
            capsule: CAPSULE_NAME,
            magic: &API_MAGIC,
        })
    })?;
    // Kept for the process (the table is a static of its publisher).
    std::mem::forget(found);
    Ok(api)
}

/// The registry in `cap`, if it is one a dlcast build of this layout
/// published (see the module documentation). Runs no Python code.
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
    // magic is the `BorrowApi` static of a dlcast build of this layout,
    // valid for the process; every version starts with these fields.
    let api = unsafe { &*ptr.cast::<BorrowApi>() };
    let functions = [
        api.acquire as *const c_void,
        api.release as *const c_void,
        api.live as *const c_void,
    ];
    let one_image = functions.iter().all(|&f| image_base(f) == Some(image));
    (one_image && api.version >= API_VERSION).then_some(api)
}

/// A registered borrow; dropping it releases it (on any thread, with or
/// without the GIL).
pub(crate) struct Borrow {
    id: u64,
    api: &'static BorrowApi,
}

impl Drop for Borrow {
    #[inline]
    fn drop(&mut self) {
        if std::ptr::eq(self.api, &OWN_API) {
            // SAFETY: this build's own function (called directly: no call
            // through the table), with an id it handed out.
            unsafe { release(self.id) }
        } else {
            // SAFETY: the publisher's function, with an id it handed out.
            unsafe { (self.api.release)(self.id) }
        }
        // The same view's borrow in rust-numpy's registry, if any.
        if rust_numpy::foreign().is_some() {
            rust_numpy::release(self.id);
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
#[inline]
pub(crate) fn acquire_with(api: &'static BorrowApi, req: &BorrowReq) -> Result<Borrow, Refused> {
    let mut conflict = MaybeUninit::<BorrowReq>::uninit();
    let id = if std::ptr::eq(api, &OWN_API) {
        // SAFETY: this build's own function (called directly), with a valid
        // request and out slot.
        unsafe { acquire(req, conflict.as_mut_ptr()) }
    } else {
        // SAFETY: the publisher's function, with a valid request and out slot.
        unsafe { (api.acquire)(req, conflict.as_mut_ptr()) }
    };
    if id != 0 {
        return Ok(Borrow { id, api });
    }
    refused(conflict)
}

#[cold]
#[inline(never)]
fn refused(conflict: MaybeUninit<BorrowReq>) -> Result<Borrow, Refused> {
    // SAFETY: `acquire` returned 0, so it wrote the slot (see `BorrowApi`).
    let conflict = unsafe { conflict.assume_init() };
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

/// A name recorded in a [`BorrowReq`], as text (`len` its length field).
pub(crate) fn name(ptr: *const u8, len: impl Into<usize>) -> &'static str {
    if ptr.is_null() {
        return "?";
    }
    // SAFETY: names in requests point to `'static` UTF-8 strings of an
    // extension module, of at least `len` bytes (checked again below, in
    // case another build cut a name inside a character).
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len.into()) };
    std::str::from_utf8(bytes).unwrap_or("?")
}

/// A fresh call id, unique among this extension's calls. (Two extensions
/// may hand out the same id; a conflict is within one call only when the
/// ids and the function name's address, a static of the extension, agree.)
///
/// One atomic add: the call context draws it before it holds any lock, and
/// nothing in its type proves the GIL is held there, so neither serialises
/// it.
#[inline(always)]
pub(crate) fn new_call_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Whether `other` was registered by the same call as `req`.
pub(crate) fn same_call(req: &BorrowReq, other: &BorrowReq) -> bool {
    req.call == other.call && std::ptr::eq(req.function, other.function)
}

/// `len` as a name's length field: cut to what the field holds (a prefix of
/// the name, still in its bounds).
#[inline(always)]
fn name_len(len: usize) -> u16 {
    u16::try_from(len).unwrap_or(u16::MAX)
}

/// The request for `len` elements of `itemsize` bytes at `start` with
/// `shape`/`strides` (in elements) spanning `lo..hi`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
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
    let (itemsize, modulus) = compact(itemsize, modulus);
    BorrowReq {
        lo,
        hi,
        start,
        modulus,
        call,
        function: function.as_ptr(),
        param: param.as_ptr(),
        device_type: space.device_type,
        device_id: space.device_id,
        itemsize,
        function_len: name_len(function.len()),
        param_len: name_len(param.len()),
        writable: writable as u8,
    }
}

/// `itemsize` and `modulus` as a request holds them: an item size beyond
/// `u32` (no dtype has one) is recorded as single bytes at every address
/// of the span (`1, 1`), which meets every borrow of an intersecting span:
/// conservative, as the overlap test must be.
#[inline(always)]
fn compact(itemsize: usize, modulus: usize) -> (u32, usize) {
    match u32::try_from(itemsize) {
        Ok(i) => (i, modulus),
        Err(_) => (1, 1),
    }
}

// Keep the C types honest: a `c_char` name would be read the same way.
const _: () = assert!(std::mem::size_of::<c_char>() == 1);
// Ten words on 64-bit targets (the compact layout of `API_MAGIC`'s `\x02`).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<BorrowReq>() == 80);

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

    /// The registry's state is process-wide: the tests below use address
    /// ranges of their own, and count only their own entries.
    fn mine(lo: usize, hi: usize) -> usize {
        REGISTRY
            .lock()
            .entries
            .iter()
            .filter(|e| e.req.lo >= lo && e.req.hi <= hi)
            .count()
    }

    #[test]
    fn released_in_any_order() {
        let base = 1 << 30;
        let reqs: Vec<_> = (0..4).map(|i| req(base + i * 64, 4, 1, 8, true)).collect();
        let held: Vec<_> = reqs
            .iter()
            .map(|r| acquire_with(&OWN_API, r).ok().expect("disjoint"))
            .collect();
        assert_eq!(mine(base, base + 256), 4);
        let mut held: Vec<_> = held.into_iter().map(Some).collect();
        // First entered, last entered, then the middle ones.
        for i in [0, 3, 1, 2] {
            drop(held[i].take());
            // The borrow released is gone, and only it: each range can be
            // borrowed again exactly when its own borrow ended.
            for (j, r) in reqs.iter().enumerate() {
                let free = acquire_with(&OWN_API, r).is_ok();
                assert_eq!(free, held[j].is_none(), "after releasing {i}: {j}");
            }
        }
        assert_eq!(mine(base, base + 256), 0);
    }

    #[test]
    fn ids_are_unique_and_never_zero() {
        let base = 1 << 31;
        let a = acquire_with(&OWN_API, &req(base, 2, 1, 8, false))
            .ok()
            .expect("free");
        let b = acquire_with(&OWN_API, &req(base, 2, 1, 8, false))
            .ok()
            .expect("readers");
        assert!(a.id != 0 && b.id != 0 && a.id != b.id);
    }

    #[test]
    fn an_item_size_beyond_u32_is_conservative() {
        // Two "items" of 2^33 bytes at the same stride, half a stride apart,
        // recorded as every byte of their spans: they overlap (their spans
        // intersect), as an exact test would also say.
        let big = 1usize << 33;
        let a = request(
            Device::CPU,
            0,
            3 * big,
            0,
            &[2],
            &[1],
            big,
            true,
            1,
            "f",
            "x",
        );
        let b = request(
            Device::CPU,
            big / 2,
            big / 2 + 2 * big,
            big / 2,
            &[2],
            &[1],
            big,
            false,
            2,
            "f",
            "y",
        );
        assert_eq!((a.itemsize, a.modulus), (1, 1));
        assert!(may_overlap(&a, &b) && may_overlap(&b, &a));
    }

    #[test]
    fn long_names_are_cut_within_their_bounds() {
        let long: &'static str = Box::leak("é".repeat(40_000).into_boxed_str());
        let r = request(Device::CPU, 0, 8, 0, &[1], &[1], 8, false, 1, long, "x");
        assert_eq!(r.function_len, u16::MAX);
        // 65535 bytes end inside a two-byte character: read as "?".
        assert_eq!(name(r.function, r.function_len), "?");
        assert_eq!(name(r.param, r.param_len), "x");
    }

    #[test]
    fn the_lock_excludes() {
        static COUNT: OneWordLock<u64> = OneWordLock::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let mut n = COUNT.lock();
                        // A read and a later write: lost updates without
                        // exclusion.
                        let v = *n;
                        std::hint::black_box(&v);
                        *n = v + 1;
                    }
                });
            }
        });
        assert_eq!(*COUNT.lock(), 40_000);
    }
}
