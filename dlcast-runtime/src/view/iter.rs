//! [`Iter`]: the elements of a view by value, in C or memory order.

use crate::dtype::Element;
use crate::import::{Dims, RawTensor};
use crate::layout;
use std::fmt;
use std::marker::PhantomData;

/// The elements of a view by value, in C order ([`TensorRef::iter`](crate::TensorRef::iter)) or in
/// memory order ([`TensorRef::iter_memory_order`](crate::TensorRef::iter_memory_order)). Borrows the view.
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
    pub(super) fn new(raw: &'v RawTensor, memory_order: bool) -> Self {
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
