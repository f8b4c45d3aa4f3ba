    // Tile 16x64x16, 1x1 warps, WMMA 16x16x16 tensor cores, staged: AB, VEC=2 (cp.async), double buffer: off, B layout: t, pad: 0.
    constexpr int BM = 16, BN = 64, BK = 16;
    constexpr int WN = 1;
    constexpr int SG_M = 16, SG_N = 64;
    constexpr int THREADS = 32;
    constexpr int VEC = 2;
    constexpr int LDA = BK + 0;
    constexpr int LDB = BK + 0;
    constexpr int WF_M = 1, WF_N = 4;

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
    T* Bs = reinterpret_cast<T*>(ks_smem) + A_TILE;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[WF_M][WF_N];
    for (int i = 0; i < WF_M; ++i) {
        for (int j = 0; j < WF_N; ++j) {
            wmma::fill_fragment(acc[i][j], 0.0f);
        }
    }

    for (int k0 = 0; k0 < K; k0 += BK) {
        // A tile [BM][LDA] <- A[row0 : row0+BM, k0 : k0+BK], 2 element(s) per copy, zeros outside A.
        for (int i = tid * VEC; i < BM * BK; i += THREADS * VEC) {
            const int r = i / BK, c = i % BK;
            const int gr = row0 + r, gk = k0 + c;
            const bool inside = gr < M && gk < K;
            ks_copy_async(&As[r * LDA + c], inside ? (const void*)(A + gr * K + gk) : (const void*)A, inside);
        }
        // B tile [BN][LDB] (column-major k x n) <- B^T[col0 : col0+BN, k0 : k0+BK], 2 element(s) per copy along K.
        for (int i = tid * VEC; i < BN * BK; i += THREADS * VEC) {
            const int c = i / BK, r = i % BK;
            const int gn = col0 + c, gk = k0 + r;
            const bool inside = gn < N && gk < K;
            ks_copy_async(&Bs[c * LDB + r], inside ? (const void*)(B + gn * K + gk) : (const void*)A, inside);
        }
        ks_copy_commit();

        ks_copy_wait();
        __syncthreads();
        // Multiply-accumulate this K step with WMMA 16x16x16 fragments (1 x 4 per warp).
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a_frag[WF_M];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b_frag[WF_N];
            for (int i = 0; i < WF_M; ++i) {
                wmma::load_matrix_sync(a_frag[i], As + (sg_row + i * 16) * LDA + kk, LDA);
            }
            for (int j = 0; j < WF_N; ++j) {
                wmma::load_matrix_sync(b_frag[j], Bs + (sg_col + j * 16) * LDB + kk, LDB);
            }
            for (int i = 0; i < WF_M; ++i) {
                for (int j = 0; j < WF_N; ++j) {
                    wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
                }
            }
        }

        __syncthreads();
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
