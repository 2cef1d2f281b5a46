//! What a body does with its views and buffers: several views of one
//! argument (`view`, `index_axis`, `reborrow`, `index_axis_mut`), an
//! `ArrayBuffer`'s bulk writes (`copy_from_slice`, `fill`, `with_mut`),
//! the byte offset of devices whose `data` is an opaque handle, and
//! `TensorDynMut::data_ptr`. For tests/python/test_ranked_views.py,
//! test_ownership.py and test_capsules.py.

use dlcast_runtime::device::kind;
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// The sum of each item of a batch (`x[i].sum()` for every `i`), each item
/// a view of the argument (`index_axis`), and the address of each item.
#[dlpack_fn]
#[pyfunction]
fn body_item_sums(x: TensorRef<'_, f32, 2>) -> PyResult<(Vec<f32>, Vec<usize>)> {
    let mut sums = Vec::new();
    let mut ptrs = Vec::new();
    for i in 0..x.dims()[0] {
        let item = x.index_axis(0, i)?.into_rank::<1>()?;
        sums.push(item.iter()?.sum());
        ptrs.push(item.data_ptr() as usize);
    }
    // The argument itself is untouched by its views' transforms.
    let t = x.view().t();
    debug_assert_eq!(t.dims(), [x.dims()[1], x.dims()[0]]);
    Ok((sums, ptrs))
}

/// Column `j` of `x` as a list, through `view()` then `slice_axis`, and the
/// argument's shape afterwards (unchanged).
#[dlpack_fn]
#[pyfunction]
fn body_column(x: TensorRef<'_, f32, 2>, j: usize) -> PyResult<(Vec<f32>, Vec<usize>)> {
    let col = x.view().slice_axis(1, j..j + 1)?;
    Ok((col.to_vec()?, x.shape().to_vec()))
}

/// Writes `i` into every element of row `i` (`index_axis_mut`), then
/// negates column 0 through a reborrowed, sliced view.
#[dlpack_fn]
#[pyfunction]
fn body_fill_rows(mut out: TensorMut<'_, f32, 2>) -> PyResult<()> {
    for i in 0..out.dims()[0] {
        out.index_axis_mut(0, i)?.fill(i as f32)?;
    }
    let mut col = out.reborrow().into_dyn().slice_axis(1, 0..1)?;
    for i in 0..col.shape()[0] {
        let v = col.get(&[i, 0])?;
        col.set(&[i, 0], -v)?;
    }
    Ok(())
}

/// `data_ptr()` of a writable untyped view, and `data_ptr_mut()`.
#[dlpack_fn]
#[pyfunction]
fn body_dyn_mut_ptr(mut x: TensorDynMut<'_>) -> (usize, usize) {
    let read = x.data_ptr() as usize;
    (read, x.data_ptr_mut() as usize)
}

/// `((data_ptr, byte_offset, device_type), (data_ptr, byte_offset))`.
type Offsets = ((usize, usize, i32), (usize, usize));

/// `(data_ptr, byte_offset, device_type)` of an argument on any device,
/// and the same of its view sliced from index 1 along axis 0.
#[dlpack_fn]
#[pyfunction]
fn body_offsets(#[device(any)] x: TensorDyn<'_>) -> PyResult<Offsets> {
    let sliced = x.view().slice_axis(0, 1..x.shape()[0])?;
    Ok((
        (
            x.data_ptr() as usize,
            x.byte_offset(),
            x.device().device_type,
        ),
        (sliced.data_ptr() as usize, sliced.byte_offset()),
    ))
}

/// The argument (any device) sliced from index 1 along axis 0, returned:
/// its export keeps the byte offset apart from an opaque handle.
#[dlpack_fn]
#[pyfunction]
fn body_tail(#[device(any)] x: TensorDyn<'_>) -> PyResult<TensorDyn<'_>> {
    let n = x.shape()[0];
    Ok(x.slice_axis(0, 1..n)?)
}

/// `n` f32 "in an OpenCL buffer" `handle`, from byte `byte_offset` on
/// (`Tensor::from_raw_parts_with_offset`); nothing is ever read there.
#[pyfunction]
fn body_opencl_tensor(handle: usize, byte_offset: usize, n: usize) -> PyResult<Tensor<f32>> {
    let opencl = Device {
        device_type: kind::OPENCL,
        device_id: 0,
    };
    // SAFETY: OpenCL memory is never dereferenced by dlcast (not
    // host-accessible) and the tests never hand it to a consumer that
    // would; the owner holds nothing.
    Ok(unsafe {
        Tensor::from_raw_parts_with_offset(
            handle as *mut f32,
            byte_offset,
            &[n],
            &[1],
            opencl,
            false,
            (),
        )
    }?)
}

/// A CPU tensor over `data` (leaked, 4 f32) from byte `byte_offset` on,
/// through `from_raw_parts_with_offset`: the offset is folded into the
/// address. Returns the tensor and the allocation's address.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn body_cpu_offset_tensor(byte_offset: usize) -> PyResult<(Tensor<f32>, usize)> {
    struct Owned(Box<[f32]>);
    let owner = Owned(vec![1.0, 2.0, 3.0, 4.0].into_boxed_slice());
    let base = owner.0.as_ptr().cast_mut();
    let n = 4 - byte_offset / 4;
    // SAFETY: `n` f32 from byte `byte_offset` (a multiple of 4 below 16)
    // of the 4 `owner` keeps alive until the export is freed; no Rust
    // reference to them is used meanwhile.
    let t = unsafe {
        Tensor::from_raw_parts_with_offset(base, byte_offset, &[n], &[1], Device::CPU, false, owner)
    }?;
    Ok((t, base as usize))
}

static BODY_TABLE: [f32; 4] = [1.0, 2.0, 3.0, 4.0];

/// Static data as NumPy, the whole table or its last two elements.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn body_static_numpy(tail: bool) -> PyResult<Tensor<f32>> {
    let data: &'static [f32] = if tail { &BODY_TABLE[2..] } else { &BODY_TABLE };
    let n = data.len();
    Ok(Tensor::from_static(data, &[n])?)
}

/// Static data as `dlcast.Array`.
#[pyfunction]
fn body_static_array() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&BODY_TABLE, &[4])?)
}

/// The static's address and first element, as Rust reads it.
#[pyfunction]
fn body_static_table() -> (usize, f32) {
    let p: *const f32 = &BODY_TABLE[0];
    // SAFETY: `p` points to a live, aligned, initialised static f32; read
    // volatile so that a write by a consumer, had one happened, shows.
    (p as usize, unsafe { p.read_volatile() })
}

/// A `#[pyclass]` whose `ArrayBuffer` Rust writes in bulk while Python
/// holds views of it.
#[pyclass(module = "dlcast_testext")]
pub struct BulkBuf {
    data: ArrayBuffer<f32>,
}

#[dlpack_fn]
#[pymethods]
impl BulkBuf {
    #[new]
    fn new(n: usize) -> PyResult<Self> {
        Ok(BulkBuf {
            data: ArrayBuffer::zeros(&[n])?,
        })
    }

    /// A writable NumPy view.
    #[dlpack_fn(returns = numpy)]
    fn view(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// A read-only NumPy view.
    #[dlpack_fn(returns = numpy)]
    fn view_ro(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// `copy_from_slice(values)`.
    fn load(&self, py: Python<'_>, values: Vec<f32>) -> PyResult<()> {
        self.data.copy_from_slice(py, &values)
    }

    /// `fill(v)`.
    fn fill(&self, py: Python<'_>, v: f32) -> PyResult<()> {
        self.data.fill(py, v)
    }

    /// Sorts the elements in descending order through `with_mut`;
    /// returns the largest.
    fn sort_desc(&mut self, py: Python<'_>) -> PyResult<f32> {
        self.data.with_mut(py, |s| {
            s.sort_by(|a, b| b.total_cmp(a));
            s.first().copied().unwrap_or(0.0)
        })
    }

    /// `copy_from_slice` while Rust holds a `read()` guard (refused).
    fn load_while_reading(&self, py: Python<'_>, values: Vec<f32>) -> PyResult<()> {
        let _guard = self.data.read(py)?;
        self.data.copy_from_slice(py, &values)
    }

    /// `copy_from_slice` from a dlcast view of an array (refused when
    /// it is an export of this very buffer: the view is a registered
    /// borrow).
    fn load_from(&self, py: Python<'_>, x: &[f32]) -> PyResult<()> {
        self.data.copy_from_slice(py, x)
    }

    /// `(exports, writable exports)`.
    fn exports(&self) -> (usize, usize) {
        (self.data.exports(), self.data.writable_exports())
    }
}

/// Registers the functions and the class above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        body_item_sums,
        body_column,
        body_fill_rows,
        body_dyn_mut_ptr,
        body_offsets,
        body_tail,
        body_opencl_tensor,
        body_cpu_offset_tensor,
        body_static_numpy,
        body_static_array,
        body_static_table,
    );
    m.add_class::<BulkBuf>()?;
    Ok(())
}
