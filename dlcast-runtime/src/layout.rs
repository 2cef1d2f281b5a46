//! Pure layout arithmetic over shapes and strides in **elements** (DLPack's
//! unit): contiguity, the bytes an array touches, self-overlap, index walks.
//!
//! Every function checks its arithmetic: an input whose sizes overflow
//! `usize`/`isize` gives `None` (or the conservative answer), never a
//! wrapped value.

/// Number of elements, the product of the extents; `None` on overflow.
/// A 0-d array (`shape == []`) has one element.
pub fn element_count(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        // Empty, whatever the other extents: no overflow to report.
        return Some(0);
    }
    shape.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n))
}

fn is_contiguous_in<'s>(
    dims: impl Iterator<Item = (&'s usize, &'s isize)>,
    shape: &[usize],
) -> bool {
    if shape.contains(&0) {
        // An empty array is contiguous whatever its strides (DLPack notes:
        // CuPy sends stride 0 for empty arrays).
        return true;
    }
    let mut expected: isize = 1;
    for (&n, &s) in dims {
        if n == 1 {
            // Any stride is legal on an extent-1 dimension.
            continue;
        }
        if s != expected {
            return false;
        }
        expected = match isize::try_from(n)
            .ok()
            .and_then(|n| expected.checked_mul(n))
        {
            Some(e) => e,
            None => return false,
        };
    }
    true
}

/// C (row-major) contiguity: the last dimension varies fastest, without gaps.
/// Extent-1 dimensions are ignored and empty arrays are contiguous, as NumPy
/// and the DLPack header's notes on strides require.
pub fn is_c_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    is_contiguous_in(shape.iter().zip(strides).rev(), shape)
}

/// F (column-major) contiguity: the first dimension varies fastest; the same
/// rules for extent-1 dimensions and empty arrays as [`is_c_contiguous`].
pub fn is_f_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    is_contiguous_in(shape.iter().zip(strides), shape)
}

/// Writes the strides (in elements) of a compact row-major array of `shape`
/// into `out` (same length). `None` if they overflow `isize`.
pub fn fill_c_strides(shape: &[usize], out: &mut [isize]) -> Option<()> {
    // `None` once the product overflows; an error only if a stride needs it.
    let mut acc: Option<isize> = Some(1);
    for (o, &n) in out.iter_mut().zip(shape).rev() {
        *o = acc?;
        acc = isize::try_from(n.max(1))
            .ok()
            .and_then(|n| acc?.checked_mul(n));
    }
    Some(())
}

/// [`fill_c_strides`], except that an empty array, whose strides address
/// nothing, gets strides of 0 where its compact ones would overflow (a
/// shape such as `[0, 2**62, 4]`). `None` only for a non-empty shape.
pub fn fill_c_strides_or_empty(shape: &[usize], out: &mut [isize]) -> Option<()> {
    if fill_c_strides(shape, out).is_some() {
        return Some(());
    }
    if !shape.contains(&0) {
        return None;
    }
    out.fill(0);
    Some(())
}

/// The bytes an array touches, relative to the address of element 0.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ByteExtent {
    /// Offset of the lowest byte touched (zero or negative: negative strides
    /// reach below element 0).
    pub lo: isize,
    /// One past the highest byte touched (at least `itemsize`).
    pub hi: isize,
}

/// The byte range `[lo, hi)` that the elements of an array span, relative to
/// element 0, for elements of `itemsize` bytes.
///
/// Returns `Some(None)` for an empty array (it touches no memory), and
/// `None` if the arithmetic overflows `isize`.
pub fn byte_extent(
    shape: &[usize],
    strides: &[isize],
    itemsize: usize,
) -> Option<Option<ByteExtent>> {
    if shape.contains(&0) {
        return Some(None);
    }
    let item = isize::try_from(itemsize).ok()?;
    let (mut lo, mut hi) = (0isize, 0isize);
    for (&n, &s) in shape.iter().zip(strides) {
        let last = isize::try_from(n - 1).ok()?;
        let step = last.checked_mul(s)?.checked_mul(item)?;
        if step < 0 {
            lo = lo.checked_add(step)?;
        } else {
            hi = hi.checked_add(step)?;
        }
    }
    Some(Some(ByteExtent {
        lo,
        hi: hi.checked_add(item)?,
    }))
}

/// Whether two different indices may reach the same element.
///
/// Exact `false` for every layout a strided array library produces
/// (permutations of compact layouts, slices with steps, negative strides);
/// conservative `true` when non-overlap cannot be shown by sorting the
/// dimensions by `|stride|` and checking each stride clears everything the
/// smaller ones reach. A stride of 0 on an extent above 1 is an overlap.
pub fn may_self_overlap(shape: &[usize], strides: &[isize]) -> bool {
    if shape.contains(&0) {
        return false;
    }
    let mut dims: smallvec::SmallVec<[(usize, usize); 8]> = shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n > 1)
        .map(|(&n, &s)| (s.unsigned_abs(), n))
        .collect();
    dims.sort_unstable();
    sorted_dims_overlap(&dims)
}

/// The scan of [`may_self_overlap`] (and of the fast read's copy of it on
/// fixed arrays): `dims`, the `(|stride|, extent)` of every dimension with
/// more than one index, sorted, overlap unless each stride clears all the
/// smaller ones reach.
#[inline(always)]
pub(crate) fn sorted_dims_overlap(dims: &[(usize, usize)]) -> bool {
    let mut reach: usize = 0;
    for &(stride, n) in dims {
        if stride <= reach {
            return true;
        }
        reach = match stride.checked_mul(n - 1).and_then(|r| r.checked_add(reach)) {
            Some(r) => r,
            None => return true,
        };
    }
    false
}

/// Calls `f` with the offset (in elements, relative to element 0) of every
/// element, in C order (last index fastest).
///
/// Every offset handed to `f` is the offset of an element, so for a layout
/// whose [`byte_extent`] fits (what import and export check) no step
/// overflows. The walk never steps past the last index of a dimension (it
/// goes back to index 0 by subtracting `(n - 1) * stride`), so a stride
/// that only an extent-1 dimension could carry never enters the sum. Any
/// other layout whose offsets overflow `isize` stops the walk and gives
/// `None` (checked arithmetic in every build profile, never a panic).
pub fn for_each_offset(shape: &[usize], strides: &[isize], mut f: impl FnMut(isize)) -> Option<()> {
    if shape.contains(&0) {
        return Some(());
    }
    let ndim = shape.len().min(strides.len());
    if ndim != shape.len() {
        return None;
    }
    let mut index: smallvec::SmallVec<[usize; 8]> = smallvec::smallvec![0; ndim];
    let mut offset: isize = 0;
    loop {
        f(offset);
        // Advance the odometer from the last dimension.
        let mut d = ndim;
        loop {
            if d == 0 {
                return Some(());
            }
            d -= 1;
            // `index[d] < shape[d]` always holds, so `+ 1` cannot overflow.
            if index[d] + 1 < shape[d] {
                index[d] += 1;
                offset = offset.checked_add(strides[d])?;
                break;
            }
            // Back to index 0 along `d`: subtract the `shape[d] - 1` steps
            // taken (`shape[d] >= 1` here: empty shapes returned above).
            let back = isize::try_from(shape[d] - 1)
                .ok()
                .and_then(|n| n.checked_mul(strides[d]))?;
            offset = offset.checked_sub(back)?;
            index[d] = 0;
        }
    }
}

/// Offset in elements of the element at `index`, or `None` if `index` has
/// the wrong length or is out of bounds (or, for a layout whose extent does
/// not fit `isize`, if the offset overflows).
pub fn offset_of(shape: &[usize], strides: &[isize], index: &[usize]) -> Option<isize> {
    if index.len() != shape.len() || strides.len() != shape.len() {
        return None;
    }
    let mut off: isize = 0;
    for ((&i, &n), &s) in index.iter().zip(shape).zip(strides) {
        if i >= n {
            return None;
        }
        // In bounds, so |i * s| <= |(n - 1) * s|, which byte_extent checked
        // for every validated layout; checked anyway for any other.
        off = off.checked_add(isize::try_from(i).ok()?.checked_mul(s)?)?;
    }
    Some(off)
}

/// Bytes of `count` elements of `itemsize` bytes, when that fits `isize`
/// (the most a Rust allocation, a slice or a `Py_buffer` may hold).
pub fn checked_bytes(count: usize, itemsize: usize) -> Option<usize> {
    count
        .checked_mul(itemsize)
        .filter(|&b| isize::try_from(b).is_ok())
}

/// Whether index steps along a dimension never happen: its extent is at
/// most 1, or the array is empty. The stride of such a dimension never
/// addresses memory, so any value (including 0) describes the same array.
pub fn stride_unused(shape: &[usize], axis: usize) -> bool {
    shape.get(axis).is_none_or(|&n| n <= 1) || shape.contains(&0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// Every element offset, by brute force over every index.
    fn all_offsets(shape: &[usize], strides: &[isize]) -> Vec<isize> {
        let total = element_count(shape).unwrap();
        (0..total)
            .map(|mut flat| {
                let mut off = 0;
                for d in (0..shape.len()).rev() {
                    off += (flat % shape[d]) as isize * strides[d];
                    flat /= shape[d];
                }
                off
            })
            .collect()
    }

    fn layout() -> impl Strategy<Value = (Vec<usize>, Vec<isize>)> {
        prop::collection::vec((0usize..5, -7isize..8), 0..5)
            .prop_map(|dims| dims.into_iter().unzip())
    }

    proptest! {
        #[test]
        fn offsets_match_brute_force((shape, strides) in layout()) {
            let mut seen = Vec::new();
            prop_assert!(for_each_offset(&shape, &strides, |o| seen.push(o)).is_some());
            prop_assert_eq!(seen, all_offsets(&shape, &strides));
        }

        #[test]
        fn extent_covers_exactly_the_touched_bytes((shape, strides) in layout(), item in 1usize..9) {
            let offs = all_offsets(&shape, &strides);
            match byte_extent(&shape, &strides, item).unwrap() {
                None => prop_assert!(offs.is_empty()),
                Some(e) => {
                    let lo = offs.iter().min().unwrap() * item as isize;
                    let hi = offs.iter().max().unwrap() * item as isize + item as isize;
                    prop_assert_eq!(e, ByteExtent { lo, hi });
                }
            }
        }

        #[test]
        fn overlap_check_is_sound((shape, strides) in layout()) {
            let offs = all_offsets(&shape, &strides);
            let distinct: HashSet<_> = offs.iter().collect();
            if !may_self_overlap(&shape, &strides) {
                prop_assert_eq!(distinct.len(), offs.len());
            }
        }

        #[test]
        fn contiguity_matches_brute_force((shape, strides) in layout()) {
            let offs = all_offsets(&shape, &strides);
            let compact: Vec<isize> = (0..offs.len() as isize).collect();
            // C order: the C-order walk visits 0, 1, 2, ...
            prop_assert_eq!(is_c_contiguous(&shape, &strides), offs == compact);
            // F order: reverse the dimensions and walk in C order.
            let rs: Vec<usize> = shape.iter().rev().copied().collect();
            let rt: Vec<isize> = strides.iter().rev().copied().collect();
            prop_assert_eq!(is_f_contiguous(&shape, &strides), all_offsets(&rs, &rt) == compact);
        }

        #[test]
        fn c_strides_are_c_contiguous(shape in prop::collection::vec(0usize..6, 0..6)) {
            let mut st = vec![0; shape.len()];
            fill_c_strides(&shape, &mut st).unwrap();
            prop_assert!(is_c_contiguous(&shape, &st));
            let offs = all_offsets(&shape, &st);
            prop_assert_eq!(offs, (0..element_count(&shape).unwrap() as isize).collect::<Vec<_>>());
        }

        #[test]
        fn offset_of_matches_walk((shape, strides) in layout()) {
            let mut walked = Vec::new();
            prop_assert!(for_each_offset(&shape, &strides, |o| walked.push(o)).is_some());
            let total = element_count(&shape).unwrap();
            for (flat, &expected) in (0..total).zip(&walked) {
                let mut idx = vec![0; shape.len()];
                let mut f = flat;
                for d in (0..shape.len()).rev() { idx[d] = f % shape[d]; f /= shape[d]; }
                prop_assert_eq!(offset_of(&shape, &strides, &idx), Some(expected));
            }
        }
    }

    #[test]
    fn overflow_is_detected() {
        assert_eq!(element_count(&[usize::MAX, 2]), None);
        assert_eq!(byte_extent(&[usize::MAX / 2, 2], &[4, 1], 8), None);
        assert_eq!(byte_extent(&[3], &[isize::MAX / 2], 8), None);
        let mut st = [0; 2];
        assert_eq!(fill_c_strides(&[usize::MAX, 2], &mut st), Some(()));
        assert_eq!(fill_c_strides(&[2, usize::MAX, 2], &mut [0; 3]), None);
        assert!(may_self_overlap(&[3, 3], &[isize::MAX, isize::MAX]));
        assert_eq!(checked_bytes(usize::MAX / 4, 8), None);
        assert_eq!(checked_bytes(isize::MAX as usize / 8 + 1, 8), None);
        assert_eq!(checked_bytes(3, 8), Some(24));
    }

    #[test]
    fn huge_strides_of_unused_dimensions_walk_without_overflow() {
        // Extent-1 dimensions with extreme strides: the walk never steps
        // along them (this overflowed in debug builds once).
        let mut seen = Vec::new();
        let r = for_each_offset(&[2, 1], &[1, isize::MAX], |o| seen.push(o));
        assert_eq!((r, seen), (Some(()), vec![0, 1]));
        let mut seen = Vec::new();
        let r = for_each_offset(&[3, 1, 1], &[-1, isize::MIN, isize::MAX], |o| seen.push(o));
        assert_eq!((r, seen), (Some(()), vec![0, -1, -2]));
        // A layout whose offsets overflow stops instead of wrapping.
        let mut seen = Vec::new();
        let r = for_each_offset(&[3], &[isize::MAX], |o| seen.push(o));
        assert_eq!((r, seen), (None, vec![0, isize::MAX]));
        assert_eq!(offset_of(&[3], &[isize::MAX], &[2]), None);
        assert_eq!(offset_of(&[2, 1], &[1, isize::MIN], &[1, 0]), Some(1));
        assert!(stride_unused(&[1, 5], 0) && !stride_unused(&[1, 5], 1));
        assert!(stride_unused(&[0, 5], 1));
        let mut st = [7; 3];
        assert_eq!(fill_c_strides_or_empty(&[0, 1 << 62, 4], &mut st), Some(()));
        assert_eq!(st, [0, 0, 0]);
        assert_eq!(fill_c_strides_or_empty(&[2, 1 << 62, 4], &mut st), None);
    }

    #[test]
    fn known_layouts() {
        // C1: x[:, ::-1] of a (3, 4) array.
        assert_eq!(
            byte_extent(&[3, 4], &[4, -1], 8),
            Some(Some(ByteExtent { lo: -24, hi: 72 }))
        );
        // C3: extent-1 dimensions ignore strides.
        assert!(is_c_contiguous(&[1, 77], &[1, 1]));
        assert!(is_c_contiguous(&[1], &[3]));
        // C4: empty arrays are contiguous under any order.
        assert!(is_c_contiguous(&[1, 8, 0, 128], &[0, 0, 0, 0]));
        assert!(is_f_contiguous(&[1, 8, 0, 128], &[0, 0, 0, 0]));
        // Broadcasts overlap; transposes do not.
        assert!(may_self_overlap(&[4, 3], &[0, 1]));
        assert!(!may_self_overlap(&[4, 3], &[1, 4]));
        assert!(!is_c_contiguous(&[2, 2], &[1, 2]));
        assert!(is_f_contiguous(&[2, 2], &[1, 2]));
    }
}
