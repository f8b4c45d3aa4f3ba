#include <cuda_fp16.h>
#include <cuda_bf16.h>
// kernsearch qmatvec MMA helpers
namespace ksq {
__device__ __forceinline__ unsigned int as_u32(__half2 v) { return *reinterpret_cast<unsigned int*>(&v); }
__device__ __forceinline__ unsigned int as_u32(__nv_bfloat162 v) { return *reinterpret_cast<unsigned int*>(&v); }
template <typename T> struct pair_of;
template <> struct pair_of<__half> { using type = __half2; static constexpr unsigned int MAGIC = 0x64006400u; };
template <> struct pair_of<__nv_bfloat16> { using type = __nv_bfloat162; static constexpr unsigned int MAGIC = 0x43004300u; };
template <typename T> __device__ __forceinline__ typename pair_of<T>::type from_u32(unsigned int u) {
  return *reinterpret_cast<typename pair_of<T>::type*>(&u);
}
// Two QB-bit fields of w (bits SHIFT.. and 16+SHIFT..) dequantized: q * s + b, exact q (magic-number trick).
template <typename T, int QB>
__device__ __forceinline__ unsigned int deq(unsigned int w, int shift, typename pair_of<T>::type s2, typename pair_of<T>::type b2) {
  constexpr unsigned int MASK = QB == 4 ? 0x000F000Fu : 0x00FF00FFu;
  const unsigned int bits = ((w >> shift) & MASK) | pair_of<T>::MAGIC;
  typename pair_of<T>::type q = __hsub2(from_u32<T>(bits), from_u32<T>(pair_of<T>::MAGIC));
  return as_u32(__hfma2(q, s2, b2));
}
template <typename T> __device__ __forceinline__ void mma16816(float* d, unsigned int a0, unsigned int a1, unsigned int a2,
    unsigned int a3, unsigned int b0, unsigned int b1);
template <> __device__ __forceinline__ void mma16816<__half>(float* d, unsigned int a0, unsigned int a1, unsigned int a2,
    unsigned int a3, unsigned int b0, unsigned int b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float* d, unsigned int a0, unsigned int a1, unsigned int a2,
    unsigned int a3, unsigned int b0, unsigned int b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
}  // namespace ksq
namespace ksq {
__device__ __forceinline__ float silu_mul(float gte, float up) { return gte / (1.0f + __expf(-gte)) * up; }
}
namespace ksq {
__device__ __forceinline__ unsigned int bits16(__half v) { return (unsigned int)__half_as_ushort(v); }
__device__ __forceinline__ unsigned int bits16(__nv_bfloat16 v) { return (unsigned int)__bfloat16_as_ushort(v); }
template <typename U> __device__ __forceinline__ unsigned int pack2(U s, U b) { return bits16(s) | (bits16(b) << 16); }
template <typename T2> __device__ __forceinline__ T2 lo2(unsigned int sb) { unsigned int u = __byte_perm(sb, sb, 0x1010); return *reinterpret_cast<T2*>(&u); }
template <typename T2> __device__ __forceinline__ T2 hi2(unsigned int sb) { unsigned int u = __byte_perm(sb, sb, 0x3232); return *reinterpret_cast<T2*>(&u); }
}
