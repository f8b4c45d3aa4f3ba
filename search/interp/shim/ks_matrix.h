// kernsearch MSL shim: matrix types (floatCxR, halfCxR, matrix<T, C, R>): C columns of R-element vectors,
// column-major as in Metal; m[i] is column i; m * v, v * m, m * m, transpose, element-wise + - and scalar *.
#pragma once

namespace metal {
template <class T, int C, int R> struct matrix {
  vec<T, R> columns[C];
  matrix() = default;
  explicit matrix(T diag) {  // a scalar fills the diagonal
    for (int c = 0; c < C; ++c) { columns[c] = vec<T, R>(T(0)); if (c < R) columns[c].v[c] = diag; }
  }
  template <class... V, class = std::enable_if_t<sizeof...(V) == C && (is_vec<V>::value && ...)>>
  matrix(const V&... cols) : columns{vec<T, R>(cols)...} {}
  template <class U> explicit matrix(const matrix<U, C, R>& o) { for (int c = 0; c < C; ++c) columns[c] = vec<T, R>(o.columns[c]); }
  vec<T, R>& operator[](int c) { return columns[c]; }
  const vec<T, R>& operator[](int c) const { return columns[c]; }
};
template <class T, int C, int R> matrix<T, C, R> operator+(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  matrix<T, C, R> r; for (int c = 0; c < C; ++c) r.columns[c] = a.columns[c] + b.columns[c]; return r;
}
template <class T, int C, int R> matrix<T, C, R> operator-(const matrix<T, C, R>& a, const matrix<T, C, R>& b) {
  matrix<T, C, R> r; for (int c = 0; c < C; ++c) r.columns[c] = a.columns[c] - b.columns[c]; return r;
}
template <class T, int C, int R, class S, class = std::enable_if_t<std::is_arithmetic<S>::value || std::is_same<S, half>::value>>
matrix<T, C, R> operator*(const matrix<T, C, R>& a, S s) {
  matrix<T, C, R> r; for (int c = 0; c < C; ++c) r.columns[c] = a.columns[c] * T(s); return r;
}
template <class T, int C, int R, class S, class = std::enable_if_t<std::is_arithmetic<S>::value || std::is_same<S, half>::value>>
matrix<T, C, R> operator*(S s, const matrix<T, C, R>& a) { return a * s; }
template <class T, int C, int R> vec<T, R> operator*(const matrix<T, C, R>& m, const vec<T, C>& v) {
  vec<T, R> r(T(0)); for (int c = 0; c < C; ++c) r = r + m.columns[c] * v.v[c]; return r;
}
template <class T, int C, int R> vec<T, C> operator*(const vec<T, R>& v, const matrix<T, C, R>& m) {
  vec<T, C> r; for (int c = 0; c < C; ++c) r.v[c] = dot(v, m.columns[c]); return r;
}
template <class T, int C, int R, int C2> matrix<T, C2, R> operator*(const matrix<T, C, R>& a, const matrix<T, C2, C>& b) {
  matrix<T, C2, R> r; for (int c = 0; c < C2; ++c) r.columns[c] = a * b.columns[c]; return r;
}
template <class T, int C, int R> matrix<T, R, C> transpose(const matrix<T, C, R>& m) {
  matrix<T, R, C> r; for (int c = 0; c < C; ++c) for (int k = 0; k < R; ++k) r.columns[k].v[c] = m.columns[c].v[k]; return r;
}
#define KS_MATRIX_TYPES(T, name)                                                                              \
  typedef matrix<T, 2, 2> name##2x2; typedef matrix<T, 2, 3> name##2x3; typedef matrix<T, 2, 4> name##2x4;     \
  typedef matrix<T, 3, 2> name##3x2; typedef matrix<T, 3, 3> name##3x3; typedef matrix<T, 3, 4> name##3x4;     \
  typedef matrix<T, 4, 2> name##4x2; typedef matrix<T, 4, 3> name##4x3; typedef matrix<T, 4, 4> name##4x4;
KS_MATRIX_TYPES(float, float) KS_MATRIX_TYPES(half, half)
#undef KS_MATRIX_TYPES
}  // namespace metal
