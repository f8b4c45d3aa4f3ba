// kernsearch MSL shim: Metal Shading Language as C++ for the CPU interpreter.
//
// Each GPU thread is a cooperative fiber; barriers and simd collectives yield to a scheduler that
// resumes them once every participating thread has arrived. Threadgroups run one after another.
// Build modes: KS_CHECK (threadgroup race / uninitialised / bounds detector), KS_SANITIZE (ASan build,
// ucontext fibers, driver main). Never build with -ffast-math: NaN poisoning relies on IEEE NaNs.
#pragma once
// The hand-written context switch is ELF assembly for x86-64 and aarch64 Linux; elsewhere (and under
// AddressSanitizer, which understands swapcontext) fibers use ucontext.
#if defined(KS_SANITIZE) || defined(KS_FORCE_UCONTEXT) || !defined(__linux__) || \
    !(defined(__x86_64__) || defined(__aarch64__))
#define KS_UCONTEXT 1
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700
#endif
#include <ucontext.h>
#endif
// Only small headers: <cmath> / <string> / <vector> would triple the compile time of every variant.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <sys/mman.h>

#define device
#define constant
#define thread
#ifndef KS_CHECK
#define threadgroup
#endif
#define METAL_FUNC inline
#define metal_func inline

// ------------------------------------------------------------------------------------------------
// Scalar types
// ------------------------------------------------------------------------------------------------
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef _Float16 half;

struct bfloat {
  uint16_t bits;
  bfloat() = default;
  // constexpr (bit casts, not memcpy), so limits of bfloat are constant expressions (MLX's Limits<bfloat16_t>).
  static constexpr uint16_t round(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // keep NaN a NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
  template <class U, class = std::enable_if_t<std::is_arithmetic<U>::value || std::is_same<U, half>::value>>
  constexpr bfloat(U v) : bits(round(float(v))) {}
  constexpr operator float() const { return __builtin_bit_cast(float, uint32_t(bits) << 16); }
  template <class U> bfloat& operator+=(U o) { return *this = bfloat(float(*this) + float(o)); }
  template <class U> bfloat& operator-=(U o) { return *this = bfloat(float(*this) - float(o)); }
  template <class U> bfloat& operator*=(U o) { return *this = bfloat(float(*this) * float(o)); }
  template <class U> bfloat& operator/=(U o) { return *this = bfloat(float(*this) / float(o)); }
  constexpr bfloat operator-() const { bfloat r(0.0f); r.bits = uint16_t(bits ^ 0x8000); return r; }
};
typedef half float16_t;
typedef bfloat bfloat16_t;
typedef bfloat bfloat16;

// ------------------------------------------------------------------------------------------------
// Vector types: vec<T, N>, .x .y .z .w, multi-letter swizzles (rewritten to .template swv<...>() when read,
// .template swz<...>() when assigned to),
// MSL-style conversion constructors.
// ------------------------------------------------------------------------------------------------
template <class T, int N> struct vec;
template <class T, int N> struct vec_storage;
template <class T> struct vec_storage<T, 2> { union { T v[2]; struct { T x, y; }; struct { T r, g; }; }; };
template <class T> struct vec_storage<T, 3> { union { T v[4]; struct { T x, y, z; }; struct { T r, g, b; }; }; };
template <class T> struct vec_storage<T, 4> { union { T v[4]; struct { T x, y, z, w; }; struct { T r, g, b, a; }; }; };

template <class T> struct is_vec : std::false_type {};
template <class T, int N> struct is_vec<vec<T, N>> : std::true_type {};
template <class T> struct vec_size { static constexpr int value = 1; };
template <class T, int N> struct vec_size<vec<T, N>> { static constexpr int value = N; };

template <class T, int N, int... I> struct swizzle_ref;
template <class T, int N> struct packed_vec;
template <class T> struct is_packed : std::false_type {};
template <class T, int N> struct is_packed<packed_vec<T, N>> : std::true_type {};
template <class T, int N> struct vec_size<packed_vec<T, N>> { static constexpr int value = N; };

template <class T, int N>
struct alignas((N == 3 ? 4 : N) * sizeof(T)) vec : vec_storage<T, N> {
  using value_type = T;
  using vec_storage<T, N>::v;
  vec() = default;
  template <class U, class = std::enable_if_t<!is_vec<U>::value && std::is_constructible<T, U>::value>>
  vec(U s) { for (int i = 0; i < N; ++i) v[i] = T(s); }
  template <class U> explicit vec(const vec<U, N>& o) { for (int i = 0; i < N; ++i) v[i] = T(o.v[i]); }
  template <class U> explicit vec(const packed_vec<U, N>& o) { for (int i = 0; i < N; ++i) v[i] = T(o.v[i]); }
  template <class A, class B, class... R, class = std::enable_if_t<(sizeof...(R) + 2 <= N)>>
  vec(const A& a, const B& b, const R&... r) { int k = 0; put(k, a); put(k, b); (put(k, r), ...); }
  template <class U> void put(int& k, const U& s) {
    if constexpr (is_vec<U>::value || is_packed<U>::value) { for (int i = 0; i < vec_size<U>::value; ++i) v[k++] = T(s.v[i]); }
    else v[k++] = T(s);
  }
  T& operator[](int i) { return v[i]; }
  const T& operator[](int i) const { return v[i]; }
  // A swizzle that is assigned to (`v.xy = ...`, `v.xy += ...`) is a reference; every other swizzle is read as
  // a vector value, so it deduces as one in templates (`length(v.xy)`, `v.xy * s`, `all(b.xw)`).
  template <int... I> swizzle_ref<T, N, I...> swz() { return swizzle_ref<T, N, I...>{v}; }
  template <int... I> vec<T, sizeof...(I)> swz() const { return vec<T, sizeof...(I)>(v[I]...); }
  template <int... I> vec<T, sizeof...(I)> swv() const { return vec<T, sizeof...(I)>(v[I]...); }
#define KS_VEC_OPASSIGN(op)                                                                          \
  template <class U> vec& operator op##=(const U& o) {                                              \
    if constexpr (is_vec<U>::value) { for (int i = 0; i < N; ++i) v[i] = T(v[i] op o.v[i]); }       \
    else { for (int i = 0; i < N; ++i) v[i] = T(v[i] op o); }                                       \
    return *this;                                                                                   \
  }
  KS_VEC_OPASSIGN(+) KS_VEC_OPASSIGN(-) KS_VEC_OPASSIGN(*) KS_VEC_OPASSIGN(/) KS_VEC_OPASSIGN(%)
  KS_VEC_OPASSIGN(&) KS_VEC_OPASSIGN(|) KS_VEC_OPASSIGN(^) KS_VEC_OPASSIGN(<<) KS_VEC_OPASSIGN(>>)
#undef KS_VEC_OPASSIGN
  vec operator-() const { vec r; for (int i = 0; i < N; ++i) r.v[i] = T(-v[i]); return r; }
  vec operator+() const { return *this; }
  vec operator~() const { vec r; for (int i = 0; i < N; ++i) r.v[i] = T(~v[i]); return r; }
  vec<bool, N> operator!() const { vec<bool, N> r; for (int i = 0; i < N; ++i) r.v[i] = !v[i]; return r; }
};

// The components I of an N-element vector (aligned or packed) at p, assigned to.
template <class T, int N, int... I> struct swizzle_ref {
  T* p;
  operator vec<T, sizeof...(I)>() const { return vec<T, sizeof...(I)>(p[I]...); }
  swizzle_ref& operator=(const vec<T, sizeof...(I)>& o) { int k = 0; ((p[I] = o.v[k++]), ...); return *this; }
  template <class U, class = std::enable_if_t<!is_vec<U>::value>> swizzle_ref& operator=(const U& s) {
    return *this = vec<T, sizeof...(I)>(s);
  }
#define KS_SWZ_OPASSIGN(op)                                                                          \
  template <class U> swizzle_ref& operator op##=(const U& o) {                                      \
    vec<T, sizeof...(I)> cur(p[I]...); cur op##= o; return *this = cur;                             \
  }
  KS_SWZ_OPASSIGN(+) KS_SWZ_OPASSIGN(-) KS_SWZ_OPASSIGN(*) KS_SWZ_OPASSIGN(/) KS_SWZ_OPASSIGN(%)
  KS_SWZ_OPASSIGN(&) KS_SWZ_OPASSIGN(|) KS_SWZ_OPASSIGN(^) KS_SWZ_OPASSIGN(<<) KS_SWZ_OPASSIGN(>>)
#undef KS_SWZ_OPASSIGN
};

#define KS_VEC_BINOP(op)                                                                             \
  template <class T, int N, class U> auto operator op(const vec<T, N>& a, const U& b) {             \
    if constexpr (is_vec<U>::value || is_packed<U>::value) {                                        \
      vec<T, N> r; for (int i = 0; i < N; ++i) r.v[i] = T(a.v[i] op b.v[i]); return r;              \
    } else {                                                                                        \
      vec<T, N> r; for (int i = 0; i < N; ++i) r.v[i] = T(a.v[i] op b); return r;                   \
    }                                                                                               \
  }                                                                                                 \
  template <class U, class T, int N, class = std::enable_if_t<!is_vec<U>::value && !is_packed<U>::value>> \
  vec<T, N> operator op(const U& a, const vec<T, N>& b) {                                           \
    vec<T, N> r; for (int i = 0; i < N; ++i) r.v[i] = T(a op b.v[i]); return r;                     \
  }
KS_VEC_BINOP(+) KS_VEC_BINOP(-) KS_VEC_BINOP(*) KS_VEC_BINOP(/) KS_VEC_BINOP(%) KS_VEC_BINOP(&) KS_VEC_BINOP(|)
KS_VEC_BINOP(^) KS_VEC_BINOP(<<) KS_VEC_BINOP(>>)
#undef KS_VEC_BINOP
// Comparisons and logical operators are element-wise and give a boolN (MSL), for any / all / select.
#define KS_VEC_CMP(op)                                                                               \
  template <class T, int N, class U> vec<bool, N> operator op(const vec<T, N>& a, const U& b) {     \
    vec<bool, N> r;                                                                                 \
    if constexpr (is_vec<U>::value || is_packed<U>::value) { for (int i = 0; i < N; ++i) r.v[i] = a.v[i] op b.v[i]; } \
    else { for (int i = 0; i < N; ++i) r.v[i] = a.v[i] op b; }                                      \
    return r;                                                                                       \
  }                                                                                                 \
  template <class U, class T, int N, class = std::enable_if_t<!is_vec<U>::value && !is_packed<U>::value>> \
  vec<bool, N> operator op(const U& a, const vec<T, N>& b) {                                        \
    vec<bool, N> r; for (int i = 0; i < N; ++i) r.v[i] = a op b.v[i]; return r;                     \
  }
KS_VEC_CMP(<) KS_VEC_CMP(>) KS_VEC_CMP(<=) KS_VEC_CMP(>=) KS_VEC_CMP(==) KS_VEC_CMP(!=) KS_VEC_CMP(&&)
KS_VEC_CMP(||)
#undef KS_VEC_CMP

#define KS_VEC_TYPES(T, name)                                                                        \
  typedef vec<T, 2> name##2;                                                                        \
  typedef vec<T, 3> name##3;                                                                        \
  typedef vec<T, 4> name##4;
KS_VEC_TYPES(float, float) KS_VEC_TYPES(half, half) KS_VEC_TYPES(bfloat, bfloat) KS_VEC_TYPES(int, int)
KS_VEC_TYPES(uint, uint) KS_VEC_TYPES(short, short) KS_VEC_TYPES(ushort, ushort) KS_VEC_TYPES(bool, bool)
KS_VEC_TYPES(char, char) KS_VEC_TYPES(uchar, uchar) KS_VEC_TYPES(long, long) KS_VEC_TYPES(unsigned long, ulong)
#undef KS_VEC_TYPES
// Packed vectors: no padding (packed_float3 is 12 bytes), the same members, swizzles and arithmetic as the aligned
// vector (arithmetic gives an aligned vector), converting to and from it.
template <class T, int N> struct packed_storage;
template <class T> struct packed_storage<T, 2> { union { T v[2]; struct { T x, y; }; struct { T r, g; }; }; };
template <class T> struct packed_storage<T, 3> { union { T v[3]; struct { T x, y, z; }; struct { T r, g, b; }; }; };
template <class T> struct packed_storage<T, 4> { union { T v[4]; struct { T x, y, z, w; }; struct { T r, g, b, a; }; }; };
template <class T, int N> struct packed_vec : packed_storage<T, N> {
  using value_type = T;
  using packed_storage<T, N>::v;
  packed_vec() = default;
  template <class U> packed_vec(const vec<U, N>& o) { for (int i = 0; i < N; ++i) v[i] = T(o.v[i]); }
  template <class U> packed_vec(const packed_vec<U, N>& o) { for (int i = 0; i < N; ++i) v[i] = T(o.v[i]); }
  template <class A, class... R, class = std::enable_if_t<!is_vec<A>::value && !is_packed<A>::value>>
  packed_vec(const A& a, const R&... r) : packed_vec(vec<T, N>(a, r...)) {}
  operator vec<T, N>() const { vec<T, N> r; for (int i = 0; i < N; ++i) r.v[i] = v[i]; return r; }
  T& operator[](int i) { return v[i]; }
  const T& operator[](int i) const { return v[i]; }
  template <int... I> swizzle_ref<T, N, I...> swz() { return swizzle_ref<T, N, I...>{v}; }
  template <int... I> vec<T, sizeof...(I)> swz() const { return vec<T, sizeof...(I)>(v[I]...); }
  template <int... I> vec<T, sizeof...(I)> swv() const { return vec<T, sizeof...(I)>(v[I]...); }
  template <class U> packed_vec& operator+=(const U& o) { return *this = packed_vec(vec<T, N>(*this) + o); }
  template <class U> packed_vec& operator-=(const U& o) { return *this = packed_vec(vec<T, N>(*this) - o); }
  template <class U> packed_vec& operator*=(const U& o) { return *this = packed_vec(vec<T, N>(*this) * o); }
  template <class U> packed_vec& operator/=(const U& o) { return *this = packed_vec(vec<T, N>(*this) / o); }
  vec<T, N> operator-() const { return -vec<T, N>(*this); }
};
#define KS_PACKED_BINOP(op)                                                                          \
  template <class T, int N, class U> auto operator op(const packed_vec<T, N>& a, const U& b) {      \
    return vec<T, N>(a) op b;                                                                       \
  }                                                                                                 \
  template <class U, class T, int N, class = std::enable_if_t<!is_vec<U>::value && !is_packed<U>::value>> \
  auto operator op(const U& a, const packed_vec<T, N>& b) { return a op vec<T, N>(b); }
KS_PACKED_BINOP(+) KS_PACKED_BINOP(-) KS_PACKED_BINOP(*) KS_PACKED_BINOP(/) KS_PACKED_BINOP(%) KS_PACKED_BINOP(&)
KS_PACKED_BINOP(|) KS_PACKED_BINOP(^) KS_PACKED_BINOP(<) KS_PACKED_BINOP(>) KS_PACKED_BINOP(<=) KS_PACKED_BINOP(>=)
KS_PACKED_BINOP(==) KS_PACKED_BINOP(!=)
#undef KS_PACKED_BINOP
// An aligned vector for either kind (the geometric and math functions take it).
template <class V> inline auto unpacked(const V& x) {
  if constexpr (is_packed<V>::value) return vec<typename V::value_type, vec_size<V>::value>(x);
  else return x;
}
#define KS_PACKED(T, name) typedef packed_vec<T, 2> packed_##name##2; typedef packed_vec<T, 3> packed_##name##3; \
  typedef packed_vec<T, 4> packed_##name##4;
KS_PACKED(float, float) KS_PACKED(half, half) KS_PACKED(int, int) KS_PACKED(uint, uint) KS_PACKED(short, short)
KS_PACKED(ushort, ushort) KS_PACKED(char, char) KS_PACKED(uchar, uchar) KS_PACKED(bfloat, bfloat)
KS_PACKED(long, long) KS_PACKED(unsigned long, ulong) KS_PACKED(bool, bool)
#undef KS_PACKED

// ------------------------------------------------------------------------------------------------
// Runtime: fibers, scheduler, diagnostics
// ------------------------------------------------------------------------------------------------
namespace ks {

enum DiagKind { D_DIVERGENCE = 1, D_INACTIVE_LANE, D_PARTIAL_SIMD, D_TG_LIMIT, D_RACE, D_UNINIT, D_TG_BOUNDS, D_PARTIAL_COLLECTIVE,
                D_SIMD_SYNC };
enum Severity { S_ERROR = 0, S_WARNING = 1 };

struct Diag { int32_t kind, severity, line, count; char msg[232]; };
struct DiagTable { int32_t n, max; Diag* d; };

// W_YIELD: at a device atomic in a persistent launch (ks_pool), giving the other threadgroups their turn.
enum WaitKind { W_NONE = 0, W_BARRIER, W_SIMD, W_DONE, W_STEP, W_YIELD };

#ifdef KS_CHECK
// Lockstep builds (the check-mode translation): a thread's place in the program, compared lexicographically
// between the lanes of a simdgroup. One word per enclosing loop (outermost first: the loop's first line, then
// its iteration) and a last word (line, then the count of accesses made on that line since the line or the
// iteration changed): a lane inside a loop is behind a lane past it, and a lane in iteration i is behind one in
// iteration i + 1 of the same loop, whatever their lines.
constexpr int KS_POS_WORDS = 5;
constexpr int KS_MAX_LOOPS = 64;
constexpr int KS_LINE_SHIFT = 44;
struct Pos {
  uint64_t w[KS_POS_WORDS];
};
inline bool pos_less(const Pos& a, const Pos& b) {
  for (int k = 0; k < KS_POS_WORDS; ++k)
    if (a.w[k] != b.w[k]) return a.w[k] < b.w[k];
  return false;
}
inline bool pos_equal(const Pos& a, const Pos& b) { return std::memcmp(a.w, b.w, sizeof a.w) == 0; }
// A loop of the kernel (found by the translator): its line span and the loop it is nested in (-1: none).
struct LoopInfo { int start, end, parent; };
#endif

struct Fiber;
typedef void (*CollectiveOp)(Fiber** lanes, int n, Fiber* self_or_null);

struct Fiber {
#ifdef KS_UCONTEXT
  ucontext_t uc;
#else
  void* sp;
#endif
  char* stack;
  int tid;       // index in threadgroup
  int lane, sg;  // lane in simdgroup, simdgroup index
  int wait;      // WaitKind
  int line;      // call site of the current wait
  CollectiveOp op;
  const void* in[4];
  void* out;
  int arg;       // shuffle source lane, etc.
  int ok;        // collective result flag
#ifdef KS_CHECK
  Pos pos;        // where the thread stands (lockstep builds): at its pending access, collective or barrier
  Pos others_min; // while it runs: the least place of the other live lanes of its simdgroup
  int last_line;  // line of its last access or loop step
  uint64_t seq;   // accesses made on last_line
  bool ticked;    // a loop stepped since its last access
  int nostep;     // > 0: accesses do not synchronise (inside an operation the whole simdgroup performs)
  uint64_t it[KS_MAX_LOOPS];  // iteration of each loop of the kernel
#endif
};

struct Launch;
typedef void (*ThreadMain)(Launch* L, Fiber* f);

struct TgAlloc { int line; int64_t offset, bytes, elems; int elem_size; const char* name; };

// Per threadgroup-memory element (check mode): last writer and its place, last reader (-2: several threads; r_sg
// their simdgroup, -2 when several), barrier and simdgroup-barrier epochs.
struct Shadow { int32_t writer, reader, r_sg, w_line, r_line; uint32_t w_epoch, r_epoch, w_sepoch, r_sepoch; uint64_t w_where; };

struct Launch {
  // inputs
  void** args;
  uint32_t grid[3], tgsize[3];
  int64_t tg_limit;
  int32_t stack_kb;
  DiagTable* diags;
  // state
  ThreadMain main;
  Fiber* fibers;
  int nthreads;
  uint32_t tgext[3], tgcount[3], cur_tg[3];
  char* arena;
  int64_t arena_cap, arena_used;
  TgAlloc allocs[64];
  int nallocs;
  bool over_limit_reported;
  uint32_t epoch;
  uint32_t sepoch[64];
  Shadow* shadow;  // one per arena byte-element slot (allocated per element of each allocation)
  int64_t shadow_cap, shadow_dirty;
  bool detect;     // check mode: the race / uninitialised / bounds detector runs (off: fast mode in lockstep)
#ifdef KS_UCONTEXT
  ucontext_t sched_uc;
#else
  void* sched_sp;
#endif
};

extern Launch* L;
extern Fiber* cur;
extern bool pool_yield;  // a persistent launch: threads yield at atomics (ks_runtime.inc, ks_pool)

inline void report(int kind, int severity, int line, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
inline void report(int kind, int severity, int line, const char* fmt, ...) {
  DiagTable* t = L->diags;
  for (int i = 0; i < t->n; ++i)
    if (t->d[i].kind == kind && t->d[i].line == line) { t->d[i].count++; return; }
  if (t->n >= t->max) return;
  Diag& d = t->d[t->n++];
  d.kind = kind; d.severity = severity; d.line = line; d.count = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d.msg, sizeof d.msg, fmt, ap);
  va_end(ap);
}

// ---- context switch ------------------------------------------------------------------------------
#ifndef KS_UCONTEXT
extern "C" void ks_switch(void** save_sp, void* to_sp);
#endif

inline void yield_to_scheduler() {
#ifdef KS_UCONTEXT
  swapcontext(&cur->uc, &L->sched_uc);
#else
  ks_switch(&cur->sp, L->sched_sp);
#endif
}

#ifdef KS_CHECK
}  // namespace ks
// Written by the translator into each lockstep build: the kernel's loops and, per line, its innermost loop.
extern const ks::LoopInfo ks_loop_info[];
extern const int ks_loop_count;
extern const int16_t ks_line_loop[];
extern const int ks_line_count;
extern const uint8_t ks_sync_line[];
namespace ks {
constexpr uint64_t KS_COUNT_MASK = (uint64_t(1) << KS_LINE_SHIFT) - 1;
// Every threadgroup access synchronises (a rerun after check mode found lanes passing values on lines the
// translator had not marked), and whether such an access was found in this run.
extern bool sync_all, unsynced_conflict;
// Some line synchronises (or all do): lanes are scheduled in lockstep and places are kept (else, as in plain builds,
// threads run one after another).
extern bool lockstep_active;
inline bool synced(int line) { return sync_all || (line >= 0 && line < ks_line_count && ks_sync_line[line]); }

// The place of thread `f` at an access, collective or barrier on `line` (see Pos).
void place(Fiber* f, int line);
// The condition of loop `id` is evaluated (the translator adds this to each loop): its next iteration, or
// iteration 0 when the thread comes from outside the loop.
bool tick_now(int id);
constexpr bool tick(int id) { return __builtin_is_constant_evaluated() ? true : tick_now(id); }
// Wait, at an access on a synchronising line, until no other live lane of the simdgroup is behind this one.
void step_at(Fiber* f, int line);

// An access of threadgroup memory on `line`: the lanes of a simdgroup make their accesses in lockstep, as the
// hardware does. The thread goes on at once unless another live lane of its simdgroup is behind it; else it
// waits until the scheduler has brought those lanes to its place. Only lines where the translator found an array
// that lanes may pass values through between barriers synchronise (ks_sync_line): elsewhere the order of the
// lanes cannot change a result, and running them one after another is cheaper.
inline void step(int line) {
  Fiber* f = cur;
  if (f != nullptr && !f->nostep && synced(line)) step_at(f, line);
}
// Accesses made inside an operation the whole simdgroup performs (matmul2d) do not synchronise.
struct no_step {
  no_step() { if (cur) cur->nostep++; }
  ~no_step() { if (cur) cur->nostep--; }
};
}  // namespace ks
namespace ks {
#endif

inline void wait_here(int kind, int line) {
#ifdef KS_CHECK
  if (lockstep_active) place(cur, line);
#endif
  cur->wait = kind;
  cur->line = line;
  yield_to_scheduler();
}

}  // namespace ks

// ------------------------------------------------------------------------------------------------
// Threadgroup memory
// ------------------------------------------------------------------------------------------------
namespace ks {
inline void* tg_alloc(int64_t bytes, int64_t elems, int elem_size, const char* name, int line) {
  for (int i = 0; i < L->nallocs; ++i)
    if (L->allocs[i].line == line && std::strcmp(L->allocs[i].name, name) == 0) return L->arena + L->allocs[i].offset;
  int64_t off = (L->arena_used + 63) & ~int64_t(63);
  if (L->nallocs >= 64 || off + bytes > L->arena_cap) {
    report(D_TG_LIMIT, S_ERROR, line, "threadgroup memory: arena exhausted (%lld bytes requested)", (long long)(off + bytes));
    std::fflush(stderr);
    std::_Exit(86);
  }
  L->allocs[L->nallocs++] = TgAlloc{line, off, bytes, elems, elem_size, name};
  L->arena_used = off + bytes;
  std::memset(L->arena + off, 0xff, bytes);  // poison: all-ones bytes are NaN in float, half and bfloat
  int64_t total = 0;
  for (int i = 0; i < L->nallocs; ++i) total += L->allocs[i].bytes;
  if (total > L->tg_limit && !L->over_limit_reported) {
    L->over_limit_reported = true;
    report(D_TG_LIMIT, S_ERROR, line, "threadgroup memory %lld bytes exceeds the chip's %lld bytes",
           (long long)total, (long long)L->tg_limit);
  }
  return L->arena + off;
}
}  // namespace ks

#ifdef KS_CHECK
namespace ks {
// Checked threadgroup pointer: every element access goes through the race / uninitialised / bounds
// detector. Indices carry the caller's line through a converting constructor's default argument.
struct idx {
  int64_t v;
  int line;
  template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
  idx(I i, int l = __builtin_LINE()) : v(int64_t(i)), line(l) {}
};

inline Shadow* shadow_for(const TgAlloc* a, int64_t i) {
  return L->shadow + (a->offset / 1) + i;  // shadow indexed by arena byte offset + element (elements >= 1 byte)
}

inline bool ordered_by_simd_barrier(int other, uint32_t other_sepoch) {
  int other_sg = other / 32;
  return other >= 0 && other_sg == cur->sg && L->sepoch[cur->sg] != other_sepoch;
}

// A hash of the current thread's place: two lanes writing one element at the same place did so in one instruction.
uint64_t where_now();
// One element `i` of the declared array, read or written by the current thread (the race detector; runtime).
void tg_check(const TgAlloc* a, int64_t i, bool write, int line);

// Element `i` of type T through a pointer to the array (T may differ from the declared element type after a
// cast, `(threadgroup float4*) shmem`: every declared element the access covers is checked).
template <class T> inline T* tg_access(const TgAlloc* a, int64_t i, bool write, int line, T* dummy) {
  step(line);
  const int64_t es = a->elem_size, first = i * int64_t(sizeof(T)) / es, last = ((i + 1) * int64_t(sizeof(T)) - 1) / es;
  if (i < 0 || last >= a->elems) {
    if (L->detect)
      report(D_TG_BOUNDS, S_ERROR, line, "threadgroup index %lld outside %s[0:%lld]", (long long)i, a->name, (long long)a->elems);
    return dummy;
  }
  if (L->detect)
    for (int64_t k = first; k <= last; ++k) tg_check(a, k, write, line);
  return reinterpret_cast<T*>(L->arena + a->offset) + i;
}

template <class T> struct tgptr;

template <class T> struct tgref {
  const TgAlloc* a;
  int64_t i;
  int line;
  T load() const { T d; std::memset((void*)&d, 0xff, sizeof d); return *tg_access<T>(a, i, false, line, &d); }
  template <class U, class = std::enable_if_t<std::is_convertible<T, U>::value || std::is_constructible<U, T>::value>>
  operator U() const { return U(load()); }
  template <class U> tgref& operator=(const U& v) { T d; *tg_access<T>(a, i, true, line, &d) = T(v); return *this; }
  tgref& operator=(const tgref& o) { return *this = o.load(); }
  template <class U> tgref& operator+=(const U& v) { return *this = T(load() + v); }
  template <class U> tgref& operator-=(const U& v) { return *this = T(load() - v); }
  template <class U> tgref& operator*=(const U& v) { return *this = T(load() * v); }
  template <class U> tgref& operator/=(const U& v) { return *this = T(load() / v); }
  template <class U> tgref& operator%=(const U& v) { return *this = T(load() % v); }
  template <class U> tgref& operator&=(const U& v) { return *this = T(load() & v); }
  template <class U> tgref& operator|=(const U& v) { return *this = T(load() | v); }
  template <class U> tgref& operator^=(const U& v) { return *this = T(load() ^ v); }
  template <class U> tgref& operator<<=(const U& v) { return *this = T(load() << v); }
  template <class U> tgref& operator>>=(const U& v) { return *this = T(load() >> v); }
  tgref& operator++() { return *this = T(load() + 1); }
  tgref& operator--() { return *this = T(load() - 1); }
  T operator++(int) { T old = load(); *this = T(old + 1); return old; }
  T operator--(int) { T old = load(); *this = T(old - 1); return old; }
  tgptr<T> operator&() const { return tgptr<T>{a, i}; }
  // A component of a threadgroup vector element (`tile[t][1]`, `buf[r][c][k]`): read or written as the element.
  template <class V = T, class = std::enable_if_t<is_vec<V>::value || is_packed<V>::value>>
  auto operator[](int k) const;
  // Swizzles of a threadgroup vector element (`tile[t].xy`): a read checks the element; tgswizzle writes.
  template <int... I> auto swv() const { return load().template swv<I...>(); }
  template <int... I> auto swz() const;
};
#define KS_TGREF_BINOP(op)                                                                           \
  template <class T, class U> auto operator op(const tgref<T>& r, const U& u) { return r.load() op u; } \
  template <class T, class U, class = std::enable_if_t<!std::is_same<U, tgref<T>>::value>>          \
  auto operator op(const U& u, const tgref<T>& r) { return u op r.load(); }
KS_TGREF_BINOP(+) KS_TGREF_BINOP(-) KS_TGREF_BINOP(*) KS_TGREF_BINOP(/) KS_TGREF_BINOP(<) KS_TGREF_BINOP(>)
KS_TGREF_BINOP(<=) KS_TGREF_BINOP(>=) KS_TGREF_BINOP(==) KS_TGREF_BINOP(!=)
KS_TGREF_BINOP(%) KS_TGREF_BINOP(&) KS_TGREF_BINOP(|) KS_TGREF_BINOP(^) KS_TGREF_BINOP(<<) KS_TGREF_BINOP(>>)
#undef KS_TGREF_BINOP
template <class T> struct is_tgref : std::false_type {};
template <class T> struct is_tgref<tgref<T>> : std::true_type {};
// `s += tile[k]` with a thread-local s: the element is loaded (and checked) once.
#define KS_TGREF_OPASSIGN(op)                                                                        \
  template <class A, class T, class = std::enable_if_t<!is_tgref<A>::value>>                        \
  A& operator op##=(A& a, const tgref<T>& r) { return a op##= r.load(); }
KS_TGREF_OPASSIGN(+) KS_TGREF_OPASSIGN(-) KS_TGREF_OPASSIGN(*) KS_TGREF_OPASSIGN(/) KS_TGREF_OPASSIGN(&)
KS_TGREF_OPASSIGN(|) KS_TGREF_OPASSIGN(^)
#undef KS_TGREF_OPASSIGN

template <class T> struct tgptr {
  const TgAlloc* a = nullptr;
  int64_t off = 0;
  tgref<T> operator[](idx i) const { return tgref<T>{a, off + i.v, i.line}; }
  tgref<T> operator*() const { return tgref<T>{a, off, __LINE__}; }
  tgptr operator+(int64_t d) const { return tgptr{a, off + d}; }
  tgptr operator-(int64_t d) const { return tgptr{a, off - d}; }
  tgptr& operator+=(int64_t d) { off += d; return *this; }
  tgptr& operator-=(int64_t d) { off -= d; return *this; }
  tgptr& operator++() { ++off; return *this; }
  bool operator==(const tgptr& o) const { return a == o.a && off == o.off; }
  bool operator!=(const tgptr& o) const { return !(*this == o); }
  // Range-for over a threadgroup array (`for (float x : buf)`): every element read is checked.
  struct iterator {
    const TgAlloc* a;
    int64_t i;
    tgref<T> operator*() const { return tgref<T>{a, i, __LINE__}; }
    iterator& operator++() { ++i; return *this; }
    bool operator!=(const iterator& o) const { return i != o.i; }
  };
  iterator begin() const { return iterator{a, off}; }
  iterator end() const { return iterator{a, a ? a->elems : off}; }
};

// A threadgroup element in check mode, as the kernel uses it (translate() wraps each `name[i]...` it finds):
// rd(e) where it is read (a checked load, then a plain value, which templates, `select`, `dot`, unary
// operators and `auto` take as in fast mode), wr(e) where a member or component of it is assigned (`s[t].a =`,
// `v4[t].x =`: a write of the element, not a read of its other members), rw(e) for a compound assignment of a
// member. An element assigned directly (`tile[t] = ...`, `+=`, `++`) stays a tgref. Anything that is not a
// threadgroup element (a name the rewrite could not tell apart) passes through unchanged.
template <class T> inline T rd(const tgref<T>& r) { return r.load(); }
template <class T> inline T& wr(const tgref<T>& r) {
  alignas(T) static unsigned char dummy[sizeof(T)];  // written instead of memory outside the array
  return *tg_access<T>(r.a, r.i, true, r.line, reinterpret_cast<T*>(dummy));
}
template <class T> inline T& rw(const tgref<T>& r) { (void)r.load(); return wr(r); }
template <class T, class = std::enable_if_t<!is_tgref<std::decay_t<T>>::value>> inline T&& rd(T&& x) { return static_cast<T&&>(x); }
template <class T, class = std::enable_if_t<!is_tgref<std::decay_t<T>>::value>> inline T&& wr(T&& x) { return static_cast<T&&>(x); }
template <class T, class = std::enable_if_t<!is_tgref<std::decay_t<T>>::value>> inline T&& rw(T&& x) { return static_cast<T&&>(x); }
// Components of a threadgroup vector element assigned through a swizzle (`tile[t].xy = ...`, `+=`): a plain
// assignment records a write of the element without reading it; a compound one reads it first.
template <class V, int... I> struct tgswizzle {
  tgref<V> r;
  using W = vec<typename V::value_type, int(sizeof...(I))>;
  tgswizzle& operator=(const W& o) { V d; V* p = tg_access<V>(r.a, r.i, true, r.line, &d); int k = 0; ((p->v[I] = o.v[k++]), ...); return *this; }
  template <class U, class = std::enable_if_t<!is_vec<U>::value>> tgswizzle& operator=(const U& s) { return *this = W(s); }
#define KS_TGSWZ_OPASSIGN(op)                                                                        \
  template <class U> tgswizzle& operator op##=(const U& o) { W cur = r.load().template swv<I...>(); cur op##= o; return *this = cur; }
  KS_TGSWZ_OPASSIGN(+) KS_TGSWZ_OPASSIGN(-) KS_TGSWZ_OPASSIGN(*) KS_TGSWZ_OPASSIGN(/) KS_TGSWZ_OPASSIGN(%)
  KS_TGSWZ_OPASSIGN(&) KS_TGSWZ_OPASSIGN(|) KS_TGSWZ_OPASSIGN(^) KS_TGSWZ_OPASSIGN(<<) KS_TGSWZ_OPASSIGN(>>)
#undef KS_TGSWZ_OPASSIGN
};
template <class T> template <int... I> auto tgref<T>::swz() const { return tgswizzle<T, I...>{*this}; }
template <class V> struct tgcomp {
  tgref<V> r;
  int k;
  using E = typename V::value_type;
  operator E() const { return r.load().v[k]; }
  tgcomp& operator=(const E& x) { V d; tg_access<V>(r.a, r.i, true, r.line, &d)->v[k] = x; return *this; }
  template <class U, class = std::enable_if_t<!std::is_same<U, E>::value>> tgcomp& operator=(const U& x) { return *this = E(x); }
  tgcomp& operator=(const tgcomp& o) { return *this = E(o); }
  template <class U> tgcomp& operator+=(const U& x) { return *this = E(E(*this) + x); }
  template <class U> tgcomp& operator-=(const U& x) { return *this = E(E(*this) - x); }
  template <class U> tgcomp& operator*=(const U& x) { return *this = E(E(*this) * x); }
  template <class U> tgcomp& operator/=(const U& x) { return *this = E(E(*this) / x); }
};
template <class T> template <class V, class> auto tgref<T>::operator[](int k) const { return tgcomp<T>{*this, k}; }
template <int I, class V> inline auto comp(V& v) -> decltype(v.v[I]) { return v.v[I]; }

// A multi-dimensional threadgroup array (`threadgroup T a[R][C];`): indexing narrows to rows; every element
// access is checked against the whole array (a column index past its row lands in the next row, as on the GPU).
template <class T, int64_t... D> struct tgmd;
template <class T, int64_t D0> struct tgmd<T, D0> {
  tgptr<T> p;
  tgptr<T> operator[](idx i) const { return p + i.v * D0; }
};
template <class T, int64_t D0, int64_t D1> struct tgmd<T, D0, D1> {
  tgptr<T> p;
  tgmd<T, D1> operator[](idx i) const { return tgmd<T, D1>{p + i.v * D0 * D1}; }
};

// An atomic operation on threadgroup memory: bounds and uninitialised reads are checked; atomics never race
// with each other, but they are recorded as writes, so a plain access by another thread before the next
// barrier is still a race.
template <class T> inline T* tg_atomic(const TgAlloc* a, int64_t i, bool write, int line) {
  static T dummy;
  step(line);
  if (!L->detect) return a == nullptr || i < 0 || i >= a->elems ? &dummy : reinterpret_cast<T*>(L->arena + a->offset) + i;
  if (a == nullptr || i < 0 || i >= a->elems) {
    report(D_TG_BOUNDS, S_ERROR, line, "threadgroup atomic index %lld outside %s[0:%lld]", (long long)i,
           a ? a->name : "?", a ? (long long)a->elems : 0LL);
    return &dummy;
  }
  Shadow* s = shadow_for(a, i);
  if (!write && s->w_epoch == 0)
    report(D_UNINIT, S_ERROR, line, "atomic load of never-written threadgroup memory %s[%lld] by thread %d", a->name,
           (long long)i, cur->tid);
  if (write) { s->writer = cur->tid; s->w_epoch = L->epoch; s->w_sepoch = L->sepoch[cur->sg]; s->w_where = where_now(); s->w_line = line; }
  return reinterpret_cast<T*>(L->arena + a->offset) + i;
}

// `(threadgroup U*) p` / `reinterpret_cast<threadgroup U*>(p)` of a checked pointer: the same array viewed as U.
template <class U, class T> inline tgptr<U> tg_cast(const tgptr<T>& p) {
  return tgptr<U>{p.a, p.off * int64_t(sizeof(T)) / int64_t(sizeof(U))};
}
template <class U, class T> inline tgptr<U> tg_cast(const tgref<T>& r) { return tg_cast<U>(&r); }  // (U*)&x[i]
template <class T> inline tgptr<T> tg_alloc_checked(int64_t elems, const char* name, int line) {
  void* p = tg_alloc(elems * int64_t(sizeof(T)), elems, int(sizeof(T)), name, line);
  (void)p;
  for (int k = 0; k < L->nallocs; ++k)
    if (L->allocs[k].line == line && std::strcmp(L->allocs[k].name, name) == 0) return tgptr<T>{&L->allocs[k], 0};
  return tgptr<T>{};
}
}  // namespace ks
#define threadgroup
#endif  // KS_CHECK

// ------------------------------------------------------------------------------------------------
// Barriers and simd collectives
// ------------------------------------------------------------------------------------------------
namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

inline void threadgroup_barrier(mem_flags = mem_flags::mem_none, int line = __builtin_LINE()) {
  ks::wait_here(ks::W_BARRIER, line);
}

namespace ksd {
inline void noop_op(ks::Fiber**, int, ks::Fiber*) {}
}
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none, int line = __builtin_LINE()) {
  ks::cur->op = ksd::noop_op;
  ks::wait_here(ks::W_SIMD, line);
}

namespace ksd {
template <class V, int K> void reduce_op(ks::Fiber** lanes, int n, ks::Fiber*) {
  V acc = *static_cast<const V*>(lanes[0]->in[0]);
  for (int i = 1; i < n; ++i) {
    V x = *static_cast<const V*>(lanes[i]->in[0]);
    if constexpr (K == 0) acc = V(acc + x);
    else if constexpr (K == 1) acc = x > acc ? x : acc;
    else if constexpr (K == 2) acc = x < acc ? x : acc;
    else if constexpr (K == 3) acc = V(acc * x);
  }
  for (int i = 0; i < n; ++i) *static_cast<V*>(lanes[i]->out) = acc;
}
template <class V, bool Exclusive> void prefix_op(ks::Fiber** lanes, int n, ks::Fiber*) {
  V acc = V(0);
  for (int i = 0; i < n; ++i) {
    V x = *static_cast<const V*>(lanes[i]->in[0]);
    if (Exclusive) { *static_cast<V*>(lanes[i]->out) = acc; acc = V(acc + x); }
    else { acc = V(acc + x); *static_cast<V*>(lanes[i]->out) = acc; }
  }
}
// arg: 0 shuffle (absolute lane), 1 xor, 2 up, 3 down, 4 broadcast
template <class V, int K> void shuffle_op(ks::Fiber** lanes, int n, ks::Fiber*) {
  for (int i = 0; i < n; ++i) {
    int me = lanes[i]->lane, src;
    if (K == 0 || K == 4) src = lanes[i]->arg;
    else if (K == 1) src = me ^ lanes[i]->arg;
    else if (K == 2) src = me - lanes[i]->arg;
    else src = me + lanes[i]->arg;
    const ks::Fiber* from = nullptr;
    for (int j = 0; j < n; ++j) if (lanes[j]->lane == src) from = lanes[j];
    if ((K == 2 || K == 3) && (src < 0 || src >= 32)) from = lanes[i];  // up/down keep own value at the edge
    if (!from) {
      ks::report(ks::D_INACTIVE_LANE, ks::S_ERROR, lanes[i]->line,
                 "simd shuffle/broadcast in lane %d reads lane %d, which is not active here", me, src);
      from = lanes[i];
    }
    *static_cast<V*>(lanes[i]->out) = *static_cast<const V*>(from->in[0]);
  }
}
template <class V> inline V collective(ks::CollectiveOp op, const V& x, int arg, int line) {
  V r = x;
  ks::cur->op = op;
  ks::cur->in[0] = &x;
  ks::cur->out = &r;
  ks::cur->arg = arg;
  ks::wait_here(ks::W_SIMD, line);
  return r;
}
}  // namespace ksd

template <class V> V simd_sum(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::reduce_op<V, 0>, x, 0, line); }
template <class V> V simd_max(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::reduce_op<V, 1>, x, 0, line); }
template <class V> V simd_min(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::reduce_op<V, 2>, x, 0, line); }
template <class V> V simd_product(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::reduce_op<V, 3>, x, 0, line); }
template <class V> V simd_prefix_inclusive_sum(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::prefix_op<V, false>, x, 0, line); }
template <class V> V simd_prefix_exclusive_sum(V x, int line = __builtin_LINE()) { return ksd::collective(ksd::prefix_op<V, true>, x, 0, line); }
template <class V> V simd_shuffle(V x, ushort l, int line = __builtin_LINE()) { return ksd::collective(ksd::shuffle_op<V, 0>, x, l, line); }
template <class V> V simd_shuffle_xor(V x, ushort m, int line = __builtin_LINE()) { return ksd::collective(ksd::shuffle_op<V, 1>, x, m, line); }
template <class V> V simd_shuffle_up(V x, ushort d, int line = __builtin_LINE()) { return ksd::collective(ksd::shuffle_op<V, 2>, x, d, line); }
template <class V> V simd_shuffle_down(V x, ushort d, int line = __builtin_LINE()) { return ksd::collective(ksd::shuffle_op<V, 3>, x, d, line); }
template <class V> V simd_broadcast(V x, ushort l, int line = __builtin_LINE()) { return ksd::collective(ksd::shuffle_op<V, 4>, x, l, line); }

// ------------------------------------------------------------------------------------------------
// simdgroup_matrix<T, 8, 8>: each lane holds (row, col) and (row, col + 1) in MLX steel's layout.
// ------------------------------------------------------------------------------------------------
namespace ksd {
inline int frag_row(int l) { int q = l / 4; return (q & 4) + (l / 2) % 4; }
inline int frag_col(int l) { int q = l / 4; return (q & 2) * 2 + (l % 2) * 2; }
}  // namespace ksd

template <class T, int R, int C> struct simdgroup_matrix {
  static_assert(R == 8 && C == 8, "the interpreter supports 8x8 simdgroup_matrix only");
  vec<T, 2> e;
  vec<T, 2>& thread_elements() { return e; }
  const vec<T, 2>& thread_elements() const { return e; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int R, int C> simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, R, C> m;
  m.e = vec<T, 2>(v);
  return m;
}

namespace ksd {
template <class T> void mma_op(ks::Fiber** lanes, int n, ks::Fiber*) {
  if (n != 32) {
    ks::report(ks::D_PARTIAL_SIMD, ks::S_ERROR, lanes[0]->line,
               "simdgroup_matrix multiply-accumulate with %d of 32 lanes active (partial simdgroup)", n);
    return;
  }
  float a[8][8], b[8][8], c[8][8];
  for (int i = 0; i < n; ++i) {
    int l = lanes[i]->lane, r = frag_row(l), cc = frag_col(l);
    for (int k = 0; k < 2; ++k) {
      a[r][cc + k] = float(static_cast<const simdgroup_matrix<T, 8, 8>*>(lanes[i]->in[0])->e.v[k]);
      b[r][cc + k] = float(static_cast<const simdgroup_matrix<T, 8, 8>*>(lanes[i]->in[1])->e.v[k]);
      c[r][cc + k] = float(static_cast<const simdgroup_matrix<T, 8, 8>*>(lanes[i]->in[2])->e.v[k]);
    }
  }
  for (int i = 0; i < n; ++i) {
    int l = lanes[i]->lane, r = frag_row(l), cc = frag_col(l);
    auto* d = static_cast<simdgroup_matrix<T, 8, 8>*>(lanes[i]->out);
    for (int k = 0; k < 2; ++k) {
      float s = c[r][cc + k];
      for (int j = 0; j < 8; ++j) s = __builtin_fmaf(a[r][j], b[j][cc + k], s);
      d->e.v[k] = T(s);
    }
  }
}
}  // namespace ksd

template <class T>
void simdgroup_multiply_accumulate(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<T, 8, 8>& a,
                                   const simdgroup_matrix<T, 8, 8>& b, const simdgroup_matrix<T, 8, 8>& c,
                                   int line = __builtin_LINE()) {
  simdgroup_matrix<T, 8, 8> ca = a, cb = b, cc = c, r = c;
  ks::cur->op = ksd::mma_op<T>;
  ks::cur->in[0] = &ca; ks::cur->in[1] = &cb; ks::cur->in[2] = &cc;
  ks::cur->out = &r;
  ks::wait_here(ks::W_SIMD, line);
  d = r;
}
template <class T>
void simdgroup_multiply(simdgroup_matrix<T, 8, 8>& d, const simdgroup_matrix<T, 8, 8>& a,
                        const simdgroup_matrix<T, 8, 8>& b, int line = __builtin_LINE()) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<T, 8, 8>(T(0)), line);
}

template <class T, class P>
void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, P src, unsigned long elements_per_row = 8,
                    ulong2 origin = ulong2(0), bool transpose = false) {
  int l = ks::cur->lane, r = ksd::frag_row(l), c = ksd::frag_col(l);
  for (int k = 0; k < 2; ++k) {
    long row = r, col = c + k;
    if (transpose) { long t = row; row = col; col = t; }
    m.e.v[k] = T(src[(row + long(origin.v[1])) * long(elements_per_row) + col + long(origin.v[0])]);
  }
}
template <class T, class P>
void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, P dst, unsigned long elements_per_row = 8,
                     ulong2 origin = ulong2(0), bool transpose = false) {
  int l = ks::cur->lane, r = ksd::frag_row(l), c = ksd::frag_col(l);
  for (int k = 0; k < 2; ++k) {
    long row = r, col = c + k;
    if (transpose) { long t = row; row = col; col = t; }
    dst[(row + long(origin.v[1])) * long(elements_per_row) + col + long(origin.v[0])] = m.e.v[k];
  }
}

// ------------------------------------------------------------------------------------------------
// Math (metal::, metal::fast::, metal::precise::), element-wise on vectors
// ------------------------------------------------------------------------------------------------
template <class U, class V> inline U as_type(const V& v) {
  static_assert(sizeof(U) == sizeof(V), "as_type needs equal sizes");
  U u;
  std::memcpy((void*)&u, (const void*)&v, sizeof u);
  return u;
}

#define KS_UNARY(name, fn)                                                                           \
  template <class T> inline auto name(const T& x) {                                                 \
    if constexpr (is_packed<T>::value) {                                                            \
      return name(unpacked(x));                                                                     \
    } else if constexpr (is_vec<T>::value) {                                                        \
      T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = name(x.v[i]); return r;            \
    } else {                                                                                        \
      return T(fn(float(x)));                                                                       \
    }                                                                                               \
  }
KS_UNARY(exp, __builtin_expf) KS_UNARY(exp2, __builtin_exp2f) KS_UNARY(log, __builtin_logf)
KS_UNARY(log2, __builtin_log2f) KS_UNARY(sqrt, __builtin_sqrtf) KS_UNARY(sin, __builtin_sinf)
KS_UNARY(cos, __builtin_cosf) KS_UNARY(tanh, __builtin_tanhf) KS_UNARY(floor, __builtin_floorf)
KS_UNARY(ceil, __builtin_ceilf) KS_UNARY(round, __builtin_roundf) KS_UNARY(trunc, __builtin_truncf)
KS_UNARY(fabs, __builtin_fabsf) KS_UNARY(erf, __builtin_erff) KS_UNARY(log1p, __builtin_log1pf)
KS_UNARY(expm1, __builtin_expm1f) KS_UNARY(tan, __builtin_tanf)
KS_UNARY(exp10, [](float v) { return __builtin_powf(10.0f, v); })
KS_UNARY(rsqrt, [](float v) { return 1.0f / __builtin_sqrtf(v); })
#undef KS_UNARY
template <class T> inline T abs(const T& x) {
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = abs(x.v[i]); return r; }
  else return x < T(0) ? T(-x) : x;
}
template <class T> inline bool isnan(const T& x) { return __builtin_isnan(float(x)); }
template <class T> inline bool isinf(const T& x) { return __builtin_isinf(float(x)); }
template <class T> inline bool isfinite(const T& x) { return __builtin_isfinite(float(x)); }
template <class T, class U> inline T max(const T& a, const U& b) {
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = max(a.v[i], T(b).v[i]); return r; }
  else { T bb = T(b); return __builtin_isnan(float(a)) ? bb : (__builtin_isnan(float(bb)) ? a : (a < bb ? bb : a)); }
}
template <class T, class U> inline T min(const T& a, const U& b) {
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = min(a.v[i], T(b).v[i]); return r; }
  else { T bb = T(b); return __builtin_isnan(float(a)) ? bb : (__builtin_isnan(float(bb)) ? a : (bb < a ? bb : a)); }
}
template <class T, class U> inline T fmax(const T& a, const U& b) { return max(a, b); }
template <class T, class U> inline T fmin(const T& a, const U& b) { return min(a, b); }
template <class T, class U, class V> inline T clamp(const T& x, const U& lo, const V& hi) { return min(max(x, lo), hi); }
template <class T, class U> inline T pow(const T& a, const U& b) { return T(__builtin_powf(float(a), float(b))); }
template <class T, class U> inline T powr(const T& a, const U& b) { return T(__builtin_powf(float(a), float(b))); }
template <class T> inline T fma(const T& a, const T& b, const T& c) {
  if constexpr (is_vec<T>::value) { T r; for (int i = 0; i < vec_size<T>::value; ++i) r.v[i] = fma(a.v[i], b.v[i], c.v[i]); return r; }
  else if constexpr (std::is_same<T, float>::value) return __builtin_fmaf(a, b, c);
  else return T(__builtin_fmaf(float(a), float(b), float(c)));
}
template <class T, class U, class V, class = std::enable_if_t<!(std::is_same<T, U>::value && std::is_same<T, V>::value)>>
inline auto fma(const T& a, const U& b, const V& c) { using R = std::common_type_t<float, T>; return fma(R(a), R(b), R(c)); }
template <class T, int N> inline T dot(const vec<T, N>& a, const vec<T, N>& b) {
  T s = T(0);
  for (int i = 0; i < N; ++i) s = T(s + a.v[i] * b.v[i]);
  return s;
}
template <class T> inline T select(const T& a, const T& b, bool c) { return c ? b : a; }
template <class T> inline T mix(const T& a, const T& b, const T& t) { return a + (b - a) * t; }
template <class T> inline T precise_divide(const T& a, const T& b) { return a / b; }
template <class T> inline T divide(const T& a, const T& b) { return a / b; }

namespace fast {
using metal::exp; using metal::exp2; using metal::log; using metal::log2; using metal::sqrt; using metal::rsqrt;
using metal::max; using metal::min; using metal::tanh; using metal::sin; using metal::cos; using metal::pow;
using metal::divide; using metal::abs; using metal::fabs;
}  // namespace fast
namespace precise {
using metal::exp; using metal::exp2; using metal::log; using metal::log2; using metal::sqrt; using metal::rsqrt;
using metal::max; using metal::min; using metal::tanh; using metal::sin; using metal::cos; using metal::pow;
using metal::divide; using metal::abs; using metal::fabs;
}  // namespace precise

template <class T> struct numeric_limits {
  static constexpr bool is_integer = std::is_integral<T>::value;
  static constexpr bool is_signed = !std::is_integral<T>::value || std::is_signed<T>::value;
  static constexpr int bits = int(sizeof(T)) * 8;
  static constexpr T max() {
    if constexpr (std::is_same<T, bool>::value) return true;
    else if constexpr (is_integer) return is_signed ? T((1ull << (bits - 1)) - 1) : T(~0ull);
    else if constexpr (std::is_same<T, half>::value) return T(65504.0f);
    else if constexpr (std::is_same<T, bfloat>::value) return T(0x1.fep127f);
    else return T(0x1.fffffep127f);
  }
  static constexpr T lowest() {
    if constexpr (std::is_same<T, bool>::value) return false;
    else if constexpr (is_integer) return is_signed ? T(-(long long)((1ull << (bits - 1)) - 1) - 1) : T(0);
    else return T(-float(max()));
  }
  static constexpr T min() {  // smallest positive normal for floats, like C++
    if constexpr (is_integer) return lowest();
    else if constexpr (std::is_same<T, half>::value) return T(0x1p-14f);
    else return T(0x1p-126f);
  }
  static constexpr T epsilon() {
    if constexpr (is_integer) return T(0);
    else if constexpr (std::is_same<T, half>::value) return T(0x1p-10f);
    else if constexpr (std::is_same<T, bfloat>::value) return T(0x1p-7f);
    else return T(0x1p-23f);
  }
  static constexpr T infinity() { return T(__builtin_inff()); }
  static constexpr T quiet_NaN() { return T(__builtin_nanf("")); }
  static constexpr T denorm_min() { return std::is_same<T, half>::value ? T(0x1p-24f) : T(0x1p-149f); }
};
}  // namespace metal

using metal::mem_flags;

#include "ks_atomic.h"
#include "ks_math.h"
#include "ks_matrix.h"
#include "ks_simd.h"
#include "ks_mlx.h"

// ------------------------------------------------------------------------------------------------
// The scheduler (one definition per kernel object; the kernel TU defines KS_RUNTIME_IMPL)
// ------------------------------------------------------------------------------------------------
#ifdef KS_RUNTIME_IMPL
#include "ks_runtime.inc"
#endif
