//! Views over Rust data: `#[dlpack_fn]` bodies called from `cargo test`,
//! without Python. Nothing here starts an interpreter or takes the GIL; the
//! last check of each test is that no interpreter was started.

use dlcast_runtime::{TensorMut, TensorRef, ViewError, ViewErrorKind};
use ndarray::{s, Array2};

/// No Python interpreter exists in this process: making, reading,
/// writing and dropping the views above needed none.
fn no_python() {
    // SAFETY: `Py_IsInitialized` may be called before the interpreter
    // starts (and reads a flag only).
    assert_eq!(unsafe { pyo3::ffi::Py_IsInitialized() }, 0);
}

/// A body as a `#[dlpack_fn]` function would have it: a 3x3 box filter with
/// clamped edges, written with rank-typed accessors.
fn box3(img: &TensorRef<'_, f32, 2>, out: &mut TensorMut<'_, f32, 2>) -> Result<(), ViewError> {
    let [h, w] = img.dims();
    for y in 0..h {
        for x in 0..w {
            let mut sum = 0.0;
            for dy in [-1isize, 0, 1] {
                for dx in [-1isize, 0, 1] {
                    let yy = (y as isize + dy).clamp(0, h as isize - 1) as usize;
                    let xx = (x as isize + dx).clamp(0, w as isize - 1) as usize;
                    sum += img.get([yy, xx])?;
                }
            }
            out.set([y, x], sum / 9.0)?;
        }
    }
    Ok(())
}

#[test]
fn a_body_runs_on_slices_and_ndarrays() {
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let img = TensorRef::<f32, 2>::from_slice(&data, &[3, 4]).unwrap();
    let mut out_data = vec![0.0f32; 12];
    let mut out = TensorMut::<f32, 2>::from_slice_mut(&mut out_data, &[3, 4]).unwrap();
    box3(&img, &mut out).unwrap();
    drop(out);
    // The same filter through ndarray, as the reference.
    let a = Array2::from_shape_vec((3, 4), data.clone()).unwrap();
    let mut expected = Array2::<f32>::zeros((3, 4));
    for y in 0..3usize {
        for x in 0..4usize {
            let mut sum = 0.0;
            for yy in [y.saturating_sub(1), y, (y + 1).min(2)] {
                for xx in [x.saturating_sub(1), x, (x + 1).min(3)] {
                    sum += a[[yy, xx]];
                }
            }
            expected[[y, x]] = sum / 9.0;
        }
    }
    assert_eq!(out_data, expected.iter().copied().collect::<Vec<_>>());

    // Strided input (a transposed, flipped ndarray view) and a strided
    // output (every other column of a wider array).
    let flipped = a.slice(s![..;-1, ..]);
    let img = TensorRef::<f32, 2>::from_ndarray(flipped).unwrap();
    assert_eq!(img.strides(), &[-4, 1]);
    let mut wide = Array2::<f32>::zeros((3, 8));
    let out = TensorMut::<f32, 2>::from_ndarray_mut(wide.slice_mut(s![.., ..;2])).unwrap();
    let mut out = out;
    box3(&img, &mut out).unwrap();
    drop(out);
    let mut flipped_expected = expected.clone();
    flipped_expected.invert_axis(ndarray::Axis(0));
    assert_eq!(wide.slice(s![.., ..;2]), flipped_expected);
    assert!(wide.slice(s![.., 1..;2]).iter().all(|&v| v == 0.0));
    no_python();
}

#[test]
fn errors_name_the_method_and_what_was_asked() {
    let data = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
    let x = TensorRef::<u8, 2>::from_slice(&data, &[3, 3]).unwrap();
    assert_eq!(x.get([2, 1]).unwrap(), 8);
    let e = x.get([3, 0]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "get(): index (3, 0) is out of bounds for shape (3, 3)"
    );
    assert_eq!(
        e.kind(),
        &ViewErrorKind::Index {
            index: vec![3, 0],
            shape: vec![3, 3]
        }
    );
    assert_eq!(
        (e.function(), e.parameter(), e.method()),
        (None, None, Some("get"))
    );

    // The dynamic rank: an index of the wrong length is an error too.
    let d = TensorRef::<u8>::from_slice(&data, &[3, 3]).unwrap();
    assert_eq!(d.get(&[1, 1]).unwrap(), 5);
    let e = d.get(&[1]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "get(): index (1,) has 1 entry, the array 2 dimensions (shape (3, 3))"
    );

    // Wrong rank or length at construction.
    let e = TensorRef::<u8, 3>::from_slice(&data, &[3, 3]).unwrap_err();
    assert!(
        matches!(e.kind(), ViewErrorKind::Rank { expected: 3, .. }),
        "{e}"
    );
    let e = TensorRef::<u8, 2>::from_slice(&data, &[2, 3]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "from_slice(): shape (2, 3) holds 6 elements, the slice 9"
    );
    let e = TensorRef::<u8, 1>::from_slice(&data, &[usize::MAX]).unwrap_err();
    assert!(matches!(e.kind(), ViewErrorKind::Length { .. }), "{e}");

    // Out-of-bounds writes are errors, and write nothing.
    let mut buf = [0i64; 4];
    let mut m = TensorMut::<i64, 1>::from_slice_mut(&mut buf, &[4]).unwrap();
    assert!(m.set([4], 9).is_err());
    m.set([3], 9).unwrap();
    let mut dynamic = m.into_dyn();
    assert!(dynamic.set(&[0, 0], 1).is_err());
    assert!(dynamic.set(&[9], 1).is_err());
    dynamic.set(&[0], 1).unwrap();
    drop(dynamic);
    assert_eq!(buf, [1, 0, 0, 9]);
    no_python();
}

#[test]
fn iteration_in_c_and_memory_order() {
    let data: Vec<i32> = (0..24).collect();
    let x = TensorRef::<i32, 3>::from_slice(&data, &[2, 3, 4]).unwrap();
    assert_eq!(x.iter().unwrap().collect::<Vec<_>>(), data);
    assert_eq!(x.iter().unwrap().len(), 24);
    assert_eq!(x.iter_memory_order().unwrap().collect::<Vec<_>>(), data);

    // A permuted and flipped view: C order follows the indices, memory
    // order the addresses; both visit every element once.
    let v = TensorRef::<i32, 3>::from_slice(&data, &[2, 3, 4])
        .unwrap()
        .permute(&[2, 0, 1])
        .unwrap()
        .flip_axis(1)
        .unwrap();
    assert_eq!(v.dims(), [4, 2, 3]);
    let c: Vec<i32> = v.iter().unwrap().collect();
    let mut expected = Vec::new();
    for k in 0..4 {
        for i in (0..2).rev() {
            for j in 0..3 {
                expected.push(data[i * 12 + j * 4 + k]);
            }
        }
    }
    assert_eq!(c, expected);
    assert_eq!(c, v.to_vec().unwrap());
    assert_eq!(v.iter_memory_order().unwrap().collect::<Vec<_>>(), data);

    // ndarray agrees on a stepped, reversed slice.
    let a = ndarray::Array::from_shape_vec((4, 6), (0..24).collect::<Vec<i32>>()).unwrap();
    let sl = a.slice(s![1..;2, ..;-3]);
    let t = TensorRef::<i32, 2>::from_ndarray(sl).unwrap();
    assert_eq!(
        t.iter().unwrap().collect::<Vec<_>>(),
        sl.iter().copied().collect::<Vec<_>>()
    );
    let mut mem: Vec<i32> = t.iter_memory_order().unwrap().collect();
    assert!(mem.windows(2).all(|w| w[0] < w[1]), "{mem:?}");
    mem.sort_unstable();
    let mut all: Vec<i32> = sl.iter().copied().collect();
    all.sort_unstable();
    assert_eq!(mem, all);
    assert_eq!(t.as_array().unwrap(), sl);

    // Empty and 0-d arrays.
    let e = TensorRef::<i32, 2>::from_slice(&[], &[0, 5]).unwrap();
    assert_eq!(e.iter().unwrap().count(), 0);
    assert_eq!(e.iter_memory_order().unwrap().count(), 0);
    assert!(e.get([0, 0]).is_err());
    let z = TensorRef::<i32, 0>::from_slice(&[42], &[]).unwrap();
    assert_eq!(z.iter().unwrap().collect::<Vec<_>>(), [42]);
    assert_eq!(z.iter_memory_order().unwrap().collect::<Vec<_>>(), [42]);
    assert_eq!((z.get([]).unwrap(), z.dims()), (42, []));
    no_python();
}

#[test]
fn ranks_convert_and_writes_reach_the_data() {
    let mut buf = vec![0u16; 6];
    {
        let mut m = TensorMut::<u16>::from_slice_mut(&mut buf, &[2, 3]).unwrap();
        assert!(m.set(&[1, 2], 5).is_ok());
        let mut m2 = m.into_rank::<2>().unwrap();
        assert_eq!(m2.dims(), [2, 3]);
        m2.set([0, 1], 7).unwrap();
        assert_eq!(m2.get([0, 1]).unwrap(), 7);
        let e = m2.into_rank::<3>().unwrap_err();
        assert!(matches!(e.kind(), ViewErrorKind::Rank { expected: 3, .. }));
    }
    assert_eq!(buf, [0, 7, 0, 0, 0, 5]);
    {
        let mut m = TensorMut::<u16, 2>::from_slice_mut(&mut buf, &[2, 3])
            .unwrap()
            .t();
        m.copy_from_slice(&[1, 2, 3, 4, 5, 6]).unwrap();
        assert!(m.copy_from_slice(&[1]).is_err());
        m.as_array_mut().unwrap()[[0, 0]] = 10;
    }
    // Written in the transpose's C order: buf[j * 3 + i] = (i, j).
    assert_eq!(buf, [10, 3, 5, 2, 4, 6]);
    {
        let mut m = TensorMut::<u16, 1>::from_slice_mut(&mut buf, &[6]).unwrap();
        m.fill(1).unwrap();
        let r = m.reshape(&[3, 2]).unwrap().into_rank::<2>().unwrap();
        assert_eq!(r.dims(), [3, 2]);
        assert_eq!(r.as_slice(), Some(&[1u16; 6][..]));
    }
    // A view of Rust data is read-only when made from `&[T]`.
    let x = TensorRef::<u16, 1>::from_slice(&buf, &[6]).unwrap();
    assert!(x.is_read_only());
    assert_eq!(x.import_path().name(), "rust");
    let e: ViewError = ViewErrorKind::NotContiguous.into();
    assert_eq!(e.to_string(), "the array is not C-contiguous");
    no_python();
}

/// One argument, many views: `view()` and `index_axis()` borrow the view
/// (its transforms leave it as it was), so a batch splits into its items.
#[test]
fn one_view_gives_many_views_of_the_same_argument() {
    let data: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let batch = TensorRef::<f32, 2>::from_slice(&data, &[3, 2]).unwrap();
    let items: Vec<TensorRef<'_, f32, 1>> = (0..3)
        .map(|i| batch.index_axis(0, i)?.into_rank::<1>())
        .collect::<Result<_, _>>()
        .unwrap();
    let rows: Vec<Vec<f32>> = items.iter().map(|r| r.to_vec().unwrap()).collect();
    assert_eq!(rows, [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]);
    // Same memory, no copy: item i starts i rows in.
    for (i, item) in items.iter().enumerate() {
        assert_eq!(item.data_ptr(), batch.data_ptr().wrapping_add(2 * i));
    }
    // A transform of a view leaves the original as it was.
    let t = batch.view().t();
    assert_eq!((t.dims(), batch.dims()), ([2, 3], [3, 2]));
    let col = batch.index_axis(1, 1).unwrap();
    assert_eq!(
        (col.shape(), col.to_vec().unwrap()),
        (&[3][..], vec![1.0, 3.0, 5.0])
    );
    // A 1-d view gives 0-d items.
    let first = items[0].index_axis(0, 1).unwrap();
    assert_eq!((first.ndim(), first.get(&[]).unwrap()), (0, 1.0));
    // Out of range: errors naming the method, never panics.
    let e = batch.index_axis(0, 3).unwrap_err();
    assert!(
        matches!(e.kind(), ViewErrorKind::Range { extent: 3, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("index_axis"), "{e}");
    let e = batch.index_axis(2, 0).unwrap_err();
    assert!(matches!(e.kind(), ViewErrorKind::Axes { .. }), "{e}");
    assert!(batch.index_axis(0, usize::MAX).is_err());
    no_python();
}

/// `reborrow()` and `index_axis_mut()` give shorter-lived writable views;
/// the original is usable again afterwards.
#[test]
fn a_writable_view_lends_shorter_writable_views() {
    let mut data = [0i32; 6];
    let mut out = TensorMut::<i32, 2>::from_slice_mut(&mut data, &[3, 2]).unwrap();
    for i in 0..3 {
        out.index_axis_mut(0, i)
            .unwrap()
            .fill(10 * i as i32)
            .unwrap();
    }
    {
        let mut col = out.reborrow().into_dyn().slice_axis(1, 1..2).unwrap();
        col.set(&[2, 0], -1).unwrap();
    }
    out.set([0, 0], 7).unwrap();
    assert!(out.index_axis_mut(1, 2).is_err());
    drop(out);
    assert_eq!(data, [7, 0, 10, 10, 20, -1]);
    no_python();
}

/// `sliding_windows` frames an axis without a copy, as PyTorch's
/// `unfold(axis, window, step)`: window `c` holds elements `c * step ..
/// c * step + window` of the axis; the result is read-only.
#[test]
fn sliding_windows_frame_an_axis_without_a_copy() {
    let signal: Vec<i32> = (0..10).collect();
    let x = TensorRef::<i32, 1>::from_slice(&signal, &[10]).unwrap();
    for (window, step) in [(1, 1), (3, 1), (3, 2), (4, 3), (10, 1), (2, 100)] {
        let frames = x
            .view()
            .sliding_windows(0, window, step)
            .unwrap()
            .into_rank::<2>()
            .unwrap();
        let count = (10 - window) / step + 1;
        assert_eq!(frames.dims(), [count, window]);
        assert_eq!(frames.data_ptr(), x.data_ptr());
        assert!(frames.is_read_only());
        let want: Vec<i32> = (0..count)
            .flat_map(|c| (c * step..c * step + window).map(|i| i as i32))
            .collect();
        assert_eq!(
            frames.to_vec().unwrap(),
            want,
            "window {window} step {step}"
        );
        assert_eq!(frames.iter().unwrap().collect::<Vec<_>>(), want);
        // ndarray reads the overlapping layout (read-only views may alias).
        let a = frames.as_array().unwrap();
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), want);
    }

    // Along axis 1 of a 2-d array, and of a flipped (negative-stride) one.
    let data: Vec<u8> = (0..12).collect();
    let img = TensorRef::<u8, 2>::from_slice(&data, &[3, 4]).unwrap();
    let rows = img.view().sliding_windows(1, 2, 2).unwrap();
    assert_eq!(
        (rows.shape(), rows.strides()),
        (&[3, 2, 2][..], &[4, 2, 1][..])
    );
    assert_eq!(rows.get(&[2, 1, 1]).unwrap(), 11);
    let flipped = img
        .view()
        .flip_axis(1)
        .unwrap()
        .sliding_windows(1, 3, 1)
        .unwrap();
    assert_eq!(flipped.shape(), [3, 2, 3]);
    assert_eq!(flipped.to_vec().unwrap()[..6], [3, 2, 1, 2, 1, 0]);
    // Along axis 0: windows of rows.
    let blocks = img.view().sliding_windows(0, 2, 1).unwrap();
    assert_eq!(
        (blocks.shape(), blocks.strides()),
        (&[2, 4, 2][..], &[4, 1, 4][..])
    );
    assert_eq!(blocks.get(&[1, 3, 1]).unwrap(), 11);
    // Windows that tile the axis (`step == window`) are the same elements
    // in C order, a slice; overlapping ones are no slice.
    assert_eq!(rows.as_slice(), Some(&data[..]));
    assert!(img
        .view()
        .sliding_windows(1, 3, 1)
        .unwrap()
        .as_slice()
        .is_none());
    no_python();
}

#[test]
fn sliding_windows_that_do_not_fit_are_errors_not_panics() {
    let data = [0.0f64; 5];
    let x = TensorRef::<f64, 1>::from_slice(&data, &[5]).unwrap();
    for (axis, window, step) in [
        (0, 0, 1),
        (0, 1, 0),
        (0, 6, 1),
        (0, usize::MAX, 1),
        (0, usize::MAX, usize::MAX),
        (1, 1, 1),
        (usize::MAX, 1, 1),
    ] {
        let e = x.view().sliding_windows(axis, window, step).unwrap_err();
        assert_eq!(e.method(), Some("sliding_windows"));
        assert!(
            matches!(
                e.kind(),
                ViewErrorKind::Window { .. } | ViewErrorKind::Axes { .. }
            ),
            "{e}"
        );
    }
    let e = x.view().sliding_windows(0, 6, 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "sliding_windows(): cannot take windows of 6 elements every 1 along axis 0 \
         (extent 5): the window is longer than the axis"
    );
    // A step far past the end leaves one window.
    let one = x.view().sliding_windows(0, 5, usize::MAX).unwrap();
    assert_eq!(one.shape(), [1, 5]);
    no_python();
}
