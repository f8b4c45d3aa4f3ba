// kernsearch MSL shim: the names MLX's utilities header (mlx/backend/metal/kernels/utils.h, with bf16.h,
// complex.h and defines.h) gives every mx.fast.metal_kernel body, implemented here from their meaning (not MLX's
// code): Limits (constant expressions), cast_to, WorkPerThread, ceildiv, elem_to_loc (its 1/2/3-D and
// two- / three-array forms, LoopedElemToLoc), complex64_t, ConditionalType, bfloat16 bit casts, the defines.h
// constants, float16_t / bfloat16_t. Included by ks_shim.h after the metal namespace, in the global namespace as
// MLX's are.
#pragma once

// Limits<T>: max / min / finite_max / finite_min, constant expressions (usable in constexpr and template
// arguments): floats have min = -inf and max = +inf, integers their range.
template <class U> struct Limits {
  static constexpr bool is_float = !std::is_integral<U>::value && !std::is_same<U, bool>::value;
  static constexpr U max = is_float ? metal::numeric_limits<U>::infinity() : metal::numeric_limits<U>::max();
  static constexpr U min = is_float ? U(-metal::numeric_limits<U>::infinity()) : metal::numeric_limits<U>::lowest();
  static constexpr U finite_max = metal::numeric_limits<U>::max();
  static constexpr U finite_min = metal::numeric_limits<U>::lowest();
};
template <> struct Limits<bool> {
  static constexpr bool max = true, min = false, finite_max = true, finite_min = false;
};

// cast_to<T>(x): x converted to T (element-wise for vectors; bfloat and half round to nearest even).
template <class T, class U> constexpr T cast_to(const U& x) {
  if constexpr (is_vec<T>::value && (is_vec<U>::value || is_packed<U>::value)) return T(unpacked(x));
  else return static_cast<T>(x);
}

// bfloat16 bit patterns.
inline uint16_t bfloat16_to_uint16(const bfloat16_t x) { return x.bits; }
inline bfloat16_t uint16_to_bfloat16(const uint16_t x) { bfloat16_t r(0.0f); r.bits = x; return r; }

// complex64_t: a float pair with complex arithmetic, ordered by real part then imaginary part (as MLX orders it).
struct complex64_t {
  float real, imag;
  constexpr complex64_t() : real(0), imag(0) {}
  constexpr complex64_t(float re, float im) : real(re), imag(im) {}
  template <class T, class = std::enable_if_t<std::is_convertible<T, float>::value && !std::is_same<T, complex64_t>::value>>
  constexpr complex64_t(T x) : real(float(x)), imag(0) {}
  template <class T, class = std::enable_if_t<std::is_convertible<float, T>::value>>
  constexpr explicit operator T() const { return T(real); }
};
constexpr complex64_t operator-(complex64_t x) { return {-x.real, -x.imag}; }
constexpr complex64_t operator+(complex64_t a, complex64_t b) { return {a.real + b.real, a.imag + b.imag}; }
constexpr complex64_t operator-(complex64_t a, complex64_t b) { return {a.real - b.real, a.imag - b.imag}; }
constexpr complex64_t operator*(complex64_t a, complex64_t b) {
  return {a.real * b.real - a.imag * b.imag, a.real * b.imag + a.imag * b.real};
}
constexpr complex64_t operator/(complex64_t a, complex64_t b) {
  float d = b.real * b.real + b.imag * b.imag;
  return {(a.real * b.real + a.imag * b.imag) / d, (a.imag * b.real - a.real * b.imag) / d};
}
inline complex64_t& operator+=(complex64_t& a, complex64_t b) { return a = a + b; }
inline complex64_t& operator-=(complex64_t& a, complex64_t b) { return a = a - b; }
inline complex64_t& operator*=(complex64_t& a, complex64_t b) { return a = a * b; }
constexpr bool operator==(complex64_t a, complex64_t b) { return a.real == b.real && a.imag == b.imag; }
constexpr bool operator!=(complex64_t a, complex64_t b) { return !(a == b); }
constexpr bool operator>(complex64_t a, complex64_t b) { return a.real > b.real || (a.real == b.real && a.imag > b.imag); }
constexpr bool operator<(complex64_t a, complex64_t b) { return b > a; }
constexpr bool operator>=(complex64_t a, complex64_t b) { return !(a < b); }
constexpr bool operator<=(complex64_t a, complex64_t b) { return !(a > b); }
template <> struct Limits<complex64_t> {
  static constexpr complex64_t max = complex64_t(__builtin_inff(), __builtin_inff());
  static constexpr complex64_t min = complex64_t(-__builtin_inff(), -__builtin_inff());
};

// std::conditional, which Metal lacks.
template <bool B, class T, class U> struct ConditionalType { using type = U; };
template <class T, class U> struct ConditionalType<true, T, U> { using type = T; };

// MLX's compile-time constants (defines.h) and its unroll hint.
#define MTL_CONST
#define MLX_MTL_PRAGMA_UNROLL
static constexpr int MAX_REDUCE_SPECIALIZED_DIMS = 4;
static constexpr int REDUCE_N_READS = 4;
static constexpr int REDUCE_N_WRITES = 4;
static constexpr int SOFTMAX_N_READS = 4;
static constexpr int RMS_N_READS = 4;
static constexpr int RMS_LOOPED_LIMIT = 4096;

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

// Positions of one grid element in two (three) strided arrays of the same shape.
template <class IdxT = int64_t, class S, class St>
inline vec<IdxT, 2> elem_to_loc_2_nd(uint3 elem, const S* shape, const St* a_strides, const St* b_strides, int ndim) {
  vec<IdxT, 2> loc(IdxT(elem.x) * IdxT(a_strides[ndim - 1]), IdxT(elem.x) * IdxT(b_strides[ndim - 1]));
  if (ndim > 1) {
    loc.x += IdxT(elem.y) * IdxT(a_strides[ndim - 2]);
    loc.y += IdxT(elem.y) * IdxT(b_strides[ndim - 2]);
  }
  IdxT z = IdxT(elem.z);
  for (int d = ndim - 3; d >= 0; --d) {
    IdxT l = z % IdxT(shape[d]);
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    z /= IdxT(shape[d]);
  }
  return loc;
}
template <class IdxT = int64_t, class S, class St>
inline vec<IdxT, 3> elem_to_loc_3_nd(uint3 elem, const S* shape, const St* a_strides, const St* b_strides,
                                     const St* c_strides, int ndim) {
  vec<IdxT, 3> loc(IdxT(elem.x) * IdxT(a_strides[ndim - 1]), IdxT(elem.x) * IdxT(b_strides[ndim - 1]),
                   IdxT(elem.x) * IdxT(c_strides[ndim - 1]));
  if (ndim > 1) {
    loc.x += IdxT(elem.y) * IdxT(a_strides[ndim - 2]);
    loc.y += IdxT(elem.y) * IdxT(b_strides[ndim - 2]);
    loc.z += IdxT(elem.y) * IdxT(c_strides[ndim - 2]);
  }
  IdxT z = IdxT(elem.z);
  for (int d = ndim - 3; d >= 0; --d) {
    IdxT l = z % IdxT(shape[d]);
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    loc.z += l * IdxT(c_strides[d]);
    z /= IdxT(shape[d]);
  }
  return loc;
}

// Walks the elements of a strided array in row-major order, keeping the position: next() steps one element
// (next(n, ...) n elements), location() is the offset. DIM: the dimensions it counts itself, General: whether the
// innermost one may be strided in a general array.
template <int DIM, class OffsetT = size_t, bool General = true> struct LoopedElemToLoc {
  int dim;
  OffsetT offset{0};
  int64_t index{0};
  explicit LoopedElemToLoc(int d) : dim(d) {}
  template <class S, class St> void next(const S* shape, const St* strides) { next(1, shape, strides); }
  template <class S, class St> void next(int n, const S* shape, const St* strides) {
    if (dim <= 0) return;
    index += n;
    // Offset of flat element `index` of the last `dim` dimensions.
    int64_t e = index;
    OffsetT off = 0;
    for (int i = dim - 1; i >= 0 && e > 0; --i) {
      off += OffsetT(e % int64_t(shape[i])) * OffsetT(strides[i]);
      e /= int64_t(shape[i]);
    }
    offset = off;
  }
  OffsetT location() const { return offset; }
};
