// kernsearch MSL shim: the rest of Metal's math, integer, relational and geometric library, and its macros.
// Included by ks_shim.h after the core math (metal namespace). Floating functions compute in float and
// round to the argument type; element-wise on vectors.
#pragma once

#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef HUGE_VALF
#define HUGE_VALF (__builtin_huge_valf())
#endif
#define MAXFLOAT 0x1.fffffep127f
#define FLT_MAX 0x1.fffffep127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
#define HALF_MAX 65504.0f
#define HALF_MIN 0x1p-14f
#define HALF_EPSILON 0x1p-10f
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f
#define M_PI_H half(3.14159265358979323846f)
#define M_E_H half(2.71828182845904523536f)
#define M_LN2_H half(0.693147180559945309417f)
#define M_SQRT2_H half(1.41421356237309504880f)
#ifndef INT_MAX
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 4294967295u
#define SHRT_MAX 32767
#define SHRT_MIN (-32768)
#define USHRT_MAX 65535
#define CHAR_BIT 8
#define SCHAR_MAX 127
#define SCHAR_MIN (-128)
#define UCHAR_MAX 255
#endif

namespace metal {
#define KS_UNARY(name, fn)                                                                           \
  template <class T> inline auto name(const T& x) {                                                 \
    if constexpr (is_vec<T>::value) {                                                               \
      T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = name(x.v[i]); return r;            \
    } else {                                                                                        \
      return T(fn(float(x)));                                                                       \
    }                                                                                               \
  }
KS_UNARY(sinh, __builtin_sinhf) KS_UNARY(cosh, __builtin_coshf) KS_UNARY(asinh, __builtin_asinhf)
KS_UNARY(acosh, __builtin_acoshf) KS_UNARY(atanh, __builtin_atanhf) KS_UNARY(asin, __builtin_asinf)
KS_UNARY(acos, __builtin_acosf) KS_UNARY(atan, __builtin_atanf) KS_UNARY(rint, __builtin_rintf)
KS_UNARY(log10, __builtin_log10f) KS_UNARY(cbrt, __builtin_cbrtf) KS_UNARY(erfc, __builtin_erfcf)
KS_UNARY(lgamma, __builtin_lgammaf) KS_UNARY(tgamma, __builtin_tgammaf)
KS_UNARY(fract, [](float v) { float f = v - __builtin_floorf(v); return f < 0x1.fffffep-1f ? f : 0x1.fffffep-1f; })
KS_UNARY(saturate, [](float v) { return v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v); })
KS_UNARY(sign, [](float v) { return __builtin_isnan(v) ? 0.0f : (v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v)); })
KS_UNARY(sinpi, [](float v) { return __builtin_sinf(M_PI_F * v); })
KS_UNARY(cospi, [](float v) { return __builtin_cosf(M_PI_F * v); })
KS_UNARY(tanpi, [](float v) { return __builtin_tanf(M_PI_F * v); })
KS_UNARY(recip, [](float v) { return 1.0f / v; })
#undef KS_UNARY

#define KS_BINARY(name, fn)                                                                          \
  template <class T, class U> inline T name(const T& a, const U& b) {                               \
    if constexpr (is_vec<T>::value) {                                                               \
      T r, bb = T(b); for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = name(a.v[i], bb.v[i]); return r; \
    } else {                                                                                        \
      return T(fn(float(a), float(b)));                                                             \
    }                                                                                               \
  }
KS_BINARY(atan2, __builtin_atan2f) KS_BINARY(fmod, __builtin_fmodf) KS_BINARY(copysign, __builtin_copysignf)
KS_BINARY(fdim, __builtin_fdimf) KS_BINARY(nextafter, __builtin_nextafterf) KS_BINARY(hypot, __builtin_hypotf)
KS_BINARY(step, [](float edge, float x) { return x < edge ? 0.0f : 1.0f; })
#undef KS_BINARY
template <class T> inline T step(float edge, const T& x) {  // step(scalar edge, vector x)
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = step(edge, x.v[i]); return r; }
  else return T(float(x) < edge ? 0.0f : 1.0f);
}
template <class T, class U> inline T ldexp(const T& x, const U& e) { return T(__builtin_ldexpf(float(x), int(e))); }
template <class T, class U> inline T frexp(const T& x, U& e) { int k; T r = T(__builtin_frexpf(float(x), &k)); e = U(k); return r; }
template <class T, class U> inline T modf(const T& x, U& ip) { float i; T r = T(__builtin_modff(float(x), &i)); ip = U(i); return r; }
template <class T, class U> inline T sincos(const T& x, U& c) {
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = sincos(x.v[i], c.v[i]); return r; }
  else { c = U(__builtin_cosf(float(x))); return T(__builtin_sinf(float(x))); }
}
template <class T, class U, class V> inline T smoothstep(const U& e0, const V& e1, const T& x) {
  T t = clamp(T((x - T(e0)) / (T(e1) - T(e0))), T(0), T(1));
  return t * t * (T(3) - T(2) * t);
}
template <class T, class U, class V> inline T fmax3(const T& a, const U& b, const V& c) { return fmax(fmax(a, b), c); }
template <class T, class U, class V> inline T fmin3(const T& a, const U& b, const V& c) { return fmin(fmin(a, b), c); }
template <class T, class U, class V> inline T max3(const T& a, const U& b, const V& c) { return max(max(a, b), c); }
template <class T, class U, class V> inline T min3(const T& a, const U& b, const V& c) { return min(min(a, b), c); }
template <class T, class U, class V> inline T fmedian3(const T& a, const U& b, const V& c) {
  return max(min(a, T(b)), min(max(a, T(b)), T(c)));
}
template <class T, class U, class V> inline T median3(const T& a, const U& b, const V& c) { return fmedian3(a, b, c); }
template <class T, class U, class V> inline T mad(const T& a, const U& b, const V& c) { return T(a * b + c); }

// Integer functions.
template <class T> inline T popcount(const T& x) {
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = popcount(x.v[i]); return r; }
  else return T(__builtin_popcountll((unsigned long long)(std::make_unsigned_t<T>)x));
}
template <class T> inline T clz(const T& x) {
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = clz(x.v[i]); return r; }
  else {
    using U = std::make_unsigned_t<T>;
    U u = U(x);
    return u == 0 ? T(sizeof(T) * 8) : T(__builtin_clzll((unsigned long long)u) - (64 - int(sizeof(T)) * 8));
  }
}
template <class T> inline T ctz(const T& x) {
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = ctz(x.v[i]); return r; }
  else {
    using U = std::make_unsigned_t<T>;
    U u = U(x);
    return u == 0 ? T(sizeof(T) * 8) : T(__builtin_ctzll((unsigned long long)u));
  }
}
template <class T, class U> inline T rotate(const T& v, const U& i) {
  if constexpr (is_vec<T>::value) { T r, ii = T(i); for (int k = 0; k < vec_size<T>::value; ++k) r.v[k] = rotate(v.v[k], ii.v[k]); return r; }
  else {
    using W = std::make_unsigned_t<T>;
    const int bits = int(sizeof(T)) * 8;
    int s = int((unsigned long long)(std::make_unsigned_t<U>)i % unsigned(bits));
    W w = W(v);
    return s == 0 ? v : T(W((w << s) | (w >> (bits - s))));
  }
}
template <class T> inline T mulhi(const T& a, const T& b) {
  if constexpr (sizeof(T) == 8) return T((__int128(a) * __int128(b)) >> 64);
  else return T((int64_t(a) * int64_t(b)) >> (sizeof(T) * 8));
}
template <class T> inline T absdiff(const T& a, const T& b) { return a > b ? T(a - b) : T(b - a); }
template <class T> inline T hadd(const T& a, const T& b) { return T((int64_t(a) + int64_t(b)) >> 1); }
template <class T> inline T rhadd(const T& a, const T& b) { return T((int64_t(a) + int64_t(b) + 1) >> 1); }
template <class T> inline T addsat(const T& a, const T& b) {
  int64_t s = int64_t(a) + int64_t(b), hi = int64_t(std::is_signed<T>::value ? (1ull << (sizeof(T) * 8 - 1)) - 1 : ~T(0));
  int64_t lo = std::is_signed<T>::value ? -hi - 1 : 0;
  return T(s > hi ? hi : (s < lo ? lo : s));
}
template <class T> inline T subsat(const T& a, const T& b) {
  int64_t s = int64_t(a) - int64_t(b), hi = int64_t(std::is_signed<T>::value ? (1ull << (sizeof(T) * 8 - 1)) - 1 : ~T(0));
  int64_t lo = std::is_signed<T>::value ? -hi - 1 : 0;
  return T(s > hi ? hi : (s < lo ? lo : s));
}
template <class T> inline T extract_bits(const T& x, uint offset, uint bits) {
  using W = std::make_unsigned_t<T>;
  if (bits == 0) return T(0);
  W mask = bits >= sizeof(T) * 8 ? W(~W(0)) : W((W(1) << bits) - 1);
  W v = W(W(x) >> offset) & mask;
  if constexpr (std::is_signed<T>::value) {
    if (bits < sizeof(T) * 8 && (v >> (bits - 1)) & 1) v |= W(~mask);
  }
  return T(v);
}
template <class T> inline T insert_bits(const T& base, const T& insert, uint offset, uint bits) {
  using W = std::make_unsigned_t<T>;
  W mask = bits >= sizeof(T) * 8 ? W(~W(0)) : W(((W(1) << bits) - 1) << offset);
  return T((W(base) & W(~mask)) | ((W(insert) << offset) & mask));
}
template <class T> inline T reverse_bits(const T& x) {
  using W = std::make_unsigned_t<T>;
  W v = W(x), r = 0;
  for (unsigned i = 0; i < sizeof(T) * 8; ++i) { r = W((r << 1) | (v & 1)); v >>= 1; }
  return T(r);
}

// Relational.
template <int N> inline bool any(const vec<bool, N>& v) { for (int i = 0; i < N; ++i) if (v.v[i]) return true; return false; }
template <int N> inline bool all(const vec<bool, N>& v) { for (int i = 0; i < N; ++i) if (!v.v[i]) return false; return true; }
inline bool any(bool b) { return b; }
inline bool all(bool b) { return b; }
template <class T, int N> inline vec<T, N> select(const vec<T, N>& a, const vec<T, N>& b, const vec<bool, N>& c) {
  vec<T, N> r; for (int i = 0; i < N; ++i) r.v[i] = c.v[i] ? b.v[i] : a.v[i]; return r;
}
template <class T> inline bool signbit(const T& x) { return __builtin_signbit(float(x)); }
template <class T> inline bool isnormal(const T& x) { return __builtin_isnormal(float(x)); }
template <class T, class U> inline bool isordered(const T& a, const U& b) { return !__builtin_isnan(float(a)) && !__builtin_isnan(float(b)); }
template <class T, class U> inline bool isunordered(const T& a, const U& b) { return !isordered(a, b); }

// Geometric.
template <class T, int N> inline T length_squared(const vec<T, N>& a) { return dot(a, a); }
template <class T, int N> inline T length(const vec<T, N>& a) { return T(__builtin_sqrtf(float(dot(a, a)))); }
template <class T, int N> inline T distance(const vec<T, N>& a, const vec<T, N>& b) { return length(a - b); }
template <class T, int N> inline vec<T, N> normalize(const vec<T, N>& a) { return a * T(1.0f / float(length(a))); }
template <class T> inline vec<T, 3> cross(const vec<T, 3>& a, const vec<T, 3>& b) {
  return vec<T, 3>(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}
// Packed vectors (packed_float3 ...) in the geometric functions: converted to the aligned vector, as MSL does.
template <class A, class B, class = std::enable_if_t<is_packed<A>::value || is_packed<B>::value>>
inline auto dot(const A& a, const B& b) { return dot(unpacked(a), unpacked(b)); }
template <class A, class B, class = std::enable_if_t<is_packed<A>::value || is_packed<B>::value>>
inline auto cross(const A& a, const B& b) { return cross(unpacked(a), unpacked(b)); }
template <class A, class B, class = std::enable_if_t<is_packed<A>::value || is_packed<B>::value>>
inline auto distance(const A& a, const B& b) { return distance(unpacked(a), unpacked(b)); }
template <class T, int N> inline T length_squared(const packed_vec<T, N>& a) { return dot(a, a); }
template <class T, int N> inline T length(const packed_vec<T, N>& a) { return length(unpacked(a)); }
template <class T, int N> inline vec<T, N> normalize(const packed_vec<T, N>& a) { return normalize(unpacked(a)); }

namespace fast {
using metal::sinh; using metal::cosh; using metal::asin; using metal::acos; using metal::atan; using metal::atan2;
using metal::rint; using metal::fmod; using metal::copysign; using metal::sign; using metal::fract; using metal::step;
using metal::saturate; using metal::log10; using metal::length; using metal::normalize; using metal::distance;
using metal::sincos; using metal::fmax3; using metal::fmin3; using metal::floor; using metal::ceil; using metal::round;
using metal::trunc; using metal::tan; using metal::clamp; using metal::powr; using metal::fmax; using metal::fmin;
using metal::exp10; using metal::ldexp; using metal::sinpi; using metal::cospi; using metal::recip;
}  // namespace fast
namespace precise {
using metal::sinh; using metal::cosh; using metal::asin; using metal::acos; using metal::atan; using metal::atan2;
using metal::rint; using metal::fmod; using metal::copysign; using metal::sign; using metal::fract; using metal::step;
using metal::saturate; using metal::log10; using metal::length; using metal::normalize; using metal::distance;
using metal::sincos; using metal::fmax3; using metal::fmin3; using metal::floor; using metal::ceil; using metal::round;
using metal::trunc; using metal::tan; using metal::clamp; using metal::powr; using metal::fmax; using metal::fmin;
using metal::exp10; using metal::ldexp; using metal::sinpi; using metal::cospi; using metal::recip;
}  // namespace precise

#ifdef KS_CHECK
// Check mode: threadgroup elements passed straight to math functions are loaded (and checked) first.
#define KS_TGU(name) template <class T> inline auto name(const ks::tgref<T>& x) { return name(x.load()); }
KS_TGU(exp) KS_TGU(exp2) KS_TGU(log) KS_TGU(log2) KS_TGU(sqrt) KS_TGU(rsqrt) KS_TGU(sin) KS_TGU(cos) KS_TGU(tanh)
KS_TGU(abs) KS_TGU(fabs) KS_TGU(floor) KS_TGU(ceil) KS_TGU(round) KS_TGU(trunc) KS_TGU(erf) KS_TGU(isnan)
KS_TGU(isinf) KS_TGU(isfinite) KS_TGU(sign) KS_TGU(fract) KS_TGU(saturate) KS_TGU(popcount) KS_TGU(log1p)
KS_TGU(expm1)
#undef KS_TGU
#define KS_TGB(name)                                                                                           \
  template <class T, class U, class = std::enable_if_t<!ks::is_tgref<U>::value>>                               \
  inline auto name(const ks::tgref<T>& a, const U& b) { return name(a.load(), b); }                            \
  template <class U, class T, class = std::enable_if_t<!ks::is_tgref<U>::value>>                               \
  inline auto name(const U& a, const ks::tgref<T>& b) { return name(a, T(b.load())); }                         \
  template <class T, class U> inline auto name(const ks::tgref<T>& a, const ks::tgref<U>& b) { return name(a.load(), b.load()); }
KS_TGB(max) KS_TGB(min) KS_TGB(fmax) KS_TGB(fmin) KS_TGB(pow) KS_TGB(atan2) KS_TGB(fmod)
#undef KS_TGB
#endif
}  // namespace metal
