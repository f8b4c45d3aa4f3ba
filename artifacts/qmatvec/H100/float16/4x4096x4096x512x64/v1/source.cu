    constexpr int TW = 1, KS = 4, RT = 2, UNROLL = 2, MB = 8;
    constexpr int QB = 4;
    constexpr int VPW = 32 / QB;   // values per uint32 word
    constexpr int VPC = 4 * VPW;   // values per 16-byte chunk
    constexpr unsigned int MASK = 0xFu;
    const int M = X_shape[0];
    const int K = X_shape[1];
    const int N = W_shape[0];
    const int KW = W_shape[1];
    const int NG = S_shape[1];
    const int G = K / NG;
    const int CH = KW / 4;                 // 16-byte chunks per row (K is a multiple of 32: whole chunks)
    const int STEPS = (CH + 3) / 4;        // a step: four chunks of a row, one per thread of a quad
    const int lane = int(threadIdx.x) & 31;
    const int warp = int(threadIdx.x) >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int tw = warp % TW, ks = warp / TW;
    const int row_base = (int(blockIdx.x) * TW + tw) * (16 * RT);
    using P = typename ksq::pair_of<T>::type;
    constexpr int MT = MB / 8;             // tensor-core column tiles of X's rows
    constexpr int PPW = VPW / 2;           // field pairs per word
    float acc[1][RT][MT][4];
#pragma unroll
    for (int a = 0; a < 1; ++a)
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int e = 0; e < MT * 4; ++e) {
                acc[a][rt][e / 4][e % 4] = 0.0f;
            }
    for (int s0 = ks * UNROLL; s0 < STEPS; s0 += KS * UNROLL) {
        uint4 wv[1][UNROLL][RT][2];
        T sc[1][UNROLL][RT][2], bi[1][UNROLL][RT][2];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int chunk = (s0 + u) * 4 + c;
            const bool ok = chunk < CH;
            const int grp = ok ? chunk * VPC / G : 0;  // a chunk never straddles a group (G >= 32 >= VPC)
#pragma unroll
            for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = min(row_base + rt * 16 + g + 8 * h, N - 1);  // rows past N: read, never written
                    wv[0][u][rt][h] = ok ? __ldg(reinterpret_cast<const uint4*>(W) + (size_t)row * CH + chunk) : make_uint4(0u, 0u, 0u, 0u);
                    sc[0][u][rt][h] = S[(size_t)row * NG + grp];
                    bi[0][u][rt][h] = Bq[(size_t)row * NG + grp];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int chunk = (s0 + u) * 4 + c;
            const bool ok = chunk < CH;   // past K: zero x, so the chunk adds nothing
            // X's fragments: for rows m = g + 8 mt, the value pairs (k, k + VPW/2) this thread's fields pair up.
            unsigned int xp[MT][2 * VPW];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int m = g + 8 * mt;
                const bool live = ok && m < M;
#pragma unroll
                for (int wd = 0; wd < 4; ++wd) {
                    const uint4 xv = live ? *reinterpret_cast<const uint4*>(X + (size_t)m * K + chunk * VPC + wd * 8) : make_uint4(0u, 0u, 0u, 0u);
                    xp[mt][wd * 4 + 0] = __byte_perm(xv.x, xv.z, 0x5410);
                    xp[mt][wd * 4 + 1] = __byte_perm(xv.x, xv.z, 0x7632);
                    xp[mt][wd * 4 + 2] = __byte_perm(xv.y, xv.w, 0x5410);
                    xp[mt][wd * 4 + 3] = __byte_perm(xv.y, xv.w, 0x7632);
                }
            }
#pragma unroll
            for (int rt = 0; rt < RT; ++rt) {
#pragma unroll
                for (int a = 0; a < 1; ++a) {
                    const unsigned int* w0 = reinterpret_cast<const unsigned int*>(&wv[a][u][rt][0]);
                    const unsigned int* w1 = reinterpret_cast<const unsigned int*>(&wv[a][u][rt][1]);
                    const P s0 = P{sc[a][u][rt][0], sc[a][u][rt][0]}, b0 = P{bi[a][u][rt][0], bi[a][u][rt][0]};
                    const P s1 = P{sc[a][u][rt][1], sc[a][u][rt][1]}, b1 = P{bi[a][u][rt][1], bi[a][u][rt][1]};
#pragma unroll
                    for (int j = 0; j < VPW; ++j) {  // k16 steps of this chunk: fragment slots (2c, 2c+1) and (2c+8, 2c+9)
                        const int p0 = 2 * j, p1 = 2 * j + 1;
                        const unsigned int frag[4] = {
                            ksq::deq2<T, QB>(w0[p0 / PPW], QB * (p0 % PPW), s0, b0),
                            ksq::deq2<T, QB>(w1[p0 / PPW], QB * (p0 % PPW), s1, b1),
                            ksq::deq2<T, QB>(w0[p1 / PPW], QB * (p1 % PPW), s0, b0),
                            ksq::deq2<T, QB>(w1[p1 / PPW], QB * (p1 % PPW), s1, b1)};
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            ksq::mma16816(acc[a][rt][mt], frag, xp[mt][p0], xp[mt][p1], T());
                        }
                    }
                }
            }
        }
    }
    // K parts meet in shared memory, added in a fixed order (deterministic)
    __shared__ float part[768];
    if (ks > 0) {
        float* p = part + (size_t)(((ks - 1) * TW + tw) * 32 + lane) * 8;
#pragma unroll
        for (int a = 0; a < 1; ++a)
#pragma unroll
            for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    p[(a * RT + rt) * 4 + e] = acc[a][rt][e / 4][e % 4];
                }
    }
    __syncthreads();
    if (ks > 0) {
        return;
    }
    for (int o = 1; o < KS; ++o) {
        const float* p = part + (size_t)(((o - 1) * TW + tw) * 32 + lane) * 8;
#pragma unroll
        for (int a = 0; a < 1; ++a)
#pragma unroll
            for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc[a][rt][e / 4][e % 4] += p[(a * RT + rt) * 4 + e];
                }
    }
    // accumulator (row g + 8h, columns 2c, 2c+1) of each tile: Y[m][n] with n the row of W, m the row of X
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int m = 8 * mt + 2 * c + e;
                    const int n = row_base + rt * 16 + g + 8 * h;
                    if (m < M && n < N) {
                        Y[(size_t)m * N + n] = static_cast<T>(acc[0][rt][mt][2 * h + e]);
                    }
                }
