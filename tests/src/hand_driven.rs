//! Rust's own view types (`&[T]`, `&mut [T]`, `ndarray` views) as
//! parameters, used the way a careless or hostile extension author would,
//! and the call context of `dlcast_runtime::__private` driven by hand; called
//! from tests/python/test_native_views.py, test_releases.py, test_aliasing.py
//! and test_registry.py.

use dlcast_runtime::__private::{CallContext, DeviceSpec, FnSpec, Order, ParamSpec};
use dlcast_runtime::prelude::*;
use half::f16;
use ndarray::{ArrayView0, ArrayView1, ArrayView2, ArrayViewD, ArrayViewMut1, ArrayViewMutD};
use num_complex::Complex;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

// ---------------------------------------------------------------------------
// Two arguments, one writable: the registry must refuse shared memory.

/// Writes 1.0 into `a`, then returns the sum of `b`.
#[dlpack_fn]
#[pyfunction]
fn mut_and_ref(a: &mut [f64], b: &[f64]) -> f64 {
    a.fill(1.0);
    b.iter().sum()
}

/// Returns the sum of `a`, then writes 1.0 into `b`.
#[dlpack_fn]
#[pyfunction]
fn ref_and_mut(a: &[f64], b: &mut [f64]) -> f64 {
    let s = a.iter().sum();
    b.fill(1.0);
    s
}

/// Two writable `ndarray` views of different element types.
#[dlpack_fn]
#[pyfunction]
fn nd_mut_pair(mut a: ArrayViewMut1<'_, f64>, mut b: ArrayViewMut1<'_, f32>) {
    a.fill(1.0);
    b.fill(2.0);
}

/// Two writable byte slices.
#[dlpack_fn]
#[pyfunction]
fn u8_mut_pair(a: &mut [u8], b: &mut [u8]) {
    a.fill(1);
    b.fill(2);
}

/// Optional writable and read-only slices.
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (a=None, b=None))]
fn opt_mut_and_ref(a: Option<&mut [f64]>, b: Option<&[f64]>) -> f64 {
    if let Some(a) = a {
        a.fill(1.0);
    }
    b.map(|b| b.iter().sum()).unwrap_or(f64::NAN)
}

/// A writable `ndarray` view of any rank and a read-only slice.
#[dlpack_fn]
#[pyfunction]
fn ndd_mut_and_slice(mut a: ArrayViewMutD<'_, f64>, b: &[f64]) -> f64 {
    a.fill(1.0);
    b.iter().sum()
}

/// Writes 1.0 into `a` and returns how many of `mask` are set: a refused
/// `mask` must leave `a` (and a PyTorch tensor's version counter) as it was.
#[dlpack_fn]
#[pyfunction]
fn mut_and_bool(a: &mut [f32], mask: &[bool]) -> usize {
    a.fill(1.0);
    mask.iter().filter(|b| **b).count()
}

/// Two read-only slices: the sums.
#[dlpack_fn]
#[pyfunction]
fn ref_ref(a: &[f64], b: &[f64]) -> (f64, f64) {
    (a.iter().sum(), b.iter().sum())
}

// ---------------------------------------------------------------------------
// Python code (a callback) while a body holds a view.

/// `(sum before, sum after)` a callback, through one `&[f64]`.
#[dlpack_fn]
#[pyfunction]
fn slice_cb(x: &[f64], cb: &Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
    let before = x.iter().sum();
    cb.call0()?;
    Ok((before, x.iter().sum()))
}

/// Holds a writable view of any dtype (`TensorDynMut`) while calling the
/// callback; returns its element count.
#[dlpack_fn]
#[pyfunction]
fn dyn_mut_cb(x: TensorDynMut<'_>, cb: &Bound<'_, PyAny>) -> PyResult<usize> {
    cb.call0()?;
    Ok(x.len())
}

/// Fills `x` with 1.0, calls the callback, returns the sum.
#[dlpack_fn]
#[pyfunction]
fn mut_slice_cb(x: &mut [f64], cb: &Bound<'_, PyAny>) -> PyResult<f64> {
    x.fill(1.0);
    cb.call0()?;
    Ok(x.iter().sum())
}

/// As `slice_cb` through a 2-D `ndarray` view.
#[dlpack_fn]
#[pyfunction]
fn nd_cb(x: ArrayView2<'_, f64>, cb: &Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
    let before = x.sum();
    cb.call0()?;
    Ok((before, x.sum()))
}

/// As `mut_slice_cb` through a 1-D writable `ndarray` view.
#[dlpack_fn]
#[pyfunction]
fn nd_mut_cb(mut x: ArrayViewMut1<'_, f64>, cb: &Bound<'_, PyAny>) -> PyResult<f64> {
    x.fill(1.0);
    cb.call0()?;
    Ok(x.sum())
}

// ---------------------------------------------------------------------------
// `bool` in every view type: only 0 and 1 are valid bytes.

/// The value of a 0-d `bool` array.
#[dlpack_fn]
#[pyfunction]
fn bool_nd0(x: ArrayView0<'_, bool>) -> bool {
    x[()]
}

/// How many `true` in a `bool` array of any rank.
#[dlpack_fn]
#[pyfunction]
fn bool_ndd(x: ArrayViewD<'_, bool>) -> usize {
    x.iter().filter(|b| **b).count()
}

/// Negates a writable `bool` view; returns the `true` count before.
#[dlpack_fn]
#[pyfunction]
fn bool_nd_mut(mut x: ArrayViewMut1<'_, bool>) -> usize {
    let n = x.iter().filter(|b| **b).count();
    x.mapv_inplace(|b| !b);
    n
}

/// Negates a writable `bool` slice; returns the `true` count before.
#[dlpack_fn]
#[pyfunction]
fn bool_slice_mut(x: &mut [bool]) -> usize {
    let n = x.iter().filter(|b| **b).count();
    x.iter_mut().for_each(|b| *b = !*b);
    n
}

/// `Option<&[bool]>`: the `true` count, or `None`.
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (x=None))]
fn bool_opt(x: Option<&[bool]>) -> Option<usize> {
    x.map(|s| s.iter().filter(|b| **b).count())
}

// ---------------------------------------------------------------------------
// What the body sees: addresses, values of other element types.

/// Address and length of the slice the body gets.
#[dlpack_fn]
#[pyfunction]
fn slice_addr(x: &[f64]) -> (usize, usize) {
    (x.as_ptr() as usize, x.len())
}

/// The elements of a 1-D `ndarray` view, in index order.
#[dlpack_fn]
#[pyfunction]
fn nd1_values(x: ArrayView1<'_, f64>) -> Vec<f64> {
    x.to_vec()
}

/// The elements of a `ArrayViewD<f64>`, in C order.
#[dlpack_fn]
#[pyfunction]
fn ndd_values(x: ArrayViewD<'_, f64>) -> Vec<f64> {
    x.iter().copied().collect()
}

/// The elements of a slice.
#[dlpack_fn]
#[pyfunction]
fn slice_values(x: &[f64]) -> Vec<f64> {
    x.to_vec()
}

/// The bytes of a `&[u8]`.
#[dlpack_fn]
#[pyfunction]
fn u8_values(x: &[u8]) -> Vec<u8> {
    x.to_vec()
}

/// The elements of a `&[i64]`.
#[dlpack_fn]
#[pyfunction]
fn i64_values(x: &[i64]) -> Vec<i64> {
    x.to_vec()
}

/// `(real, imaginary)` parts of a complex slice.
#[dlpack_fn]
#[pyfunction]
fn c128_values(x: &[Complex<f64>]) -> Vec<(f64, f64)> {
    x.iter().map(|c| (c.re, c.im)).collect()
}

/// The elements of a half-precision slice, as `f32`.
#[dlpack_fn]
#[pyfunction]
fn f16_values(x: &[f16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// Writes `i` into element `i` of a writable view of any rank (C order), and
/// returns how many elements it wrote: two indices reaching one element
/// would show as a value that is not its index.
#[dlpack_fn]
#[pyfunction]
fn ndd_mut_iota(mut x: ArrayViewMutD<'_, f64>) -> usize {
    let mut n = 0;
    for v in x.iter_mut() {
        *v = n as f64;
        n += 1;
    }
    n
}

/// A dtype-generic writable slice: writes the default value.
#[dlpack_fn]
#[pyfunction]
fn generic_mut_zero<T: Copy + Default>(#[dtype(f32, f64, i32)] x: &mut [T]) -> usize {
    x.fill(T::default());
    x.len()
}

/// Three slices: `c = a + b`.
#[dlpack_fn]
#[pyfunction]
fn native_add_into(#[shape(n)] a: &[f64], #[shape(n)] b: &[f64], #[shape(n)] c: &mut [f64]) {
    for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
        *c = a + b;
    }
}

/// Calls the Rust body of `native_add_into` (`native_add_into_rs`) on Rust data.
#[pyfunction]
fn native_add_into_from_rust() -> Vec<f64> {
    let mut c = [0.0; 3];
    native_add_into_rs(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0], &mut c);
    c.to_vec()
}

// ---------------------------------------------------------------------------
// Panics in bodies, and the GIL released with a slice.

/// Panics after writing: the registry must be empty afterwards.
#[dlpack_fn]
#[pyfunction]
fn panic_with_mut_slice(x: &mut [f64]) {
    x.fill(7.0);
    panic!("the body panicked on purpose");
}

static DETACH_ENTERED: AtomicBool = AtomicBool::new(false);
static DETACH_RELEASE: AtomicBool = AtomicBool::new(false);

/// Holds a `&[f64]` with the GIL released until `detach_release()`; returns
/// the sum read after. (Spins with `yield_now`, no clock.)
#[dlpack_fn]
#[pyfunction]
fn detach_hold(py: Python<'_>, x: &[f64]) -> f64 {
    DETACH_RELEASE.store(false, Ordering::SeqCst);
    py.detach(|| {
        DETACH_ENTERED.store(true, Ordering::SeqCst);
        while !DETACH_RELEASE.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        DETACH_ENTERED.store(false, Ordering::SeqCst);
        x.iter().sum()
    })
}

/// Whether a `detach_hold` body is waiting.
#[pyfunction]
fn detach_entered() -> bool {
    DETACH_ENTERED.load(Ordering::SeqCst)
}

/// Lets a waiting `detach_hold` body finish.
#[pyfunction]
fn detach_release() {
    DETACH_RELEASE.store(true, Ordering::SeqCst);
}

// ---------------------------------------------------------------------------
// The call context driven by hand (`dlcast_runtime::__private` is public,
// and every method used here is safe).

const fn param(name: &'static str) -> ParamSpec {
    ParamSpec {
        name,
        shape: None,
        devices: &[DeviceSpec::CPU],
        order: Order::Any,
        convert: false,
        aligned: true,
        dtypes: &[],
        shares_dtype: None,
    }
}

static EVIL_ALIAS: FnSpec = FnSpec {
    name: "evil_alias",
    dim_names: &[],
    params: &[param("a"), param("b")],
};

/// Prepares both arguments as read-only slices (so the registry lets them
/// share memory), then takes both as `&mut [f64]`: two `&mut` to one
/// memory in safe Rust, unless `take` refuses. Writes 42.0 through `a` and
/// returns `(address of a, address of b, b[0] read after the write)`.
#[pyfunction]
fn evil_alias(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<(usize, usize, f64)> {
    let mut cx = CallContext::<2>::new(&EVIL_ALIAS);
    cx.prepare::<&[f64]>(0, a)?;
    cx.prepare::<&[f64]>(1, b)?;
    cx.finish()?;
    let x: &mut [f64] = cx.take(0)?;
    let y: &mut [f64] = cx.take(1)?;
    if let Some(v) = x.first_mut() {
        *v = 42.0;
    }
    let seen = y.first().copied().unwrap_or(f64::NAN);
    Ok((x.as_ptr() as usize, y.as_ptr() as usize, seen))
}

/// Prepares `x` as `TensorRef<u8>` and takes it as `TensorRef<f64>`: a view
/// of `len(x)` float64 elements over `len(x)` bytes, unless `take` refuses.
/// Returns what the view reads (eight times the bytes the array has).
#[pyfunction]
fn evil_retype(x: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    let mut cx = CallContext::<1>::new(&EVIL_ONE);
    cx.prepare::<TensorRef<'_, u8>>(0, x)?;
    cx.finish()?;
    let v: TensorRef<'_, f64> = cx.take(0)?;
    Ok(v.as_slice().map(|s| s.to_vec()).unwrap_or_default())
}

/// Prepares `x` as `TensorRef<f64>` (read-only arrays pass) and takes it as
/// `TensorMut<f64>`, then writes 7.0 everywhere, unless `take` refuses.
#[pyfunction]
fn evil_write_read_only(x: &Bound<'_, PyAny>) -> PyResult<()> {
    let mut cx = CallContext::<1>::new(&EVIL_ONE);
    cx.prepare::<TensorRef<'_, f64>>(0, x)?;
    cx.finish()?;
    let mut v: TensorMut<'_, f64> = cx.take(0)?;
    v.fill(7.0)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

static EVIL_ONE: FnSpec = FnSpec {
    name: "evil_one",
    dim_names: &[],
    params: &[param("x")],
};

thread_local! {
    static LEAKED: std::cell::Cell<Option<&'static [f64]>> = const { std::cell::Cell::new(None) };
}

/// Leaks a call context to get a `&'static [f64]`, and keeps it in a
/// thread-local after the call returns.
#[pyfunction]
fn evil_leak_slice(x: &Bound<'_, PyAny>) -> PyResult<()> {
    let cx: &'static mut CallContext<1> = Box::leak(Box::new(CallContext::<1>::new(&EVIL_ONE)));
    cx.prepare::<&[f64]>(0, x)?;
    cx.finish()?;
    let cx: &'static CallContext<1> = cx;
    let s: &'static [f64] = cx.take(0)?;
    LEAKED.with(|l| l.set(Some(s)));
    Ok(())
}

/// The leaked slice's elements, read now.
#[pyfunction]
fn evil_leaked_values() -> Option<Vec<f64>> {
    LEAKED.with(|l| l.get()).map(|s| s.to_vec())
}

/// Takes a view through a hand-driven context, then nests bodies and
/// panics inside one (caught): the body API is a closure, so bodies nest
/// strictly whatever safe Rust does, and the runtime's per-thread
/// "deferred owners" state is restored each time.
#[pyfunction]
fn evil_guards_out_of_order(x: &Bound<'_, PyAny>) -> PyResult<f64> {
    let mut cx = CallContext::<1>::new(&EVIL_ONE);
    cx.prepare::<TensorRef<'_, f64>>(0, x)?;
    cx.finish()?;
    let v: TensorRef<'_, f64> = cx.take(0)?;
    let first = cx.body(|| cx.body(|| v.get(&[0]).unwrap_or(f64::NAN)));
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cx.body(|| -> () { panic!("inside a body") })
    }));
    drop(v);
    Ok(if caught.is_err() { first } else { f64::NAN })
}

/// As `evil_guards_out_of_order`, with `std::mem::forget` of the body's
/// result (a view returned out of the body and forgotten: its memory is
/// leaked, never freed early).
#[pyfunction]
fn evil_forget_guard(x: &Bound<'_, PyAny>) -> PyResult<f64> {
    let mut cx = CallContext::<1>::new(&EVIL_ONE);
    cx.prepare::<TensorRef<'_, f64>>(0, x)?;
    cx.finish()?;
    let v: TensorRef<'_, f64> = cx.take(0)?;
    let first = v.get(&[0]).unwrap_or(f64::NAN);
    std::mem::forget(cx.body(move || v));
    Ok(first)
}

/// `CallContext::new` is infallible since the speed work: a context
/// whose `N` is not the spec's parameter count must refuse every step
/// (`prepare`, `prepare_opt`, `peek`, `finish`, `take`, `take_opt`) with an
/// error, never panic or read past the spec. Tries `N` above and below the
/// spec's count (`EVIL_ONE` has one parameter, `EVIL_ALIAS` two) and returns
/// how many steps were refused (every one of them: 16).
#[pyfunction]
fn evil_spec_count(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    let mut refused = 0;
    let mut count = |r: bool| refused += usize::from(r);
    // N = 2 over a one-parameter spec: index 1 names no parameter.
    let mut cx = CallContext::<2>::new(&EVIL_ONE);
    count(cx.prepare::<&[f64]>(0, x).is_err());
    count(cx.prepare::<&[f64]>(1, x).is_err());
    count(cx.prepare_opt::<&[f64]>(1, Some(x)).is_err());
    count(cx.peek(1, x, false).is_err());
    count(cx.finish().is_err());
    count(cx.take::<&[f64]>(0).is_err());
    count(cx.take::<&[f64]>(1).is_err());
    count(matches!(cx.take_opt::<&[f64]>(1), Err(_) | Ok(None)));
    // N = 1 over a two-parameter spec.
    let mut cx = CallContext::<1>::new(&EVIL_ALIAS);
    count(cx.prepare::<&[f64]>(0, x).is_err());
    count(cx.peek(0, x, false).is_err());
    count(cx.finish().is_err());
    count(cx.take::<&[f64]>(0).is_err());
    // N = 0 over a one-parameter spec.
    let mut cx = CallContext::<0>::new(&EVIL_ONE);
    count(cx.finish().is_err());
    count(cx.body(|| true));
    // The right N, after a refused `finish` of a wrong one: a fresh context
    // works (nothing was left behind in the registry).
    let mut cx = CallContext::<1>::new(&EVIL_ONE);
    count(cx.prepare::<&[f64]>(0, x).is_ok());
    count(cx.finish().is_ok());
    Ok(refused)
}

/// Registers the functions above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        mut_and_ref,
        mut_and_bool,
        ref_ref,
        ref_and_mut,
        nd_mut_pair,
        u8_mut_pair,
        opt_mut_and_ref,
        ndd_mut_and_slice,
        slice_cb,
        mut_slice_cb,
        nd_cb,
        nd_mut_cb,
        bool_nd0,
        bool_ndd,
        bool_nd_mut,
        bool_slice_mut,
        bool_opt,
        slice_addr,
        nd1_values,
        ndd_values,
        slice_values,
        u8_values,
        i64_values,
        c128_values,
        f16_values,
        ndd_mut_iota,
        generic_mut_zero,
        native_add_into,
        native_add_into_from_rust,
        panic_with_mut_slice,
        detach_hold,
        detach_entered,
        detach_release,
        evil_alias,
        evil_retype,
        evil_write_read_only,
        evil_leak_slice,
        evil_leaked_values,
        evil_guards_out_of_order,
        evil_forget_guard,
        evil_spec_count,
        dyn_mut_cb,
    );
    Ok(())
}
