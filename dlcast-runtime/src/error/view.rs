//! Errors of views: of view methods, public ([`ViewError`]: which method,
//! function and parameter, around a [`ViewErrorKind`]: what went wrong),
//! and what the Rust-native views of a call's parameters refuse
//! ([`NativeRefusal`]: a slice, an `ndarray` view), and a view extracted
//! without `#[dlpack_fn]` ([`DirectExtraction`]).

use crate::device::Device;
use crate::dtype::DType;
use crate::spec::TupleDisplay;
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyTypeError, PyValueError};
use pyo3::PyErr;
use std::fmt;

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
    /// Sliding windows that do not fit their axis: a window of 0 elements
    /// or longer than the axis, or a step of 0.
    #[error(
        "cannot take windows of {window} elements every {step} along axis {axis} (extent {extent}): {why}"
    )]
    Window {
        /// The axis.
        axis: usize,
        /// The axis' extent.
        extent: usize,
        /// The window length asked for.
        window: usize,
        /// The step asked for.
        step: usize,
        /// What is wrong.
        why: &'static str,
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
pub struct ViewError(pub(crate) Box<ErrorInner>);

/// What a [`ViewError`] holds (boxed, so that it stays one pointer wide).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ErrorInner {
    pub(crate) kind: ViewErrorKind,
    pub(crate) method: Option<&'static str>,
    pub(crate) function: Option<&'static str>,
    pub(crate) parameter: Option<&'static str>,
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

impl From<ViewError> for PyErr {
    fn from(e: ViewError) -> Self {
        let text = e.to_string();
        match e.kind() {
            ViewErrorKind::OutOfMemory { .. } => PyMemoryError::new_err(text),
            ViewErrorKind::Index { .. } => PyIndexError::new_err(text),
            ViewErrorKind::Rank { .. } => PyTypeError::new_err(text),
            _ => PyValueError::new_err(text),
        }
    }
}

impl From<ViewErrorKind> for PyErr {
    fn from(e: ViewErrorKind) -> Self {
        ViewError::from(e).into()
    }
}

/// What a Rust-native view (`&[T]`, `&mut [T]`, `ndarray::ArrayView`,
/// `ArrayViewMut`) of a call's argument refuses, with the function and the
/// parameter: `ValueError` for [`Native::InvalidBool`], `TypeError` for
/// the others.
#[derive(Debug, thiserror::Error)]
#[error("{func}(): argument '{param}': {why}")]
pub(crate) struct NativeRefusal {
    pub(crate) func: &'static str,
    pub(crate) param: &'static str,
    pub(crate) why: Native,
}

/// What a [`NativeRefusal`] refuses.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Native {
    /// Memory the CPU cannot read.
    #[error("the array is on {0}, not in memory the CPU can read")]
    NotHost(Device),
    /// Another element type.
    #[error("expected dtype {want}, got {got}")]
    DType { want: DType, got: DType },
    /// Data not aligned for the element type (its alignment).
    #[error("the data is not aligned to {0} bytes")]
    Misaligned(usize),
    /// `bool` elements that are neither 0 nor 1.
    #[error(
        "the array holds bytes that are not valid {} values (a bool must be 0 or 1)",
        DType::BOOL
    )]
    InvalidBool,
    /// A slice of memory that is not C-contiguous.
    #[error("a slice needs a C-contiguous array")]
    NotCContiguous,
    /// An element count that overflows.
    #[error("the element count overflows")]
    CountOverflow,
    /// A read-only array for a writable view.
    #[error("the array is read-only")]
    ReadOnly,
    /// Another number of dimensions than the view type's.
    #[error("expected {want} dimensions, got {got}")]
    Rank { want: usize, got: usize },
    /// A layout `ndarray`'s arithmetic cannot hold.
    #[error("the layout is too large for an ndarray view")]
    TooLarge,
    /// An empty shape `ndarray` refuses.
    #[error(
        "ndarray refuses the empty shape {} (the product of its nonzero extents must fit isize)",
        TupleDisplay(.0)
    )]
    EmptyShape(Vec<usize>),
    /// A writable view of memory some element of which two indices reach.
    #[error("a writable array must not reach one element from two indices")]
    SelfOverlap,
    /// A view type without a fast-path constructor asked for one (only a
    /// call context driven by hand can get there).
    #[error("no fast view of this type")]
    NoFastView,
}

impl From<NativeRefusal> for PyErr {
    #[cold]
    fn from(e: NativeRefusal) -> PyErr {
        let msg = e.to_string();
        match e.why {
            Native::InvalidBool => PyValueError::new_err(msg),
            _ => PyTypeError::new_err(msg),
        }
    }
}

/// `TypeError`: a view type extracted by PyO3 itself (a parameter of a
/// function without `#[dlpack_fn]`).
#[derive(Debug, thiserror::Error)]
#[error("dlcast views are taken through #[dlpack_fn]")]
pub(crate) struct DirectExtraction;

impl From<DirectExtraction> for PyErr {
    #[cold]
    fn from(e: DirectExtraction) -> PyErr {
        PyTypeError::new_err(e.to_string())
    }
}
