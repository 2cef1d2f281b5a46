//! The untyped views, [`TensorDyn`] and [`TensorDynMut`]: any dtype, and
//! the typed view when the dtype is known.

use super::*;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::import::RawTensor;
use crate::layout;
use std::fmt;

/// A read-only view whose element type is read at run time, for functions
/// that dispatch on [`TensorDyn::dtype`] themselves.
pub struct TensorDyn<'a> {
    pub(super) raw: ViewRead,
    pub(super) origin: Origin,
    pub(super) _marker: PhantomData<&'a ()>,
}

/// A writable view whose element type is read at run time.
pub struct TensorDynMut<'a> {
    pub(super) raw: ViewRead,
    pub(super) origin: Origin,
    pub(super) _marker: PhantomData<&'a ()>,
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

    /// Overlapping windows of `window` elements along `axis`, one every
    /// `step`, without a copy; read-only (see
    /// [`TensorRef::sliding_windows`]).
    ///
    /// # Errors
    /// As [`TensorRef::sliding_windows`].
    pub fn sliding_windows(
        mut self,
        axis: usize,
        window: usize,
        step: usize,
    ) -> Result<Self, ViewError> {
        let origin = self.origin;
        self.raw
            .sliding_windows(axis, window, step)
            .map_err(|k| origin.error("sliding_windows", k))?;
        Ok(self)
    }

    /// Address of element 0 (`data + byte_offset`), untyped; the handle
    /// itself where `data` is one (see [`TensorDyn::byte_offset`]).
    pub fn data_ptr(&self) -> *const u8 {
        self.raw.data
    }

    /// Another view of the same elements, borrowing this one (see
    /// [`TensorRef::view`]).
    pub fn view(&self) -> TensorDyn<'_> {
        TensorDyn {
            raw: ViewRead(self.raw.share()),
            origin: self.origin,
            _marker: PhantomData,
        }
    }

    /// The sub-array at `index` along `axis`, one dimension fewer,
    /// borrowing this view (see [`TensorRef::index_axis`]).
    ///
    /// # Errors
    /// [`ViewErrorKind::Axes`] if `axis >= ndim()`; [`ViewErrorKind::Range`]
    /// if `index` is at or beyond the extent of `axis`.
    pub fn index_axis(&self, axis: usize, index: usize) -> Result<TensorDyn<'_>, ViewError> {
        let mut v = self.view();
        v.raw
            .index_axis(axis, index)
            .map_err(|k| self.origin.error("index_axis", k))?;
        Ok(v)
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

    /// Address of element 0 (`data + byte_offset`), untyped, for reading
    /// (as [`TensorDyn::data_ptr`]); [`TensorDynMut::data_ptr_mut`] for
    /// writing. For memory the CPU cannot access it is a device address;
    /// it may be unaligned for the element type.
    pub fn data_ptr(&self) -> *const u8 {
        self.raw.data
    }

    /// Address of element 0 (`data + byte_offset`), untyped and writable.
    pub fn data_ptr_mut(&mut self) -> *mut u8 {
        self.raw.data
    }

    /// A read-only view of the same elements, borrowing this one (see
    /// [`TensorRef::view`]).
    pub fn view(&self) -> TensorDyn<'_> {
        TensorDyn {
            raw: ViewRead(self.raw.share()),
            origin: self.origin,
            _marker: PhantomData,
        }
    }

    /// A writable view of the same elements borrowing this one exclusively,
    /// for a shorter time (see [`TensorMut::reborrow`]).
    pub fn reborrow(&mut self) -> TensorDynMut<'_> {
        TensorDynMut {
            raw: ViewRead(self.raw.share()),
            origin: self.origin,
            _marker: PhantomData,
        }
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
