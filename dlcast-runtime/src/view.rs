//! The views a `#[dlpack_fn]` parameter receives, and views over Rust data.
//!
//! A view made for a call owns the imported DLPack tensor (its deleter runs
//! when the view drops) and borrows the Python argument for `'a`, so it
//! cannot outlive the call. A view made from Rust data
//! ([`TensorRef::from_slice`], [`TensorRef::from_ndarray`], ...) borrows
//! that data for `'a` and owns nothing. Views are neither `Send` nor
//! `Sync`: they stay on the thread that made them.
//!
//! The const parameter `N` of [`TensorRef`] and [`TensorMut`] is the number
//! of dimensions: [`DYN`] (the default) for a rank read at run time, or
//! `0..=6` for a rank fixed by the type, which adds accessors that take and
//! give arrays (`dims() -> [usize; N]`, `get([usize; N])`, `as_array()`).

use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::import::{Dims, ImportPath, RawTensor};
use crate::layout;
use crate::spec::{FnSpec, TupleDisplay};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use std::fmt;
use std::marker::PhantomData;

/// What the call context needs to know of a parameter's view type.
/// Implemented by the view types only (in the `view` module), each for its own
/// lifetime `'a`: the call context can then only make a view that borrows
/// the Python argument, never one that outlives it (`TensorRef<'static, _>`
/// does not implement `View<'a>` for a shorter `'a`).
#[doc(hidden)]
pub trait View<'a>: Sized {
    /// The element type, or `None` for the untyped views.
    const DTYPE: Option<DType>;
    /// Whether the view writes.
    const WRITABLE: bool;
    /// The number of dimensions the view type fixes (`TensorRef<'_, T, 2>`,
    /// `ArrayView2`, `&[T]`), or `None` for any.
    const NDIM: Option<usize>;
    /// Makes the view of `raw`, a read that passed every check of the
    /// parameter's [`ParamSpec`]. A view that owns its read keeps `raw`; one
    /// that borrows it (a slice, an `ndarray` view) hands it to `keep`,
    /// which holds it in the call context for `'a`.
    ///
    /// # Errors
    /// What the type needs that the read does not give (a rank, values a
    /// `bool` may hold), named by `keep`.
    #[doc(hidden)]
    fn from_raw(raw: RawTensor, keep: Keep<'a>) -> PyResult<Self>;
}

/// Where a view that borrows its read (a slice, an `ndarray` view) leaves
/// it: the call context's slot, which the view's lifetime `'a` borrows, so
/// the read (its owner, its borrow-registry entry) outlives the view.
#[doc(hidden)]
pub struct Keep<'a> {
    pub(crate) slot: &'a std::cell::Cell<Option<RawTensor>>,
    /// The function and the parameter (`spec.params[index]`), for errors.
    pub(crate) spec: &'static FnSpec,
    pub(crate) index: usize,
    pub(crate) func: &'static str,
    pub(crate) param: &'static str,
}

impl Keep<'_> {
    /// Holds `raw` until the call context drops.
    pub(crate) fn hold(self, raw: RawTensor) {
        self.slot.set(Some(raw));
    }

    /// A `TypeError` naming the function and the parameter.
    #[cold]
    pub(crate) fn error(&self, msg: std::fmt::Arguments<'_>) -> PyErr {
        PyTypeError::new_err(format!("{}(): argument '{}': {msg}", self.func, self.param))
    }
}

/// The rank parameter of a view whose number of dimensions is known only at
/// run time: `TensorRef<'_, T>` is `TensorRef<'_, T, DYN>`. Any other value
/// `N` fixes the number of dimensions to `N` (checked when the view is
/// made: a `TypeError` naming the parameter for a call's argument); ranks
/// `0..=6` get the array-typed accessors. Compiler messages spell it
/// `usize::MAX` (`TensorRef<'_, f32, usize::MAX>` is `TensorRef<'_, f32>`).
pub const DYN: usize = usize::MAX;

/// What went wrong in a view method; the [`ViewError`] around it says which
/// method, function and parameter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ViewErrorKind {
    /// The memory is on a device the CPU cannot read (CUDA, ROCm, ...).
    #[error("the array is on {0}, not in memory the CPU can access")]
    NotHostAccessible(Device),
    /// The data pointer is not aligned for the element type; Rust references
    /// and `ndarray` views need aligned memory.
    #[error("the data is not aligned to {0} bytes for its element type")]
    Misaligned(usize),
    /// A CUDA device address was asked of memory on another device.
    #[error("the array is on {0}, not in CUDA memory")]
    NotCuda(Device),
    /// A slice needs C-contiguous memory.
    #[error("the array is not C-contiguous")]
    NotContiguous,
    /// Some byte is not a valid value of the element type (a `bool` other
    /// than 0 or 1).
    #[error("the array holds bytes that are not valid values of its element type")]
    InvalidValue,
    /// Several indices reach the same element; a writable view of that
    /// memory would alias.
    #[error("several indices of the array reach the same element")]
    SelfOverlap,
    /// An index with the wrong number of entries, or an entry at or beyond
    /// the extent of its dimension. Converts to Python's `IndexError`.
    #[error("{}", IndexDisplay { index, shape })]
    Index {
        /// The index asked for.
        index: Vec<usize>,
        /// The view's shape.
        shape: Vec<usize>,
    },
    /// A view of a fixed rank `N` asked of an array with another number of
    /// dimensions. Converts to Python's `TypeError`.
    #[error(
        "expected an array of {expected} dimensions, got shape {}",
        TupleDisplay(shape)
    )]
    Rank {
        /// The rank of the view type.
        expected: usize,
        /// The array's shape.
        shape: Vec<usize>,
    },
    /// A slice whose length is not the element count of the shape given.
    #[error(
        "shape {} holds {expected} elements, the slice {got}",
        TupleDisplay(shape)
    )]
    Length {
        /// The shape.
        shape: Vec<usize>,
        /// Elements the shape holds (`usize::MAX` when the count overflows).
        expected: usize,
        /// The slice's length.
        got: usize,
    },
    /// An axis number at or beyond `ndim`, or a permutation that is not one.
    #[error("invalid axes {axes:?} for an array of {ndim} dimensions")]
    Axes {
        /// The axes given.
        axes: Vec<usize>,
        /// The array's number of dimensions.
        ndim: usize,
    },
    /// A range outside the extent of its axis.
    #[error("range {start}..{end} is outside the extent {extent} of axis {axis}")]
    Range {
        /// The axis.
        axis: usize,
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// The axis' extent.
        extent: usize,
    },
    /// A reshape to a different element count, or of a non-C-contiguous view.
    #[error("cannot reshape {from:?} to {to:?}: {why}")]
    Reshape {
        /// The current shape.
        from: Vec<usize>,
        /// The requested shape.
        to: Vec<usize>,
        /// What is wrong.
        why: &'static str,
    },
    /// Memory for a copy of the elements could not be allocated (the
    /// request is too large for the address space, or the allocator
    /// refused it). Converts to Python's `MemoryError`.
    #[error("cannot allocate {bytes} bytes for a copy of {count} elements")]
    OutOfMemory {
        /// Elements to copy.
        count: usize,
        /// Bytes asked for (`usize::MAX` when the size itself overflows).
        bytes: usize,
    },
    /// The layout's sizes or offsets do not fit the arithmetic the access
    /// needs (`isize`), e.g. more than `isize::MAX` elements for an
    /// `ndarray` view, or a flip of a stride that has no negation.
    #[error(
        "the layout (shape {shape:?}, strides {strides:?}) is too large for this access: {why}"
    )]
    Overflow {
        /// The view's shape.
        shape: Vec<usize>,
        /// The view's strides (elements).
        strides: Vec<isize>,
        /// What overflows.
        why: &'static str,
    },
}

/// `index (3, 0) is out of bounds for shape (3, 3)`, or, for an index of
/// the wrong length, `index (1,) has 1 entry, the array 2 dimensions
/// (shape (3, 3))`.
struct IndexDisplay<'a> {
    index: &'a [usize],
    shape: &'a [usize],
}

impl fmt::Display for IndexDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (index, shape) = (TupleDisplay(self.index), TupleDisplay(self.shape));
        if self.index.len() == self.shape.len() {
            write!(f, "index {index} is out of bounds for shape {shape}")
        } else {
            let entries = if self.index.len() == 1 {
                "entry"
            } else {
                "entries"
            };
            write!(
                f,
                "index {index} has {} {entries}, the array {} dimensions (shape {shape})",
                self.index.len(),
                self.shape.len()
            )
        }
    }
}

/// The error of a view method: what went wrong ([`ViewError::kind`]), in
/// which method, and, for a view a `#[dlpack_fn]` call made, the function
/// and the parameter. Its text says all of it:
///
/// `conv(): argument 'img': get(): index (3, 0) is out of bounds for shape (3, 3)`
///
/// Converts into a Python exception (so `?` works in functions returning
/// `PyResult`): `IndexError` for [`ViewErrorKind::Index`], `TypeError` for
/// [`ViewErrorKind::Rank`], `MemoryError` for
/// [`ViewErrorKind::OutOfMemory`], `ValueError` for the others. One pointer
/// wide, so a `Result<T, ViewError>` stays small in element loops.
#[derive(Clone, PartialEq, Eq)]
pub struct ViewError(Box<ErrorInner>);

#[derive(Clone, PartialEq, Eq)]
struct ErrorInner {
    kind: ViewErrorKind,
    method: Option<&'static str>,
    function: Option<&'static str>,
    parameter: Option<&'static str>,
}

impl ViewError {
    /// What went wrong.
    pub fn kind(&self) -> &ViewErrorKind {
        &self.0.kind
    }
    /// The view method that failed (`"get"`, `"to_vec"`, ...), if known.
    pub fn method(&self) -> Option<&'static str> {
        self.0.method
    }
    /// The `#[dlpack_fn]` function whose argument the view is; `None` for
    /// views over Rust data.
    pub fn function(&self) -> Option<&'static str> {
        self.0.function
    }
    /// The parameter the view was made for; `None` for views over Rust data.
    pub fn parameter(&self) -> Option<&'static str> {
        self.0.parameter
    }
    /// The error without its method, function and parameter.
    pub fn into_kind(self) -> ViewErrorKind {
        self.0.kind
    }
}

impl From<ViewErrorKind> for ViewError {
    fn from(kind: ViewErrorKind) -> Self {
        ViewError(Box::new(ErrorInner {
            kind,
            method: None,
            function: None,
            parameter: None,
        }))
    }
}

impl fmt::Display for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.0;
        if let Some(func) = e.function {
            write!(f, "{func}(): ")?;
        }
        if let Some(param) = e.parameter {
            write!(f, "argument '{param}': ")?;
        }
        if let Some(m) = e.method {
            write!(f, "{m}(): ")?;
        }
        write!(f, "{}", e.kind)
    }
}

impl fmt::Debug for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewError")
            .field("kind", &self.0.kind)
            .field("method", &self.0.method)
            .field("function", &self.0.function)
            .field("parameter", &self.0.parameter)
            .finish()
    }
}

impl std::error::Error for ViewError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0.kind)
    }
}

impl From<ViewError> for pyo3::PyErr {
    fn from(e: ViewError) -> Self {
        use pyo3::exceptions::{PyIndexError, PyMemoryError, PyTypeError, PyValueError};
        let text = e.to_string();
        match e.kind() {
            ViewErrorKind::OutOfMemory { .. } => PyMemoryError::new_err(text),
            ViewErrorKind::Index { .. } => PyIndexError::new_err(text),
            ViewErrorKind::Rank { .. } => PyTypeError::new_err(text),
            _ => PyValueError::new_err(text),
        }
    }
}

impl From<ViewErrorKind> for pyo3::PyErr {
    fn from(e: ViewErrorKind) -> Self {
        ViewError::from(e).into()
    }
}

/// Where a view came from, for its errors: the function and parameter of
/// the call that made it, or nothing for a view over Rust data. Two words.
#[derive(Clone, Copy)]
struct Origin(Option<(&'static FnSpec, u32)>);

impl Origin {
    const RUST: Origin = Origin(None);

    fn param(spec: &'static FnSpec, index: usize) -> Origin {
        Origin(u32::try_from(index).ok().map(|i| (spec, i)))
    }

    /// The error of `method` on this view.
    #[cold]
    #[inline(never)]
    fn error(self, method: &'static str, kind: ViewErrorKind) -> ViewError {
        let (function, parameter) = match self.0 {
            Some((spec, i)) => (Some(spec.name), spec.params.get(i as usize).map(|p| p.name)),
            None => (None, None),
        };
        ViewError(Box::new(ErrorInner {
            kind,
            method: (!method.is_empty()).then_some(method),
            function,
            parameter,
        }))
    }
}

/// The most dimensions of a view with rank-typed accessors.
const MAX_RANK: usize = 6;

/// What the rank-typed accessors read on every access, kept in the view
/// itself (not behind the inline-or-heap pointer of the raw tensor's
/// shape), so that element loops keep it in registers and the compiler can
/// prove index checks redundant. Refreshed by every layout transform.
#[derive(Clone, Copy)]
struct Fast {
    /// The first `MAX_RANK` extents (0 beyond `ndim`).
    dims: [usize; MAX_RANK],
    /// The first `MAX_RANK` strides in elements.
    strides: [isize; MAX_RANK],
    /// The number of dimensions.
    ndim: usize,
    /// Whether the CPU can read the memory.
    host: bool,
}

impl Fast {
    #[inline(always)]
    fn of(raw: &RawTensor) -> Fast {
        // The slices once (a `SmallVec` dereference tests where it lives).
        let (shape, strides) = (raw.shape.as_slice(), raw.strides.as_slice());
        Fast {
            dims: std::array::from_fn(|k| shape.get(k).copied().unwrap_or(0)),
            strides: std::array::from_fn(|k| strides.get(k).copied().unwrap_or(0)),
            ndim: shape.len(),
            host: raw.device.is_host_accessible(),
        }
    }
}

impl RawTensor {
    fn overflow(&self, why: &'static str) -> ViewErrorKind {
        ViewErrorKind::Overflow {
            shape: self.shape.to_vec(),
            strides: self.strides.to_vec(),
            why,
        }
    }
}

/// A vector with room for the `count` elements of a view, or
/// [`ViewErrorKind::OutOfMemory`]: the size comes from a Python input, so an
/// impossible one must raise instead of aborting the process.
fn vec_for<T>(count: usize) -> Result<Vec<T>, ViewErrorKind> {
    let mut out = Vec::new();
    out.try_reserve_exact(count)
        .map_err(|_| ViewErrorKind::OutOfMemory {
            count,
            bytes: count.saturating_mul(std::mem::size_of::<T>()),
        })?;
    Ok(out)
}

/// Whether `raw` has the number of dimensions a view of rank `N` needs.
fn rank_fits<const N: usize>(raw: &RawTensor) -> Result<(), ViewErrorKind> {
    if N == DYN || raw.shape.len() == N {
        Ok(())
    } else {
        Err(ViewErrorKind::Rank {
            expected: N,
            shape: raw.shape.to_vec(),
        })
    }
}

/// A read-only view of an array with elements of type `T` and `N`
/// dimensions ([`DYN`], the default: any number, read at run time).
///
/// Shape and strides are in elements (DLPack's unit); strides are always
/// present, whatever the producer sent. Element access (`get`, `iter`,
/// `to_vec`, `as_slice`, `as_ndarray`) works on memory the CPU can read; for
/// other devices use [`TensorRef::data_ptr`] with the device's own API.
/// No accessor panics: each failure is a [`ViewError`] naming the method and,
/// for a call's argument, the function and parameter.
///
/// A `#[dlpack_fn]` parameter `x: TensorRef<'_, f32, 2>` takes 2-d arrays
/// only; its accessors take and give arrays:
///
/// ```
/// use dlcast_runtime::{TensorRef, ViewError};
///
/// fn trace(x: &TensorRef<'_, f32, 2>) -> Result<f32, ViewError> {
///     let [n, m] = x.dims();
///     (0..n.min(m)).map(|i| x.get([i, i])).sum()
/// }
///
/// let data = [1.0, 2.0, 3.0, 4.0];
/// let x = TensorRef::<f32, 2>::from_slice(&data, &[2, 2])?;
/// assert_eq!(trace(&x)?, 5.0);
/// assert!(x.get([2, 0]).is_err()); // out of bounds: an error, not a panic
/// # Ok::<(), ViewError>(())
/// ```
pub struct TensorRef<'a, T: Element, const N: usize = DYN> {
    raw: Held,
    origin: Origin,
    fast: Fast,
    _marker: PhantomData<&'a fn() -> T>,
    _gil: StaysWithTheGil,
}

/// A writable view: everything [`TensorRef`] offers (through `Deref`), plus
/// writes. Refuses read-only inputs (DLPack's `READ_ONLY` flag, non-writeable
/// NumPy arrays, `bytes`) and layouts where two indices reach one element.
pub struct TensorMut<'a, T: Element, const N: usize = DYN> {
    inner: TensorRef<'a, T, N>,
}

/// A read-only view whose element type is read at run time, for functions
/// that dispatch on [`TensorDyn::dtype`] themselves.
pub struct TensorDyn<'a> {
    raw: Held,
    origin: Origin,
    _marker: PhantomData<&'a ()>,
    _gil: StaysWithTheGil,
}

/// A writable view whose element type is read at run time.
pub struct TensorDynMut<'a> {
    raw: Held,
    origin: Origin,
    _marker: PhantomData<&'a ()>,
    _gil: StaysWithTheGil,
}

/// Named in the compiler's error when a view is moved into `py.detach`, a
/// thread or a `static`: views stay on the thread that holds the GIL (their
/// producer's memory is released with it). Take a slice (`as_slice()`,
/// `as_array()`) or declare the parameter as `&[T]` / an `ndarray` view,
/// which are `Send`, and move that instead.
pub trait TakeASliceOrNdarrayViewBeforeLeavingTheGil {}

/// What makes a view neither `Send` nor `Sync`: the only part of it that is
/// not, so that the compiler's error names the rule above and nothing else.
type StaysWithTheGil = PhantomData<dyn TakeASliceOrNdarrayViewBeforeLeavingTheGil>;

/// A view's read. `Send` and `Sync` only so that a view's auto traits come
/// from [`StaysWithTheGil`] alone (one short error); see the `SAFETY` notes.
struct Held(RawTensor);

// SAFETY: `Held` is a private field type of the four view types only, and
// each of them also holds `StaysWithTheGil`, which is neither `Send` nor
// `Sync`: no view, and so no `Held`, ever reaches another thread, and the
// read's owner is released on the thread that holds the GIL, as before.
unsafe impl Send for Held {}
// SAFETY: as above: no `&Held` is reachable from another thread.
unsafe impl Sync for Held {}

impl std::ops::Deref for Held {
    type Target = RawTensor;
    fn deref(&self) -> &RawTensor {
        &self.0
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut RawTensor {
        &mut self.0
    }
}

/// Layout transforms, the same for every view: they change which elements
/// the view reaches and how, never the memory.
impl RawTensor {
    fn itemsize(&self) -> isize {
        self.dtype.itemsize().unwrap_or(1) as isize
    }

    fn refresh_extent(&mut self) {
        // A sub-layout of a validated layout: the arithmetic cannot overflow.
        self.extent = layout::byte_extent(&self.shape, &self.strides, self.itemsize() as usize)
            .unwrap_or(None);
    }

    fn slice_axis(
        &mut self,
        axis: usize,
        range: std::ops::Range<usize>,
    ) -> Result<(), ViewErrorKind> {
        let Some(&extent) = self.shape.get(axis) else {
            return Err(ViewErrorKind::Axes {
                axes: vec![axis],
                ndim: self.shape.len(),
            });
        };
        if range.start > range.end || range.end > extent {
            return Err(ViewErrorKind::Range {
                axis,
                start: range.start,
                end: range.end,
                extent,
            });
        }
        let new_extent = range.end - range.start;
        let empty = new_extent == 0 || self.shape.contains(&0);
        if !empty {
            // Element `start` along `axis` is an element of the validated
            // layout, so its byte offset fits `isize` (byte_extent checked
            // it); checked anyway. An empty result keeps `data`: it is
            // never read, and the strides of empty arrays are unchecked.
            let step = isize::try_from(range.start)
                .ok()
                .and_then(|i| i.checked_mul(self.strides[axis]))
                .and_then(|o| o.checked_mul(self.itemsize()))
                .ok_or_else(|| self.overflow("the slice start's byte offset overflows"))?;
            self.data = self.data.wrapping_offset(step);
        }
        self.shape[axis] = new_extent;
        self.refresh_extent();
        Ok(())
    }

    fn flip_axis(&mut self, axis: usize) -> Result<(), ViewErrorKind> {
        let Some(&extent) = self.shape.get(axis) else {
            return Err(ViewErrorKind::Axes {
                axes: vec![axis],
                ndim: self.shape.len(),
            });
        };
        if layout::stride_unused(&self.shape, axis) {
            // No index ever steps along `axis` (extent <= 1, or the array
            // is empty): flipping changes no address, and the stride, which
            // import never checked here, may be any value (`isize::MIN`
            // has no negation), so it becomes 0.
            self.strides[axis] = self.strides[axis].checked_neg().unwrap_or(0);
            self.refresh_extent();
            return Ok(());
        }
        // The last element along `axis` is an element of the validated
        // layout: its byte offset fits `isize`; checked anyway.
        let step = isize::try_from(extent - 1)
            .ok()
            .and_then(|n| n.checked_mul(self.strides[axis]))
            .and_then(|o| o.checked_mul(self.itemsize()))
            .ok_or_else(|| self.overflow("the last element's byte offset overflows"))?;
        let flipped = self.strides[axis]
            .checked_neg()
            .ok_or_else(|| self.overflow("the stride has no negation"))?;
        self.data = self.data.wrapping_offset(step);
        self.strides[axis] = flipped;
        self.refresh_extent();
        Ok(())
    }

    fn permute(&mut self, axes: &[usize]) -> Result<(), ViewErrorKind> {
        let ndim = self.shape.len();
        let mut seen: smallvec::SmallVec<[bool; 8]> = smallvec::smallvec![false; ndim];
        let valid = axes.len() == ndim
            && axes
                .iter()
                .all(|&a| a < ndim && !std::mem::replace(&mut seen[a], true));
        if !valid {
            return Err(ViewErrorKind::Axes {
                axes: axes.to_vec(),
                ndim,
            });
        }
        self.shape = axes.iter().map(|&a| self.shape[a]).collect();
        self.strides = axes.iter().map(|&a| self.strides[a]).collect();
        Ok(())
    }

    fn reshape(&mut self, shape: &[usize]) -> Result<(), ViewErrorKind> {
        let err = |why| ViewErrorKind::Reshape {
            from: self.shape.to_vec(),
            to: shape.to_vec(),
            why,
        };
        if !layout::is_c_contiguous(&self.shape, &self.strides) {
            return Err(err("only a C-contiguous view can be reshaped"));
        }
        if layout::element_count(shape) != layout::element_count(&self.shape) {
            return Err(err("the element counts differ"));
        }
        let mut strides: crate::import::Dims<isize> = smallvec::smallvec![0; shape.len()];
        layout::fill_c_strides(shape, &mut strides).ok_or_else(|| err("the shape overflows"))?;
        self.shape = shape.iter().copied().collect();
        self.strides = strides;
        self.refresh_extent();
        Ok(())
    }
}

/// Read-only layout queries shared by every view.
macro_rules! layout_methods {
    () => {
        /// Extents, one per dimension (`[]` for a 0-d array).
        pub fn shape(&self) -> &[usize] {
            &self.raw.shape
        }
        /// Strides in elements, one per dimension, never absent (compact
        /// row-major strides when the producer sent none).
        pub fn strides(&self) -> &[isize] {
            &self.raw.strides
        }
        /// Number of dimensions.
        pub fn ndim(&self) -> usize {
            self.raw.shape.len()
        }
        /// Number of elements (1 for a 0-d array).
        pub fn len(&self) -> usize {
            // The import checked that the count fits.
            layout::element_count(&self.raw.shape).unwrap_or(0)
        }
        /// Whether the array has no elements.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }
        /// The DLPack data type.
        pub fn dtype(&self) -> DType {
            self.raw.dtype
        }
        /// The DLPack device.
        pub fn device(&self) -> Device {
            self.raw.device
        }
        /// Whether the elements are laid out in C (row-major) order without
        /// gaps; extent-1 dimensions are ignored, empty arrays qualify.
        pub fn is_c_contiguous(&self) -> bool {
            layout::is_c_contiguous(&self.raw.shape, &self.raw.strides)
        }
        /// Whether the elements are laid out in F (column-major) order
        /// without gaps; same rules as [`Self::is_c_contiguous`].
        pub fn is_f_contiguous(&self) -> bool {
            layout::is_f_contiguous(&self.raw.shape, &self.raw.strides)
        }
        /// Whether the producer marked the data read-only.
        pub fn is_read_only(&self) -> bool {
            self.raw.read_only
        }
        /// The stream the data is ready on, as the array API standard's
        /// `__dlpack__(stream=...)` integer: for CUDA `1` (legacy default),
        /// `2` (per-thread default) or a `cudaStream_t`; for ROCm `0`
        /// (default) or a `hipStream_t`; `-1` if the function asked for no
        /// synchronisation. It is what dlcast passed to the producer's
        /// `__dlpack__`, or the producer's current work stream from the
        /// DLPack C exchange API. Launch work on the data on this stream.
        /// `None` for memory without streams (CPU, pinned host memory), for
        /// a DLPack capsule passed directly, and for a producer without
        /// `__dlpack_device__` (which could not be told a stream).
        /// See [`crate::stream`].
        pub fn stream(&self) -> Option<i64> {
            self.raw.stream
        }
        /// The device address of element 0 (`data + byte_offset`) as a
        /// `cudarc` `CUdeviceptr`, for CUDA device and managed memory; pass
        /// `&ptr` to a kernel launch, on [`Self::cu_stream`].
        ///
        /// # Errors
        /// [`ViewErrorKind::NotCuda`] for memory on other devices.
        #[cfg(feature = "cudarc")]
        pub fn cuda_device_ptr(&self) -> Result<cudarc::driver::sys::CUdeviceptr, ViewError> {
            match self.raw.device.device_type {
                crate::device::kind::CUDA | crate::device::kind::CUDA_MANAGED => {
                    Ok(self.raw.data as usize as u64)
                }
                _ => Err(self
                    .origin
                    .error("cuda_device_ptr", ViewErrorKind::NotCuda(self.raw.device))),
            }
        }
        /// [`Self::stream`] as a CUDA driver handle (`1` and `2` are
        /// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`); `None` when there
        /// is no stream to order work on (`None` or `-1`).
        #[cfg(feature = "cudarc")]
        pub fn cu_stream(&self) -> Option<cudarc::driver::sys::CUstream> {
            self.raw.stream.and_then(crate::cuda::cu_stream)
        }
        /// How the argument was imported (NumPy fields, the exchange API, a
        /// capsule, `__dlpack__`, the buffer protocol, TensorFlow).
        pub fn import_path(&self) -> crate::import::ImportPath {
            self.raw.path
        }
    };
}

/// Layout transforms shared by every view; each keeps the number of
/// dimensions. They consume the view and return it, so a function can return
/// a slice of its input zero-copy. Needs `parts_mut` and `refresh` methods.
macro_rules! transform_methods {
    () => {
        /// Keeps the indices `range` along `axis`.
        ///
        /// # Errors
        /// [`ViewErrorKind::Axes`] or [`ViewErrorKind::Range`].
        pub fn slice_axis(
            mut self,
            axis: usize,
            range: std::ops::Range<usize>,
        ) -> Result<Self, ViewError> {
            let (raw, origin) = self.parts_mut();
            raw.slice_axis(axis, range)
                .map_err(|k| origin.error("slice_axis", k))?;
            self.refresh();
            Ok(self)
        }
        /// Reverses the order of the indices along `axis` (a negative stride).
        ///
        /// # Errors
        /// [`ViewErrorKind::Axes`].
        pub fn flip_axis(mut self, axis: usize) -> Result<Self, ViewError> {
            let (raw, origin) = self.parts_mut();
            raw.flip_axis(axis)
                .map_err(|k| origin.error("flip_axis", k))?;
            self.refresh();
            Ok(self)
        }
        /// Reorders the dimensions: dimension `i` of the result is
        /// dimension `axes[i]` of `self`.
        ///
        /// # Errors
        /// [`ViewErrorKind::Axes`] if `axes` is not a permutation of `0..ndim`.
        pub fn permute(mut self, axes: &[usize]) -> Result<Self, ViewError> {
            let (raw, origin) = self.parts_mut();
            raw.permute(axes).map_err(|k| origin.error("permute", k))?;
            self.refresh();
            Ok(self)
        }
        /// The transpose: the dimensions in reverse order.
        pub fn t(mut self) -> Self {
            let (raw, _) = self.parts_mut();
            let axes: Vec<usize> = (0..raw.shape.len()).rev().collect();
            // A reversal is always a valid permutation.
            let _ = raw.permute(&axes);
            self.refresh();
            self
        }
    };
}

/// Checks that the elements of a view over Rust data are addressable, and
/// makes its raw tensor: host memory, no owner, no borrow-registry entry
/// (Rust's borrow checker guards the data). `strides` `None`: C order.
fn rust_raw<T: Element, const N: usize>(
    data: *mut T,
    len: Option<usize>,
    shape: &[usize],
    strides: Option<&[isize]>,
    read_only: bool,
) -> Result<RawTensor, ViewErrorKind> {
    if N != DYN && shape.len() != N {
        return Err(ViewErrorKind::Rank {
            expected: N,
            shape: shape.to_vec(),
        });
    }
    let count = layout::element_count(shape);
    if let Some(len) = len {
        if count != Some(len) {
            return Err(ViewErrorKind::Length {
                shape: shape.to_vec(),
                expected: count.unwrap_or(usize::MAX),
                got: len,
            });
        }
    }
    let overflow = |why| ViewErrorKind::Overflow {
        shape: shape.to_vec(),
        strides: strides.map(<[isize]>::to_vec).unwrap_or_default(),
        why,
    };
    let strides: Dims<isize> = match strides {
        Some(s) if s.len() == shape.len() => Dims::from_slice(s),
        Some(_) => return Err(overflow("the strides do not match the shape")),
        None => {
            let mut s: Dims<isize> = smallvec::smallvec![0; shape.len()];
            layout::fill_c_strides_or_empty(shape, &mut s)
                .ok_or_else(|| overflow("the C-order strides overflow"))?;
            s
        }
    };
    count.ok_or_else(|| overflow("the element count overflows"))?;
    let extent = layout::byte_extent(shape, &strides, std::mem::size_of::<T>())
        .ok_or_else(|| overflow("the byte extent overflows"))?;
    let mut raw = RawTensor::new(
        data.cast(),
        Dims::from_slice(shape),
        strides,
        T::DTYPE,
        read_only,
        extent,
        ImportPath::Rust,
    );
    raw.set_owner(crate::import::Owner::Rust);
    Ok(raw)
}

impl<'a, T: Element, const N: usize> TensorRef<'a, T, N> {
    layout_methods!();
    transform_methods!();

    fn parts_mut(&mut self) -> (&mut RawTensor, Origin) {
        (&mut self.raw, self.origin)
    }

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.raw.0
    }

    /// Whether the view borrows Rust data (export copies it).
    pub(crate) fn is_rust_data(&self) -> bool {
        self.raw.is_rust_data()
    }

    /// The same view with rank parameter `M` (the caller checked it).
    fn with_rank<const M: usize>(self) -> TensorRef<'a, T, M> {
        TensorRef::new(self.raw.0, self.origin)
    }

    /// A view of `raw` (whose rank the caller checked).
    #[inline(always)]
    fn new(raw: RawTensor, origin: Origin) -> Self {
        TensorRef {
            fast: Fast::of(&raw),
            raw: Held(raw),
            origin,
            _marker: PhantomData,
            _gil: PhantomData,
        }
    }

    /// After a layout transform.
    fn refresh(&mut self) {
        self.fast = Fast::of(&self.raw);
    }

    /// A view of the C-order elements of `data` under `shape` (host memory,
    /// read-only, owning nothing), for calling a `#[dlpack_fn]` body from
    /// Rust (unit tests) without Python. Its errors name no function or
    /// parameter.
    ///
    /// ```
    /// # use dlcast_runtime::TensorRef;
    /// let x = TensorRef::<i32, 2>::from_slice(&[1, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    /// assert_eq!((x.dims(), x.get([1, 0]).unwrap()), ([2, 3], 4));
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if `shape` does not have `N` entries (for a
    /// fixed `N`), [`ViewErrorKind::Length`] if it does not hold
    /// `data.len()` elements.
    pub fn from_slice(data: &'a [T], shape: &[usize]) -> Result<Self, ViewError> {
        let raw = rust_raw::<T, N>(
            data.as_ptr().cast_mut(),
            Some(data.len()),
            shape,
            None,
            true,
        )
        .map_err(|k| Origin::RUST.error("from_slice", k))?;
        Ok(TensorRef::new(raw, Origin::RUST))
    }

    /// A read-only view of an `ndarray` view's elements, same shape and
    /// strides (negative ones included), owning nothing.
    ///
    /// ```
    /// # use dlcast_runtime::TensorRef;
    /// let a = ndarray::arr2(&[[1.0f64, 2.0], [3.0, 4.0]]);
    /// let x = TensorRef::<f64, 2>::from_ndarray(a.t()).unwrap();
    /// assert_eq!(x.get([0, 1]).unwrap(), 3.0);
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if the array does not have `N` dimensions
    /// (for a fixed `N`).
    #[cfg(feature = "ndarray")]
    pub fn from_ndarray<D: ndarray::Dimension>(
        array: ndarray::ArrayView<'a, T, D>,
    ) -> Result<Self, ViewError> {
        let raw = rust_raw::<T, N>(
            array.as_ptr().cast_mut(),
            None,
            array.shape(),
            Some(array.strides()),
            true,
        )
        .map_err(|k| Origin::RUST.error("from_ndarray", k))?;
        Ok(TensorRef::new(raw, Origin::RUST))
    }

    /// The view with its rank fixed to `M` (or made dynamic, `M` = [`DYN`]).
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if the view does not have `M` dimensions.
    pub fn into_rank<const M: usize>(self) -> Result<TensorRef<'a, T, M>, ViewError> {
        rank_fits::<M>(&self.raw).map_err(|k| self.origin.error("into_rank", k))?;
        Ok(self.with_rank())
    }

    /// The view with a dynamic rank.
    pub fn into_dyn(self) -> TensorRef<'a, T> {
        self.with_rank()
    }

    /// The same elements in C order under another shape with the same
    /// element count; the view must be C-contiguous. The result has a
    /// dynamic rank (fix it with [`TensorRef::into_rank`]).
    ///
    /// # Errors
    /// [`ViewErrorKind::Reshape`].
    pub fn reshape(mut self, shape: &[usize]) -> Result<TensorRef<'a, T>, ViewError> {
        let origin = self.origin;
        self.raw
            .reshape(shape)
            .map_err(|k| origin.error("reshape", k))?;
        Ok(self.with_rank())
    }

    /// Address of element 0 (the producer's `data` plus `byte_offset`).
    /// It may be unaligned, and for non-CPU devices it is a device address.
    pub fn data_ptr(&self) -> *const T {
        self.raw.data.cast()
    }

    fn host(&self, method: &'static str) -> Result<(), ViewError> {
        if self.raw.device.is_host_accessible() {
            Ok(())
        } else {
            Err(self
                .origin
                .error(method, ViewErrorKind::NotHostAccessible(self.raw.device)))
        }
    }

    fn aligned(&self, method: &'static str) -> Result<(), ViewError> {
        let align = std::mem::align_of::<T>();
        if self.raw.data as usize % align == 0 || self.is_empty() {
            Ok(())
        } else {
            Err(self.origin.error(method, ViewErrorKind::Misaligned(align)))
        }
    }

    /// Checks that every element holds a valid `T` (only `bool` can fail).
    fn valid_values(&self, method: &'static str) -> Result<(), ViewError> {
        if T::ALL_BIT_PATTERNS_VALID {
            return Ok(());
        }
        let mut ok = true;
        layout::for_each_offset(&self.raw.shape, &self.raw.strides, |off| {
            // SAFETY: the import checked that every element offset lies in
            // the producer's memory, and the memory is host-accessible.
            ok &= unsafe { T::is_valid_at(self.data_ptr().offset(off)) };
        })
        .ok_or_else(|| {
            self.origin
                .error(method, self.raw.overflow("an element offset overflows"))
        })?;
        if ok {
            Ok(())
        } else {
            Err(self.origin.error(method, ViewErrorKind::InvalidValue))
        }
    }

    /// Offset (elements) of the element at `index`, for a view of `M`
    /// dimensions in host memory; `None` out of bounds, for memory the CPU
    /// cannot read (or if the rank is not `M`).
    #[inline(always)]
    fn offset_n<const M: usize>(&self, index: &[usize; M]) -> Option<isize> {
        // `M <= MAX_RANK` for every caller; the rank is `M` (checked when
        // the view was made), so these are the view's extents and strides.
        let shape: &[usize; M] = self.fast.dims.get(..M)?.try_into().ok()?;
        let strides: &[isize; M] = self.fast.strides.get(..M)?.try_into().ok()?;
        if !self.fast.host {
            return None;
        }
        // One test for all entries (`|`, not `||`).
        let mut outside = false;
        for (&i, &n) in index.iter().zip(shape) {
            outside |= i >= n;
        }
        if outside {
            return None;
        }
        let mut off: isize = 0;
        for (&i, &s) in index.iter().zip(strides) {
            // In bounds: `i <= n - 1 <= isize::MAX`, `|i * s|` is at most
            // the byte extent of the dimension, and every partial sum lies
            // within the layout's byte extent, which the import (or
            // `rust_raw`) checked fits `isize`: the wrapping operations are
            // exact.
            off = off.wrapping_add((i as isize).wrapping_mul(s));
        }
        Some(off)
    }

    /// Offset (elements) of the element at `index` (any length); `None` if
    /// out of bounds or of the wrong length.
    #[inline(always)]
    fn offset_dyn(&self, index: &[usize]) -> Option<isize> {
        if index.len() != self.fast.ndim {
            return None;
        }
        if index.len() > MAX_RANK {
            return layout::offset_of(&self.raw.shape, &self.raw.strides, index);
        }
        let mut off: isize = 0;
        for ((&i, &n), &s) in index.iter().zip(&self.fast.dims).zip(&self.fast.strides) {
            if i >= n {
                return None;
            }
            // Exact, as in `offset_n`.
            off = off.wrapping_add((i as isize).wrapping_mul(s));
        }
        Some(off)
    }

    /// The element at `index` of a view of rank `M`.
    #[inline(always)]
    fn read_n<const M: usize>(
        &self,
        method: &'static str,
        index: &[usize; M],
    ) -> Result<T, ViewError> {
        match self.offset_n(index) {
            Some(off) => {
                // SAFETY: `off` addresses an in-bounds element, inside the
                // memory the import validated, which the host can read
                // (`offset_n` checked both); `read_at` handles misalignment.
                Ok(unsafe { T::read_at(self.data_ptr().offset(off)) })
            }
            None => Err(self.index_error_n(method, *index)),
        }
    }

    /// [`Self::index_error`] for an array index, taken by value: element
    /// loops then keep their indices in registers.
    #[cold]
    #[inline(never)]
    fn index_error_n<const M: usize>(&self, method: &'static str, index: [usize; M]) -> ViewError {
        self.index_error(method, &index)
    }

    /// Why the element at `index` cannot be read or written.
    #[cold]
    #[inline(never)]
    fn index_error(&self, method: &'static str, index: &[usize]) -> ViewError {
        if let Err(e) = self.host(method) {
            return e;
        }
        self.origin.error(
            method,
            ViewErrorKind::Index {
                index: index.to_vec(),
                shape: self.raw.shape.to_vec(),
            },
        )
    }

    /// All elements, copied in C order (last index fastest).
    ///
    /// # Errors
    /// [`ViewErrorKind::NotHostAccessible`] for device memory;
    /// [`ViewErrorKind::OutOfMemory`] when the copy cannot be allocated (a
    /// broadcast view may hold far more elements than memory).
    pub fn to_vec(&self) -> Result<Vec<T>, ViewError> {
        self.host("to_vec")?;
        let mut out = vec_for::<T>(self.len()).map_err(|k| self.origin.error("to_vec", k))?;
        layout::for_each_offset(&self.raw.shape, &self.raw.strides, |off| {
            // SAFETY: every offset of the walk is an in-bounds element.
            // `push` never reallocates: the walk visits `len()` elements,
            // the capacity reserved above.
            out.push(unsafe { T::read_at(self.data_ptr().offset(off)) });
        })
        .ok_or_else(|| {
            self.origin
                .error("to_vec", self.raw.overflow("an element offset overflows"))
        })?;
        Ok(out)
    }

    /// The elements one by one, by value, in C order (last index fastest),
    /// whatever the strides (negative ones included); nothing for an empty
    /// array, one element for a 0-d one. Reads unaligned memory too.
    ///
    /// ```
    /// # use dlcast_runtime::TensorRef;
    /// let x = TensorRef::<u8, 2>::from_slice(&[1, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    /// let t: Vec<u8> = x.t().iter().unwrap().collect();
    /// assert_eq!(t, [1, 4, 2, 5, 3, 6]);
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    pub fn iter(&self) -> Result<Iter<'_, T>, ViewError> {
        self.host("iter")?;
        Ok(Iter::new(&self.raw, false))
    }

    /// The elements one by one, by value, in the order they lie in memory:
    /// every index once, the fastest traversal (contiguous runs are read
    /// straight through). For the layouts strided libraries make (C, F,
    /// permuted, sliced, flipped) that is increasing address order; for
    /// overlapping layouts (a broadcast) an address is visited once per
    /// index reaching it. Use it for reductions where the order does not
    /// matter.
    ///
    /// ```
    /// # use dlcast_runtime::TensorRef;
    /// let x = TensorRef::<u8, 2>::from_slice(&[1, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    /// let t: Vec<u8> = x.t().iter_memory_order().unwrap().collect();
    /// assert_eq!(t, [1, 2, 3, 4, 5, 6]);
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    pub fn iter_memory_order(&self) -> Result<Iter<'_, T>, ViewError> {
        self.host("iter_memory_order")?;
        Ok(Iter::new(&self.raw, true))
    }

    /// The elements as a slice in C order, when the memory is host-
    /// accessible, C-contiguous, aligned for `T` and (for `bool`) holds only
    /// valid values; `None` otherwise ([`TensorRef::iter`] and
    /// [`TensorRef::to_vec`] work on every layout).
    pub fn as_slice(&self) -> Option<&[T]> {
        self.slice_parts("as_slice").ok().map(|(ptr, len)| {
            // SAFETY: `slice_parts` checked host access, C contiguity,
            // alignment and value validity; the memory stays alive and
            // unmodified by Rust code for the borrow of `self` (the only
            // writable access is through `&mut TensorMut`).
            unsafe { std::slice::from_raw_parts(ptr, len) }
        })
    }

    fn slice_parts(&self, method: &'static str) -> Result<(*const T, usize), ViewError> {
        self.host(method)?;
        if !self.is_c_contiguous() {
            return Err(self.origin.error(method, ViewErrorKind::NotContiguous));
        }
        self.aligned(method)?;
        self.valid_values(method)?;
        let len = self.len();
        let ptr = if len == 0 {
            std::ptr::NonNull::<T>::dangling().as_ptr().cast_const()
        } else {
            self.data_ptr()
        };
        Ok((ptr, len))
    }

    /// An `ndarray` view of dynamic rank with the same shape and strides
    /// (negative strides included); [`TensorRef::as_array`] gives a view of
    /// static rank for views of rank `0..=6`.
    ///
    /// # Errors
    /// [`ViewError`] when the memory is not host-accessible, not aligned for
    /// `T`, or (for `bool`) holds invalid values.
    #[cfg(feature = "ndarray")]
    pub fn as_ndarray(&self) -> Result<ndarray::ArrayViewD<'_, T>, ViewError> {
        self.ndarray_in("as_ndarray")
    }

    #[cfg(feature = "ndarray")]
    fn ndarray_in(&self, method: &'static str) -> Result<ndarray::ArrayViewD<'_, T>, ViewError> {
        self.host(method)?;
        self.aligned(method)?;
        self.valid_values(method)?;
        use ndarray::ShapeBuilder;
        let parts = ndarray_parts(&self.raw, std::mem::size_of::<T>())
            .map_err(|k| self.origin.error(method, k))?;
        let (ptr, shape, strides, flips) = match parts {
            NdParts::Empty(shape) => {
                // No memory to view: ndarray's safe constructor over an
                // empty slice checks the shape itself.
                return ndarray::ArrayViewD::from_shape(shape, &[]).map_err(|_| {
                    self.origin
                        .error(method, self.raw.overflow("ndarray refuses the shape"))
                });
            }
            NdParts::Strided(p) => p,
        };
        // SAFETY: `ptr` is the lowest-addressed element of memory the import
        // validated (host-accessible, in bounds for every index); strides
        // are non-negative after the flip, the element count fits `isize`
        // and the elements are aligned and valid (ndarray's requirements,
        // checked by `ndarray_parts` and above). The borrow of `self` keeps
        // the memory alive.
        let mut view =
            unsafe { ndarray::ArrayViewD::from_shape_ptr(shape.strides(strides), ptr.cast::<T>()) };
        for axis in flips {
            view.invert_axis(ndarray::Axis(axis));
        }
        Ok(view)
    }
}

impl<T: Element> TensorRef<'_, T> {
    /// The element at `index` (one entry per dimension). Works on unaligned
    /// memory. Views of a fixed rank take an array instead
    /// (`x.get([i, j])`), which is faster.
    ///
    /// # Errors
    /// [`ViewErrorKind::Index`] if `index` does not have `ndim()` entries
    /// or an entry is out of bounds (Python's `IndexError`);
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    #[inline]
    pub fn get(&self, index: &[usize]) -> Result<T, ViewError> {
        match self.offset_dyn(index) {
            Some(off) if self.fast.host => {
                // SAFETY: `off` addresses an in-bounds element, inside the
                // memory the import validated; `read_at` handles misalignment.
                Ok(unsafe { T::read_at(self.data_ptr().offset(off)) })
            }
            _ => Err(self.index_error("get", index)),
        }
    }
}

impl<'a, T: Element, const N: usize> std::ops::Deref for TensorMut<'a, T, N> {
    type Target = TensorRef<'a, T, N>;
    fn deref(&self) -> &TensorRef<'a, T, N> {
        &self.inner
    }
}

impl<'a, T: Element, const N: usize> TensorMut<'a, T, N> {
    transform_methods!();

    fn parts_mut(&mut self) -> (&mut RawTensor, Origin) {
        (&mut self.inner.raw, self.inner.origin)
    }

    fn refresh(&mut self) {
        self.inner.refresh();
    }

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.inner.raw.0
    }

    /// A writable view of the C-order elements of `data` under `shape`
    /// (host memory, owning nothing), for calling a `#[dlpack_fn]` body
    /// from Rust without Python.
    ///
    /// ```
    /// # use dlcast_runtime::TensorMut;
    /// let mut data = [0u8; 6];
    /// let mut out = TensorMut::<u8, 2>::from_slice_mut(&mut data, &[2, 3]).unwrap();
    /// out.set([1, 2], 7).unwrap();
    /// drop(out);
    /// assert_eq!(data, [0, 0, 0, 0, 0, 7]);
    /// ```
    ///
    /// # Errors
    /// As [`TensorRef::from_slice`].
    pub fn from_slice_mut(data: &'a mut [T], shape: &[usize]) -> Result<Self, ViewError> {
        let raw = rust_raw::<T, N>(data.as_mut_ptr(), Some(data.len()), shape, None, false)
            .map_err(|k| Origin::RUST.error("from_slice_mut", k))?;
        Ok(Self::wrap(raw))
    }

    /// A writable view of an `ndarray` mutable view's elements, same shape
    /// and strides, owning nothing.
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if the array does not have `N` dimensions
    /// (for a fixed `N`); [`ViewErrorKind::SelfOverlap`] if two indices
    /// reach one element (ndarray's mutable views never do).
    #[cfg(feature = "ndarray")]
    pub fn from_ndarray_mut<D: ndarray::Dimension>(
        mut array: ndarray::ArrayViewMut<'a, T, D>,
    ) -> Result<Self, ViewError> {
        let err = |k| Origin::RUST.error("from_ndarray_mut", k);
        if layout::may_self_overlap(array.shape(), array.strides()) {
            return Err(err(ViewErrorKind::SelfOverlap));
        }
        let shape = Dims::<usize>::from_slice(array.shape());
        let strides = Dims::<isize>::from_slice(array.strides());
        let raw = rust_raw::<T, N>(array.as_mut_ptr(), None, &shape, Some(&strides), false)
            .map_err(err)?;
        Ok(Self::wrap(raw))
    }

    fn wrap(raw: RawTensor) -> Self {
        TensorMut {
            inner: TensorRef::new(raw, Origin::RUST),
        }
    }

    /// The view with its rank fixed to `M` (or made dynamic, `M` = [`DYN`]).
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if the view does not have `M` dimensions.
    pub fn into_rank<const M: usize>(self) -> Result<TensorMut<'a, T, M>, ViewError> {
        Ok(TensorMut {
            inner: self.inner.into_rank()?,
        })
    }

    /// The view with a dynamic rank.
    pub fn into_dyn(self) -> TensorMut<'a, T> {
        TensorMut {
            inner: self.inner.into_dyn(),
        }
    }

    /// As [`TensorRef::reshape`], writable.
    ///
    /// # Errors
    /// [`ViewErrorKind::Reshape`].
    pub fn reshape(self, shape: &[usize]) -> Result<TensorMut<'a, T>, ViewError> {
        Ok(TensorMut {
            inner: self.inner.reshape(shape)?,
        })
    }

    /// Address of element 0, writable.
    pub fn data_ptr_mut(&mut self) -> *mut T {
        self.inner.raw.data.cast()
    }

    /// Writes `value` at the element of rank-`M` index `index`.
    #[inline(always)]
    fn write_n<const M: usize>(
        &mut self,
        method: &'static str,
        index: &[usize; M],
        value: T,
    ) -> Result<(), ViewError> {
        match self.inner.offset_n(index) {
            Some(off) => {
                // SAFETY: in-bounds element of writable, host-accessible
                // memory validated at import (or a `&mut` slice); `&mut
                // self` excludes every other Rust access.
                unsafe { self.data_ptr_mut().offset(off).write_unaligned(value) };
                Ok(())
            }
            None => Err(self.inner.index_error_n(method, *index)),
        }
    }

    /// Writes `value` into every element.
    ///
    /// # Errors
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    pub fn fill(&mut self, value: T) -> Result<(), ViewError> {
        self.inner.host("fill")?;
        let base = self.data_ptr_mut();
        layout::for_each_offset(&self.inner.raw.shape, &self.inner.raw.strides, |off| {
            // SAFETY: as in `set`, for every in-bounds element.
            unsafe { base.offset(off).write_unaligned(value) };
        })
        .ok_or_else(|| {
            self.inner.origin.error(
                "fill",
                self.inner.raw.overflow("an element offset overflows"),
            )
        })
    }

    /// Writes the elements of `src`, in C order, into the view, whatever
    /// its strides: the inverse of [`TensorRef::to_vec`].
    ///
    /// # Errors
    /// [`ViewErrorKind::Length`] if `src.len()` is not [`TensorRef::len`];
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<(), ViewError> {
        self.inner.host("copy_from_slice")?;
        if src.len() != self.len() {
            return Err(self.inner.origin.error(
                "copy_from_slice",
                ViewErrorKind::Length {
                    shape: self.shape().to_vec(),
                    expected: self.len(),
                    got: src.len(),
                },
            ));
        }
        let base = self.data_ptr_mut();
        let mut values = src.iter();
        layout::for_each_offset(&self.inner.raw.shape, &self.inner.raw.strides, |off| {
            if let Some(&v) = values.next() {
                // SAFETY: as in `set`, for every in-bounds element.
                unsafe { base.offset(off).write_unaligned(v) };
            }
        })
        .ok_or_else(|| {
            self.inner.origin.error(
                "copy_from_slice",
                self.inner.raw.overflow("an element offset overflows"),
            )
        })
    }

    /// The elements as a mutable slice in C order; `None` unless host-
    /// accessible, C-contiguous, aligned and (for `bool`) valid.
    pub fn as_slice_mut(&mut self) -> Option<&mut [T]> {
        let (ptr, len) = self.inner.slice_parts("as_slice_mut").ok()?;
        // SAFETY: as in `as_slice`; in addition the memory is writable (not
        // read-only, checked at import), C-contiguous so no two slice
        // elements alias, and `&mut self` makes this the only live access.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast_mut(), len) })
    }

    /// A mutable `ndarray` view of dynamic rank with the same shape and
    /// strides.
    ///
    /// # Errors
    /// As [`TensorRef::as_ndarray`].
    #[cfg(feature = "ndarray")]
    pub fn as_ndarray_mut(&mut self) -> Result<ndarray::ArrayViewMutD<'_, T>, ViewError> {
        self.ndarray_mut_in("as_ndarray_mut")
    }

    #[cfg(feature = "ndarray")]
    fn ndarray_mut_in(
        &mut self,
        method: &'static str,
    ) -> Result<ndarray::ArrayViewMutD<'_, T>, ViewError> {
        self.inner.host(method)?;
        self.inner.aligned(method)?;
        self.inner.valid_values(method)?;
        use ndarray::ShapeBuilder;
        let origin = self.inner.origin;
        let parts = ndarray_parts(&self.inner.raw, std::mem::size_of::<T>())
            .map_err(|k| origin.error(method, k))?;
        let (ptr, shape, strides, flips) = match parts {
            NdParts::Empty(shape) => {
                // As in `as_ndarray`: no memory, a view over `&mut []`
                // (ndarray's debug checks refused the dangling pointer
                // and zero strides this used to pass: kind 9).
                return ndarray::ArrayViewMutD::from_shape(shape, &mut []).map_err(|_| {
                    origin.error(method, self.inner.raw.overflow("ndarray refuses the shape"))
                });
            }
            NdParts::Strided(p) => p,
        };
        // SAFETY: as in `as_ndarray`; the memory is writable, the import
        // refused self-overlapping layouts for writable views, and
        // `&mut self` makes this the only live access.
        let mut view = unsafe {
            ndarray::ArrayViewMutD::from_shape_ptr(shape.strides(strides), ptr.cast::<T>())
        };
        for axis in flips {
            view.invert_axis(ndarray::Axis(axis));
        }
        Ok(view)
    }
}

impl<T: Element> TensorMut<'_, T> {
    /// Writes `value` at `index` (one entry per dimension). Views of a fixed
    /// rank take an array instead (`out.set([i, j], v)`), which is faster.
    ///
    /// # Errors
    /// [`ViewErrorKind::Index`] if `index` does not have `ndim()` entries
    /// or an entry is out of bounds (Python's `IndexError`);
    /// [`ViewErrorKind::NotHostAccessible`] for device memory. Nothing is
    /// written then.
    #[must_use = "an index out of bounds writes nothing: handle the error (`?`)"]
    #[inline]
    pub fn set(&mut self, index: &[usize], value: T) -> Result<(), ViewError> {
        match self.inner.offset_dyn(index) {
            Some(off) if self.inner.fast.host => {
                // SAFETY: in-bounds element of writable, host-accessible
                // memory validated at import; `&mut self` excludes every
                // other Rust access.
                unsafe { self.data_ptr_mut().offset(off).write_unaligned(value) };
                Ok(())
            }
            _ => Err(self.inner.index_error("set", index)),
        }
    }
}

/// The accessors of views whose rank the type fixes.
macro_rules! ranked {
    ($($n:literal $ix:ident),* $(,)?) => {$(
        impl<T: Element> TensorRef<'_, T, $n> {
            #[doc = concat!("The shape as an array of ", stringify!($n), " extents.")]
            #[inline]
            pub fn dims(&self) -> [usize; $n] {
                // The rank is `N` (checked when the view was made).
                std::array::from_fn(|k| self.fast.dims.get(k).copied().unwrap_or(0))
            }

            #[doc = concat!("The strides (elements) as an array of ", stringify!($n), ".")]
            #[inline]
            pub fn stride_array(&self) -> [isize; $n] {
                std::array::from_fn(|k| self.fast.strides.get(k).copied().unwrap_or(0))
            }

            /// The element at `index`; no allocation, no panic. Works on
            /// unaligned memory.
            ///
            /// # Errors
            /// [`ViewErrorKind::Index`] if an entry is out of bounds
            /// (Python's `IndexError`, naming the function, the parameter,
            /// the index and the shape); [`ViewErrorKind::NotHostAccessible`]
            /// for device memory.
            #[inline]
            pub fn get(&self, index: [usize; $n]) -> Result<T, ViewError> {
                self.read_n("get", &index)
            }

            #[doc = concat!("An `ndarray` view of static rank (`ndarray::", stringify!($ix), "`) with the same shape and strides.")]
            ///
            /// # Errors
            /// As [`TensorRef::as_ndarray`].
            #[cfg(feature = "ndarray")]
            pub fn as_array(&self) -> Result<ndarray::ArrayView<'_, T, ndarray::$ix>, ViewError> {
                let a = self.ndarray_in("as_array")?;
                a.into_dimensionality::<ndarray::$ix>().map_err(|_| {
                    self.origin.error(
                        "as_array",
                        ViewErrorKind::Rank { expected: $n, shape: self.raw.shape.to_vec() },
                    )
                })
            }
        }

        impl<T: Element> TensorMut<'_, T, $n> {
            /// Writes `value` at `index`; no allocation, no panic.
            ///
            /// # Errors
            /// [`ViewErrorKind::Index`] if an entry is out of bounds
            /// (Python's `IndexError`); [`ViewErrorKind::NotHostAccessible`]
            /// for device memory. Nothing is written then.
            #[must_use = "an index out of bounds writes nothing: handle the error (`?`)"]
            #[inline]
            pub fn set(&mut self, index: [usize; $n], value: T) -> Result<(), ViewError> {
                self.write_n("set", &index, value)
            }

            #[doc = concat!("A mutable `ndarray` view of static rank (`ndarray::", stringify!($ix), "`).")]
            ///
            /// # Errors
            /// As [`TensorRef::as_ndarray`].
            #[cfg(feature = "ndarray")]
            pub fn as_array_mut(&mut self) -> Result<ndarray::ArrayViewMut<'_, T, ndarray::$ix>, ViewError> {
                let origin = self.inner.origin;
                let shape = self.inner.raw.shape.to_vec();
                let a = self.ndarray_mut_in("as_array_mut")?;
                a.into_dimensionality::<ndarray::$ix>().map_err(|_| {
                    origin.error("as_array_mut", ViewErrorKind::Rank { expected: $n, shape })
                })
            }
        }
    )*};
}
ranked!(0 Ix0, 1 Ix1, 2 Ix2, 3 Ix3, 4 Ix4, 5 Ix5, 6 Ix6);

/// The elements of a view by value, in C order ([`TensorRef::iter`]) or in
/// memory order ([`TensorRef::iter_memory_order`]). Borrows the view.
pub struct Iter<'v, T: Element> {
    /// Element 0 of the view.
    base: *const T,
    /// Offset (elements) of the next element.
    offset: isize,
    /// The walk's dimensions, outermost first (extent-1 dimensions
    /// dropped, contiguous ones merged).
    shape: Dims<usize>,
    strides: Dims<isize>,
    index: Dims<usize>,
    remaining: usize,
    _marker: PhantomData<&'v T>,
}

impl<'v, T: Element> Iter<'v, T> {
    /// The walk over `raw`'s elements (host memory, checked by the caller).
    fn new(raw: &'v RawTensor, memory_order: bool) -> Self {
        let remaining = layout::element_count(&raw.shape).unwrap_or(0);
        // Dimensions that are stepped along, with their axis for ties.
        let mut dims: Dims<(usize, isize, usize)> = Dims::new();
        let mut offset: isize = 0;
        if remaining > 0 {
            for (axis, (&n, &s)) in raw.shape.iter().zip(&raw.strides).enumerate() {
                if n > 1 {
                    dims.push((n, s, axis));
                }
            }
        }
        if memory_order {
            for d in dims.iter_mut() {
                if d.1 < 0 {
                    // Start at the last index along this axis: an element
                    // offset of the validated layout (exact, see `offset_n`).
                    offset = offset.wrapping_add(((d.0 - 1) as isize).wrapping_mul(d.1));
                    // `s < 0` steps along a dimension of extent > 1, so its
                    // byte extent bounds `|s|`: never `isize::MIN`.
                    d.1 = d.1.wrapping_neg();
                }
            }
            // Largest stride outermost; the axis breaks ties (broadcasts).
            dims.sort_unstable_by_key(|&(_, s, axis)| (std::cmp::Reverse(s), axis));
        }
        // Merge a dimension into the next inner one where they form one
        // contiguous run (long inner loops).
        let mut shape: Dims<usize> = Dims::new();
        let mut strides: Dims<isize> = Dims::new();
        for &(n, s, _) in dims.iter().rev() {
            if let (Some(inner_n), Some(&inner_s)) = (shape.last_mut(), strides.last()) {
                let run = isize::try_from(*inner_n)
                    .ok()
                    .and_then(|m| m.checked_mul(inner_s));
                if run == Some(s) {
                    if let Some(total) = inner_n.checked_mul(n) {
                        *inner_n = total;
                        continue;
                    }
                }
            }
            shape.push(n);
            strides.push(s);
        }
        shape.reverse();
        strides.reverse();
        let index = smallvec::smallvec![0; shape.len()];
        Iter {
            base: raw.data.cast(),
            offset,
            shape,
            strides,
            index,
            remaining,
            _marker: PhantomData,
        }
    }

    /// Moves to the next index (odometer, last dimension fastest).
    fn step(&mut self) {
        for d in (0..self.shape.len()).rev() {
            let (n, s) = (self.shape[d], self.strides[d]);
            // `index[d] < n`, so `+ 1` cannot overflow. Every offset reached
            // is an element offset of the validated layout: exact.
            if self.index[d] + 1 < n {
                self.index[d] += 1;
                self.offset = self.offset.wrapping_add(s);
                return;
            }
            self.offset = self.offset.wrapping_sub(((n - 1) as isize).wrapping_mul(s));
            self.index[d] = 0;
        }
    }
}

impl<T: Element> Iterator for Iter<'_, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        if self.remaining == 0 {
            return None;
        }
        // SAFETY: `offset` is the offset of an element of the view (the
        // walk visits exactly `len()` indices), in host memory the import
        // validated and the borrow of the view keeps alive; `read_at`
        // handles misalignment.
        let value = unsafe { T::read_at(self.base.offset(self.offset)) };
        self.remaining -= 1;
        if self.remaining > 0 {
            self.step();
        }
        Some(value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<T: Element> ExactSizeIterator for Iter<'_, T> {}
impl<T: Element> std::iter::FusedIterator for Iter<'_, T> {}

impl<T: Element> fmt::Debug for Iter<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iter")
            .field("remaining", &self.remaining)
            .finish()
    }
}

impl<'a> TensorDyn<'a> {
    layout_methods!();
    transform_methods!();

    fn parts_mut(&mut self) -> (&mut RawTensor, Origin) {
        (&mut self.raw, self.origin)
    }

    /// Untyped views keep no accessor cache.
    fn refresh(&mut self) {}

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.raw.0
    }

    /// The same elements in C order under another shape with the same
    /// element count; the view must be C-contiguous.
    ///
    /// # Errors
    /// [`ViewErrorKind::Reshape`].
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self, ViewError> {
        let origin = self.origin;
        self.raw
            .reshape(shape)
            .map_err(|k| origin.error("reshape", k))?;
        Ok(self)
    }

    /// Address of element 0 (`data + byte_offset`), untyped.
    pub fn data_ptr(&self) -> *const u8 {
        self.raw.data
    }

    /// The typed view, if the data type is `T`'s; otherwise `self` back.
    // Handing the view back by value is the point (like `Box::downcast`);
    // it is moved once per dispatch step.
    #[allow(clippy::result_large_err)]
    pub fn into_typed<T: Element>(self) -> Result<TensorRef<'a, T>, Self> {
        if self.raw.dtype == T::DTYPE {
            Ok(TensorRef::new(self.raw.0, self.origin))
        } else {
            Err(self)
        }
    }
}

impl<'a> TensorDynMut<'a> {
    layout_methods!();
    transform_methods!();

    fn parts_mut(&mut self) -> (&mut RawTensor, Origin) {
        (&mut self.raw, self.origin)
    }

    /// Untyped views keep no accessor cache.
    fn refresh(&mut self) {}

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.raw.0
    }

    /// As [`TensorDyn::reshape`].
    ///
    /// # Errors
    /// [`ViewErrorKind::Reshape`].
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self, ViewError> {
        let origin = self.origin;
        self.raw
            .reshape(shape)
            .map_err(|k| origin.error("reshape", k))?;
        Ok(self)
    }

    /// Address of element 0 (`data + byte_offset`), untyped and writable.
    pub fn data_ptr_mut(&mut self) -> *mut u8 {
        self.raw.data
    }

    /// The typed writable view, if the data type is `T`'s; otherwise `self`.
    #[allow(clippy::result_large_err)]
    pub fn into_typed<T: Element>(self) -> Result<TensorMut<'a, T>, Self> {
        if self.raw.dtype == T::DTYPE {
            Ok(TensorMut {
                inner: TensorRef::new(self.raw.0, self.origin),
            })
        } else {
            Err(self)
        }
    }
}

macro_rules! debug_impl {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("shape", &self.raw.shape.as_slice())
                    .field("strides", &self.raw.strides.as_slice())
                    .field("dtype", &self.raw.dtype)
                    .field("device", &self.raw.device)
                    .finish()
            }
        }
    )*};
}
debug_impl!(TensorDyn<'_>, TensorDynMut<'_>);

impl<T: Element, const N: usize> fmt::Debug for TensorRef<'_, T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRef")
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .finish()
    }
}

impl<T: Element, const N: usize> fmt::Debug for TensorMut<'_, T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TensorMut").field(&self.inner).finish()
    }
}

/// The rank a view type fixes, for [`View::NDIM`].
const fn ndim_of(n: usize) -> Option<usize> {
    if n == DYN {
        None
    } else {
        Some(n)
    }
}

impl<'a, T: Element, const N: usize> View<'a> for TensorRef<'a, T, N> {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = false;
    const NDIM: Option<usize> = ndim_of(N);
    #[inline(always)]
    fn from_raw(raw: RawTensor, keep: Keep<'a>) -> pyo3::PyResult<Self> {
        let origin = Origin::param(keep.spec, keep.index);
        rank_fits::<N>(&raw).map_err(|k| origin.error("", k))?;
        Ok(TensorRef::new(raw, origin))
    }
}

impl<'a, T: Element, const N: usize> View<'a> for TensorMut<'a, T, N> {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = true;
    const NDIM: Option<usize> = ndim_of(N);
    #[inline(always)]
    fn from_raw(raw: RawTensor, keep: Keep<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorMut {
            inner: TensorRef::from_raw(raw, keep)?,
        })
    }
}

impl<'a> View<'a> for TensorDyn<'a> {
    const DTYPE: Option<DType> = None;
    const WRITABLE: bool = false;
    const NDIM: Option<usize> = None;
    fn from_raw(raw: RawTensor, keep: Keep<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorDyn {
            raw: Held(raw),
            origin: Origin::param(keep.spec, keep.index),
            _marker: PhantomData,
            _gil: PhantomData,
        })
    }
}

impl<'a> View<'a> for TensorDynMut<'a> {
    const DTYPE: Option<DType> = None;
    const WRITABLE: bool = true;
    const NDIM: Option<usize> = None;
    fn from_raw(raw: RawTensor, keep: Keep<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorDynMut {
            raw: Held(raw),
            origin: Origin::param(keep.spec, keep.index),
            _marker: PhantomData,
            _gil: PhantomData,
        })
    }
}

/// What `ndarray` needs for a view: the shape alone for an empty array (a
/// view over an empty slice), else a base pointer, shape, non-negative
/// strides and the axes to invert afterwards to restore negative strides.
#[cfg(feature = "ndarray")]
pub(crate) enum NdParts {
    Empty(ndarray::IxDyn),
    Strided((*mut u8, ndarray::IxDyn, ndarray::IxDyn, Vec<usize>)),
}

/// Shape, non-negative strides and a base pointer for `ndarray`, checked
/// against `ndarray::ArrayView::from_shape_ptr`'s requirements: element
/// count within `isize::MAX`, non-negative strides (as `isize`), every
/// offset in bytes within `isize`.
#[cfg(feature = "ndarray")]
pub(crate) fn ndarray_parts(raw: &RawTensor, itemsize: usize) -> Result<NdParts, ViewErrorKind> {
    if raw.shape.contains(&0) {
        return Ok(NdParts::Empty(ndarray::IxDyn(&raw.shape)));
    }
    // A broadcast view may hold more elements than `isize::MAX`, which
    // ndarray does not allow (it could not index them).
    layout::element_count(&raw.shape)
        .filter(|&n| isize::try_from(n).is_ok())
        .ok_or_else(|| raw.overflow("ndarray views hold at most isize::MAX elements"))?;
    let item = isize::try_from(itemsize).map_err(|_| raw.overflow("the itemsize overflows"))?;
    let mut ptr = raw.data;
    let mut flips = Vec::new();
    // Inline up to `INLINE_DIMS` dimensions, as the read's own strides: no
    // allocation for the view of an ordinary array.
    let mut strides: crate::import::Dims<usize> = smallvec::SmallVec::new();
    for (axis, (&n, &s)) in raw.shape.iter().zip(&raw.strides).enumerate() {
        if n <= 1 {
            // Never stepped along: any stride will do, and 0 is one ndarray
            // takes whatever the producer sent (`isize::MIN`, say).
            strides.push(0);
            continue;
        }
        if s < 0 {
            // Move to the lowest address along this axis: the byte offset
            // of an element of the validated layout (fits; checked anyway).
            let step = isize::try_from(n - 1)
                .ok()
                .and_then(|k| k.checked_mul(s))
                .and_then(|o| o.checked_mul(item))
                .ok_or_else(|| raw.overflow("an element offset overflows"))?;
            ptr = ptr.wrapping_offset(step);
            flips.push(axis);
        }
        strides.push(s.unsigned_abs());
    }
    Ok(NdParts::Strided((
        ptr,
        ndarray::IxDyn(&raw.shape),
        ndarray::IxDyn(&strides),
        flips,
    )))
}

mod sealed {
    pub trait Sealed {}
}

/// Never implemented: it makes PyO3's extraction of a view type fail with a
/// message that says what is missing, when a function takes a view without
/// `#[dlpack_fn]` or with `#[dlpack_fn]` placed below `#[pyfunction]` (PyO3
/// then sees the view parameter itself).
#[diagnostic::on_unimplemented(
    message = "array parameter of type `{Self}` needs #[dlpack_fn] above #[pyfunction]",
    label = "PyO3 cannot take a dlcast view by itself",
    note = "place #[dlpack_fn] above #[pyfunction], or, for methods, on the impl block above #[pymethods]",
    note = "#[dlpack_fn] recognises a view parameter spelled directly (`TensorRef<'_, T>`, `TensorMut`, `TensorDyn`, `TensorDynMut`, or an `Option` of one), not through a type alias or inside another type"
)]
pub trait NeedsDlpackFn: sealed::Sealed {}

macro_rules! refuse_direct_extraction {
    ($(impl[$($g:tt)*] $t:ty;)*) => {$(
        impl<'a, 'py, $($g)*> pyo3::FromPyObject<'a, 'py> for $t
        where
            Self: NeedsDlpackFn,
        {
            type Error = pyo3::PyErr;
            fn extract(_obj: pyo3::Borrowed<'a, 'py, pyo3::PyAny>) -> pyo3::PyResult<Self> {
                Err(pyo3::exceptions::PyTypeError::new_err(
                    "dlcast views are taken through #[dlpack_fn]",
                ))
            }
        }
    )*};
}

refuse_direct_extraction! {
    impl[T: Element, const N: usize] TensorRef<'a, T, N>;
    impl[T: Element, const N: usize] TensorMut<'a, T, N>;
    impl[] TensorDyn<'a>;
    impl[] TensorDynMut<'a>;
}
