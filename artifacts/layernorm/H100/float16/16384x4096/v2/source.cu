    // TG=512, 2 row(s) per block (256 threads each), VEC=8, UNROLL=2, row held in registers, simd reduction, float32 accumulation.
    constexpr int ROWS = 2, TPR = 256, VEC = 8, UNROLL = 2;
    constexpr int STEP = TPR * VEC;
    typedef float A;
    const int R = x_shape[0];
    const int N = x_shape[1];
    const int tid = int(threadIdx.x);
    const int sub = tid / TPR, lane = tid % TPR;
    const int row = int(blockIdx.x) * ROWS + sub;
    const int n = row < R ? N : 0;  // rows past the end: empty loops, barriers only
    const T* xr = x + static_cast<size_t>(row < R ? row : 0) * N;
    constexpr int SPR = TPR / 32;
    const int sg = tid / 32, slane = tid % 32;
    __shared__ A part0[ROWS * SPR];
    __shared__ A part1[ROWS * SPR];
    A sum = A(0.0f);
    T h[UNROLL][VEC];
    // Held row: the mean, then the variance around it (two reductions, no second read of x).
    for (int u = 0; u < UNROLL; ++u) {
        const int i = u * STEP + lane * VEC;
        T t[VEC];
        if (i < n) {
            {
                const ks_vec<T, 8> v_ = *reinterpret_cast<const ks_vec<T, 8>*>(xr + i);
            #pragma unroll
                for (int e = 0; e < 8; ++e) {
                    t[e] = v_.v[e];
                }
            }

        } else {
            for (int e = 0; e < VEC; ++e) {
                t[e] = T(0.0f);
            }
        }
        for (int e = 0; e < VEC; ++e) {
            h[u][e] = t[e];
            sum += A(t[e]);
        }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    if (slane == 0) {
        part0[sg] = sum;
    }
    __syncthreads();
    sum = part0[sub * SPR];
    #pragma unroll
    for (int k = 1; k < SPR; ++k) {
        sum += part0[sub * SPR + k];
    }

    const float mean = float(sum) / float(N);
    A sq = A(0.0f);
    for (int u = 0; u < UNROLL; ++u) {
        const int i = u * STEP + lane * VEC;
        if (i < n) {
            for (int e = 0; e < VEC; ++e) {
                const A d = A(float(h[u][e]) - mean);
                sq += d * d;
            }
        }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
    }
    if (slane == 0) {
        part1[sg] = sq;
    }
    __syncthreads();
    sq = part1[sub * SPR];
    #pragma unroll
    for (int k = 1; k < SPR; ++k) {
        sq += part1[sub * SPR + k];
    }

    const float inv = rsqrtf(float(sq) / float(N) + eps[0]);
    T* yr = y + static_cast<size_t>(row < R ? row : 0) * N;
    for (int u = 0; u < UNROLL; ++u) {
        const int i = u * STEP + lane * VEC;
        if (i < n) {
            T w_[VEC], b_[VEC], o[VEC];
            {
                const ks_vec<T, 8> v_ = *reinterpret_cast<const ks_vec<T, 8>*>(w + i);
            #pragma unroll
                for (int e = 0; e < 8; ++e) {
                    w_[e] = v_.v[e];
                }
            }

            {
                const ks_vec<T, 8> v_ = *reinterpret_cast<const ks_vec<T, 8>*>(b + i);
            #pragma unroll
                for (int e = 0; e < 8; ++e) {
                    b_[e] = v_.v[e];
                }
            }

            for (int e = 0; e < VEC; ++e) {
                o[e] = T((float(h[u][e]) - mean) * inv * float(w_[e]) + float(b_[e]));
            }
            {
                ks_vec<T, 8> v_;
            #pragma unroll
                for (int e = 0; e < 8; ++e) {
                    v_.v[e] = o[e];
                }
                *reinterpret_cast<ks_vec<T, 8>*>(yr + i) = v_;
            }

        }
    }
