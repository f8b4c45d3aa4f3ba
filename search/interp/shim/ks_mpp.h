// kernsearch MSL shim: the subset of Metal 4 tensors and Metal Performance Primitives (MPP) that
// kernel bodies use for matrix products on the neural accelerators (Apple M5 and later).
//
// Written from Apple's documentation of Metal 4 tensors and MPP (the MetalPerformancePrimitives headers'
// API comments: "C = A*B + C"; operand and destination kinds) and public usage; semantics the docs leave
// open are chosen strictly and listed in docs/msl-subset.md ("Metal 4 tensor operations"):
// * tensor<ElementType, dextents<I, 2>, Kind>(data, extents[, strides]): extents are (columns, rows) —
//   index 0 is the innermost, contiguous dimension — and strides default to (1, extents[0]);
//   slice(x, y) moves the origin and shrinks the extents; reading outside the extents is an error (the
//   MSL specification makes it undefined behaviour).
// * matmul2d_descriptor(m, n, k, transpose_left, transpose_right, relaxed_precision, mode): an m x n
//   destination tile; k < 0 (dynamic_extent) takes K from the operands' extents, which must agree.
//   The op edge-checks the tile against the operands' extents: rows of A and columns of B past their
//   extents are not read, and the matching destination elements are left as they were.
// * matmul2d<descriptor, scope>: a collective operation. Every thread of the scope calls run();
//   execution_simdgroups<N> is N whole simdgroups (execution_simdgroup = 1, execution_thread = 1 thread).
//   Each thread computes its own share of the destination, reading the operands itself, so check mode
//   sees every operand read: a tile written without a barrier before the op is reported as a race.
// * The destination cooperative tensor spreads the m x n tile over the scope's threads, get_capacity()
//   elements each (thread rank t holds elements t*capacity ... in row-major order);
//   get_multidimensional_index(i) is (column, row).
#pragma once

namespace metal {

constexpr size_t dynamic_extent = size_t(-1);
template <class I> constexpr I dynamic_length_v = I(-1);

struct tensor_inline {};
struct tensor_handle {};
struct tensor_offset {};

template <class T, int N> struct array {
  T v[N];
  T& operator[](int i) { return v[i]; }
  const T& operator[](int i) const { return v[i]; }
};

template <class I, int R> struct dextents;
template <class I> struct dextents<I, 2> {
  I e[2];
  dextents(I cols, I rows) : e{cols, rows} {}
  I extent(int d) const { return e[d]; }
};

template <int N> struct execution_simdgroups { static constexpr int threads = 32 * N; };
using execution_simdgroup = execution_simdgroups<1>;
struct execution_thread { static constexpr int threads = 1; };

namespace ksd {
template <class Scope> inline int scope_rank() {
  if constexpr (Scope::threads == 1) return 0;
  else return (ks::cur->sg % (Scope::threads / 32)) * 32 + ks::cur->lane;
}
}  // namespace ksd

// A 2-D view of device/constant memory (a plain pointer) or threadgroup memory (a checked pointer in
// check mode). Elements are read through element(); the op below is the only reader.
template <class E, class Ext, class Kind = tensor_handle> struct tensor {
  using T = std::remove_cv_t<E>;
  T* p = nullptr;
#ifdef KS_CHECK
  ks::tgptr<T> tg;
  bool in_tg = false;
#endif
  int64_t off = 0;
  int32_t ext[2] = {0, 0};
  int64_t stride[2] = {1, 0};

  tensor(E* data, Ext e) : p(const_cast<T*>(data)), ext{int32_t(e.extent(0)), int32_t(e.extent(1))},
                           stride{1, int64_t(e.extent(0))} {}
  template <class I> tensor(E* data, Ext e, array<I, 2> s)
      : p(const_cast<T*>(data)), ext{int32_t(e.extent(0)), int32_t(e.extent(1))}, stride{int64_t(s[0]), int64_t(s[1])} {}
#ifdef KS_CHECK
  tensor(ks::tgptr<T> data, Ext e) : tg(data), in_tg(true), ext{int32_t(e.extent(0)), int32_t(e.extent(1))},
                                      stride{1, int64_t(e.extent(0))} {}
  template <class I> tensor(ks::tgptr<T> data, Ext e, array<I, 2> s)
      : tg(data), in_tg(true), ext{int32_t(e.extent(0)), int32_t(e.extent(1))}, stride{int64_t(s[0]), int64_t(s[1])} {}
#endif

  int32_t extent(int d) const { return ext[d]; }
  tensor slice(int32_t x, int32_t y) const {
    tensor t = *this;
    t.off = off + x * stride[0] + y * stride[1];
    t.ext[0] = ext[0] - x > 0 ? ext[0] - x : 0;
    t.ext[1] = ext[1] - y > 0 ? ext[1] - y : 0;
    return t;
  }
  template <size_t E0, size_t E1> tensor slice(int32_t x, int32_t y) const {
    tensor t = slice(x, y);
    if (E0 != dynamic_extent) t.ext[0] = int32_t(E0);
    if (E1 != dynamic_extent) t.ext[1] = int32_t(E1);
    return t;
  }
  // Element (x, y) = (column, row); outside the extents it is an error and reads as NaN.
  float element(int32_t x, int32_t y, int line) const {
    if (x < 0 || y < 0 || x >= ext[0] || y >= ext[1]) {
      ks::report(ks::D_TG_BOUNDS, ks::S_ERROR, line, "tensor op reads element (%d, %d) outside the tensor's extents (%d, %d)",
                 int(x), int(y), int(ext[0]), int(ext[1]));
      return __builtin_nanf("");
    }
    const int64_t i = off + x * stride[0] + y * stride[1];
#ifdef KS_CHECK
    if (in_tg) return float(T(tg[ks::idx(i, line)]));
#endif
    return float(p[i]);
  }
};

}  // namespace metal

namespace mpp {
namespace tensor_ops {

using metal::execution_simdgroup;
using metal::execution_simdgroups;
using metal::execution_thread;

struct matmul2d_descriptor {
  enum class mode { multiply = 0, multiply_accumulate = 1 };
  int m, n, k;
  bool transpose_left, transpose_right, relaxed_precision;
  mode matmul_mode;
  constexpr matmul2d_descriptor(int m_, int n_, int k_ = -1, bool tl = false, bool tr = false, bool relaxed = false,
                                mode md = mode::multiply)
      : m(m_), n(n_), k(k_), transpose_left(tl), transpose_right(tr), relaxed_precision(relaxed), matmul_mode(md) {}
};

template <class V, matmul2d_descriptor D, class Scope> struct cooperative_tensor {
  static constexpr int total = D.m * D.n;
  static constexpr int capacity = (total + Scope::threads - 1) / Scope::threads;
  V v[capacity];
  int rank = metal::ksd::scope_rank<Scope>();
  uint16_t get_capacity() const { return uint16_t(capacity); }
  V& operator[](int i) { return v[i]; }
  const V& operator[](int i) const { return v[i]; }
  bool is_valid_element(int i) const { return rank * capacity + i < total; }
  metal::array<int, 2> get_multidimensional_index(int i) const {
    const int e = rank * capacity + i;
    return metal::array<int, 2>{{e % D.n, e / D.n}};
  }
};

template <matmul2d_descriptor D, class Scope> struct matmul2d {
  template <class A, class B, class V> cooperative_tensor<V, D, Scope> get_destination_cooperative_tensor() const {
    cooperative_tensor<V, D, Scope> t;
    for (int i = 0; i < t.capacity; ++i) t.v[i] = V(__builtin_nanf(""));  // unset until written
    return t;
  }

  // C = A*B (+ C): this thread's share of the destination.
  template <class A, class B, class V>
  void run(const A& a, const B& b, cooperative_tensor<V, D, Scope>& c, int line = __builtin_LINE()) const {
#ifdef KS_CHECK
    ks::no_step whole_op;  // one operation of the scope: its operand reads do not synchronise lanes one by one
#endif
    const int rows_a = D.transpose_left ? a.extent(0) : a.extent(1);
    const int k_a = D.transpose_left ? a.extent(1) : a.extent(0);
    const int cols_b = D.transpose_right ? b.extent(1) : b.extent(0);
    const int k_b = D.transpose_right ? b.extent(0) : b.extent(1);
    int k = D.k;
    if (k < 0) {
      if (k_a != k_b) {
        ks::report(ks::D_TG_BOUNDS, ks::S_ERROR, line, "matmul2d: K extents of the operands differ (%d and %d)", k_a, k_b);
        return;
      }
      k = k_a;
    }
    for (int i = 0; i < c.capacity; ++i) {
      if (!c.is_valid_element(i)) continue;
      const auto idx = c.get_multidimensional_index(i);
      const int col = idx[0], row = idx[1];
      if (row >= rows_a || col >= cols_b) continue;  // edge-checked: outside the operands' extents
      float dot = 0.0f;
      for (int kk = 0; kk < k; ++kk) {
        const float x = D.transpose_left ? a.element(row, kk, line) : a.element(kk, row, line);
        const float y = D.transpose_right ? b.element(kk, col, line) : b.element(col, kk, line);
        dot = __builtin_fmaf(x, y, dot);
      }
      if (D.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate) c.v[i] = V(float(c.v[i]) + dot);
      else c.v[i] = V(dot);
    }
  }
};

}  // namespace tensor_ops
}  // namespace mpp
