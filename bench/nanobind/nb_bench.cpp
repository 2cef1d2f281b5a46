// The nanobind side of the array-boundary benchmark (`make bench`): the same
// functions as bench/rust/src/lib.rs, with nb::ndarray.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>

namespace nb = nanobind;

// A new zero-filled float32 array of n elements, owned by a capsule and
// handed to the framework Framework (nb::numpy or nb::pytorch) without a copy.
template <typename Framework>
static nb::ndarray<Framework, float, nb::ndim<1>> make_f32(size_t n) {
    float *data = new float[n]();
    nb::capsule owner(data, [](void *p) noexcept { delete[] static_cast<float *>(p); });
    return nb::ndarray<Framework, float, nb::ndim<1>>(data, {n}, owner);
}

NB_MODULE(nb_bench, m) {
    // nanobind's own floor: one object argument, no conversion.
    m.def("floor", [](nb::handle x) -> size_t { (void) x; return 0; });

    // Any float64 CPU array, any shape and strides: the element count.
    m.def("sum_len",
          [](nb::ndarray<const double, nb::device::cpu> x) -> size_t { return x.size(); });

    // float32 (n, 3), C-contiguous: the sum of the first row.
    m.def("sum_pts",
          [](nb::ndarray<const float, nb::shape<-1, 3>, nb::c_contig, nb::device::cpu> x) -> float {
              if (x.shape(0) == 0) return 0.0f;
              const float *d = x.data();
              return d[0] + d[1] + d[2];
          });

    m.def("make_f32_numpy", &make_f32<nb::numpy>);
    m.def("make_f32_torch", &make_f32<nb::pytorch>);
}
