//! Test extension for dlcast's pytest suite: functions that exercise every
//! annotation and view method, and a producer of arbitrary DLPack capsules.

use dlcast_runtime::prelude::*;
use half::{bf16, f16};
use num_complex::Complex;
use pyo3::prelude::*;
use pyo3::types::PyComplex;

mod accessors;
mod api;
mod body;
mod borrows;
mod buffer_exports;
mod callbacks;
mod constructions;
mod copies;
mod fast_numpy;
mod first_hour;
mod float8;
mod gpu;
mod hand_driven;
mod native;
mod ownership;
mod ownership_edges;
mod producer;
mod ranked;
mod stored;
mod stubs;
mod view_drops;
mod windows;

/// Counts the Rust heap allocations of this extension (dlcast's runtime is
/// compiled into it), to show that the fast import paths allocate nothing.
struct CountingAllocator;

static RUST_ALLOCATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        RUST_ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's layout contract is passed through.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from `System`.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Rust heap allocations so far.
#[pyfunction]
fn rust_allocations() -> usize {
    RUST_ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Touches one element; allocates nothing itself.
#[dlpack_fn]
#[pyfunction]
fn first_f64(x: TensorRef<'_, f64>) -> f64 {
    let zeros = [0usize; 16];
    x.get(&zeros[..x.ndim().min(16)]).unwrap_or(f64::NAN)
}

/// The benchmark's shape: `(n, 3)` float32 in C order.
#[dlpack_fn]
#[pyfunction]
fn points_len(
    #[shape(_, 3)]
    #[order(c)]
    x: TensorRef<'_, f32>,
) -> usize {
    x.len()
}

/// The README's first example.
#[dlpack_fn]
#[pyfunction]
fn centroid(
    #[shape(n, 3)] points: TensorRef<'_, f32, 2>,
    #[shape(n)] weights: TensorRef<'_, f32, 1>,
) -> PyResult<[f32; 3]> {
    let mut c = [0.0f32; 3];
    let mut total = 0.0f32;
    for i in 0..points.dims()[0] {
        let w = weights.get([i])?;
        total += w;
        for (k, ck) in c.iter_mut().enumerate() {
            *ck += w * points.get([i, k])?;
        }
    }
    Ok(c.map(|x| x / total))
}

/// Layout as seen by Rust: `(shape, strides, dtype, device, read_only,
/// c_contiguous, f_contiguous)`.
type Described = (Vec<usize>, Vec<isize>, String, (i32, i32), bool, bool, bool);

fn describe_view(x: &TensorDyn<'_>) -> Described {
    (
        x.shape().to_vec(),
        x.strides().to_vec(),
        x.dtype().to_string(),
        (x.device().device_type, x.device().device_id),
        x.is_read_only(),
        x.is_c_contiguous(),
        x.is_f_contiguous(),
    )
}

/// Describes any array on any device, without touching its memory.
#[dlpack_fn]
#[pyfunction]
fn describe(#[device(any)] x: TensorDyn<'_>) -> Described {
    describe_view(&x)
}

/// The elements in C order as Python values, dispatching on the dtype read
/// at run time (through each typed view's `to_vec`).
#[dlpack_fn]
#[pyfunction]
fn values(py: Python<'_>, x: TensorDyn<'_>) -> PyResult<Vec<Py<PyAny>>> {
    use pyo3::IntoPyObjectExt;
    fn all<'py, T: Element, U: IntoPyObject<'py>>(
        py: Python<'py>,
        x: TensorRef<'_, T>,
        f: impl Fn(T) -> U,
    ) -> PyResult<Vec<Py<PyAny>>> {
        x.to_vec()?
            .into_iter()
            .map(|v| f(v).into_py_any(py))
            .collect()
    }
    macro_rules! dispatch {
        ($x:ident; $($t:ty => $f:expr),* $(,)?) => {{
            $(let $x = match $x.into_typed::<$t>() { Ok(t) => return all(py, t, $f), Err(x) => x };)*
            Err(pyo3::exceptions::PyTypeError::new_err(format!("no test dispatch for {}", $x.dtype())))
        }};
    }
    let complex = |re: f64, im: f64| PyComplex::from_doubles(py, re, im);
    dispatch!(x;
        f64 => |v| v, f32 => |v| v, bool => |v| v,
        i8 => |v| v, i16 => |v| v, i32 => |v| v, i64 => |v| v,
        u8 => |v| v, u16 => |v| v, u32 => |v| v, u64 => |v| v,
        f16 => f64::from, bf16 => f64::from,
        Complex<f32> => |v: Complex<f32>| complex(v.re.into(), v.im.into()),
        Complex<f64> => |v: Complex<f64>| complex(v.re, v.im),
        microfloat::f8e3m4 => |v: microfloat::f8e3m4| f64::from(v.to_f32()),
        microfloat::f8e4m3 => |v: microfloat::f8e4m3| f64::from(v.to_f32()),
        microfloat::f8e4m3b11fnuz => |v: microfloat::f8e4m3b11fnuz| f64::from(v.to_f32()),
        microfloat::f8e4m3fn => |v: microfloat::f8e4m3fn| f64::from(v.to_f32()),
        microfloat::f8e4m3fnuz => |v: microfloat::f8e4m3fnuz| f64::from(v.to_f32()),
        microfloat::f8e5m2 => |v: microfloat::f8e5m2| f64::from(v.to_f32()),
        microfloat::f8e5m2fnuz => |v: microfloat::f8e5m2fnuz| f64::from(v.to_f32()),
        microfloat::f8e8m0fnu => |v: microfloat::f8e8m0fnu| f64::from(v.to_f32()),
    )
}

macro_rules! typed_fns {
    ($($name:ident: $t:ty),* $(,)?) => {$(
        /// Sum of the elements through the typed view (as `f64`).
        #[dlpack_fn]
        #[pyfunction]
        fn $name(x: TensorRef<'_, $t>) -> PyResult<f64> {
            Ok(x.to_vec()?.into_iter().map(|v| v as f64).sum())
        }
    )*};
}
typed_fns!(sum_i8: i8, sum_i16: i16, sum_i32: i32, sum_i64: i64, sum_u8: u8, sum_u16: u16,
           sum_u32: u32, sum_u64: u64, sum_f32: f32, sum_f64: f64);

/// Sum through the typed `f16` view.
#[dlpack_fn]
#[pyfunction]
fn sum_f16(x: TensorRef<'_, f16>) -> PyResult<f64> {
    Ok(x.to_vec()?.into_iter().map(f64::from).sum())
}

/// Sum through the typed `bf16` view.
#[dlpack_fn]
#[pyfunction]
fn sum_bf16(x: TensorRef<'_, bf16>) -> PyResult<f64> {
    Ok(x.to_vec()?.into_iter().map(f64::from).sum())
}

/// Sum through the typed `complex64` view, as `(re, im)`.
#[dlpack_fn]
#[pyfunction]
fn sum_c64(x: TensorRef<'_, Complex<f32>>) -> PyResult<(f64, f64)> {
    let s: Complex<f32> = x.to_vec()?.into_iter().sum();
    Ok((s.re.into(), s.im.into()))
}

/// Sum through the typed `complex128` view, as `(re, im)`.
#[dlpack_fn]
#[pyfunction]
fn sum_c128(x: TensorRef<'_, Complex<f64>>) -> PyResult<(f64, f64)> {
    let s: Complex<f64> = x.to_vec()?.into_iter().sum();
    Ok((s.re, s.im))
}

/// Number of `true` elements, read element by element (valid for any byte).
#[dlpack_fn]
#[pyfunction]
fn count_true(x: TensorRef<'_, bool>) -> PyResult<usize> {
    Ok(x.to_vec()?.into_iter().filter(|&b| b).count())
}

/// Whether a `bool` slice can be formed (only if every byte is 0 or 1).
#[dlpack_fn]
#[pyfunction]
fn bool_slice_ok(x: TensorRef<'_, bool>) -> bool {
    x.as_slice().is_some()
}

/// `x.get(index)`.
#[dlpack_fn]
#[pyfunction]
fn get_f64(x: TensorRef<'_, f64>, index: Vec<usize>) -> Option<f64> {
    x.get(&index).ok()
}

/// `x.as_slice()` copied out, or `None`.
#[dlpack_fn]
#[pyfunction]
fn slice_f64(x: TensorRef<'_, f64>) -> Option<Vec<f64>> {
    x.as_slice().map(<[f64]>::to_vec)
}

/// Elements in C order through `as_ndarray` (negative strides included).
#[dlpack_fn]
#[pyfunction]
fn ndarray_f64(x: TensorRef<'_, f64>) -> PyResult<Vec<f64>> {
    Ok(x.as_ndarray()?.iter().copied().collect())
}

/// The address of element 0, for zero-copy checks.
#[dlpack_fn]
#[pyfunction]
fn data_ptr(#[device(any)] x: TensorDyn<'_>) -> usize {
    x.data_ptr() as usize
}

/// `x[...] = value` through `fill`.
#[dlpack_fn]
#[pyfunction]
fn fill_f64(out: TensorMut<'_, f64>, value: f64) -> PyResult<()> {
    let mut out = out;
    out.fill(value)?;
    Ok(())
}

/// `x += 1` through `as_ndarray_mut` (any strides).
#[dlpack_fn]
#[pyfunction]
fn add_one_f32(mut x: TensorMut<'_, f32>) -> PyResult<()> {
    x.as_ndarray_mut()?.mapv_inplace(|v| v + 1.0);
    Ok(())
}

/// Doubles every element through `as_slice_mut`; `false` if no slice.
#[dlpack_fn]
#[pyfunction]
fn double_slice_f64(mut x: TensorMut<'_, f64>) -> bool {
    match x.as_slice_mut() {
        Some(s) => {
            s.iter_mut().for_each(|v| *v *= 2.0);
            true
        }
        None => false,
    }
}

/// `x[index] = value` through `set`: whether it wrote.
#[dlpack_fn]
#[pyfunction]
fn set_f64(mut x: TensorMut<'_, f64>, index: Vec<usize>, value: f64) -> bool {
    x.set(&index, value).is_ok()
}

/// Copies `src` into `dst` (same shape).
#[dlpack_fn]
#[pyfunction]
fn copy_into(#[shape(..)] src: TensorRef<'_, f64>, mut dst: TensorMut<'_, f64>) -> PyResult<()> {
    let v = src.to_vec()?;
    let mut it = v.into_iter();
    let shape = dst.shape().to_vec();
    let n: usize = shape.iter().product();
    for flat in 0..n {
        let mut idx = vec![0; shape.len()];
        let mut f = flat;
        for d in (0..shape.len()).rev() {
            idx[d] = f % shape[d];
            f /= shape[d];
        }
        dst.set(&idx, it.next().unwrap_or(0.0))?;
    }
    Ok(())
}

/// Writable untyped view: zeroes every byte of a C-contiguous array.
#[dlpack_fn]
#[pyfunction]
fn zero_bytes(#[order(c)] mut x: TensorDynMut<'_>) -> usize {
    let bytes = x.len() * usize::from(x.dtype().bits / 8);
    // SAFETY: the view is writable, host memory, C-contiguous, so its
    // elements occupy exactly `bytes` bytes from element 0.
    unsafe { std::ptr::write_bytes(x.data_ptr_mut(), 0, bytes) };
    bytes
}

/// `order(c)`, conversion off: shows what the check accepts.
#[dlpack_fn(noconvert)]
#[pyfunction]
fn needs_c(#[order(c)] x: TensorDyn<'_>) -> Vec<usize> {
    x.shape().to_vec()
}

/// `order(f)`, conversion off: shows what the check accepts.
#[dlpack_fn(noconvert)]
#[pyfunction]
fn needs_f(#[order(f)] x: TensorDyn<'_>) -> Vec<usize> {
    x.shape().to_vec()
}

/// `order(contiguous)`, conversion off: shows what the check accepts.
#[dlpack_fn(noconvert)]
#[pyfunction]
fn needs_contiguous(#[order(contiguous)] x: TensorDyn<'_>) -> Vec<usize> {
    x.shape().to_vec()
}

/// A 0-d array.
#[dlpack_fn]
#[pyfunction]
fn scalar_f64(#[shape()] x: TensorRef<'_, f64, 0>) -> Option<f64> {
    x.get([]).ok()
}

/// `..` between fixed extents.
#[dlpack_fn]
#[pyfunction]
fn batch_of_pairs(#[shape(.., 2)] x: TensorDyn<'_>) -> Vec<usize> {
    x.shape().to_vec()
}

/// `_`, a fixed extent and named extents across three parameters.
#[dlpack_fn]
#[pyfunction]
fn matmul_shapes(
    #[shape(m, k)] a: TensorDyn<'_>,
    #[shape(k, n)] b: TensorDyn<'_>,
    #[shape(m, n)] out: TensorDyn<'_>,
) -> (usize, usize, usize) {
    let _ = out;
    (a.shape()[0], a.shape()[1], b.shape()[1])
}

/// A square matrix: one name used twice in one shape.
#[dlpack_fn]
#[pyfunction]
fn square(#[shape(n, n)] x: TensorDyn<'_>) -> usize {
    x.shape()[0]
}

/// Only CUDA (device id any).
#[dlpack_fn]
#[pyfunction]
fn cuda_only(#[device(cuda)] x: TensorDyn<'_>) -> (i32, i32) {
    (x.device().device_type, x.device().device_id)
}

/// CUDA device 1 or CPU.
#[dlpack_fn]
#[pyfunction]
fn cuda1_or_cpu(#[device(cuda(1), cpu)] x: TensorDyn<'_>) -> (i32, i32) {
    (x.device().device_type, x.device().device_id)
}

/// Element access refused for device memory.
#[dlpack_fn]
#[pyfunction]
fn device_to_vec(#[device(cuda)] x: TensorRef<'_, f32>) -> PyResult<Vec<f32>> {
    Ok(x.to_vec()?)
}

/// An optional array: `None` gives `None`.
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (x=None))]
fn maybe_len(x: Option<TensorRef<'_, f64>>) -> Option<usize> {
    x.map(|x| x.len())
}

/// An optional writable array.
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (x=None))]
fn maybe_fill(x: Option<TensorMut<'_, f64>>) -> PyResult<bool> {
    match x {
        Some(mut x) => {
            x.fill(7.0)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Import paths can be checked for the deleter: take a view, do nothing.
#[dlpack_fn]
#[pyfunction]
fn consume(#[device(any)] x: TensorDyn<'_>) -> usize {
    x.ndim()
}

#[pymodule(gil_used = true)]
fn dlcast_testext(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // False in abi3 builds for Python 3.9/3.10 (`make abi3`): exported
    // arrays offer `__array_interface__` instead of the buffer protocol.
    m.add("BUFFER_PROTOCOL", dlcast_runtime::export::BUFFER_PROTOCOL)?;
    m.add_function(wrap_pyfunction!(producer::make_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(producer::producer_counts, m)?)?;
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        centroid,
        describe,
        values,
        sum_i8,
        sum_i16,
        sum_i32,
        sum_i64,
        sum_u8,
        sum_u16,
        sum_u32,
        sum_u64,
        sum_f32,
        sum_f64,
        sum_f16,
        sum_bf16,
        sum_c64,
        sum_c128,
        count_true,
        bool_slice_ok,
        get_f64,
        slice_f64,
        ndarray_f64,
        data_ptr,
        fill_f64,
        add_one_f32,
        double_slice_f64,
        set_f64,
        copy_into,
        zero_bytes,
        needs_c,
        needs_f,
        needs_contiguous,
        scalar_f64,
        batch_of_pairs,
        matmul_shapes,
        square,
        cuda_only,
        cuda1_or_cpu,
        device_to_vec,
        maybe_len,
        maybe_fill,
        consume,
    );
    add_export_functions(m)?;
    api::add(m)?;
    borrows::add(m)?;
    copies::add(m)?;
    callbacks::add(m)?;
    native::add(m)?;
    view_drops::add(m)?;
    ownership::add(m)?;
    gpu::add(m)?;
    accessors::add(m)?;
    hand_driven::add(m)?;
    fast_numpy::add(m)?;
    first_hour::add(m)?;
    ownership_edges::add(m)?;
    ranked::add(m)?;
    windows::add(m)?;
    stubs::add(m)?;
    constructions::add(m)?;
    stored::add(m)?;
    float8::add(m)?;
    body::add(m)?;
    buffer_exports::add(m)?;
    add_robustness_functions(m)
}

// ---------------------------------------------------------------------------
// Export: owned tensors and views of inputs returned to Python.

/// `(buffers created, buffers freed, capsules created, capsule deleters run)`.
#[pyfunction]
fn export_stats() -> (usize, usize, usize, usize) {
    let s = dlcast_runtime::export::stats();
    (
        s.buffers_created,
        s.buffers_freed,
        s.capsules_created,
        s.capsule_deleters_run,
    )
}

/// Values `0, 1, 2, ...` (as `T`) of `shape`, laid out in `order` ("c", "f",
/// or "rev": C order walked backwards through negative strides), with the
/// address of the Rust allocation.
fn arange<T: Element>(
    shape: &[usize],
    order: &str,
    f: impl Fn(usize) -> T,
) -> PyResult<(Tensor<T>, usize)> {
    let n: usize = shape.iter().product();
    let data: Vec<T> = (0..n).map(&f).collect();
    let ptr = data.as_ptr() as usize;
    let t = match order {
        "c" => Tensor::from_vec(data, shape)?,
        "aligned" => {
            let t = Tensor::from_fn(shape, &f)?;
            let ptr = t.data_ptr() as usize;
            return Ok((t, ptr));
        }
        "f" => {
            // Element (i, j, ...) must hold its C-order index: permute data.
            let mut fdata = data.clone();
            let mut idx = vec![0usize; shape.len()];
            for (flat, v) in data.into_iter().enumerate() {
                let mut r = flat;
                for d in (0..shape.len()).rev() {
                    idx[d] = r % shape[d];
                    r /= shape[d];
                }
                let mut fo = 0;
                let mut m = 1;
                for d in 0..shape.len() {
                    fo += idx[d] * m;
                    m *= shape[d];
                }
                fdata[fo] = v;
            }
            let ptr = fdata.as_ptr() as usize;
            return Ok((Tensor::from_vec_f(fdata, shape)?, ptr));
        }
        "rev" => {
            let mut rev = data;
            rev.reverse();
            let ptr = rev.as_ptr() as usize;
            let mut strides = vec![0isize; shape.len()];
            let mut acc = 1isize;
            for d in (0..shape.len()).rev() {
                strides[d] = -acc;
                acc *= shape[d] as isize;
            }
            return Ok((Tensor::from_vec_strides(rev, shape, &strides)?, ptr));
        }
        _ => return Err(pyo3::exceptions::PyValueError::new_err("order")),
    };
    Ok((t, ptr))
}

/// `arange` of `dtype` (every dtype but float8) as a `dlcast.Array`, with
/// the address of the Rust allocation: what the `arange_*` functions return
/// before their `returns = ...` hands it over.
fn arange_array(
    py: Python<'_>,
    dtype: &str,
    shape: &[usize],
    order: &str,
) -> PyResult<(Py<PyAny>, usize)> {
    use pyo3::IntoPyObjectExt;
    macro_rules! go {
        ($f:expr) => {{
            let (t, p) = arange(shape, order, $f)?;
            Ok((t.into_py_any(py)?, p))
        }};
    }
    match dtype {
        "bool" => go!(|i| i % 2 == 1),
        "int8" => go!(|i| i as i8),
        "int16" => go!(|i| i as i16),
        "int32" => go!(|i| i as i32),
        "int64" => go!(|i| i as i64),
        "uint8" => go!(|i| i as u8),
        "uint16" => go!(|i| i as u16),
        "uint32" => go!(|i| i as u32),
        "uint64" => go!(|i| i as u64),
        "float16" => go!(|i| f16::from_f64(i as f64)),
        "bfloat16" => go!(|i| bf16::from_f64(i as f64)),
        "float32" => go!(|i| i as f32),
        "float64" => go!(|i| i as f64),
        "complex64" => go!(|i| Complex::new(i as f32, -(i as f32))),
        "complex128" => go!(|i| Complex::new(i as f64, -(i as f64))),
        _ => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "dtype {dtype}"
        ))),
    }
}

macro_rules! arange_fns {
    ($($name:ident => ($($opt:tt)*)),* $(,)?) => {$(
        /// `arange` for every dtype, handed to the framework in its name
        /// by the macro's `returns = ...`.
        #[dlpack_fn($($opt)*)]
        #[pyfunction]
        #[pyo3(signature = (dtype, shape, order="c"))]
        fn $name(py: Python<'_>, dtype: &str, shape: Vec<usize>, order: &str) -> PyResult<(Py<PyAny>, usize)> {
            arange_array(py, dtype, &shape, order)
        }
    )*};
}
arange_fns!(
    arange_default => (returns = dlcast),
    arange_numpy => (returns = numpy),
    arange_torch => (returns = torch),
    arange_jax => (returns = jax),
    arange_array_api => (returns = array_api),
    arange_cupy => (returns = cupy),
    arange_tensorflow => (returns = tensorflow),
    arange_memoryview => (returns = memoryview),
    arange_mlx => (returns = mlx),
);

/// `arange` handed to the framework whose option (`"numpy"`, ...) is given
/// at run time, through the runtime code a `returns = <option>` function's
/// result goes through: every row of the framework table is tested by one
/// function (`test_exports.py` parametrizes over the table's options).
#[pyfunction]
#[pyo3(signature = (option, dtype, shape, order="c"))]
fn arange_to(
    py: Python<'_>,
    option: &str,
    dtype: &str,
    shape: Vec<usize>,
    order: &str,
) -> PyResult<Py<PyAny>> {
    use pyo3::IntoPyObjectExt;
    let framework = dlcast_runtime::facts::FRAMEWORKS
        .iter()
        .find(|f| f.option == option)
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!("no framework row `{option}`"))
        })?
        .id;
    let result = arange_array(py, dtype, &shape, order)?.into_bound_py_any(py)?;
    dlcast_runtime::export::convert_result(result, Some(framework))
}

/// A `Tensor` from a `Box<[u8]>`.
#[dlpack_fn]
#[pyfunction]
fn boxed_bytes(n: usize) -> Tensor<u8> {
    let b: Box<[u8]> = (0..n).map(|i| i as u8).collect();
    Tensor::from(b)
}

/// A `Tensor` from an owned, transposed `ndarray` array (F order).
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn from_ndarray_t(rows: usize, cols: usize) -> (Tensor<f64>, usize) {
    let a = ndarray::Array2::from_shape_fn((rows, cols), |(i, j)| (i * cols + j) as f64);
    let t = a.reversed_axes();
    let ptr = t.as_ptr() as usize;
    (Tensor::from_ndarray(t), ptr)
}

/// `Option` and `PyResult` around tensors; a tuple of two.
#[dlpack_fn]
#[pyfunction]
fn maybe_tensor(give: bool) -> Option<Tensor<f32>> {
    give.then(|| Tensor::from(vec![1.0f32, 2.0]))
}

/// A fallible tensor.
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn fallible_tensor(ok: bool) -> PyResult<Tensor<i32>> {
    if ok {
        Ok(Tensor::from(vec![1, 2, 3]))
    } else {
        Err(pyo3::exceptions::PyRuntimeError::new_err("asked to fail"))
    }
}

/// A tuple of tensors, handed to NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn tensor_pair(n: usize) -> (Tensor<f32>, Tensor<i64>) {
    (
        Tensor::from(vec![0.5f32; n]),
        Tensor::from((0..n as i64).collect::<Vec<_>>()),
    )
}

/// The input itself, zero-copy, as a `dlcast.Array`.
#[dlpack_fn(returns = dlcast)]
#[pyfunction]
fn identity(#[device(any)] x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

/// The input itself as a writable view, handed to NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn identity_mut(x: TensorMut<'_, f32>) -> TensorMut<'_, f32> {
    x
}

/// Rows `start..stop` of the input (a slice along axis 0).
#[dlpack_fn]
#[pyfunction]
fn rows(x: TensorRef<'_, f64>, start: usize, stop: usize) -> PyResult<TensorRef<'_, f64>> {
    Ok(x.slice_axis(0, start..stop)?)
}

/// The transpose of the input, handed to PyTorch.
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn transposed(x: TensorDyn<'_>) -> TensorDyn<'_> {
    x.t()
}

/// The input reshaped (it must be C-contiguous), flipped along axis 0.
#[dlpack_fn]
#[pyfunction]
fn reshaped_flipped(x: TensorRef<'_, f64>, shape: Vec<usize>) -> PyResult<TensorRef<'_, f64>> {
    Ok(x.reshape(&shape)?.flip_axis(0)?)
}

/// The axes of the input permuted.
#[dlpack_fn]
#[pyfunction]
fn permuted(x: TensorRef<'_, f64>, axes: Vec<usize>) -> PyResult<TensorRef<'_, f64>> {
    Ok(x.permute(&axes)?)
}

/// The input itself, handed to JAX (read-only inputs included).
#[dlpack_fn(returns = jax)]
#[pyfunction]
fn identity_jax(x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

/// Takes a DLPack capsule the way a consumer does (renaming it) and runs its
/// deleter on a new thread that never holds the GIL, while this thread has
/// released it.
#[pyfunction]
fn delete_on_foreign_thread(py: Python<'_>, capsule: &Bound<'_, PyAny>) -> PyResult<()> {
    use dlpack_rs::ffi::{DLManagedTensor, DLManagedTensorVersioned};
    use pyo3::ffi;
    let cap = capsule.as_ptr();
    let versioned = c"dltensor_versioned";
    let legacy = c"dltensor";
    // SAFETY: `cap` is a live object; IsValid checks it is a capsule of
    // that name before GetPointer reads it.
    let (ptr, is_versioned) = unsafe {
        if ffi::PyCapsule_IsValid(cap, versioned.as_ptr()) != 0 {
            (ffi::PyCapsule_GetPointer(cap, versioned.as_ptr()), true)
        } else if ffi::PyCapsule_IsValid(cap, legacy.as_ptr()) != 0 {
            (ffi::PyCapsule_GetPointer(cap, legacy.as_ptr()), false)
        } else {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "not an unused DLPack capsule",
            ));
        }
    };
    let used = if is_versioned {
        c"used_dltensor_versioned"
    } else {
        c"used_dltensor"
    };
    // SAFETY: renaming a live capsule to a 'static name.
    unsafe { ffi::PyCapsule_SetName(cap, used.as_ptr()) };
    let addr = ptr as usize;
    py.detach(move || {
        std::thread::spawn(move || {
            // SAFETY: we took the capsule, so its deleter is ours to call,
            // once; the struct kind follows the name we saw.
            unsafe {
                if is_versioned {
                    let m = addr as *mut DLManagedTensorVersioned;
                    if let Some(d) = (*m).deleter {
                        d(m)
                    }
                } else {
                    let m = addr as *mut DLManagedTensor;
                    if let Some(d) = (*m).deleter {
                        d(m)
                    }
                }
            }
        })
        .join()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("deleter thread panicked"))
    })
}

/// A new array of ones shaped like the input, in the input's framework
/// (`returns = like(x)`); an optional second input takes the framework of
/// the first one given.
#[dlpack_fn(returns = like(x))]
#[pyfunction]
fn ones_like(#[device(any)] x: TensorDyn<'_>) -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_fn(x.shape(), |_| 1.0)?)
}

/// `returns = like(x)` on an optional parameter.
#[dlpack_fn(returns = like(x))]
#[pyfunction]
#[pyo3(signature = (x=None))]
fn maybe_ones_like(x: Option<TensorDyn<'_>>) -> PyResult<Tensor<f32>> {
    let shape = x.map(|x| x.shape().to_vec()).unwrap_or_default();
    Ok(Tensor::from_fn(&shape, |_| 1.0)?)
}

/// How the argument was imported: "numpy", "exchange_api", "capsule",
/// "dlpack", "buffer" or "tensorflow".
#[dlpack_fn]
#[pyfunction]
fn import_path(#[device(any)] x: TensorDyn<'_>) -> &'static str {
    x.import_path().name()
}

/// Whether dlcast reads PyTorch tensors directly (`"on"`), why not (the
/// reason), or `None` before the first PyTorch argument.
#[pyfunction]
fn torch_direct() -> Option<String> {
    dlcast_runtime::__private::torch_direct_state().map(|s| match s {
        Ok(()) => "on".to_owned(),
        Err(why) => why.to_owned(),
    })
}

/// How a typed float64 view of `x` was read (`"torch"`: directly), and its
/// values.
#[dlpack_fn]
#[pyfunction]
fn typed_path(x: TensorRef<'_, f64>) -> PyResult<(&'static str, Vec<f64>)> {
    Ok((x.import_path().name(), x.to_vec()?))
}

/// As [`typed_path`], writable: adds 1 to every element.
#[dlpack_fn]
#[pyfunction]
fn typed_path_mut(mut x: TensorMut<'_, f64>) -> PyResult<&'static str> {
    let path = x.import_path().name();
    let mut values = x.to_vec()?;
    values.iter_mut().for_each(|v| *v += 1.0);
    x.copy_from_slice(&values)?;
    Ok(path)
}

/// Registers the export functions (called from the module initialiser).
fn add_export_functions(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        export_stats,
        arange_default,
        arange_numpy,
        arange_torch,
        arange_jax,
        arange_array_api,
        arange_to,
        boxed_bytes,
        from_ndarray_t,
        maybe_tensor,
        fallible_tensor,
        tensor_pair,
        identity,
        identity_mut,
        rows,
        transposed,
        reshaped_flipped,
        permuted,
        identity_jax,
        arange_cupy,
        arange_tensorflow,
        arange_memoryview,
        arange_mlx,
        ones_like,
        maybe_ones_like,
        identity_tf,
        import_path,
        torch_direct,
        typed_path,
        typed_path_mut,
        rust_allocations,
        first_f64,
        points_len,
        delete_on_foreign_thread,
    );
    Ok(())
}

/// The input itself, handed to TensorFlow (read-only inputs included).
#[dlpack_fn(returns = tensorflow)]
#[pyfunction]
fn identity_tf(x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

// ---------------------------------------------------------------------------
// Robustness: functions for the thread and aliasing tests
// (tests/python/test_threads.py, test_aliasing.py).

/// Sum of the elements, computed with the GIL released. Views are neither
/// `Send` nor `Sync`, so they cannot cross into `py.detach`: the elements
/// are copied out first and the view is dropped (its deleter runs) while
/// the GIL is still held.
#[dlpack_fn]
#[pyfunction]
fn sum_detached(py: Python<'_>, x: TensorRef<'_, f64>) -> PyResult<f64> {
    let v = x.to_vec()?;
    drop(x);
    Ok(py.detach(move || {
        use std::sync::atomic::Ordering::SeqCst;
        let now = DETACHED.fetch_add(1, SeqCst) + 1;
        DETACHED_PEAK.fetch_max(now, SeqCst);
        // Stay detached a moment, so that other threads run meanwhile.
        std::thread::sleep(std::time::Duration::from_micros(20));
        let sum = v.iter().sum();
        DETACHED.fetch_sub(1, SeqCst);
        sum
    }))
}

/// Threads inside `sum_detached`'s detached section now, and at most so far.
static DETACHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static DETACHED_PEAK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The most threads seen at once in `sum_detached`'s detached section.
#[pyfunction]
fn detached_peak() -> usize {
    DETACHED_PEAK.load(std::sync::atomic::Ordering::SeqCst)
}

/// `out = k * x`, computed with the GIL released from a copy of `x`, then
/// written back through the writable view (which stayed on this thread).
#[dlpack_fn]
#[pyfunction]
fn scale_detached(
    py: Python<'_>,
    #[shape(n)] x: TensorRef<'_, f64>,
    #[shape(n)] mut out: TensorMut<'_, f64>,
    k: f64,
) -> PyResult<()> {
    let v = x.to_vec()?;
    let scaled: Vec<f64> = py.detach(move || {
        std::thread::yield_now();
        v.into_iter().map(|e| e * k).collect()
    });
    for (i, e) in scaled.into_iter().enumerate() {
        out.set(&[i], e)?;
    }
    Ok(())
}

/// Number of bodies of `swap_f64` / `copy_into_counted` run so far: the
/// aliasing tests check that a refused call never ran its body.
static BODIES_RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many bodies of the aliasing test functions have run.
#[pyfunction]
fn bodies_run() -> usize {
    BODIES_RUN.load(std::sync::atomic::Ordering::SeqCst)
}

/// Swaps the elements of two writable arrays of one shape.
#[dlpack_fn]
#[pyfunction]
fn swap_f64(#[shape(..)] mut a: TensorMut<'_, f64>, mut b: TensorMut<'_, f64>) -> PyResult<()> {
    BODIES_RUN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let (va, vb) = (a.to_vec()?, b.to_vec()?);
    a.fill(0.0)?;
    let shape = a.shape().to_vec();
    let mut idx = vec![0usize; shape.len()];
    for (flat, (x, y)) in va.into_iter().zip(vb).enumerate() {
        let mut f = flat;
        for d in (0..shape.len()).rev() {
            idx[d] = f % shape[d];
            f /= shape[d];
        }
        a.set(&idx, y)?;
        b.set(&idx, x)?;
    }
    Ok(())
}

/// `dst[...] = src + 1` for two arrays of one shape (the writable one last).
#[dlpack_fn]
#[pyfunction]
fn add_one_into(
    #[shape(n)] src: TensorRef<'_, f64>,
    #[shape(n)] mut dst: TensorMut<'_, f64>,
) -> PyResult<()> {
    BODIES_RUN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    for (i, v) in src.to_vec()?.into_iter().enumerate() {
        dst.set(&[i], v + 1.0)?;
    }
    Ok(())
}

/// Two arrays on any device, the second writable; touches neither (the
/// aliasing checks on device memory).
#[dlpack_fn]
#[pyfunction]
fn device_pair(
    #[device(any)] src: TensorDyn<'_>,
    #[device(any)] dst: TensorDynMut<'_>,
) -> (usize, usize) {
    BODIES_RUN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    (src.len(), dst.len())
}

/// Registers the robustness functions (called from the module initialiser).
fn add_robustness_functions(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        sum_detached,
        detached_peak,
        scale_detached,
        bodies_run,
        swap_f64,
        add_one_into,
        device_pair
    );
    Ok(())
}
