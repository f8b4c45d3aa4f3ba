    // Tile 16x64x32, 4x4 warps, scalar micro-tile, staged: AB, VEC=4 (cp.async), double buffer: on, B layout: t, pad: 4.
    constexpr int BM = 16, BN = 64, BK = 32;
    constexpr int WN = 4;
    constexpr int SG_M = 4, SG_N = 16;
    constexpr int THREADS = 512;
    constexpr int VEC = 4;
    constexpr int LDA = BK + 8;
    constexpr int LDB = BK + 8;
    constexpr int TM = 1, TN = 2;

    const int M = A_shape[0];
    const int K = A_shape[1];
    const int N = B_shape[0];
    const int row0 = int(blockIdx.y) * BM;
    const int col0 = int(blockIdx.x) * BN;
    const int tid = int(threadIdx.x);
    const int warp = int(threadIdx.x) / 32;
    const int lane = int(threadIdx.x) % 32;
    const int sg_row = (warp / WN) * SG_M;
    const int sg_col = (warp % WN) * SG_N;

    extern __shared__ __align__(128) unsigned char ks_smem[];
    constexpr int A_TILE = BM * LDA;
    T* As = reinterpret_cast<T*>(ks_smem);
    constexpr int B_TILE = BN * LDB;
    T* Bs = reinterpret_cast<T*>(ks_smem) + 2 * A_TILE;

    // 4 x 8 threads per warp; thread (tr, tc) owns rows tr + 4i and columns tc + 8j of the warp's tile.
    const int tr = lane / 8, tc = lane % 8;
    float acc[TM][TN];
    for (int i = 0; i < TM; ++i) {
        for (int j = 0; j < TN; ++j) {
            acc[i][j] = 0.0f;
        }
    }

    // Double buffering: step kt computes from one tile pair while step kt+1 is copied into the other;
    // one barrier per step (it also guarantees nobody still reads the buffer about to be refilled).
    const int num_k = (K + BK - 1) / BK;
    // A tile [BM][LDA] <- A[row0 : row0+BM, 0 : 0+BK], 4 element(s) per copy, zeros outside A.
    for (int i = tid * VEC; i < BM * BK; i += THREADS * VEC) {
        const int r = i / BK, c = i % BK;
        const int gr = row0 + r, gk = 0 + c;
        const bool inside = gr < M && gk < K;
        ks_copy_async(&As[r * LDA + c], inside ? (const void*)(A + gr * K + gk) : (const void*)A, inside);
    }
    // B tile [BN][LDB] (column-major k x n) <- B^T[col0 : col0+BN, 0 : 0+BK], 4 element(s) per copy along K.
    for (int i = tid * VEC; i < BN * BK; i += THREADS * VEC) {
        const int c = i / BK, r = i % BK;
        const int gn = col0 + c, gk = 0 + r;
        const bool inside = gn < N && gk < K;
        ks_copy_async(&Bs[c * LDB + r], inside ? (const void*)(B + gn * K + gk) : (const void*)A, inside);
    }
    ks_copy_commit();

    for (int kt = 0; kt < num_k; ++kt) {
        const int k0 = kt * BK;
        ks_copy_wait();
        __syncthreads();
        const T* As_cur = As + (kt & 1) * A_TILE;
        T* As_next = As + ((kt + 1) & 1) * A_TILE;
        const T* Bs_cur = Bs + (kt & 1) * B_TILE;
        T* Bs_next = Bs + ((kt + 1) & 1) * B_TILE;
        if (kt + 1 < num_k) {
            // A tile [BM][LDA] <- A[row0 : row0+BM, (k0 + BK) : (k0 + BK)+BK], 4 element(s) per copy, zeros outside A.
            for (int i = tid * VEC; i < BM * BK; i += THREADS * VEC) {
                const int r = i / BK, c = i % BK;
                const int gr = row0 + r, gk = (k0 + BK) + c;
                const bool inside = gr < M && gk < K;
                ks_copy_async(&As_next[r * LDA + c], inside ? (const void*)(A + gr * K + gk) : (const void*)A, inside);
            }
            // B tile [BN][LDB] (column-major k x n) <- B^T[col0 : col0+BN, (k0 + BK) : (k0 + BK)+BK], 4 element(s) per copy along K.
            for (int i = tid * VEC; i < BN * BK; i += THREADS * VEC) {
                const int c = i / BK, r = i % BK;
                const int gn = col0 + c, gk = (k0 + BK) + r;
                const bool inside = gn < N && gk < K;
                ks_copy_async(&Bs_next[c * LDB + r], inside ? (const void*)(B + gn * K + gk) : (const void*)A, inside);
            }
            ks_copy_commit();

        }
        // Multiply-accumulate this K step on the thread's TM x TN micro-tile.
        for (int kk = 0; kk < BK; ++kk) {
            float a_val[TM];
            float b_val[TN];
            for (int i = 0; i < TM; ++i) {
                const int r = sg_row + tr + i * 4;
                a_val[i] = static_cast<float>(As_cur[r * LDA + kk]);
            }
            for (int j = 0; j < TN; ++j) {
                const int c = sg_col + tc + j * 8;
                b_val[j] = static_cast<float>(Bs_cur[(c) * LDB + (kk)]);
            }
            for (int i = 0; i < TM; ++i) {
                for (int j = 0; j < TN; ++j) {
                    acc[i][j] = fmaf(a_val[i], b_val[j], acc[i][j]);
                }
            }
        }

    }

    // Write C, guarded at the ragged edges; float32 accumulators are rounded to T once.
    for (int i = 0; i < TM; ++i) {
        for (int j = 0; j < TN; ++j) {
            const int r = row0 + sg_row + tr + i * 4;
            const int c = col0 + sg_col + tc + j * 8;
            if (r < M && c < N) {
                C[r * N + c] = static_cast<T>(acc[i][j]);
            }
        }
    }
