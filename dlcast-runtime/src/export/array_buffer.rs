//! [`ArrayBuffer`] and [`BufferRef`]: the data of a `#[pyclass]`, handed to
//! Python as arrays that write into it. Public as [`crate::buffer`]; the
//! design (shared allocation, the owner kept alive, reads registered in the
//! borrow registry, cycles) is documented there, from `array_buffer.md`.

use crate::borrow::{self, Borrow, Refused};
use crate::device::Device;
use crate::dtype::Element;
use crate::error::ExportError;
use crate::export::{ShapeError, Tensor};
use crate::layout;
use pyo3::prelude::*;
use smallvec::SmallVec;
use std::ptr::NonNull;
use std::sync::Arc;

/// The allocation an [`ArrayBuffer`] and its exports share.
struct Storage<T> {
    /// `len` elements, aligned to [`ArrayBuffer::ALIGN`] bytes (dangling
    /// when `len == 0`).
    ptr: NonNull<T>,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: `Storage` owns a plain heap allocation of `T: Element` values
// (integers, floats, bools: `Send + Sync`, no thread-bound state). Its
// contents are only read or written through raw pointers, under the rules
// of the module docs (registry guards, `Arc::get_mut`, Python's own
// accesses), never through a reference held by `Storage` itself.
unsafe impl<T: Element> Send for Storage<T> {}
// SAFETY: as above; `&Storage` gives no access to the contents.
unsafe impl<T: Element> Sync for Storage<T> {}

impl<T> Drop for Storage<T> {
    fn drop(&mut self) {
        if self.layout.size() != 0 {
            // SAFETY: allocated in `Storage::zeroed` with this layout; the
            // last `Arc` is going, so nothing refers to it any more.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), self.layout) }
        }
    }
}

impl<T: Element> Storage<T> {
    /// `len` zeroed elements (0, 0.0, `false`: valid for every `Element`).
    fn zeroed(len: usize) -> Option<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        let align = ArrayBuffer::<T>::ALIGN.max(std::mem::align_of::<T>());
        let layout = std::alloc::Layout::from_size_align(bytes, align).ok()?;
        let ptr = if bytes == 0 {
            NonNull::dangling()
        } else {
            // SAFETY: `layout` has a non-zero size.
            NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?.cast()
        };
        Some(Storage { ptr, len, layout })
    }
}

/// Data a `#[pyclass]` owns and hands to Python as arrays that read and
/// write it in place, keeping the object alive.
///
/// A C-order array of `T` (64-byte aligned, so JAX takes it without a
/// copy). [`ArrayBuffer::view`] exports it writable,
/// [`ArrayBuffer::view_read_only`] read-only; both return a [`Tensor`], so
/// a method returns it like any tensor (to `dlcast.Array`, or the framework
/// of `#[dlpack_fn(returns = ..)]`). While exported arrays live, Rust code
/// cannot take `&mut` to the data or reallocate it (`BufferError`); it
/// reads through a registered guard. See the [module docs](crate::buffer) for the
/// rules and why they are sound.
///
/// ```
/// use dlcast_runtime::prelude::*;
/// use pyo3::prelude::*;
///
/// #[pyclass]
/// struct Matrix {
///     data: ArrayBuffer<f32>,
/// }
///
/// #[pymethods]
/// impl Matrix {
///     #[new]
///     fn new() -> PyResult<Self> {
///         Ok(Matrix { data: ArrayBuffer::zeros(&[4, 4])? })
///     }
///     /// A writable (4, 4) view: writes through it change the matrix.
///     /// (`try_borrow`: a Python error, not a panic, if a `&mut self`
///     /// method of the object is running.)
///     fn data(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
///         slf.try_borrow()?.data.view(slf)
///     }
///     /// Rust's own access: refused while a view from `data()` lives.
///     fn identity(&mut self) -> PyResult<()> {
///         let m = self.data.as_mut_slice()?;
///         m.fill(0.0);
///         for i in 0..4 {
///             m[i * 5] = 1.0;
///         }
///         Ok(())
///     }
/// }
/// ```
pub struct ArrayBuffer<T: Element> {
    storage: Arc<Storage<T>>,
    /// Held by every writable export (and this buffer): their number is
    /// `strong_count - 1`, what [`ArrayBuffer::with_mut`] refuses.
    writers: Arc<()>,
    shape: SmallVec<[usize; 4]>,
    strides: SmallVec<[isize; 4]>,
}

impl<T: Element> ArrayBuffer<T> {
    /// Alignment in bytes of the data (that of [`Tensor::zeros`]).
    pub const ALIGN: usize = 64;

    /// A C-order buffer of `shape` filled with zero bytes (0, 0.0, `false`).
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the element count overflows,
    /// [`ShapeError::OutOfMemory`] (`MemoryError`) if it cannot be allocated.
    pub fn zeros(shape: &[usize]) -> Result<Self, ShapeError> {
        // An element count beyond `usize` cannot be allocated either.
        let count = layout::element_count(shape).ok_or_else(|| ShapeError::OutOfMemory {
            shape: shape.to_vec(),
            bytes: usize::MAX,
        })?;
        let oom = || ShapeError::OutOfMemory {
            shape: shape.to_vec(),
            bytes: count.saturating_mul(std::mem::size_of::<T>()),
        };
        let mut strides: SmallVec<[isize; 4]> = smallvec::smallvec![0; shape.len()];
        layout::fill_c_strides_or_empty(shape, &mut strides).ok_or_else(oom)?;
        let storage = Storage::zeroed(count).ok_or_else(oom)?;
        Ok(ArrayBuffer {
            storage: Arc::new(storage),
            writers: Arc::new(()),
            shape: shape.into(),
            strides,
        })
    }

    /// A C-order buffer of `shape` holding `data` (copied once into an
    /// aligned allocation).
    ///
    /// # Errors
    /// [`ShapeError::Length`] if `shape` does not hold `data.len()`
    /// elements; [`ShapeError::OutOfMemory`] as for [`ArrayBuffer::zeros`].
    pub fn from_slice(data: &[T], shape: &[usize]) -> Result<Self, ShapeError> {
        if layout::element_count(shape) != Some(data.len()) {
            return Err(ShapeError::Length {
                shape: shape.to_vec(),
                expected: layout::element_count(shape).unwrap_or(usize::MAX),
                got: data.len(),
            });
        }
        let mut buf = Self::zeros(shape)?;
        // A fresh buffer has no exports.
        if let Some(s) = buf.exclusive_slice() {
            s.copy_from_slice(data);
        }
        Ok(buf)
    }

    /// Extents.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.storage.len
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.storage.len == 0
    }

    /// How many exported arrays of this buffer are alive (a snapshot:
    /// another thread may export or drop one right after).
    pub fn exports(&self) -> usize {
        Arc::strong_count(&self.storage) - 1
    }

    /// `&mut` to the elements when no export lives; proven by `&mut self`
    /// plus `Arc::get_mut` (no other `Arc`, so no export and no guard).
    fn exclusive_slice(&mut self) -> Option<&mut [T]> {
        let s = Arc::get_mut(&mut self.storage)?;
        // SAFETY: `s` is the only handle to the storage (`get_mut`), and
        // `&mut self` excludes every other Rust access for the returned
        // lifetime; the storage holds `len` initialised, aligned elements
        // (zeroed at allocation, written only as `T` since).
        Some(unsafe { std::slice::from_raw_parts_mut(s.ptr.as_ptr(), s.len) })
    }

    /// For element types with invalid bit patterns (`bool`): every element
    /// holds a valid value. Python may write any byte into an exported
    /// `bool` array (`a.view(np.uint8)[0] = 2`), and a Rust `bool` must be
    /// 0 or 1, so anything that hands out `bool`s checks first.
    ///
    /// # Errors
    /// `ValueError` naming the first invalid element.
    fn check_values(&self) -> PyResult<()> {
        if T::ALL_BIT_PATTERNS_VALID {
            return Ok(());
        }
        let s = &*self.storage;
        for i in 0..s.len {
            // SAFETY: `i < len`: inside the live allocation; `is_valid_at`
            // reads the element's bytes without forming a `T`.
            if !unsafe { T::is_valid_at(s.ptr.as_ptr().add(i)) } {
                return Err(ExportError::InvalidElement {
                    index: i,
                    dtype: T::DTYPE,
                }
                .into());
            }
        }
        Ok(())
    }

    fn in_use(&self, what: &'static str) -> PyErr {
        ExportError::Exported {
            what,
            exports: self.exports(),
        }
        .into()
    }

    /// The elements in C order, writable, when no exported array lives.
    ///
    /// # Errors
    /// `BufferError` while any array exported from the buffer is alive
    /// (their memory is Python's to write).
    pub fn as_mut_slice(&mut self) -> PyResult<&mut [T]> {
        if Arc::get_mut(&mut self.storage).is_none() {
            return Err(self.in_use("write the buffer from Rust"));
        }
        self.check_values()?;
        self.exclusive_slice()
            .ok_or_else(|| ExportError::InUse.into())
    }

    /// Replaces the contents by `shape` zero elements, reallocating (the
    /// only way the buffer changes size).
    ///
    /// # Errors
    /// `BufferError` while any exported array is alive (it would keep the
    /// old memory); `MemoryError` / `ValueError` as [`ArrayBuffer::zeros`].
    pub fn resize(&mut self, shape: &[usize]) -> PyResult<()> {
        if Arc::get_mut(&mut self.storage).is_none() {
            return Err(self.in_use("resize the buffer"));
        }
        *self = Self::zeros(shape)?;
        Ok(())
    }

    /// A read guard over the elements (C order), registered as a read
    /// borrow in the borrow registry until it drops.
    ///
    /// # Errors
    /// `BufferError` if a writable dlcast view of the memory is live (an
    /// exported array passed as `TensorMut` to a call still running);
    /// `MemoryError` if the registry cannot grow; `RuntimeError` while exports
    /// that rust-numpy could borrow live and its borrows cannot be followed
    /// (the type's documentation).
    pub fn read(&self, py: Python<'_>) -> PyResult<BufferRef<'_, T>> {
        let blind = Self::rust_numpy(py)?;
        let borrow = self.register(py, false, "read")?;
        // A rust-numpy `PyReadwriteArray` (`&mut`) of a writable export is
        // invisible here when rust-numpy keeps its own registry (see
        // `register_write`).
        Self::refuse_blind(blind, self.writable_exports(), "read the buffer")?;
        self.check_values()?;
        let s = &*self.storage;
        // SAFETY: the storage holds `len` initialised, aligned elements and
        // stays allocated while `self` (whose `Arc` the guard borrows)
        // lives. No Rust `&mut` to it exists: `as_mut_slice` needs `&mut
        // self`, and every dlcast `&mut` view of exported memory is a
        // registered writable borrow, which `borrow` excludes until it drops.
        let slice = unsafe { std::slice::from_raw_parts(s.ptr.as_ptr(), s.len) };
        Ok(BufferRef {
            slice,
            _borrow: borrow,
        })
    }

    /// The flat (C-order) position of `index`, if in bounds.
    fn flat(&self, index: &[usize]) -> Option<usize> {
        let off = layout::offset_of(&self.shape, &self.strides, index)?;
        usize::try_from(off).ok().filter(|&o| o < self.storage.len)
    }

    /// Element `index` (one index per dimension), read without forming a
    /// Rust reference, also while arrays are exported.
    ///
    /// # Errors
    /// `IndexError` out of bounds; `BufferError` while a writable dlcast view
    /// of the memory is live; `RuntimeError` while exports that rust-numpy
    /// could borrow live and its borrows cannot be followed (the type's
    /// documentation).
    pub fn get(&self, py: Python<'_>, index: &[usize]) -> PyResult<T> {
        let at = self.flat(index).ok_or_else(|| self.index_error(index))?;
        let blind = Self::rust_numpy(py)?;
        let _borrow = self.register(py, false, "read the buffer")?;
        // As in `read`: a rust-numpy `&mut` of a writable export.
        Self::refuse_blind(blind, self.writable_exports(), "read the buffer")?;
        let ptr = self.storage.ptr.as_ptr().wrapping_add(at);
        // SAFETY: `at < len`: `ptr` is inside the live allocation (this
        // `Arc`); `is_valid_at` reads its bytes without forming a `T`.
        if !T::ALL_BIT_PATTERNS_VALID && !unsafe { T::is_valid_at(ptr) } {
            return Err(ExportError::InvalidElementAt {
                index: index.to_vec(),
                dtype: T::DTYPE,
            }
            .into());
        }
        // SAFETY: as above, an initialised, aligned `T` holding a valid
        // value (checked); no registered writer exists (checked).
        Ok(unsafe { ptr.read() })
    }

    /// Writes element `index` without forming a Rust reference: allowed
    /// while arrays are exported (they see the write, as nanobind's
    /// `reference_internal` arrays do), refused while any Rust or dlcast
    /// borrow of the memory is live ([`BufferRef`], or a view in a call
    /// still running).
    ///
    /// # Errors
    /// `IndexError` out of bounds; `BufferError` while such a borrow lives;
    /// `RuntimeError` while exports that rust-numpy could borrow live and its
    /// borrows cannot be followed (the type's documentation).
    pub fn set(&self, py: Python<'_>, index: &[usize], value: T) -> PyResult<()> {
        let at = self.flat(index).ok_or_else(|| self.index_error(index))?;
        let _borrow = self.register_write(py, "write the buffer")?;
        // SAFETY: `at < len`, inside the live allocation, aligned for `T`;
        // no Rust reference to the memory is live (a `BufferRef` or a
        // dlcast view would be a registered borrow, refused above, and
        // `as_mut_slice` needs `&mut self`).
        unsafe { self.storage.ptr.as_ptr().add(at).write(value) };
        Ok(())
    }

    /// How many writable arrays exported from this buffer
    /// ([`ArrayBuffer::view`]) are alive (a snapshot, as
    /// [`ArrayBuffer::exports`]).
    pub fn writable_exports(&self) -> usize {
        Arc::strong_count(&self.writers) - 1
    }

    /// Writes `src` (C order, [`ArrayBuffer::len`] elements) over the
    /// whole buffer, without forming a Rust reference to it: the bulk
    /// [`ArrayBuffer::set`], with its rule. Allowed while arrays exported
    /// from the buffer live (they see the new values); refused while a Rust
    /// or dlcast borrow of the memory is live (a [`BufferRef`], or a view
    /// of an exported array in a call still running, here or on another
    /// thread), which Rust's aliasing rules would forbid. The write holds
    /// a writable borrow-registry entry while it runs.
    ///
    /// ```
    /// # use dlcast_runtime::ArrayBuffer;
    /// # use pyo3::prelude::*;
    /// # Python::initialize();
    /// # Python::attach(|py| -> PyResult<()> {
    /// let buf = ArrayBuffer::<f32>::zeros(&[2, 2])?;
    /// buf.copy_from_slice(py, &[1.0, 2.0, 3.0, 4.0])?;
    /// assert_eq!(buf.get(py, &[1, 0])?, 3.0);
    /// assert!(buf.copy_from_slice(py, &[1.0]).is_err()); // wrong length
    /// # Ok(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// `ValueError` if `src.len()` is not [`ArrayBuffer::len`] (nothing is
    /// written); `BufferError` while such a borrow lives; `MemoryError` if the
    /// registry cannot grow; `RuntimeError` while exports that rust-numpy could
    /// borrow live and its borrows cannot be followed (the type's
    /// documentation).
    pub fn copy_from_slice(&self, py: Python<'_>, src: &[T]) -> PyResult<()> {
        let len = self.storage.len;
        if src.len() != len {
            return Err(ExportError::Parts(ShapeError::Length {
                shape: self.shape.to_vec(),
                expected: len,
                got: src.len(),
            })
            .into());
        }
        let _borrow = self.register_write(py, "write the buffer")?;
        // SAFETY: `len` elements fit the live allocation (this `Arc`),
        // aligned for `T`, and `src` holds `len` initialised `T`s. No Rust
        // reference to the buffer's memory is live: a `BufferRef` or a
        // dlcast view of an exported array would be a registered borrow,
        // refused above, and `as_mut_slice`/`with_mut` need `&mut self`. So
        // `src` (a live shared reference) is not the buffer's memory unless
        // an unregistered reference aliases it; `copy` (a `memmove`) is used
        // all the same, correct for overlapping ranges.
        unsafe { std::ptr::copy(src.as_ptr(), self.storage.ptr.as_ptr(), len) };
        Ok(())
    }

    /// Writes `value` into every element, without forming a Rust
    /// reference: the bulk [`ArrayBuffer::set`], with its rule (see
    /// [`ArrayBuffer::copy_from_slice`]).
    ///
    /// # Errors
    /// `BufferError` while a Rust or dlcast borrow of the memory is live;
    /// `MemoryError` if the registry cannot grow; `RuntimeError` while exports
    /// that rust-numpy could borrow live and its borrows cannot be followed
    /// (the type's documentation).
    pub fn fill(&self, py: Python<'_>, value: T) -> PyResult<()> {
        let _borrow = self.register_write(py, "write the buffer")?;
        let base = self.storage.ptr.as_ptr();
        for i in 0..self.storage.len {
            // SAFETY: `i < len`: inside the live allocation, aligned for
            // `T`; no Rust reference to the memory is live (as in
            // `copy_from_slice`).
            unsafe { base.add(i).write(value) };
        }
        Ok(())
    }

    /// Runs `f` on the elements (C order) as `&mut [T]`, while arrays
    /// exported read-only ([`ArrayBuffer::view_read_only`]) may be alive:
    /// they see the new values, as they see [`ArrayBuffer::set`]'s. The
    /// guarded bulk write for code that needs a slice (sorting, `ndarray`,
    /// a numeric kernel); [`ArrayBuffer::as_mut_slice`] when no array is
    /// exported at all.
    ///
    /// The rule: `&mut [T]` promises Rust that nothing else writes the
    /// elements while it lives. A writable export is Python's to write at
    /// any time (from another thread too, where NumPy releases the GIL),
    /// so `with_mut` is refused while one lives; read-only exports cannot
    /// be written by their consumers (NumPy refuses to make such an array
    /// writable). Their readers on other threads may see the elements
    /// mid-update, as with any write to memory Python shares; Python code
    /// that `f` itself runs (through a captured `py`) must not read them
    /// while it holds the slice, which Rust's aliasing rules forbid. Like every
    /// dlcast guarantee, this assumes consumers honour read-only marks:
    /// one that ignores DLPack's `READ_ONLY` (`torch.from_dlpack` of a
    /// read-only export) and writes meanwhile is not detected (README,
    /// *Safety*). While `f` runs, a writable entry in the borrow registry
    /// makes a dlcast view of an exported array (a call on another
    /// thread) wait its turn with a `BufferError`.
    ///
    /// ```
    /// # use dlcast_runtime::ArrayBuffer;
    /// # use pyo3::prelude::*;
    /// # Python::initialize();
    /// # Python::attach(|py| -> PyResult<()> {
    /// let mut buf = ArrayBuffer::<i32>::from_slice(&[3, 1, 2], &[3])?;
    /// let largest = buf.with_mut(py, |s| {
    ///     s.sort_unstable();
    ///     s[2]
    /// })?;
    /// assert_eq!((largest, buf.get(py, &[0])?), (3, 1));
    /// # Ok(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// `BufferError` while a writable export lives, or a dlcast view of an
    /// exported array in a call still running; `ValueError` for a `bool` buffer
    /// holding a byte other than 0 or 1 (written by Python); `MemoryError` if
    /// the registry cannot grow; `RuntimeError` while exports that rust-numpy
    /// could borrow live and its borrows cannot be followed (the type's
    /// documentation). `f` does not run then.
    pub fn with_mut<R>(&mut self, py: Python<'_>, f: impl FnOnce(&mut [T]) -> R) -> PyResult<R> {
        // `Arc::get_mut`, not a count of `strong_count` (a relaxed load):
        // its acquire makes everything a writable export's holder did
        // before dropping it, on any thread (free-threaded Python drops
        // objects without a GIL to order them), happen before `f`'s accesses.
        if Arc::get_mut(&mut self.writers).is_none() {
            return Err(ExportError::Exported {
                what: "lend the buffer as `&mut` (with_mut) while a writable view of it lives \
                       (read-only views may stay)",
                exports: self.writable_exports(),
            }
            .into());
        }
        let _borrow = self.register_write(py, "write the buffer")?;
        self.check_values()?;
        let s = &*self.storage;
        let slice = if s.len == 0 {
            &mut []
        } else {
            // SAFETY: the storage holds `len` initialised, aligned elements
            // holding valid values (checked above), allocated while `self`
            // lives. Nothing else writes them while `slice` lives: no
            // writable export exists (`get_mut` above; a new one needs `&self`,
            // which `&mut self` excludes, and a read-only export never
            // becomes writable), `set`/`fill`/`copy_from_slice` need `&self`,
            // and a dlcast view of an exported array is a registered borrow
            // that `_borrow` excludes until `f` returns. No Rust reference
            // reads them either: a `BufferRef` borrows `self`, and the
            // registry excludes dlcast views as above.
            unsafe { std::slice::from_raw_parts_mut(s.ptr.as_ptr(), s.len) }
        };
        Ok(f(slice))
    }

    fn index_error(&self, index: &[usize]) -> PyErr {
        let (index, shape) = (index.to_vec(), self.shape.to_vec());
        if index.len() != shape.len() {
            return ExportError::IndexRank { index, shape }.into();
        }
        ExportError::IndexBounds { index, shape }.into()
    }

    /// Registers a borrow of the whole buffer (`None` for an empty one).
    fn register(
        &self,
        py: Python<'_>,
        writable: bool,
        what: &'static str,
    ) -> PyResult<Option<Borrow>> {
        let s = &*self.storage;
        if s.len == 0 {
            return Ok(None);
        }
        let item = std::mem::size_of::<T>();
        let start = s.ptr.as_ptr() as usize;
        // The allocation's byte size (`len * item`) fits `isize`.
        let hi = start + s.len * item;
        let req = borrow::request(
            Device::CPU,
            start,
            hi,
            start,
            &[s.len],
            &[1],
            item,
            writable,
            borrow::new_call_id(),
            if writable {
                "ArrayBuffer.set"
            } else {
                "ArrayBuffer.read"
            },
            "self",
        );
        let api = borrow::api(py)?;
        match borrow::acquire_with(api, &req) {
            Ok(b) => Ok(Some(b)),
            Err(Refused::NoMemory) => Err(ExportError::RegistryFull.into()),
            Err(Refused::Conflict(other))
                if borrow::name(other.function, other.function_len)
                    == borrow::rust_numpy::RUST_NUMPY =>
            {
                Err(ExportError::BorrowedByRustNumpy {
                    what,
                    writable: other.writable != 0,
                }
                .into())
            }
            Err(Refused::Conflict(other)) => Err(ExportError::Borrowed {
                what,
                writable: other.writable != 0,
                param: borrow::name(other.param, other.param_len),
                func: borrow::name(other.function, other.function_len),
            }
            .into()),
        }
    }

    /// A registered write from Rust (`set`, `fill`, `copy_from_slice`,
    /// `with_mut`): [`ArrayBuffer::register`], and refused while exports
    /// live if a rust-numpy extension keeps its own borrow registry. There
    /// rust-numpy's `PyReadonlyArray`s (`&` to the elements) of an exported
    /// NumPy array are entered by the array's base object, which dlcast's
    /// registry never sees, so the write could change memory under them.
    /// In dlcast's registry (dlcast came first, the usual case) they are
    /// entered by address and `register` sees them.
    fn register_write(&self, py: Python<'_>, what: &'static str) -> PyResult<Option<Borrow>> {
        let blind = Self::rust_numpy(py)?;
        let borrow = self.register(py, true, what)?;
        Self::refuse_blind(blind, self.exports(), what)?;
        Ok(borrow)
    }

    /// Before an access registers its borrow: where rust-numpy's borrows of
    /// NumPy arrays are, as `borrow::rust_numpy::foreign_in_use` says after
    /// checking rust-numpy's table (Python code may have deleted dlcast's
    /// table since the last dlcast call, and a rust-numpy extension
    /// published its own: it is adopted now, or NumPy arrays refused).
    /// That check is the access's last step that may run Python code (the
    /// registry is set up first: its set-up may too); what follows
    /// (`register`, the count of exports, the access) runs none. An error
    /// is kept for `refuse_blind`, which needs it only while exports live.
    fn rust_numpy(py: Python<'_>) -> PyResult<PyResult<bool>> {
        borrow::api(py)?;
        Ok(borrow::rust_numpy::foreign_in_use(py))
    }

    /// Refuses the access while `exports` arrays that rust-numpy could be
    /// borrowing live, and rust-numpy's borrows are not all in dlcast's
    /// registry (`blind`, from `rust_numpy`).
    fn refuse_blind(blind: PyResult<bool>, exports: usize, what: &'static str) -> PyResult<()> {
        if exports == 0 {
            return Ok(());
        }
        match blind {
            Ok(false) => Ok(()),
            Ok(true) => Err(ExportError::RustNumpyBlind { what, exports }.into()),
            Err(e) => Err(e),
        }
    }

    fn export(&self, owner: Py<PyAny>, read_only: bool) -> PyResult<Tensor<T>> {
        let keep = ExportedStorage {
            _storage: self.storage.clone(),
            _writer: (!read_only).then(|| self.writers.clone()),
        };
        let data = self.storage.ptr.as_ptr().cast::<u8>();
        Tensor::from_shared_parts(
            data,
            &self.shape,
            &self.strides,
            Device::CPU,
            read_only,
            Box::new(keep),
            Some(owner),
        )
        .map_err(|e| ExportError::Parts(e).into())
    }

    /// A writable array over the buffer, holding `owner` (the object the
    /// buffer belongs to) alive; writes through it are seen by the object
    /// and Rust's writes (after the array is gone) by nobody else.
    ///
    /// # Errors
    /// `BufferError` while a [`BufferRef`] of the buffer or any other live
    /// dlcast view of its memory exists (Rust would see writes under a
    /// shared reference).
    pub fn view<'py, O>(&self, owner: &Bound<'py, O>) -> PyResult<Tensor<T>> {
        // A transient writable borrow: refused by live readers.
        drop(self.register(owner.py(), true, "export a writable view")?);
        self.export(owner.as_any().clone().unbind(), false)
    }

    /// A read-only array over the buffer (DLPack `READ_ONLY`, NumPy
    /// `writeable == False`), holding `owner` alive.
    ///
    /// # Errors
    /// `BufferError` while a writable dlcast view of the memory is live.
    pub fn view_read_only<'py, O>(&self, owner: &Bound<'py, O>) -> PyResult<Tensor<T>> {
        drop(self.register(owner.py(), false, "export a read-only view")?);
        self.export(owner.as_any().clone().unbind(), true)
    }

    /// A copy of the elements as an owned [`Tensor`] (independent of the
    /// buffer).
    ///
    /// # Errors
    /// As [`ArrayBuffer::read`]; `MemoryError` if the copy cannot be made.
    pub fn to_tensor(&self, py: Python<'_>) -> PyResult<Tensor<T>> {
        let r = self.read(py)?;
        let mut t = Tensor::<T>::zeros(&self.shape)?;
        if let Some(s) = t.as_slice_mut() {
            s.copy_from_slice(&r);
        }
        Ok(t)
    }
}

/// What an export of an [`ArrayBuffer`] holds besides the object: the
/// memory.
struct ExportedStorage<T> {
    _storage: Arc<Storage<T>>,
    /// For a writable export: counted in [`ArrayBuffer::writable_exports`].
    _writer: Option<Arc<()>>,
}

impl<T: Element> std::fmt::Debug for ArrayBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayBuffer")
            .field("shape", &self.shape.as_slice())
            .field("dtype", &T::DTYPE)
            .field("exports", &self.exports())
            .finish()
    }
}

/// Shared access to an [`ArrayBuffer`]'s elements (C order), registered
/// in the borrow registry until it drops. Dereferences to `[T]`.
pub struct BufferRef<'a, T> {
    slice: &'a [T],
    _borrow: Option<Borrow>,
}

impl<T> std::ops::Deref for BufferRef<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}
