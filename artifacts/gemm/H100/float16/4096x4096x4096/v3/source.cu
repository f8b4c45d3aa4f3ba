    // Tile 128x64x32, 2x2 warps, WMMA 16x16x16 tensor cores, staged: AB, VEC=4 (cp.async), double buffer: on, B layout: n, pad: 4.
    constexpr int BM = 128, BN = 64, BK = 32;
    constexpr int WN = 2;
    constexpr int SG_M = 64, SG_N = 32;
    constexpr int THREADS = 128;
    constexpr int VEC = 4;
    constexpr int LDA = BK + 8;
    constexpr int LDB = BN + 8;
    constexpr int WF_M = 4, WF_N = 2;

    const int M = A_shape[0];
    const int K = A_shape[1];
    const int N = B_shape[1];
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
    constexpr int B_TILE = BK * LDB;
    T* Bs = reinterpret_cast<T*>(ks_smem) + 2 * A_TILE;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[WF_M][WF_N];
    for (int i = 0; i < WF_M; ++i) {
        for (int j = 0; j < WF_N; ++j) {
            wmma::fill_fragment(acc[i][j], 0.0f);
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
    // B tile [BK][LDB] <- B[0 : 0+BK, col0 : col0+BN] (row-major B), 4 element(s) per copy along N.
    for (int i = tid * VEC; i < BK * BN; i += THREADS * VEC) {
        const int r = i / BN, c = i % BN;
        const int gk = 0 + r, gn = col0 + c;
        const bool inside = gk < K && gn < N;
        ks_copy_async(&Bs[r * LDB + c], inside ? (const void*)(B + gk * N + gn) : (const void*)A, inside);
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
            // B tile [BK][LDB] <- B[(k0 + BK) : (k0 + BK)+BK, col0 : col0+BN] (row-major B), 4 element(s) per copy along N.
            for (int i = tid * VEC; i < BK * BN; i += THREADS * VEC) {
                const int r = i / BN, c = i % BN;
                const int gk = (k0 + BK) + r, gn = col0 + c;
                const bool inside = gk < K && gn < N;
                ks_copy_async(&Bs_next[r * LDB + c], inside ? (const void*)(B + gk * N + gn) : (const void*)A, inside);
            }
            ks_copy_commit();

        }
        // Multiply-accumulate this K step with WMMA 16x16x16 fragments (4 x 2 per warp).
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a_frag[WF_M];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b_frag[WF_N];
            for (int i = 0; i < WF_M; ++i) {
                wmma::load_matrix_sync(a_frag[i], As_cur + (sg_row + i * 16) * LDA + kk, LDA);
            }
            for (int j = 0; j < WF_N; ++j) {
                wmma::load_matrix_sync(b_frag[j], Bs_cur + kk * LDB + sg_col + j * 16, LDB);
            }
            for (int i = 0; i < WF_M; ++i) {
                for (int j = 0; j < WF_N; ++j) {
                    wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
                }
            }
        }

    }

    // Write C, guarded at the ragged edges; float32 accumulators are rounded to T once.
    // Each warp rounds its fragments through its own 16x16 float scratch in the (now free) shared memory.
    __syncthreads();
    float* scratch = reinterpret_cast<float*>(ks_smem) + warp * 256;
    for (int i = 0; i < WF_M; ++i) {
        for (int j = 0; j < WF_N; ++j) {
            wmma::store_matrix_sync(scratch, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                const int r = row0 + sg_row + i * 16 + e / 16;
                const int c = col0 + sg_col + j * 16 + e % 16;
                if (r < M && c < N) {
                    C[r * N + c] = static_cast<T>(scratch[e]);
                }
            }
            __syncwarp();
        }
    }
