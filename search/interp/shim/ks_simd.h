// kernsearch MSL shim: the simd and quad functions beyond the core reductions and shuffles of ks_shim.h:
// votes (simd_all / any / ballot), simd_broadcast_first, shuffle-and-fill, rotates, bitwise reductions,
// prefix products, simd_is_first, and every quad_* function (groups of 4 lanes). Each is a collective:
// the lanes of a simdgroup that reach the same call complete it together.
#pragma once

namespace metal {
struct simd_vote {
  typedef uint64_t vote_t;
  vote_t v;
  explicit operator vote_t() const { return v; }
  bool all() const { return v == 0xffffffffull; }
  bool any() const { return v != 0; }
};

namespace ksd {
// Lanes of `lanes` in the same group of width W as lanes[i] (all of them for W = 32).
template <int W> inline bool same_group(const ks::Fiber* a, const ks::Fiber* b) { return a->lane / W == b->lane / W; }

// K: 0 sum, 1 max, 2 min, 3 product, 4 and, 5 or, 6 xor, 7 all, 8 any
template <class V, int K> inline V combine(const V& a, const V& b) {
  if constexpr (K == 0) return V(a + b);
  else if constexpr (K == 1) { if constexpr (is_vec<V>::value) return metal::max(a, b); else return b > a ? b : a; }
  else if constexpr (K == 2) { if constexpr (is_vec<V>::value) return metal::min(a, b); else return b < a ? b : a; }
  else if constexpr (K == 3) return V(a * b);
  else if constexpr (K == 4) return V(a & b);
  else if constexpr (K == 5) return V(a | b);
  else if constexpr (K == 6) return V(a ^ b);
  else if constexpr (K == 7) return V(a && b);
  else return V(a || b);
}
template <class V, int K, int W> void group_reduce_op(ks::Fiber** lanes, int n, ks::Fiber*) {
  for (int i = 0; i < n; ++i) {
    bool first = true;
    V acc{};
    for (int j = 0; j < n; ++j) {
      if (!same_group<W>(lanes[i], lanes[j])) continue;
      const V& x = *static_cast<const V*>(lanes[j]->in[0]);
      acc = first ? x : combine<V, K>(acc, x);
      first = false;
    }
    *static_cast<V*>(lanes[i]->out) = acc;
  }
}
// Prefix (in lane order) of K over the group: inclusive or exclusive (identity first).
template <class V, int K, bool Exclusive, int W> void group_prefix_op(ks::Fiber** lanes, int n, ks::Fiber*) {
  for (int i = 0; i < n; ++i) {
    V acc = K == 3 ? V(1) : V(0);
    for (int j = 0; j < n; ++j) {
      if (!same_group<W>(lanes[i], lanes[j])) continue;
      if (lanes[j]->lane > lanes[i]->lane || (Exclusive && lanes[j]->lane == lanes[i]->lane)) continue;
      acc = combine<V, K>(acc, *static_cast<const V*>(lanes[j]->in[0]));
    }
    *static_cast<V*>(lanes[i]->out) = acc;
  }
}
template <int W> void ballot_op(ks::Fiber** lanes, int n, ks::Fiber*) {
  for (int i = 0; i < n; ++i) {
    unsigned long long m = 0;
    for (int j = 0; j < n; ++j)
      if (same_group<W>(lanes[i], lanes[j]) && *static_cast<const bool*>(lanes[j]->in[0])) m |= 1ull << lanes[j]->lane;
    static_cast<simd_vote*>(lanes[i]->out)->v = W == 32 ? m : (m >> (lanes[i]->lane / W * W)) & ((1ull << W) - 1);
  }
}
inline const ks::Fiber* lane_of(ks::Fiber** lanes, int n, int lane) {
  for (int j = 0; j < n; ++j) if (lanes[j]->lane == lane) return lanes[j];
  return nullptr;
}
// Shuffles in a group of width W. K: 0 absolute, 1 xor, 2 up, 3 down, 4 rotate up, 5 rotate down,
// 6 fill up, 7 fill down, 8 broadcast first (lowest active lane of the group).
template <class V, int K, int W> void group_shuffle_op(ks::Fiber** lanes, int n, ks::Fiber*) {
  for (int i = 0; i < n; ++i) {
    int me = lanes[i]->lane, base = me / W * W, r = me - base, d = lanes[i]->arg;
    int width = (K == 6 || K == 7) && lanes[i]->ok > 0 ? lanes[i]->ok : W;  // shuffle_and_fill's modulo
    int seg = r / width * width, rr = r - seg;
    int src = me;
    int slot = 0;  // 0: data, 1: filling
    if (K == 0) src = base + (d % W);
    else if (K == 1) src = base + ((r ^ d) % W);
    else if (K == 2) src = rr >= d ? me - d : me;
    else if (K == 3) src = rr + d < width ? me + d : me;
    else if (K == 4) src = base + ((r - d) % W + W) % W;
    else if (K == 5) src = base + (r + d) % W;
    else if (K == 6) { if (rr >= d) src = me - d; else { src = base + seg + rr - d + width; slot = 1; } }
    else if (K == 7) { if (rr + d < width) src = me + d; else { src = base + seg + rr + d - width; slot = 1; } }
    else {
      src = 64;
      for (int j = 0; j < n; ++j) if (same_group<W>(lanes[i], lanes[j]) && lanes[j]->lane < src) src = lanes[j]->lane;
    }
    const ks::Fiber* from = lane_of(lanes, n, src);
    if (!from) {
      ks::report(ks::D_INACTIVE_LANE, ks::S_ERROR, lanes[i]->line,
                 "simd/quad shuffle in lane %d reads lane %d, which is not active here", me, src);
      from = lanes[i];
    }
    *static_cast<V*>(lanes[i]->out) = *static_cast<const V*>(from->in[slot]);
  }
}
template <class V> inline V collective2(ks::CollectiveOp op, const V& x, const V& y, int arg, int arg2, int line) {
  V r = x;
  ks::cur->op = op;
  ks::cur->in[0] = &x;
  ks::cur->in[1] = &y;
  ks::cur->out = &r;
  ks::cur->arg = arg;
  ks::cur->ok = arg2;
  ks::wait_here(ks::W_SIMD, line);
  return r;
}
template <class R, class V> inline R collective_to(ks::CollectiveOp op, const V& x, int line) {
  R r{};
  ks::cur->op = op;
  ks::cur->in[0] = &x;
  ks::cur->out = &r;
  ks::wait_here(ks::W_SIMD, line);
  return r;
}
}  // namespace ksd

#define KS_GROUP_FUNCS(P, W)                                                                                     \
  inline bool P##_all(bool x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<bool, 7, W>, x, 0, line); } \
  inline bool P##_any(bool x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<bool, 8, W>, x, 0, line); } \
  inline simd_vote P##_ballot(bool x, int line = __builtin_LINE()) { return ksd::collective_to<simd_vote>(ksd::ballot_op<W>, x, line); } \
  template <class V> V P##_and(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<V, 4, W>, x, 0, line); } \
  template <class V> V P##_or(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<V, 5, W>, x, 0, line); } \
  template <class V> V P##_xor(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<V, 6, W>, x, 0, line); } \
  template <class V> V P##_prefix_inclusive_product(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_prefix_op<V, 3, false, W>, x, 0, line); } \
  template <class V> V P##_prefix_exclusive_product(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_prefix_op<V, 3, true, W>, x, 0, line); } \
  template <class V> V P##_broadcast_first(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<V, 8, W>, x, 0, line); } \
  template <class V> V P##_shuffle_rotate_up(V x, ushort d, int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<V, 4, W>, x, d, line); } \
  template <class V> V P##_shuffle_rotate_down(V x, ushort d, int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<V, 5, W>, x, d, line); } \
  template <class V> V P##_shuffle_and_fill_up(V x, V fill, ushort d, int line = __builtin_LINE()) { return ksd::collective2(ksd::group_shuffle_op<V, 6, W>, x, fill, d, 0, line); } \
  template <class V> V P##_shuffle_and_fill_up(V x, V fill, ushort d, ushort modulo, int line = __builtin_LINE()) { return ksd::collective2(ksd::group_shuffle_op<V, 6, W>, x, fill, d, modulo, line); } \
  template <class V> V P##_shuffle_and_fill_down(V x, V fill, ushort d, int line = __builtin_LINE()) { return ksd::collective2(ksd::group_shuffle_op<V, 7, W>, x, fill, d, 0, line); } \
  template <class V> V P##_shuffle_and_fill_down(V x, V fill, ushort d, ushort modulo, int line = __builtin_LINE()) { return ksd::collective2(ksd::group_shuffle_op<V, 7, W>, x, fill, d, modulo, line); } \
  inline bool P##_is_first(int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<int, 8, W>, ks::cur->lane, 0, line) == ks::cur->lane; }
KS_GROUP_FUNCS(simd, 32)
KS_GROUP_FUNCS(quad, 4)
#undef KS_GROUP_FUNCS

template <class V> V quad_sum(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<V, 0, 4>, x, 0, line); }
template <class V> V quad_max(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<V, 1, 4>, x, 0, line); }
template <class V> V quad_min(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<V, 2, 4>, x, 0, line); }
template <class V> V quad_product(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_reduce_op<V, 3, 4>, x, 0, line); }
template <class V> V quad_prefix_inclusive_sum(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_prefix_op<V, 0, false, 4>, x, 0, line); }
template <class V> V quad_prefix_exclusive_sum(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::group_prefix_op<V, 0, true, 4>, x, 0, line); }
template <class V> V quad_shuffle(V x, ushort l, int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<V, 0, 4>, x, l, line); }
template <class V> V quad_shuffle_xor(V x, ushort m, int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<V, 1, 4>, x, m, line); }
template <class V> V quad_shuffle_up(V x, ushort d, int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<V, 2, 4>, x, d, line); }
template <class V> V quad_shuffle_down(V x, ushort d, int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<V, 3, 4>, x, d, line); }
template <class V> V quad_broadcast(V x, ushort l, int line = __builtin_LINE()) { return ksd::collective(ksd::group_shuffle_op<V, 0, 4>, x, l, line); }
inline simd_vote simd_active_threads_mask(int line = __builtin_LINE()) { return simd_ballot(true, line); }

#ifdef KS_CHECK
// Check mode: a threadgroup element passed straight to a collective is loaded (and checked) first.
#define KS_TG1(name) template <class T> T name(const ks::tgref<T>& x, int line = __builtin_LINE()) { return name(x.load(), line); }
#define KS_TG2(name) template <class T> T name(const ks::tgref<T>& x, ushort a, int line = __builtin_LINE()) { return name(x.load(), a, line); }
KS_TG1(simd_sum) KS_TG1(simd_max) KS_TG1(simd_min) KS_TG1(simd_product) KS_TG1(simd_prefix_inclusive_sum)
KS_TG1(simd_prefix_exclusive_sum) KS_TG1(simd_broadcast_first) KS_TG1(simd_and) KS_TG1(simd_or) KS_TG1(simd_xor)
KS_TG1(quad_sum) KS_TG1(quad_max) KS_TG1(quad_min) KS_TG1(quad_product) KS_TG1(quad_prefix_inclusive_sum)
KS_TG1(quad_prefix_exclusive_sum)
KS_TG2(simd_shuffle) KS_TG2(simd_shuffle_xor) KS_TG2(simd_shuffle_up) KS_TG2(simd_shuffle_down) KS_TG2(simd_broadcast)
KS_TG2(quad_shuffle) KS_TG2(quad_shuffle_xor) KS_TG2(quad_shuffle_up) KS_TG2(quad_shuffle_down) KS_TG2(quad_broadcast)
#undef KS_TG1
#undef KS_TG2
#endif
}  // namespace metal
