//! What the call driver's fast reads hand the views (an exact
//! `numpy.ndarray`, or a PyTorch tensor read directly): what a view type
//! needs of such a read ([`FastNeeds`]), what the view keeps of the call
//! ([`FastKeep`]), and the read an owning view takes ([`fast_raw`]).

use crate::error::{Native, NativeRefusal};
use crate::import::numpy::{NpRead, FAST_DIMS};
use crate::import::RawTensor;
use crate::spec::FnSpec;
use pyo3::prelude::*;

/// What a view type needs of an exact `numpy.ndarray` read by the call
/// driver's fast path ([`View::FAST`]), beyond its dtype and writability.
#[doc(hidden)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FastNeeds {
    /// The number of dimensions the type fixes.
    pub(crate) ndim: Option<usize>,
    /// Data aligned for the element type (the type hands out references).
    pub(crate) aligned: bool,
    /// Unit element strides (a slice).
    pub(crate) contiguous: bool,
    /// The element type's size and alignment in bytes.
    pub(crate) itemsize: usize,
    pub(crate) align: usize,
}

/// What a view made from a fast read keeps: the call context's hold of the
/// argument (a strong reference, so the memory lives while the context
/// does) and of the read's borrow-registry entry, both borrowed for `'a`;
/// a view that may outlive the body (a typed view, which can be returned)
/// takes its own.
#[doc(hidden)]
pub struct FastKeep<'a> {
    pub(crate) obj: &'a Bound<'a, PyAny>,
    pub(crate) borrow: &'a std::cell::Cell<Option<crate::borrow::Borrow>>,
    pub(crate) spec: &'static FnSpec,
    pub(crate) index: usize,
}

impl FastKeep<'_> {
    /// The refusal `why`, naming the function and the parameter.
    #[cold]
    pub(crate) fn refuse(&self, why: Native) -> PyErr {
        NativeRefusal {
            func: self.spec.name,
            param: self.spec.params.get(self.index).map_or("?", |p| p.name),
            why,
        }
        .into()
    }
}

/// The read a view of the general path would own, for a fast read (see
/// `import::numpy::read_fast`): the same fields, the argument as owner, and
/// the read's registry entry, taken from the call context.
#[inline(always)]
pub(super) fn fast_raw(read: &NpRead, keep: &FastKeep<'_>) -> pyo3::PyResult<RawTensor> {
    // Inline dims filled from the read's fixed arrays (a fixed-size copy,
    // no `memcpy` of variable length; the read's arrays fit: checked at
    // compile time).
    const _: () = assert!(FAST_DIMS <= crate::import::INLINE_DIMS);
    fn inline<T: Copy + Default>(v: &[T; FAST_DIMS], n: usize) -> crate::import::Dims<T> {
        let mut buf = [T::default(); crate::import::INLINE_DIMS];
        buf[..FAST_DIMS].copy_from_slice(v);
        smallvec::SmallVec::from_buf_and_len(buf, n.min(FAST_DIMS))
    }
    // A PyTorch tensor read directly hands its held storage to the view
    // (each parameter's read is taken by one view); a NumPy array is held
    // by a reference to it.
    let (owner, path) = match read.torch.as_ref().map(|t| t.storage.take()) {
        None => (
            crate::import::Owner::Object(keep.obj.clone().unbind()),
            crate::import::ImportPath::Numpy,
        ),
        Some(storage) => {
            let Some(storage) = storage else {
                return Err(keep.refuse(Native::NoFastView));
            };
            let original = keep.obj.clone().unbind();
            (
                crate::import::Owner::Storage { storage, original },
                crate::import::ImportPath::Torch,
            )
        }
    };
    let mut raw = RawTensor::new(
        read.data,
        inline(&read.dims, read.ndim),
        inline(&read.strides, read.ndim),
        read.dtype,
        read.read_only,
        Some(crate::layout::ByteExtent { lo: 0, hi: read.hi }),
        path,
    );
    raw.borrow = keep.borrow.take();
    raw.set_owner(owner);
    Ok(raw)
}
