// The tvm-ffi peer of the benchmark: the functions of bench/rust/src/lib.rs
// (floor, floor4, sum_len, args1, args4) written against tvm-ffi's C++ API.
// Compiled by tvm_ffi.cpp.load_inline (bench/tvmffi/tvmffi_bench.py), which
// prepends tvm-ffi's headers and exports every function below with
// TVM_FFI_DLL_EXPORT_TYPED_FUNC: the symbol `__tvm_ffi_<name>` is a packed
// function (AnyView args, count, Any result) that unpacks the arguments into
// the typed parameters, calls the function and packs its result.
//
// What a call does (tvm-ffi 0.1.15, python/tvm_ffi/cython/function.pxi):
// before the C++ function runs, tvm-ffi's Cython `Function.__call__` turns
// each Python argument into a TVMFFIAny by a setter chosen once per
// argument type (cached by the type object's address):
// - a class with `__dlpack_c_exchange_api__` (torch.Tensor, PyTorch >= 2.9):
//   `managed_tensor_from_py_object_no_sync` from that table, then
//   TVMFFITensorFromDLPackVersioned wraps the DLManagedTensorVersioned in a
//   temporary ffi::Tensor, released after the call;
// - another class with `__dlpack__` (numpy.ndarray): `__dlpack__()` through
//   Python, then the same wrapping;
// - a Python int: an int64 in the TVMFFIAny, no object.
// Calls release the GIL around the C++ function by default
// (TVM_FFI_RELEASE_GIL_BY_DEFAULT=1), the floors' too.
//
// What tvm-ffi checks on the way: TVMFFITensorFromDLPackVersioned refuses
// only the "sub-byte type padded" flag (alignment and contiguity only when
// asked, and the argument setters do not ask). It does NOT check:
// - dtype, ndim, shape or device: the function body does (below), as the
//   dlpark functions do by hand;
// - DLPack's READ_ONLY flag: a TensorView hands out a writable
//   `void* data_ptr()` whatever the producer said, and the flags are not
//   reachable from a TensorView, so `args4` cannot refuse a read-only `out`
//   (dlcast's `TensorMut` does);
// - anything PyTorch-specific: the table is taken from
//   `type(arg).__dlpack_c_exchange_api__`, a class attribute that Python
//   code can replace (looked up once per type, then cached by the type's
//   address), and neither tvm-ffi's call path nor PyTorch 2.15's table
//   checks the conj or neg bit, requires_grad or inference mode: a
//   requires_grad tensor, a `_neg_view()` (whose memory holds the
//   un-negated values) and a `.conj()` view are all accepted, where
//   `torch.Tensor.__dlpack__` refuses the first and the third;
// - aliasing between arguments (`out` may be `a`), and nothing keeps
//   another thread from writing the memory during the call (the GIL is
//   released).
// `data_ptr()` is DLTensor::data; the first element is at `byte_offset()`
// from it, which the reads below add.

#include <cstdint>

namespace {

const DLDataType kF64{kDLFloat, 64, 1};
const DLDataType kF32{kDLFloat, 32, 1};

// dtype and device, as dlpark_sum_len checks them after validate().
void check_cpu(const tvm::ffi::TensorView& x, DLDataType dtype, const char* param,
               const char* what) {
  if (x.dtype() != dtype) {
    TVM_FFI_THROW(TypeError) << param << ": expected " << what;
  }
  if (x.device().device_type != kDLCPU) {
    TVM_FFI_THROW(TypeError) << param << ": expected a CPU array";
  }
}

// float32 (n, 3), any strides (dlcast's `#[shape(n, 3)] TensorRef<f32>`).
void check_n3(const tvm::ffi::TensorView& x, const char* param) {
  check_cpu(x, kF32, param, "float32");
  if (x.ndim() != 2 || x.size(1) != 3) {
    TVM_FFI_THROW(TypeError) << param << ": expected shape (n, 3)";
  }
}

// float32 (n,), any stride.
void check_n(const tvm::ffi::TensorView& x, const char* param) {
  check_cpu(x, kF32, param, "float32");
  if (x.ndim() != 1) {
    TVM_FFI_THROW(TypeError) << param << ": expected 1 dimension";
  }
}

// The element at index (0, ..., 0): the data pointer plus the byte offset
// (strides do not matter for the first element). Callers check numel > 0.
float* first(const tvm::ffi::TensorView& x) {
  return reinterpret_cast<float*>(static_cast<char*>(x.data_ptr()) + x.byte_offset());
}

}  // namespace

// The floors: tvm-ffi's bare call, with one and with four arguments that
// need no conversion (Python ints; a tensor argument would be converted
// before the call whatever the parameter type, AnyView included).
int64_t floor1(int64_t a) {
  (void)a;
  return 0;
}

int64_t floor4(int64_t a, int64_t b, int64_t w, int64_t out) {
  (void)a;
  (void)b;
  (void)w;
  (void)out;
  return 0;
}

// Any float64 CPU array, any shape and strides: the element count.
int64_t sum_len(tvm::ffi::TensorView x) {
  check_cpu(x, kF64, "x", "float64");
  return x.numel();
}

// One float32 (n, 3) array: its first element (0 when n is 0).
float args1(tvm::ffi::TensorView a) {
  check_n3(a, "a");
  return a.size(0) == 0 ? 0.0f : *first(a);
}

// a, b float32 (n, 3), w float32 (n,), out float32 (n,) written: the extents
// compared by hand, the first elements read, out's first written.
float args4(tvm::ffi::TensorView a, tvm::ffi::TensorView b, tvm::ffi::TensorView w,
            tvm::ffi::TensorView out) {
  check_n3(a, "a");
  check_n3(b, "b");
  check_n(w, "w");
  check_n(out, "out");
  int64_t n = a.size(0);
  if (b.size(0) != n || w.size(0) != n || out.size(0) != n) {
    TVM_FFI_THROW(ValueError) << "dimension 'n' differs between arguments";
  }
  if (n == 0) return 0.0f;
  float v = *first(a) + *first(b) + *first(w);
  *first(out) = v;
  return v;
}
