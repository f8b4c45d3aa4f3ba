// kernsearch gemm (CUDA): C[M,N] = A[M,K] · B[K,N], float32 accumulation.
#include <mma.h>
namespace wmma = nvcuda::wmma;

// Asynchronous 8-byte global -> shared copy (sm_80+); zero-fills the destination when !inside.
__device__ __forceinline__ void ks_copy_async(void* dst, const void* src, bool inside) {
    const unsigned int s = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n"
                 :: "r"(s), "l"(src), "r"(inside ? 8 : 0));
}
__device__ __forceinline__ void ks_copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void ks_copy_wait() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
