//! How fast element access through views is, against slices: a 5x5
//! convolution of a 512x512 `f32` image (the shape of the speed issue),
//! written four ways. Run with
//! `cargo run --release -p dlcast-runtime --example access_speed`; it prints
//! milliseconds per convolution (the median of 15 runs) and the ratio to
//! plain slice indexing.

use dlcast_runtime::{TensorMut, TensorRef, ViewError};
use std::hint::black_box;
use std::time::Instant;

const K: usize = 5;
const H: usize = 512;
const W: usize = 512;

/// Plain slice indexing (panics out of bounds); the extents `h`, `w` are
/// run-time values, as in a body.
#[inline(never)]
fn slices(src: &[f32], h: usize, w: usize, k: &[f32; K * K], dst: &mut [f32]) {
    let ow = w - K + 1;
    for y in 0..h - K + 1 {
        for x in 0..ow {
            let mut acc = 0.0;
            for dy in 0..K {
                for dx in 0..K {
                    acc += src[(y + dy) * w + x + dx] * k[dy * K + dx];
                }
            }
            dst[y * ow + x] = acc;
        }
    }
}

/// Slices without panics: `get(..)` and an error out of bounds.
#[inline(never)]
fn slices_checked(
    src: &[f32],
    h: usize,
    w: usize,
    k: &[f32; K * K],
    dst: &mut [f32],
) -> Result<(), String> {
    let ow = w - K + 1;
    let oob = |i: usize| format!("index {i} out of bounds");
    for y in 0..h - K + 1 {
        for x in 0..ow {
            let mut acc = 0.0;
            for dy in 0..K {
                for dx in 0..K {
                    let i = (y + dy) * w + x + dx;
                    acc += src.get(i).ok_or_else(|| oob(i))? * k[dy * K + dx];
                }
            }
            *dst.get_mut(y * ow + x).ok_or_else(|| oob(y * ow + x))? = acc;
        }
    }
    Ok(())
}

/// Rank-typed views: `get([i, j])`, `set([i, j], v)`.
#[inline(never)]
fn ranked(
    src: &TensorRef<'_, f32, 2>,
    k: &[f32; K * K],
    dst: &mut TensorMut<'_, f32, 2>,
) -> Result<(), ViewError> {
    let [h, w] = src.dims();
    for y in 0..h - K + 1 {
        for x in 0..w - K + 1 {
            let mut acc = 0.0;
            for dy in 0..K {
                for dx in 0..K {
                    acc += src.get([y + dy, x + dx])? * k[dy * K + dx];
                }
            }
            dst.set([y, x], acc)?;
        }
    }
    Ok(())
}

/// Dynamic-rank views: `get(&[i, j])`, `set(&[i, j], v)`.
#[inline(never)]
fn dynamic(
    src: &TensorRef<'_, f32>,
    k: &[f32; K * K],
    dst: &mut TensorMut<'_, f32>,
) -> Result<(), ViewError> {
    let (h, w) = (src.shape()[0], src.shape()[1]);
    for y in 0..h - K + 1 {
        for x in 0..w - K + 1 {
            let mut acc = 0.0;
            for dy in 0..K {
                for dx in 0..K {
                    acc += src.get(&[y + dy, x + dx])? * k[dy * K + dx];
                }
            }
            dst.set(&[y, x], acc)?;
        }
    }
    Ok(())
}

/// Median milliseconds of 15 runs of `f`.
fn time(mut f: impl FnMut()) -> f64 {
    let mut runs: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let src: Vec<f32> = (0..H * W).map(|i| (i % 97) as f32).collect();
    let k = [0.04f32; K * K];
    let (oh, ow) = (H - K + 1, W - K + 1);
    let mut want = vec![0.0f32; oh * ow];
    let mut got = vec![0.0f32; oh * ow];
    let (h, w) = (black_box(H), black_box(W));
    let base = time(|| slices(black_box(&src), h, w, &k, &mut want));
    let report = |name: &str, ms: f64, got: &mut [f32]| {
        assert_eq!(*got, want[..], "{name} computed something else");
        got.fill(0.0);
        println!("{name:<32} {ms:7.3} ms  {:5.2}x", ms / base);
    };
    println!("{:<32} {base:7.3} ms  {:5.2}x", "slices (indexing)", 1.0);
    let ms = time(|| slices_checked(black_box(&src), h, w, &k, &mut got).unwrap());
    report("slices (get()?, no panic)", ms, &mut got);
    let s = TensorRef::<f32, 2>::from_slice(&src, &[H, W])?;
    let ms = time(|| {
        let mut d = TensorMut::<f32, 2>::from_slice_mut(&mut got, &[oh, ow]).unwrap();
        ranked(black_box(&s), &k, &mut d).unwrap();
    });
    report("TensorRef<f32, 2>::get([i, j])", ms, &mut got);
    let s = s.into_dyn();
    let ms = time(|| {
        let mut d = TensorMut::<f32>::from_slice_mut(&mut got, &[oh, ow]).unwrap();
        dynamic(black_box(&s), &k, &mut d).unwrap();
    });
    report("TensorRef<f32>::get(&[i, j])", ms, &mut got);
    Ok(())
}
