//! [`Tensor`]: an owned array made in Rust (its constructors, the `From`
//! impls), and how a `Tensor` or a returned view becomes a Python object
//! ([`IntoPyObject`], [`export_view`]).

use super::alloc::{
    zeroed_dims, Exported, KeepAlive, OwnedAlloc, ShapeError, Unrepresentable, EXPORT_ALIGN,
};
use super::array::Array;
use crate::device::Device;
use crate::dtype::Element;
use crate::error::ExportError;
use crate::import::{Dims, RawTensor};
use crate::layout;
use crate::view::{TensorDyn, TensorDynMut, TensorMut, TensorRef, DYN};
use pyo3::prelude::*;
use std::any::Any;
use std::marker::PhantomData;

/// An owned array made in Rust, exported to Python without a copy.
///
/// Build it from a `Vec<T>` plus a shape (C or F order, or explicit strides
/// in elements), from a `Box<[T]>` (1-d), or from an `ndarray::Array` (its
/// allocation becomes the exported buffer). Return it from a `#[dlpack_fn]`
/// function (also inside `Option`, `PyResult` or a tuple); Python receives a
/// `dlcast.Array`, or the framework named in `returns = ...`. The data is
/// freed when the last Python object or DLPack consumer lets go.
///
/// # Examples
///
/// ```
/// use dlcast_runtime::Tensor;
///
/// // C order over a `Vec` (no copy):
/// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// assert_eq!((t.shape(), t.strides()), (vec![2, 3], vec![3, 1])); // strides in elements
/// // The same values in F order:
/// let f = Tensor::from_vec_f(vec![1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0], &[2, 3])?;
/// assert_eq!(f.strides(), [1, 2]);
/// // Zeros in a 64-byte aligned buffer, then filled:
/// let mut z = Tensor::<u8>::zeros(&[2, 2])?;
/// assert_eq!(z.data_ptr() as usize % Tensor::<u8>::ALIGN, 0);
/// z.as_slice_mut().unwrap().copy_from_slice(&[1, 0, 0, 1]);
/// // A shape that does not hold the data:
/// assert!(Tensor::from_vec(vec![0i32; 5], &[2, 3]).is_err());
/// # Ok::<(), dlcast_runtime::ShapeError>(())
/// ```
///
/// Returned from a `#[dlpack_fn]` function, Python gets a `dlcast.Array`
/// over the same buffer (or the framework `returns = ..` names):
///
/// ```
/// # use dlcast_runtime::prelude::*;
/// # use pyo3::prelude::*;
/// #[dlpack_fn(returns = numpy)]
/// #[pyfunction]
/// fn identity(n: usize) -> PyResult<Tensor<f64>> {
///     Ok(Tensor::from_fn(&[n, n], |i| if i % (n + 1) == 0 { 1.0 } else { 0.0 })?)
/// }
/// ```
///
/// The const parameter `N` is the number of dimensions, as for
/// [`TensorRef`]: [`DYN`] (the default) for a rank known at run time, any
/// other value for a rank the type fixes. The constructors make dynamic
/// tensors; [`Tensor::into_rank`] fixes the rank (checked), and a function
/// returning `Tensor<f32, 2>` states its result's rank in Rust and in the
/// Python signature the macros write (`numpy.ndarray[float32, (_, _)]`).
pub struct Tensor<T: Element, const N: usize = DYN> {
    inner: Exported,
    _marker: PhantomData<T>,
    /// Whether Rust owns the memory and nothing else refers to it (so
    /// [`Tensor::as_slice_mut`] may hand it out): false for views of an
    /// [`ArrayBuffer`](crate::ArrayBuffer), static and foreign memory.
    exclusive: bool,
}

impl<T: Element> Tensor<T> {
    /// A C-order (row-major) array of `shape` over `data`.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the shape does not hold `data.len()` elements.
    pub fn from_vec(data: Vec<T>, shape: &[usize]) -> Result<Self, ShapeError> {
        let mut strides = zeroed_dims(shape.len());
        Self::check_len(&data, shape)?;
        // The count fits (checked), so only an empty shape with a huge
        // extent can overflow its strides: no consumer could be told them.
        layout::fill_c_strides(shape, &mut strides).ok_or_else(|| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: Vec::new(),
            why: "the compact strides of an extent overflow isize",
        })?;
        Self::from_vec_strides(data, shape, &strides)
    }

    /// An F-order (column-major) array of `shape` over `data`.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the shape does not hold `data.len()` elements.
    pub fn from_vec_f(data: Vec<T>, shape: &[usize]) -> Result<Self, ShapeError> {
        Self::check_len(&data, shape)?;
        let rev: Dims<usize> = shape.iter().rev().copied().collect();
        let mut strides: Dims<isize> = smallvec::smallvec![0; shape.len()];
        layout::fill_c_strides(&rev, &mut strides).ok_or_else(|| Self::len_error(&data, shape))?;
        strides.reverse();
        Self::from_vec_strides(data, shape, &strides)
    }

    /// An array of `shape` with explicit `strides` (in elements, negative
    /// allowed) whose element 0 is `data[0]`... unless strides are negative,
    /// in which case element 0 is placed so that the lowest element is
    /// `data[0]`.
    ///
    /// # Errors
    /// [`ShapeError`] if the ranks differ or an index reaches outside `data`.
    pub fn from_vec_strides(
        mut data: Vec<T>,
        shape: &[usize],
        strides: &[isize],
    ) -> Result<Self, ShapeError> {
        if shape.len() != strides.len() {
            return Err(ShapeError::Rank(shape.len(), strides.len()));
        }
        let item = std::mem::size_of::<T>();
        let oob = || ShapeError::OutOfBounds {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            len: data.len(),
        };
        let (first, empty) = match layout::byte_extent(shape, strides, item).ok_or_else(oob)? {
            None => (0usize, true),
            Some(e) => {
                let span =
                    e.hi.checked_sub(e.lo)
                        .and_then(|d| usize::try_from(d).ok())
                        .ok_or_else(oob)?;
                // `data.len() * item` is the byte size of a live `Vec`,
                // which fits `isize`; checked anyway.
                if data.len().checked_mul(item).is_none_or(|b| span > b) {
                    return Err(oob());
                }
                (e.lo.unsigned_abs(), false)
            }
        };
        let base = data.as_mut_ptr().cast::<u8>();
        // Element 0 sits `first` bytes above the lowest element, which is
        // `data[0]`; in bounds as checked above (or empty: never read).
        let ptr = if empty {
            base
        } else {
            base.wrapping_add(first)
        };
        let unrepresentable = |e: Unrepresentable| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: e.0,
        };
        Ok(Tensor {
            inner: Exported::new(
                ptr,
                shape,
                strides,
                T::DTYPE,
                Device::CPU,
                false,
                OwnedAlloc::keep_vec(data),
            )
            .map_err(unrepresentable)?,
            _marker: PhantomData,
            exclusive: true,
        })
    }

    /// A C-order array of `shape` whose element at flat (C-order) index `i`
    /// is `f(i)`, in a buffer aligned to [`Tensor::ALIGN`] bytes.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the element count overflows,
    /// [`ShapeError::OutOfMemory`] (Python's `MemoryError`) if the buffer
    /// cannot be allocated.
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(usize) -> T) -> Result<Self, ShapeError> {
        let mut t = Self::zeros(shape)?;
        // `zeros` makes owned, C-contiguous, aligned and valid elements.
        for (i, v) in t.as_slice_mut().unwrap_or_default().iter_mut().enumerate() {
            *v = f(i);
        }
        Ok(t)
    }

    /// A C-order array of `shape` filled with zero bytes (0, 0.0, `false`),
    /// in a buffer aligned to [`Tensor::ALIGN`] bytes, which frameworks such
    /// as JAX need to take the buffer without a copy.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the element count overflows `usize`,
    /// [`ShapeError::Unrepresentable`] if an extent exceeds `i64::MAX`,
    /// [`ShapeError::OutOfMemory`] (Python's `MemoryError`) if the byte
    /// size exceeds the address space or the allocator refuses it.
    pub fn zeros(shape: &[usize]) -> Result<Self, ShapeError> {
        let overflow = || ShapeError::Length {
            shape: shape.to_vec(),
            expected: usize::MAX,
            got: 0,
        };
        let count = layout::element_count(shape).ok_or_else(overflow)?;
        let oom = |bytes| ShapeError::OutOfMemory {
            shape: shape.to_vec(),
            bytes,
        };
        let item = std::mem::size_of::<T>();
        let bytes = layout::checked_bytes(count, item)
            .filter(|&b| b <= isize::MAX as usize - Self::ALIGN)
            .ok_or_else(|| oom(count.saturating_mul(item)))?;
        let mut strides = zeroed_dims(shape.len());
        // Compact strides of a non-empty shape whose byte size fits `isize`
        // fit too; an empty one gets zeros where they would overflow.
        layout::fill_c_strides_or_empty(shape, &mut strides).ok_or_else(|| {
            ShapeError::Unrepresentable {
                shape: shape.to_vec(),
                strides: Vec::new(),
                why: "an extent exceeds i64::MAX, or its compact strides overflow",
            }
        })?;
        let (buf, data) = OwnedAlloc::zeroed(bytes, Self::ALIGN).ok_or_else(|| oom(bytes))?;
        let inner = Exported::new(
            data,
            shape,
            &strides,
            T::DTYPE,
            Device::CPU,
            false,
            KeepAlive::Alloc(buf),
        )
        .map_err(|e| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: e.0,
        })?;
        Ok(Tensor {
            inner,
            _marker: PhantomData,
            exclusive: true,
        })
    }

    /// Alignment in bytes of the buffers [`Tensor::zeros`] and
    /// [`Tensor::from_fn`] allocate (XLA's, for JAX's zero-copy import).
    pub const ALIGN: usize = EXPORT_ALIGN;

    /// An owned `ndarray` array, exported with its own strides; its
    /// allocation becomes the exported buffer.
    #[cfg(feature = "ndarray")]
    pub fn from_ndarray<D: ndarray::Dimension>(array: ndarray::Array<T, D>) -> Self {
        let shape: Dims<usize> = array.shape().iter().copied().collect();
        let strides: Dims<isize> = array.strides().iter().copied().collect();
        if Exported::describe(&shape, &strides, T::DTYPE).is_err() {
            // Unreachable by ndarray's invariants (extents and the byte
            // offset of every element fit `isize`; strides of extent-1 axes
            // are exported as 0 when they do not fit): a C-order copy, never
            // a panic. Its compact strides always fit, so the last resort,
            // an empty array, is never taken either.
            let v: Vec<T> = array.iter().copied().collect();
            return Tensor::from_vec(v, &shape).unwrap_or_else(|_| Tensor::from(Vec::new()));
        }
        let (vec, offset) = array.into_raw_vec_and_offset();
        let mut vec = vec;
        let base = vec.as_mut_ptr();
        // `offset` is the index of element 0 in the vector (ndarray's own
        // guarantee); an empty array may report none.
        let ptr = base.wrapping_add(offset.unwrap_or(0)).cast::<u8>();
        match Exported::new(
            ptr,
            &shape,
            &strides,
            T::DTYPE,
            Device::CPU,
            false,
            OwnedAlloc::keep_vec(vec),
        ) {
            Ok(inner) => Tensor {
                inner,
                _marker: PhantomData,
                exclusive: true,
            },
            // `describe` accepted this very shape and strides above.
            Err(_) => Tensor::from(Vec::new()),
        }
    }

    fn check_len(data: &[T], shape: &[usize]) -> Result<(), ShapeError> {
        match layout::element_count(shape) {
            Some(n) if n == data.len() => Ok(()),
            _ => Err(Self::len_error(data, shape)),
        }
    }

    fn len_error(data: &[T], shape: &[usize]) -> ShapeError {
        ShapeError::Length {
            shape: shape.to_vec(),
            expected: layout::element_count(shape).unwrap_or(usize::MAX),
            got: data.len(),
        }
    }
}

/// What every tensor offers, whatever its rank parameter.
impl<T: Element, const N: usize> Tensor<T, N> {
    /// The elements in C order, when the tensor is in host memory,
    /// C-contiguous and its data aligned for `T` (always so for `zeros`,
    /// `from_fn`, `from_vec`; never for device memory).
    ///
    /// `None` also for memory Rust does not own alone: views of an
    /// [`ArrayBuffer`](crate::ArrayBuffer), [`Tensor::from_static`] and
    /// [`Tensor::from_raw_parts`] tensors.
    pub fn as_slice_mut(&mut self) -> Option<&mut [T]> {
        if !self.exclusive {
            return None;
        }
        let e = &self.inner;
        // Device memory (a `CudaSlice` export) is never handed out as a slice.
        let ok = e.device.is_host_accessible()
            && e.is_c_contiguous()
            && (e.data as usize) % std::mem::align_of::<T>() == 0;
        if !ok {
            return None;
        }
        let len = layout::element_count(&e.shape_usize())?;
        let ptr = if len == 0 {
            std::ptr::NonNull::<T>::dangling().as_ptr()
        } else {
            e.data.cast::<T>()
        };
        // SAFETY: the tensor owns its buffer alone (`exclusive`; no Python
        // object exists yet, since exporting consumes the tensor), which holds `len` valid,
        // aligned, C-contiguous elements; `&mut self` makes this the only
        // access.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// Extents.
    pub fn shape(&self) -> Vec<usize> {
        self.inner.shape_usize().to_vec()
    }

    /// Strides in elements.
    pub fn strides(&self) -> Vec<isize> {
        self.inner.strides_isize().to_vec()
    }

    /// Address of element 0 (for zero-copy checks).
    pub fn data_ptr(&self) -> *const T {
        self.inner.data.cast()
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.inner.shape.len()
    }

    /// The same tensor, exported read-only: DLPack consumers get the
    /// `READ_ONLY` flag (versioned capsules; a legacy capsule, which cannot
    /// say so, holds a copy), NumPy arrays have `writeable == False`, the buffer
    /// protocol refuses writable requests, `returns = jax`, `mlx` and
    /// `tensorflow` hand their importers (which take only legacy capsules) a
    /// copy, given once, and `returns = torch` raises
    /// `BufferError` (PyTorch has no read-only tensors). Rust may still
    /// write it through [`Tensor::as_slice_mut`] until it is returned.
    ///
    /// ```
    /// # use dlcast_runtime::Tensor;
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap().into_read_only();
    /// assert!(t.is_read_only());
    /// ```
    pub fn into_read_only(mut self) -> Self {
        self.inner.read_only = true;
        self
    }

    /// Whether the tensor is exported read-only.
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// The tensor with its rank fixed to `M` (or made dynamic, `M` =
    /// [`DYN`]): a function returning `Tensor<f32, 2>` says, in its Rust
    /// signature and the Python stub the macros write for it
    /// (`numpy.ndarray[float32, (_, _)]`), that it returns 2-d arrays.
    ///
    /// ```
    /// # use dlcast_runtime::{Tensor, ShapeError};
    /// fn outer(a: &[f32], b: &[f32]) -> Result<Tensor<f32, 2>, ShapeError> {
    ///     Tensor::from_fn(&[a.len(), b.len()], |i| a[i / b.len()] * b[i % b.len()])?
    ///         .into_rank::<2>()
    /// }
    /// let t = outer(&[1.0, 2.0], &[3.0, 4.0, 5.0])?;
    /// assert_eq!(t.dims(), [2, 3]);
    /// assert!(Tensor::from(vec![1u8, 2]).into_rank::<2>().is_err());
    /// # Ok::<(), ShapeError>(())
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Ndim`] (Python's `TypeError`) if the tensor does not
    /// have `M` dimensions; the tensor is dropped then.
    pub fn into_rank<const M: usize>(self) -> Result<Tensor<T, M>, ShapeError> {
        if M != DYN && self.ndim() != M {
            return Err(ShapeError::Ndim {
                expected: M,
                shape: self.shape(),
            });
        }
        Ok(self.with_rank())
    }

    /// The tensor with a dynamic rank.
    pub fn into_dyn(self) -> Tensor<T> {
        self.with_rank()
    }

    /// The same tensor with rank parameter `M` (the caller checked it).
    fn with_rank<const M: usize>(self) -> Tensor<T, M> {
        Tensor {
            inner: self.inner,
            _marker: PhantomData,
            exclusive: self.exclusive,
        }
    }
}

/// The accessors of tensors whose rank the type fixes.
macro_rules! ranked_tensor {
    ($($n:literal),* $(,)?) => {$(
        impl<T: Element> Tensor<T, $n> {
            #[doc = concat!("The shape as an array of ", stringify!($n), " extents.")]
            pub fn dims(&self) -> [usize; $n] {
                // The rank is `N` (checked by `into_rank`).
                let shape = self.inner.shape_usize();
                std::array::from_fn(|k| shape.get(k).copied().unwrap_or(0))
            }
        }
    )*};
}
ranked_tensor!(0, 1, 2, 3, 4, 5, 6);

impl<T: Element> Tensor<T> {
    /// A read-only C-order array of `shape` over static data: the
    /// constants of nanobind's `rv_policy::reference`, with one difference
    /// that keeps the static unwritable. Every export of one static shares
    /// one read-only copy of its bytes, made on the first export and kept
    /// for the rest of the process (exports of a sub-slice share it too):
    /// two calls that return it give the same memory, as the static itself
    /// would, with no copy after the first. The static itself is never
    /// handed out: NumPy passes read-only arrays on to PyTorch
    /// (`torch.from_dlpack(a)`), which ignores DLPack's `READ_ONLY` and
    /// writes, and a write into a Rust static faults.
    ///
    /// Where the shared copy goes, read-only: NumPy (`returns = numpy`,
    /// `numpy.asarray`: `writeable == False`, and NumPy refuses to make it
    /// writable), `memoryview` (read-only). Copied instead: JAX, MLX and
    /// TensorFlow (`returns = ...`: their importers take only legacy
    /// capsules, which cannot say read-only; a copy each), every consumer of
    /// `dlcast.Array.__dlpack__` (CuPy, array_api_strict, a consumer
    /// calling it directly: a fresh copy each, since a DLPack consumer
    /// cannot be told apart from PyTorch; `copy=False` raises
    /// `BufferError`). Refused: `returns = torch` and `returns = paddle`
    /// (`BufferError`: no read-only tensors). A consumer that ignores
    /// `READ_ONLY` and writes the shared copy (PyTorch, given NumPy's
    /// array) changes what later exports show, never the static Rust reads.
    ///
    /// ```
    /// # use dlcast_runtime::Tensor;
    /// static TABLE: [u16; 6] = [1, 2, 3, 4, 5, 6];
    /// let t = Tensor::from_static(&TABLE, &[2, 3]).unwrap();
    /// assert!(t.is_read_only());
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Length`] if `shape` does not hold `data.len()` elements.
    pub fn from_static(data: &'static [T], shape: &[usize]) -> Result<Self, ShapeError> {
        match layout::element_count(shape) {
            Some(n) if n == data.len() => {}
            _ => {
                return Err(ShapeError::Length {
                    shape: shape.to_vec(),
                    expected: layout::element_count(shape).unwrap_or(usize::MAX),
                    got: data.len(),
                })
            }
        }
        let mut strides: Dims<isize> = smallvec::smallvec![0; shape.len()];
        // A live slice holds at most `isize::MAX` bytes, so its compact
        // strides fit; checked anyway.
        layout::fill_c_strides_or_empty(shape, &mut strides).ok_or_else(|| {
            ShapeError::Unrepresentable {
                shape: shape.to_vec(),
                strides: Vec::new(),
                why: "the compact strides overflow",
            }
        })?;
        // SAFETY: a `'static` shared slice is valid, initialised and
        // aligned for reads for the rest of the process, and never written
        // (`T` has no interior mutability); exported read-only, so no
        // consumer may write it; `shape` covers exactly `data.len()`
        // elements in C order (checked above). The owner `()` holds nothing.
        let mut t = unsafe {
            Self::from_raw_parts(
                data.as_ptr().cast_mut(),
                shape,
                &strides,
                Device::CPU,
                true,
                (),
            )
        }?;
        t.inner.static_data = true;
        Ok(t)
    }

    /// An array over memory dlcast did not allocate — a C library's
    /// buffer, an mmap, another library's device memory — exported without
    /// a copy; `owner` is dropped, exactly once, when Rust drops the tensor
    /// unexported or when the last Python object and DLPack consumer lets
    /// go of the export (nanobind's `nb::ndarray(ptr, shape, owner)` with a
    /// capsule deleter). Put what frees the memory in `owner`'s `Drop`.
    ///
    /// - `data`: address of element 0 (element `(i0, i1, ..)` is at
    ///   `data.offset(i0 * strides[0] + i1 * strides[1] + ..)`);
    /// - `shape`, `strides`: extents, and strides **in elements** (negative
    ///   allowed), of the same length;
    /// - `device`: where the memory is (`Device::CPU`, CUDA, ...); the dtype
    ///   is `T`'s;
    /// - `read_only`: export read-only, as memory that must never be
    ///   written: NumPy arrays over it have `writeable == False`,
    ///   `returns = torch` refuses it, and `__dlpack__` hands consumers a
    ///   copy of host memory (PyTorch ignores DLPack's `READ_ONLY`), as for
    ///   [`Tensor::from_static`];
    /// - `owner`: any `Send + 'static` value, kept until the memory is no
    ///   longer used.
    ///
    /// The tensor never hands the memory to Rust code:
    /// [`Tensor::as_slice_mut`] gives `None`.
    ///
    /// # Safety
    /// The caller guarantees, from this call until `owner` is dropped:
    /// 1. every element the layout reaches (each index in `shape` with
    ///    `strides`) lies inside one allocation on `device`, with `data`
    ///    aligned for `T`; for memory the host can access, every such
    ///    element holds a valid `T` (`bool`: 0 or 1);
    /// 2. that memory stays allocated and is neither moved nor freed while
    ///    `owner` lives, whatever thread holds it;
    /// 3. if `read_only` is false, the memory may be written by consumers
    ///    (Python code, other frameworks) at any time, and no Rust
    ///    reference (`&[T]`, `&mut [T]`) to it exists or is made while the
    ///    export lives; if `read_only` is true, host memory is never written
    ///    by consumers (they get copies, see above), but device memory is
    ///    handed out with DLPack's `READ_ONLY` flag only, which a consumer
    ///    such as PyTorch ignores: it must tolerate such writes;
    /// 4. dropping `owner` is sound on any thread, with or without the GIL
    ///    (it must not call Python without taking the GIL itself), and frees
    ///    nothing that other live tensors still use.
    ///
    /// # Errors
    /// [`ShapeError::Rank`] if `shape` and `strides` differ in length;
    /// [`ShapeError::Unrepresentable`] for a null or misaligned `data` of a
    /// non-empty array, or a layout whose byte offsets overflow. `owner` is
    /// dropped then.
    ///
    /// ```
    /// # use dlcast_runtime::{Device, Tensor};
    /// // A buffer from a C-style allocator, freed by the owner's Drop.
    /// struct Freed(*mut f64, usize);
    /// // SAFETY: the allocation is not tied to a thread.
    /// unsafe impl Send for Freed {}
    /// impl Drop for Freed {
    ///     fn drop(&mut self) {
    ///         // SAFETY: made by `Box::into_raw` below, freed once.
    ///         drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.0, self.1)) });
    ///     }
    /// }
    /// let ptr = Box::into_raw(vec![0.0f64; 6].into_boxed_slice()).cast::<f64>();
    /// // SAFETY: 6 valid f64 elements, kept alive by `Freed` until it drops.
    /// let t = unsafe { Tensor::from_raw_parts(ptr, &[2, 3], &[3, 1], Device::CPU, false, Freed(ptr, 6)) }
    ///     .unwrap();
    /// assert_eq!(t.shape(), vec![2, 3]);
    /// ```
    pub unsafe fn from_raw_parts<O: Send + 'static>(
        data: *mut T,
        shape: &[usize],
        strides: &[isize],
        device: Device,
        read_only: bool,
        owner: O,
    ) -> Result<Self, ShapeError> {
        if shape.len() != strides.len() {
            return Err(ShapeError::Rank(shape.len(), strides.len()));
        }
        let bad = |why| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why,
        };
        let item = std::mem::size_of::<T>();
        let empty = match layout::byte_extent(shape, strides, item) {
            None => return Err(bad("a byte offset overflows")),
            Some(e) => e.is_none(),
        };
        if !empty && data.is_null() {
            return Err(bad("the data pointer is null"));
        }
        // An opaque handle is no address: nothing to align.
        if !empty && !device.data_is_handle() && (data as usize) % std::mem::align_of::<T>() != 0 {
            return Err(bad("the data pointer is not aligned for the element type"));
        }
        Self::from_shared_parts(
            data.cast(),
            shape,
            strides,
            device,
            read_only,
            Box::new(owner),
            None,
        )
    }

    /// [`Tensor::from_raw_parts`] with DLPack's `byte_offset`: element 0
    /// lies `byte_offset` bytes after `data`. On a device whose `data` is an
    /// opaque handle (OpenCL `cl_mem`, Vulkan `VkBuffer`, Metal
    /// `MTLBuffer`: [`Device::data_is_handle`]) `data` is the handle, cast
    /// to `*mut T`, and the offset is exported as DLPack's `byte_offset`,
    /// apart from it, as the DLPack header requires there (the handle is
    /// not checked for alignment). On every other device the offset is
    /// added to `data` (exports then carry `byte_offset` 0), exactly as
    /// `from_raw_parts(data.byte_add(byte_offset), ..)`.
    ///
    /// ```
    /// # use dlcast_runtime::{Device, Tensor};
    /// # use dlcast_runtime::device::kind;
    /// // The second half of an OpenCL buffer (`cl_mem` handle 0x1000, say),
    /// // kept alive by the owner (here nothing).
    /// let opencl = Device { device_type: kind::OPENCL, device_id: 0 };
    /// let handle = 0x1000 as *mut f32;
    /// // SAFETY: (for real code) the handle's buffer holds 8 f32 from byte
    /// // 16 on, alive while the owner lives; dlcast never dereferences it.
    /// let t = unsafe { Tensor::from_raw_parts_with_offset(handle, 16, &[4], &[1], opencl, false, ()) }
    ///     .unwrap();
    /// assert_eq!(t.data_ptr(), handle.cast_const()); // the handle, not handle + 16
    /// ```
    ///
    /// # Safety
    /// As [`Tensor::from_raw_parts`], for the elements counted from byte
    /// `byte_offset` of `data`'s memory (of the handle's buffer).
    ///
    /// # Errors
    /// As [`Tensor::from_raw_parts`]; [`ShapeError::Unrepresentable`] also
    /// if `data + byte_offset` overflows on a device with addresses.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn from_raw_parts_with_offset<O: Send + 'static>(
        data: *mut T,
        byte_offset: usize,
        shape: &[usize],
        strides: &[isize],
        device: Device,
        read_only: bool,
        owner: O,
    ) -> Result<Self, ShapeError> {
        if !device.data_is_handle() {
            if (data as usize).checked_add(byte_offset).is_none() {
                return Err(ShapeError::Unrepresentable {
                    shape: shape.to_vec(),
                    strides: strides.to_vec(),
                    why: "data + byte_offset overflows",
                });
            }
            // SAFETY: the caller's guarantees, for element 0 at
            // `data + byte_offset` (no overflow, checked).
            return unsafe {
                Self::from_raw_parts(
                    data.cast::<u8>().wrapping_add(byte_offset).cast(),
                    shape,
                    strides,
                    device,
                    read_only,
                    owner,
                )
            };
        }
        // SAFETY: the caller's guarantees; the handle is never dereferenced
        // (its device is not host-accessible).
        let mut t =
            unsafe { Self::from_raw_parts(data, shape, strides, device, read_only, owner) }?;
        // `usize` fits `u64` on every target dlcast builds for.
        t.inner.byte_offset = byte_offset as u64;
        Ok(t)
    }

    /// A tensor over memory `keep` keeps alive, which Rust code does not
    /// own alone ([`Tensor::as_slice_mut`] gives `None`). The layout's
    /// byte offsets were checked by the caller.
    pub(crate) fn from_shared_parts(
        data: *mut u8,
        shape: &[usize],
        strides: &[isize],
        device: Device,
        read_only: bool,
        keep: Box<dyn Any + Send>,
        py_owner: Option<Py<PyAny>>,
    ) -> Result<Self, ShapeError> {
        let mut inner = Exported::new(
            data,
            shape,
            strides,
            T::DTYPE,
            device,
            read_only,
            KeepAlive::Owned(keep),
        )
        .map_err(|e| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: e.0,
        })?;
        inner.py_owner = py_owner;
        // Memory Rust does not own, marked read-only, may be a Rust static
        // or a read-only mapping: no consumer may get it writable.
        inner.never_written = read_only && inner.py_owner.is_none();
        Ok(Tensor {
            inner,
            _marker: PhantomData,
            exclusive: false,
        })
    }
}

impl<T: Element> Tensor<T> {
    /// A C-order array over device memory that `keep` owns (freed when the
    /// export is), ready on `stream`. Only for the device features
    /// (`cudarc`): nothing here reads the memory.
    #[cfg(feature = "cudarc")]
    pub(crate) fn from_device_parts(
        data: *mut u8,
        shape: &[usize],
        device: Device,
        stream: Option<i64>,
        keep: Box<dyn Any + Send>,
    ) -> Result<Self, ShapeError> {
        let mut strides: Dims<isize> = smallvec::smallvec![0; shape.len()];
        let unrepresentable = |why, strides: &[isize]| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why,
        };
        // The caller checked the element count (that of a real allocation),
        // so compact strides fit; checked anyway.
        if layout::fill_c_strides(shape, &mut strides).is_none() {
            return Err(unrepresentable("the compact strides overflow", &[]));
        }
        let mut inner = Exported::new(
            data,
            shape,
            &strides,
            T::DTYPE,
            device,
            false,
            KeepAlive::Owned(keep),
        )
        .map_err(|e| unrepresentable(e.0, &strides))?;
        inner.stream = stream;
        Ok(Tensor {
            inner,
            _marker: PhantomData,
            exclusive: true,
        })
    }
}

impl<T: Element> From<Vec<T>> for Tensor<T> {
    /// A 1-d array over the vector.
    fn from(v: Vec<T>) -> Self {
        let n = v.len();
        let data = v.as_ptr().cast_mut().cast::<u8>();
        // A `Vec` holds at most `isize::MAX` bytes, so its length fits
        // `i64` and `isize`, and stride 1 times the itemsize fits: no check
        // of `Exported::new` can fail for a 1-d vector.
        match Exported::new(
            data,
            &[n],
            &[1],
            T::DTYPE,
            Device::CPU,
            false,
            OwnedAlloc::keep_vec(v),
        ) {
            Ok(inner) => Tensor {
                inner,
                _marker: PhantomData,
                exclusive: true,
            },
            Err(_) => Tensor::from(Vec::new()),
        }
    }
}

impl<T: Element> From<Box<[T]>> for Tensor<T> {
    /// A 1-d array over the boxed slice (no copy: it becomes a `Vec`).
    fn from(b: Box<[T]>) -> Self {
        Tensor::from(b.into_vec())
    }
}

#[cfg(feature = "ndarray")]
impl<T: Element, D: ndarray::Dimension> From<ndarray::Array<T, D>> for Tensor<T> {
    fn from(a: ndarray::Array<T, D>) -> Self {
        Tensor::from_ndarray(a)
    }
}

impl<T: Element, const N: usize> std::fmt::Debug for Tensor<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.inner.shape.as_slice())
            .field("strides", &self.inner.strides.as_slice())
            .field("dtype", &self.inner.dtype)
            .finish()
    }
}

/// Exports an imported view (a slice, transpose, reshape or the input
/// itself): the input stays alive inside the exported object.
/// The export is read-only when the input was, and for views of PyTorch
/// tensors that require grad.
///
/// A view of a converted temporary (an argument whose dtype or order did
/// not fit) exports writable: the temporary belongs to the call alone, so
/// returned it is a new array of the caller's, which no one else sees.
/// Where its producer marked it read-only (JAX and TensorFlow arrays are
/// immutable), an aligned copy is exported instead, once.
pub(crate) fn export_view(py: Python<'_>, mut raw: RawTensor) -> PyResult<ExportedArray> {
    if raw.is_rust_data() {
        // Borrowed Rust memory would outlive its borrow inside Python (the
        // typed views copy before they get here).
        return Err(ExportError::RustData.into());
    }
    let mut copy_converted = false;
    if let Some(producer_read_only) = raw.converted {
        raw.read_only = false;
        copy_converted = producer_read_only;
    }
    // A view of a PyTorch tensor that requires grad exports read-only:
    // writes through it would bypass autograd, which PyTorch's own
    // `.numpy()` and `__dlpack__` refuse.
    let mut requires_grad = false;
    if let Some(original) = raw.torch_original() {
        if crate::import::torch::requires_grad(original.bind(py))? {
            raw.read_only = true;
            requires_grad = true;
        }
    }
    // A layout in which two indices may reach one element is never
    // exported writable: a write through one index would change what the
    // others read. `sliding_windows` views mark themselves read-only, but a
    // view of a converted temporary was made writable just above, so the
    // rule is applied here, last. (The copy made below is compact: it may
    // be writable again.)
    if layout::may_self_overlap(&raw.shape, &raw.strides) {
        raw.read_only = true;
    }
    raw.prepare_export(py)?;
    let (data, dtype, device, stream) = (raw.data, raw.dtype, raw.device, raw.stream);
    // Non-zero only where `data` is an opaque handle; `usize` fits `u64`.
    let byte_offset = raw.byte_offset as u64;
    let shape = raw.shape.clone();
    let strides = raw.strides.clone();
    // On error `raw` is dropped inside `new`: the producer's deleter runs
    // once, here.
    let mut e = Exported::new(
        data,
        &shape,
        &strides,
        dtype,
        device,
        raw.read_only,
        KeepAlive::Imported(Box::new(raw)),
    )
    .map_err(|e| ExportError::ViewUndescribable {
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        dtype,
        why: e.0,
    })?;
    // The data is ready on the stream the input was made ready on (and the
    // body's work on it, if it followed `view.stream()`).
    e.stream = stream;
    e.byte_offset = byte_offset;
    e.requires_grad = requires_grad && e.read_only;
    if copy_converted {
        if e.device.is_host_accessible() {
            // The temporary is dropped with `e` (its producer's deleter
            // runs once, here); the copy is the caller's alone.
            let mut copy = e.aligned_copy(py, "a returned view of a converted argument")?;
            copy.read_only = false;
            return Ok(ExportedArray(copy));
        }
        // Device memory: no copy here, so it stays read-only.
        e.read_only = true;
    }
    Ok(ExportedArray(e))
}

/// An export ready to become a Python object; what views convert into.
#[doc(hidden)]
pub struct ExportedArray(Exported);

impl<'py> IntoPyObject<'py> for ExportedArray {
    type Target = Array;
    type Output = Bound<'py, Array>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, Array>> {
        Array::new(py, self.0)
    }
}

impl<'py, T: Element, const N: usize> IntoPyObject<'py> for Tensor<T, N> {
    type Target = Array;
    type Output = Bound<'py, Array>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, Array>> {
        Array::new(py, self.inner)
    }
}

/// Returning a view exports it: the input stays alive inside the exported
/// object until the last consumer lets go; a view of a read-only
/// input is exported read-only. A view over Rust data (`TensorRef::from_slice`
/// and friends) is copied into a new C-order array instead: Python objects
/// may outlive the Rust data it borrows.
macro_rules! into_py_view {
    ($([$($g:tt)*] $t:ty;)*) => {$(
        impl<'py, $($g)*> pyo3::IntoPyObject<'py> for $t {
            type Target = Array;
            type Output = pyo3::Bound<'py, Array>;
            type Error = pyo3::PyErr;
            fn into_pyobject(self, py: pyo3::Python<'py>) -> pyo3::PyResult<Self::Output> {
                if self.is_rust_data() {
                    let copy = Tensor::from_vec(self.to_vec()?, self.shape())?;
                    return copy.into_pyobject(py);
                }
                export_view(py, self.into_raw())?.into_pyobject(py)
            }
        }
    )*};
}
into_py_view!(
    [T: Element, const N: usize] TensorRef<'_, T, N>;
    [T: Element, const N: usize] TensorMut<'_, T, N>;
);

/// Untyped views are always a call's arguments, never Rust data.
macro_rules! into_py_dyn_view {
    ($($t:ty;)*) => {$(
        impl<'py> pyo3::IntoPyObject<'py> for $t {
            type Target = Array;
            type Output = pyo3::Bound<'py, Array>;
            type Error = pyo3::PyErr;
            fn into_pyobject(self, py: pyo3::Python<'py>) -> pyo3::PyResult<Self::Output> {
                export_view(py, self.into_raw())?.into_pyobject(py)
            }
        }
    )*};
}
into_py_dyn_view!(
    TensorDyn<'_>;
    TensorDynMut<'_>;
);

#[cfg(test)]
mod tests {
    use super::Tensor;
    use crate::ShapeError;

    #[test]
    fn a_tensor_s_rank_is_fixed_only_if_it_fits() {
        let t = Tensor::from_vec((0..6u32).collect(), &[2, 3]).unwrap();
        let ptr = t.data_ptr();
        let t: Tensor<u32, 2> = t.into_rank().unwrap();
        // The same buffer, described as before.
        assert_eq!(
            (t.dims(), t.data_ptr(), t.strides()),
            ([2, 3], ptr, vec![3, 1])
        );
        let e = t.into_dyn().into_rank::<3>().unwrap_err();
        assert_eq!(
            e,
            ShapeError::Ndim {
                expected: 3,
                shape: vec![2, 3]
            }
        );
        assert!(e
            .to_string()
            .starts_with("into_rank(): expected a tensor of 3 dimensions, got shape [2, 3]"));
        let scalar = Tensor::<f64>::zeros(&[]).unwrap().into_rank::<0>().unwrap();
        assert_eq!((scalar.dims(), scalar.ndim()), ([], 0));
        // Read-only survives the rank change.
        let ro = Tensor::from(vec![1i8])
            .into_read_only()
            .into_rank::<1>()
            .unwrap();
        assert!(ro.is_read_only());
    }

    #[test]
    fn tensors_from_vecs_and_zeros_describe_their_memory() {
        let t = Tensor::from_vec(vec![1u16, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        assert_eq!((t.shape(), t.strides()), (vec![2, 3], vec![3, 1]));
        assert_eq!(t.inner.byte_strides.as_slice(), [6, 2]);
        // More dimensions than are held inline.
        let mut z = Tensor::<f32>::zeros(&[2, 1, 3, 1, 2, 1]).unwrap();
        assert_eq!(z.strides(), vec![6, 6, 2, 2, 1, 1]);
        assert_eq!(z.inner.byte_strides.as_slice(), [24, 24, 8, 8, 4, 4]);
        assert!(z.as_slice_mut().unwrap().iter().all(|&x| x == 0.0));
    }
}
