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

    // A 1-D contiguous float64 array (dlcast's `&[f64]`): its length.
    m.def("slice_len",
          [](nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu> x) -> size_t {
              return x.size();
          });

    // Writable versions of sum_len and slice_len (dlcast's `TensorMut<f64>`
    // and `&mut [f64]`): nanobind checks only that the array is writable.
    m.def("sum_len_mut",
          [](nb::ndarray<double, nb::device::cpu> x) -> size_t { return x.size(); });
    m.def("slice_len_mut",
          [](nb::ndarray<double, nb::ndim<1>, nb::c_contig, nb::device::cpu> x) -> size_t {
              return x.size();
          });

    // A 2-D float32 array, any strides, through .view(): the first element.
    m.def("view_first",
          [](nb::ndarray<const float, nb::ndim<2>, nb::device::cpu> x) -> float {
              if (x.size() == 0) return 0.0f;
              return x.view()(0, 0);
          });

    // Several arguments: one (n, 3) float32 argument against four, the
    // extent n shared (checked by hand) and the last one written.
    m.def("args1",
          [](nb::ndarray<const float, nb::shape<-1, 3>, nb::device::cpu> a) -> float {
              return a.shape(0) == 0 ? 0.0f : a.view()(0, 0);
          });
    m.def("args4",
          [](nb::ndarray<const float, nb::shape<-1, 3>, nb::device::cpu> a,
             nb::ndarray<const float, nb::shape<-1, 3>, nb::device::cpu> b,
             nb::ndarray<const float, nb::ndim<1>, nb::device::cpu> w,
             nb::ndarray<float, nb::ndim<1>, nb::device::cpu> out) -> float {
              size_t n = a.shape(0);
              if (b.shape(0) != n || w.shape(0) != n || out.shape(0) != n)
                  throw nb::type_error("dimension 'n' differs between arguments");
              if (n == 0) return 0.0f;
              float v = a.view()(0, 0) + b.view()(0, 0) + w.view()(0);
              out.view()(0) = v;
              return v;
          });

    // The body tables (bench/rust/src/body.rs has the same arithmetic):
    // a valid 5x5 correlation into a writable (h - 4, w - 4) output ...
    m.def("conv5",
          [](nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu> img,
             nb::ndarray<const float, nb::shape<5, 5>, nb::c_contig, nb::device::cpu> k,
             nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu> out) {
              size_t h = img.shape(0), w = img.shape(1), oh = out.shape(0), ow = out.shape(1);
              if (h < 4 || w < 4 || oh != h - 4 || ow != w - 4)
                  throw nb::value_error("conv5(): out must be (h - 4, w - 4)");
              auto iv = img.view();
              auto kv = k.view();
              auto ov = out.view();
              for (size_t i = 0; i < oh; ++i)
                  for (size_t j = 0; j < ow; ++j) {
                      float acc = 0.0f;
                      for (size_t di = 0; di < 5; ++di)
                          for (size_t dj = 0; dj < 5; ++dj)
                              acc += iv(i + di, j + dj) * kv(di, dj);
                      ov(i, j) = acc;
                  }
          });
    // ... and the sum of a float64 (n, m) array in C index order, any strides.
    m.def("strided_sum",
          [](nb::ndarray<const double, nb::ndim<2>, nb::device::cpu> x) -> double {
              auto v = x.view();
              size_t n = x.shape(0), m = x.shape(1);
              double acc = 0.0;
              for (size_t i = 0; i < n; ++i)
                  for (size_t j = 0; j < m; ++j)
                      acc += v(i, j);
              return acc;
          });

    m.def("make_f32_numpy", &make_f32<nb::numpy>);
    m.def("make_f32_torch", &make_f32<nb::pytorch>);
}
