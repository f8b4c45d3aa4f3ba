// kernsearch MSL shim: atomics (metal_atomic). Included by ks_shim.h.
//
// Threads are cooperative fibers that switch only at barriers and simd collectives, so every atomic
// operation runs whole, without interleaving: a plain read-modify-write is exactly Metal's relaxed
// atomic. Device atomics are plain memory; threadgroup atomics in check mode go through the detector
// (bounds, uninitialised reads), and a plain access racing with another thread's atomic is reported.
#pragma once

namespace metal {
enum memory_order { memory_order_relaxed = 0, memory_order_acquire, memory_order_release, memory_order_acq_rel,
                    memory_order_seq_cst };
enum thread_scope { thread_scope_thread = 0, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };

template <class T> struct atomic {
  static_assert(std::is_same<T, int>::value || std::is_same<T, uint>::value || std::is_same<T, float>::value ||
                std::is_same<T, bool>::value || std::is_same<T, unsigned long>::value ||
                std::is_same<T, long>::value,
                "Metal atomics hold int, uint, bool, float or (64-bit, min/max only) ulong");
  T v;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<bool> atomic_bool;
typedef atomic<float> atomic_float;
typedef atomic<unsigned long> atomic_ulong;

inline void atomic_thread_fence(mem_flags, memory_order, thread_scope = thread_scope_device) {}

namespace ksa {
// In a persistent launch (ks_pool) a thread yields before each atomic: a threadgroup spinning on a counter lets
// the others run, as the GPU's resident threadgroups run side by side.
template <class T> inline atomic<T>* raw(atomic<T>* p, bool, int line) {
  if (ks::pool_yield) ks::wait_here(ks::W_YIELD, line);
  return p;
}
template <class T> inline atomic<T>* raw(volatile atomic<T>* p, bool write, int line) {
  return raw(const_cast<atomic<T>*>(p), write, line);
}
#ifdef KS_CHECK
template <class T> inline atomic<T>* raw(ks::tgptr<atomic<T>> p, bool write, int line) {
  return ks::tg_atomic<atomic<T>>(p.a, p.off, write, line);
}
#endif
}  // namespace ksa

template <class P>
inline auto atomic_load_explicit(P obj, memory_order, int line = __builtin_LINE()) -> decltype(ksa::raw(obj, false, 0)->v) {
  return ksa::raw(obj, false, line)->v;
}
template <class P, class U>
inline void atomic_store_explicit(P obj, U desired, memory_order, int line = __builtin_LINE()) {
  auto* a = ksa::raw(obj, true, line);
  a->v = decltype(a->v)(desired);
}
template <class P, class U>
inline auto atomic_exchange_explicit(P obj, U desired, memory_order, int line = __builtin_LINE()) {
  auto* a = ksa::raw(obj, true, line);
  auto old = a->v;
  a->v = decltype(old)(desired);
  return old;
}
template <class P, class E, class U>
inline bool atomic_compare_exchange_weak_explicit(P obj, E* expected, U desired, memory_order, memory_order,
                                                  int line = __builtin_LINE()) {
  auto* a = ksa::raw(obj, true, line);
  if (a->v == *expected) { a->v = decltype(a->v)(desired); return true; }
  *expected = a->v;
  return false;
}
template <class P, class E, class U>
inline bool atomic_compare_exchange_strong_explicit(P obj, E* expected, U desired, memory_order s, memory_order f,
                                                    int line = __builtin_LINE()) {
  return atomic_compare_exchange_weak_explicit(obj, expected, desired, s, f, line);
}

#define KS_ATOMIC_RMW(name, expr)                                                                    \
  template <class P, class U>                                                                       \
  inline auto atomic_fetch_##name##_explicit(P obj, U arg, memory_order, int line = __builtin_LINE()) { \
    auto* a = ksa::raw(obj, true, line);                                                            \
    using T = decltype(a->v);                                                                       \
    T old = a->v, b = T(arg);                                                                       \
    a->v = T(expr);                                                                                 \
    return old;                                                                                     \
  }
KS_ATOMIC_RMW(add, old + b)
KS_ATOMIC_RMW(sub, old - b)
KS_ATOMIC_RMW(and, old & b)
KS_ATOMIC_RMW(or, old | b)
KS_ATOMIC_RMW(xor, old ^ b)
KS_ATOMIC_RMW(min, b < old ? b : old)
KS_ATOMIC_RMW(max, b > old ? b : old)
#undef KS_ATOMIC_RMW
}  // namespace metal
