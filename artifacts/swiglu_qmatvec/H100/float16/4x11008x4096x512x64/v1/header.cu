// kernsearch swiglu_qmatvec (CUDA, mma): 4-bit affine quantization, MLX's layout; TW=1 KS=4 RT=2 UNROLL=2 MB=8.
namespace ksq {
template <typename U> struct pair_of;
template <> struct pair_of<__half> { using type = __half2; static constexpr unsigned int MAGIC = 0x64006400u; };
template <> struct pair_of<__nv_bfloat16> { using type = __nv_bfloat162; static constexpr unsigned int MAGIC = 0x43004300u; };
template <> struct pair_of<float> { using type = float2; static constexpr unsigned int MAGIC = 0u; };
template <typename P> __device__ __forceinline__ P as_pair(unsigned int u) { return *reinterpret_cast<P*>(&u); }
template <typename P> __device__ __forceinline__ unsigned int as_u32(P v) { return *reinterpret_cast<unsigned int*>(&v); }
// The fields at bits SH.. and 16+SH.. of w as a half2 (bf162) pair, dequantized: q * s + b (q exact).
template <typename U, int QB>
__device__ __forceinline__ unsigned int deq2(unsigned int w, int sh, typename pair_of<U>::type s2, typename pair_of<U>::type b2) {
    using P = typename pair_of<U>::type;
    constexpr unsigned int MASK = QB == 4 ? 0x000F000Fu : 0x00FF00FFu;
    const P q = __hsub2(as_pair<P>(((w >> sh) & MASK) | pair_of<U>::MAGIC), as_pair<P>(pair_of<U>::MAGIC));
    return as_u32(__hfma2(q, s2, b2));
}
__device__ __forceinline__ void mma16816(float* d, const unsigned int* a, unsigned int b0, unsigned int b1, __half) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(float* d, const unsigned int* a, unsigned int b0, unsigned int b1, __nv_bfloat16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float field(unsigned int w, int sh, unsigned int mask) {
    return __uint_as_float(((w >> sh) & mask) | 0x4B000000u) - 8388608.0f;  // exact: 2^23 + q, minus 2^23
}
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + __expf(-g)) * u; }
}  // namespace ksq
