// kernsearch MSL shim: the names MLX's utilities header (mlx/backend/metal/kernels/utils.h) gives every
// mx.fast.metal_kernel body, implemented here from their documented meaning (not MLX's code): Limits,
// WorkPerThread, ceildiv, elem_to_loc (and its 1/2/3-D forms), float16_t / bfloat16_t. Included by
// ks_shim.h after the metal namespace, in the global namespace as MLX's are.
#pragma once

template <class U> struct Limits {
  static constexpr bool is_float = !std::is_integral<U>::value && !std::is_same<U, bool>::value;
  static inline const U max = is_float ? metal::numeric_limits<U>::infinity() : metal::numeric_limits<U>::max();
  static inline const U min = is_float ? U(-float(metal::numeric_limits<U>::infinity()))
                                    : metal::numeric_limits<U>::lowest();
  static inline const U finite_max = metal::numeric_limits<U>::max();
  static inline const U finite_min = metal::numeric_limits<U>::lowest();
};
template <> struct Limits<bool> {
  static constexpr bool max = true, min = false, finite_max = true, finite_min = false;
};

// Elements each thread of MLX's element-wise kernels handles: 8 bytes' worth.
template <class U> struct WorkPerThread {
  static_assert(sizeof(U) <= 8, "Type too large");
  static constexpr int n = 8 / int(sizeof(U));
};

template <class T, class U> inline constexpr auto ceildiv(T n, U m) { return (n + m - 1) / m; }

// Position of flat element `elem` in a strided array of `ndim` dimensions (row-major element order).
template <class IdxT = int64_t, class I, class S, class St>
inline IdxT elem_to_loc(I elem, const S* shape, const St* strides, int ndim) {
  IdxT loc = 0;
  IdxT e = IdxT(elem);
  for (int i = ndim - 1; i >= 0 && e > 0; --i) {
    loc += IdxT(e % IdxT(shape[i])) * IdxT(strides[i]);
    e /= IdxT(shape[i]);
  }
  return loc;
}
// A grid position (x fastest, then y, then z collapsed over the leading dimensions).
template <class IdxT = int64_t, class S, class St>
inline IdxT elem_to_loc(uint3 elem, const S* shape, const St* strides, int ndim) {
  IdxT loc = IdxT(elem.x) * IdxT(strides[ndim - 1]);
  if (ndim > 1) loc += IdxT(elem.y) * IdxT(strides[ndim - 2]);
  IdxT z = IdxT(elem.z);
  for (int d = ndim - 3; d >= 0; --d) {
    loc += (z % IdxT(shape[d])) * IdxT(strides[d]);
    z /= IdxT(shape[d]);
  }
  return loc;
}
template <class IdxT = int64_t, class St> inline IdxT elem_to_loc_1(uint elem, St stride) {
  return IdxT(elem) * IdxT(stride);
}
template <class IdxT = int64_t, class St> inline IdxT elem_to_loc_2(uint2 elem, const St* strides) {
  return IdxT(elem.x) * IdxT(strides[1]) + IdxT(elem.y) * IdxT(strides[0]);
}
template <class IdxT = int64_t, class St> inline IdxT elem_to_loc_3(uint3 elem, const St* strides) {
  return IdxT(elem.x) * IdxT(strides[2]) + IdxT(elem.y) * IdxT(strides[1]) + IdxT(elem.z) * IdxT(strides[0]);
}
