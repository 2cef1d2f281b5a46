//! dlcast demo: small image filters that take their input and output arrays
//! from any DLPack producer (NumPy, PyTorch, JAX, ...).
//!
//! Every filter reads a `TensorRef` and writes into a caller-allocated
//! `TensorMut`. `#[dlpack_fn]` checks dtypes, shapes (the named extents `h`
//! and `w` must agree between input and output), device and memory order
//! before the body runs, so the bodies only deal with pixels.
//!
//! `grayscale` and `edge_magnitude` read and write pixels with the
//! rank-typed accessors (`TensorRef<'_, u8, 3>`: `get([y, x, c])`,
//! `set([y, x], v)`), which work on any strides, flipped or transposed
//! views included; an index out of bounds would be an `IndexError` naming
//! the function and the parameter, never a panic. The blurs run on plain
//! slices: where a filter asks for `#[order(c)]`, dlcast hands it a C-order
//! copy made by the input's framework, or, under `#[noconvert]`, refuses
//! the view.
//!
//! All arithmetic is exact integer arithmetic (plus one `f32` square root),
//! so results are bit-identical whichever framework supplied the arrays.

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
    #[shape(h, w, 3)] img: TensorRef<'_, u8, 3>,
    #[shape(h, w)] mut out: TensorMut<'_, u8, 2>,
) -> PyResult<()> {
    let [h, w] = out.dims();
    if out.is_empty() {
        // No pixels (and no loop over a huge extent beside a zero one).
        return Ok(());
    }
    for y in 0..h {
        for x in 0..w {
            let rgb = |c| img.get([y, x, c]);
            out.set([y, x], luma(rgb(0)?, rgb(1)?, rgb(2)?))?;
        }
    }
    Ok(())
}

/// The C-order pixels of an `#[order(c)]` image: its slice (always there
/// for host `u8` data), else a copy.
fn c_order<'t>(img: &'t TensorRef<'_, u8>, copy: &'t mut Vec<u8>) -> PyResult<&'t [u8]> {
    Ok(match img.as_slice() {
        Some(s) => s,
        None => {
            *copy = img.to_vec()?;
            copy
        }
    })
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
    img: TensorRef<'_, u8>,
    #[shape(h, w, 3)] mut out: TensorMut<'_, u8>,
    radius: usize,
) -> PyResult<()> {
    if radius > MAX_RADIUS {
        return Err(PyValueError::new_err(format!(
            "box_blur(): radius {radius} is larger than {MAX_RADIUS}"
        )));
    }
    let (h, w) = (img.shape()[0], img.shape()[1]);
    if h == 0 || w == 0 {
        return Ok(());
    }
    let mut copy = Vec::new();
    let src = c_order(&img, &mut copy)?;
    match out.as_slice_mut() {
        Some(dst) => blur(src, h, w, radius, dst),
        None => {
            // A strided output: blur into C order, then write it back.
            let mut dst = vec![0u8; src.len()];
            blur(src, h, w, radius, &mut dst);
            out.copy_from_slice(&dst)?;
        }
    }
    Ok(())
}

/// The same blur, returning a new image in the caller's framework: a NumPy
/// array for NumPy input, a `torch.Tensor` for PyTorch input, a JAX array
/// for JAX input (`returns = like(img)`), made without a copy from the Rust
/// buffer.
#[dlpack_fn(returns = like(img))]
#[pyfunction]
#[pyo3(signature = (img, radius = 4))]
fn blurred(
    #[shape(h, w, 3)]
    #[order(c)]
    img: TensorRef<'_, u8>,
    radius: usize,
) -> PyResult<Tensor<u8>> {
    if radius > MAX_RADIUS {
        return Err(PyValueError::new_err(format!(
            "blurred(): radius {radius} is larger than {MAX_RADIUS}"
        )));
    }
    let (h, w) = (img.shape()[0], img.shape()[1]);
    let mut out = Tensor::<u8>::zeros(&[h, w, 3])?;
    if h > 0 && w > 0 {
        let mut copy = Vec::new();
        let src = c_order(&img, &mut copy)?;
        let dst = out
            .as_slice_mut()
            .expect("zeros() is C-contiguous and aligned");
        blur(src, h, w, radius, dst);
    }
    Ok(out)
}

/// Box blur of the C-order `(h, w, 3)` pixels `src` into `dst` (same size):
/// two passes of running sums, so the cost does not depend on `radius`.
fn blur(src: &[u8], h: usize, w: usize, radius: usize, dst: &mut [u8]) {
    let r = radius as isize;
    let row_len = w * 3;

    // Horizontal pass: `rows[y][x][c]` is the sum of the `2r + 1` samples of
    // channel `c` around `x` in row `y`, one running sum per channel.
    let mut rows = vec![0u32; src.len()];
    for (line, sums) in src
        .chunks_exact(row_len)
        .zip(rows.chunks_exact_mut(row_len))
    {
        let at = |x: isize, c: usize| u32::from(line[clamp_index(x, w) * 3 + c]);
        for c in 0..3 {
            let mut sum: u32 = (-r..=r).map(|x| at(x, c)).sum();
            for x in 0..w as isize {
                sums[x as usize * 3 + c] = sum;
                // Slide the window from [x - r, x + r] to [x + 1 - r, x + 1 + r].
                sum = sum + at(x + r + 1, c) - at(x - r, c);
            }
        }
    }

    // Vertical pass: `acc` holds, for every column and channel, the sum of
    // the `2r + 1` row sums around row `y`, i.e. the full window sum.
    let row = |y: isize| &rows[clamp_index(y, h) * row_len..][..row_len];
    let area = ((2 * radius + 1) * (2 * radius + 1)) as u32;
    {
        let mut acc = vec![0u32; row_len];
        for y in -r..=r {
            acc.iter_mut().zip(row(y)).for_each(|(a, s)| *a += s);
        }
        for (y, dst_row) in (0..h as isize).zip(dst.chunks_exact_mut(row_len)) {
            for (d, &a) in dst_row.iter_mut().zip(&acc) {
                // Rounded mean, at most 255 since `a <= 255 * area`.
                *d = ((a + area / 2) / area) as u8;
            }
            let (enter, leave) = (row(y + r + 1), row(y - r));
            for ((a, e), l) in acc.iter_mut().zip(enter).zip(leave) {
                *a = *a + e - l;
            }
        }
    }
}

/// Gradient magnitude `sqrt(gx² + gy²)` of a grayscale image `(h, w)` with
/// the 3×3 Sobel operator, edges clamped, into an `f32` image `(h, w)`.
/// Flat regions give 0; the largest possible value is `1020 * sqrt(2)`.
#[dlpack_fn]
#[pyfunction]
fn edge_magnitude(
    #[shape(h, w)] gray: TensorRef<'_, u8, 2>,
    #[shape(h, w)] mut out: TensorMut<'_, f32, 2>,
) -> PyResult<()> {
    let [h, w] = gray.dims();
    if gray.is_empty() {
        return Ok(());
    }
    for y in 0..h {
        let (up, down) = (y.saturating_sub(1), (y + 1).min(h - 1));
        for x in 0..w {
            let (left, right) = (x.saturating_sub(1), (x + 1).min(w - 1));
            let px = |y: usize, x: usize| gray.get([y, x]).map(i32::from);
            let gx = (px(up, right)? + 2 * px(y, right)? + px(down, right)?)
                - (px(up, left)? + 2 * px(y, left)? + px(down, left)?);
            let gy = (px(down, left)? + 2 * px(down, x)? + px(down, right)?)
                - (px(up, left)? + 2 * px(up, x)? + px(up, right)?);
            // |gx|, |gy| <= 1020, so the sum of squares is exact in f32.
            out.set([y, x], ((gx * gx + gy * gy) as f32).sqrt())?;
        }
    }
    Ok(())
}

#[pymodule]
fn dlcast_demo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(grayscale, m)?)?;
    m.add_function(wrap_pyfunction!(box_blur, m)?)?;
    m.add_function(wrap_pyfunction!(blurred, m)?)?;
    m.add_function(wrap_pyfunction!(edge_magnitude, m)?)?;
    Ok(())
}
