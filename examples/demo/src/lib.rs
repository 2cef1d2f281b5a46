//! dlcast demo: small image filters that take their input and output arrays
//! from any DLPack producer (NumPy, PyTorch, JAX, ...).
//!
//! Every filter reads an `ndarray` view and writes into a caller-allocated
//! mutable one. `#[dlpack_fn]` checks dtypes, ranks (from the view types),
//! shapes (the named extents `h` and `w` must agree between input and
//! output), device and memory order before the body runs, and guarantees
//! what the views need (memory the CPU reads, aligned, native byte order),
//! so the bodies only deal with pixels, through any strides: flipped or
//! transposed views work as they are. Where a filter asks for
//! `#[order(c)]`, dlcast hands it a C-order copy made by the input's
//! framework, or, under `#[noconvert]`, refuses the view.
//!
//! All arithmetic is exact integer arithmetic (plus one `f32` square root),
//! so results are bit-identical whichever framework supplied the arrays.

use dlcast_runtime::ndarray::{
    Array3, ArrayView2, ArrayView3, ArrayViewMut2, ArrayViewMut3, Axis, Zip,
};
use dlcast_runtime::prelude::*;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Largest `box_blur` radius accepted: enough for any visible effect, and
/// the window sums stay below `255 * 2049² < 2³²`, so they fit in a `u32`.
const MAX_RADIUS: usize = 1024;

/// Luma of an RGB pixel with the ITU-R BT.601 weights
/// (0.299, 0.587, 0.114), in 8-bit fixed point with rounding.
fn luma(r: u8, g: u8, b: u8) -> u8 {
    let y = 77 * u32::from(r) + 150 * u32::from(g) + 29 * u32::from(b);
    // The weights sum to 256, so `(y + 128) >> 8` is at most 255.
    ((y + 128) >> 8) as u8
}

/// Converts an RGB image `(h, w, 3)` to grayscale `(h, w)` with the BT.601
/// luma weights. Any memory layout is accepted.
#[dlpack_fn]
#[pyfunction]
fn grayscale(
    #[shape(h, w, 3)] img: ArrayView3<'_, u8>,
    #[shape(h, w)] mut out: ArrayViewMut2<'_, u8>,
) {
    Zip::from(&mut out)
        .and(img.lanes(Axis(2)))
        .for_each(|y, rgb| *y = luma(rgb[0], rgb[1], rgb[2]));
}

/// Index `i` clamped into `0..n` (`n > 0`): samples beyond the ends of a
/// line repeat the edge sample.
fn clamp_index(i: isize, n: usize) -> usize {
    i.clamp(0, n as isize - 1) as usize
}

/// Box blur of an RGB image `(h, w, 3)` into `out` (same shape): every
/// output pixel is the rounded mean of the `(2 * radius + 1)²` pixels around
/// it, edges clamped. Two separable passes of running sums, so the cost does
/// not depend on `radius`.
///
/// The input must be C-contiguous (`#[order(c)]`), and `#[noconvert]`
/// makes dlcast refuse other layouts with a `TypeError` instead of copying
/// them into C order (what `blurred` below accepts).
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (img, out, radius = 4))]
fn box_blur(
    #[shape(h, w, 3)]
    #[order(c)]
    #[noconvert]
    img: ArrayView3<'_, u8>,
    #[shape(h, w, 3)] out: ArrayViewMut3<'_, u8>,
    radius: usize,
) -> PyResult<()> {
    if radius > MAX_RADIUS {
        return Err(PyValueError::new_err(format!(
            "box_blur(): radius {radius} is larger than {MAX_RADIUS}"
        )));
    }
    blur(img, radius, out);
    Ok(())
}

/// The same blur, returning a new image in the caller's framework: a NumPy
/// array for NumPy input, a `torch.Tensor` for PyTorch input, a JAX array
/// for JAX input (`returns = like(img)`), made without a copy from the Rust
/// buffer.
#[dlpack_fn(returns = like(img))]
#[pyfunction]
#[pyo3(signature = (img, radius = 4))]
fn blurred(#[shape(h, w, 3)] img: ArrayView3<'_, u8>, radius: usize) -> PyResult<Tensor<u8>> {
    if radius > MAX_RADIUS {
        return Err(PyValueError::new_err(format!(
            "blurred(): radius {radius} is larger than {MAX_RADIUS}"
        )));
    }
    let mut out = Array3::<u8>::zeros(img.raw_dim());
    blur(img, radius, out.view_mut());
    Ok(Tensor::from(out))
}

/// Box blur of the `(h, w, 3)` pixels `src` into `dst` (same shape, any
/// strides): two passes of running sums, so the cost does not depend on
/// `radius`.
fn blur(src: ArrayView3<'_, u8>, radius: usize, mut dst: ArrayViewMut3<'_, u8>) {
    let (h, w, _) = src.dim();
    if h == 0 || w == 0 {
        return;
    }
    let r = radius as isize;

    // Horizontal pass: `rows[[y, x, c]]` is the sum of the `2r + 1` samples
    // of channel `c` around `x` in row `y`, one running sum per channel.
    let mut rows = Array3::<u32>::zeros((h, w, 3));
    for (line, mut sums) in src.outer_iter().zip(rows.outer_iter_mut()) {
        let at = |x: isize, c: usize| u32::from(line[[clamp_index(x, w), c]]);
        for c in 0..3 {
            let mut sum: u32 = (-r..=r).map(|x| at(x, c)).sum();
            for x in 0..w as isize {
                sums[[x as usize, c]] = sum;
                // Slide the window from [x - r, x + r] to [x + 1 - r, x + 1 + r].
                sum = sum + at(x + r + 1, c) - at(x - r, c);
            }
        }
    }

    // Vertical pass: `acc` holds, for every column and channel, the sum of
    // the `2r + 1` row sums around row `y`, i.e. the full window sum.
    let row = |y: isize| rows.index_axis(Axis(0), clamp_index(y, h));
    let area = ((2 * radius + 1) * (2 * radius + 1)) as u32;
    let mut acc = ndarray_zeros_like(&rows);
    for y in -r..=r {
        acc += &row(y);
    }
    for (y, mut dst_row) in (0..h as isize).zip(dst.outer_iter_mut()) {
        // Rounded mean, at most 255 since `a <= 255 * area`.
        Zip::from(&mut dst_row)
            .and(&acc)
            .for_each(|d, &a| *d = ((a + area / 2) / area) as u8);
        Zip::from(&mut acc)
            .and(&row(y + r + 1))
            .and(&row(y - r))
            .for_each(|a, &e, &l| *a = *a + e - l);
    }
}

/// A zero `(w, 3)` accumulator for one row of `rows`.
fn ndarray_zeros_like(rows: &Array3<u32>) -> dlcast_runtime::ndarray::Array2<u32> {
    let (_, w, c) = rows.dim();
    dlcast_runtime::ndarray::Array2::zeros((w, c))
}

/// Gradient magnitude `sqrt(gx² + gy²)` of a grayscale image `(h, w)` with
/// the 3×3 Sobel operator, edges clamped, into an `f32` image `(h, w)`.
/// Flat regions give 0; the largest possible value is `1020 * sqrt(2)`.
#[dlpack_fn]
#[pyfunction]
fn edge_magnitude(
    #[shape(h, w)] gray: ArrayView2<'_, u8>,
    #[shape(h, w)] mut out: ArrayViewMut2<'_, f32>,
) {
    let (h, w) = gray.dim();
    let px = |y: usize, x: usize| i32::from(gray[[y, x]]);
    for ((y, x), d) in out.indexed_iter_mut() {
        let (up, down) = (y.saturating_sub(1), (y + 1).min(h - 1));
        let (left, right) = (x.saturating_sub(1), (x + 1).min(w - 1));
        let gx = (px(up, right) + 2 * px(y, right) + px(down, right))
            - (px(up, left) + 2 * px(y, left) + px(down, left));
        let gy = (px(down, left) + 2 * px(down, x) + px(down, right))
            - (px(up, left) + 2 * px(up, x) + px(up, right));
        // |gx|, |gy| <= 1020, so the sum of squares is exact in f32.
        *d = ((gx * gx + gy * gy) as f32).sqrt();
    }
}

#[pymodule(gil_used = true)]
fn dlcast_demo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(grayscale, m)?)?;
    m.add_function(wrap_pyfunction!(box_blur, m)?)?;
    m.add_function(wrap_pyfunction!(blurred, m)?)?;
    m.add_function(wrap_pyfunction!(edge_magnitude, m)?)?;
    Ok(())
}
