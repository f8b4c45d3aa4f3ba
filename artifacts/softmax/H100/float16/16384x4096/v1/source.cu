    // TG=64, 1 row(s) per block (64 threads each), VEC=4, UNROLL=16, row held in threadgroup, simd reduction, three pass(es) for max and sum.
    constexpr int ROWS = 1, TPR = 64, VEC = 4, UNROLL = 16;
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
    A m = -3.0e38f;  // the running maximum (finite: rows past the end give __expf(0) * 0)
    A s = A(0.0f);
    __shared__ T rows_tg[ROWS * UNROLL * STEP];
    T* h = rows_tg + sub * (UNROLL * STEP);
    for (int u = 0; u < UNROLL; ++u) {
        const int i = u * STEP + lane * VEC;
        T t[VEC];
        if (i < n) {
            {
                const ks_vec<T, 4> v_ = *reinterpret_cast<const ks_vec<T, 4>*>(xr + i);
            #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    t[e] = v_.v[e];
                }
            }

            for (int e = 0; e < VEC; ++e) {
                m = fmaxf(m, A(t[e]));
            }
        } else {
            for (int e = 0; e < VEC; ++e) {
                t[e] = T(0.0f);
            }
        }
        for (int e = 0; e < VEC; ++e) {
            h[i + e] = t[e];
        }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    if (slane == 0) {
        part0[sg] = m;
    }
    __syncthreads();
    m = part0[sub * SPR];
    #pragma unroll
    for (int k = 1; k < SPR; ++k) {
        m = fmaxf(m, part0[sub * SPR + k]);
    }

    for (int u = 0; u < UNROLL; ++u) {
        const int i = u * STEP + lane * VEC;
        if (i < n) {
            for (int e = 0; e < VEC; ++e) {
                s += __expf(A(h[i + e]) - m);
            }
        }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    if (slane == 0) {
        part1[sg] = s;
    }
    __syncthreads();
    s = part1[sub * SPR];
    #pragma unroll
    for (int k = 1; k < SPR; ++k) {
        s += part1[sub * SPR + k];
    }

    const A inv = 1.0f / s;
    T* yr = y + static_cast<size_t>(row < R ? row : 0) * N;
    for (int u = 0; u < UNROLL; ++u) {
        const int i = u * STEP + lane * VEC;
        if (i < n) {
            T o[VEC];
            for (int e = 0; e < VEC; ++e) {
                o[e] = T(__expf(A(h[i + e]) - m) * inv);
            }
            {
                ks_vec<T, 4> v_;
            #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    v_.v[e] = o[e];
                }
                *reinterpret_cast<ks_vec<T, 4>*>(yr + i) = v_;
            }

        }
    }
