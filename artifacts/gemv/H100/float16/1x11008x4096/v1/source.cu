    // layout nk, 4 warp(s), K split 2 way(s), R=1, VEC=2, MB=1.
    constexpr int MB = 1, VEC = 2, KS = 2;
    constexpr int OUT_TG = 2;
    const int M = X_shape[0];
    const int K = X_shape[1];
    const int N = W_shape[0];
    const int m0 = int(blockIdx.y) * MB;
    const int n_base = int(blockIdx.x) * OUT_TG;
    constexpr int R = 1;
    const int sg = int(threadIdx.x) / 32;
    const int lane = int(threadIdx.x) % 32;
    const int rg = sg / KS, kp = sg % KS;
    const int n0 = n_base + rg * R;
    float acc[MB][R];
#pragma unroll
    for (int i = 0; i < MB; ++i) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[i][r] = 0.0f;
        }
    }
    for (int k = (kp * 32 + lane) * VEC; k < K; k += KS * 32 * VEC) {
        float xv[MB][VEC];
#pragma unroll
        for (int i = 0; i < MB; ++i) {
            if (m0 + i < M) {
                {
                    const ks_vec<T, VEC> v = *reinterpret_cast<const ks_vec<T, VEC>*>(X + (m0 + i) * K + k);
                #pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        xv[i][e] = static_cast<float>(v.v[e]);
                    }
                }

            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    xv[i][e] = 0.0f;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (n0 + r < N) {
                float wv[VEC];
                {
                    const ks_vec<T, VEC> v = *reinterpret_cast<const ks_vec<T, VEC>*>(W + (size_t)(n0 + r) * K + k);
                #pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        wv[e] = static_cast<float>(v.v[e]);
                    }
                }

#pragma unroll
                for (int i = 0; i < MB; ++i) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        acc[i][r] = fmaf(wv[e], xv[i][e], acc[i][r]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MB; ++i) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                acc[i][r] += __shfl_xor_sync(0xffffffffu, acc[i][r], off);
            }
        }
    }
    // Partial sums of the KS warps of each output group meet in shared memory.
    __shared__ float part[4 * MB * R];
    if (lane == 0) {
        for (int i = 0; i < MB; ++i) {
            for (int r = 0; r < R; ++r) {
                part[(sg * MB + i) * R + r] = acc[i][r];
            }
        }
    }
    __syncthreads();
    if (kp != 0) {
        return;
    }
    for (int i = 0; i < MB; ++i) {
        for (int r = 0; r < R; ++r) {
            for (int p = 1; p < KS; ++p) {
                acc[i][r] += part[((sg + p) * MB + i) * R + r];
            }
        }
    }
    // Every lane holds the sums; lane (i * R + r) % 32 writes output (i, r).
#pragma unroll
    for (int i = 0; i < MB; ++i) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if ((i * R + r) % 32 == lane && m0 + i < M && n0 + r < N) {
                Y[(m0 + i) * N + n0 + r] = static_cast<T>(acc[i][r]);
            }
        }
    }
