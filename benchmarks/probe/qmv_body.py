"""CUDA body of the MMA qmatvec probe (NMAT=1: Y = X dequant(W)^T; NMAT=2: silu(X Wg^T) * (X Wu^T))."""


def body(nmat: int = 1) -> str:
    mats = ["W", "Wu"][:nmat]
    scl = ["S", "Su"][:nmat]
    bia = ["Bq", "Bu"][:nmat]
    load = []
    comp = []
    for i, (w, s, b) in enumerate(zip(mats, scl, bia)):
        load.append(f"""
          {{
            const int row = min(row_base + rt * 16 + g + 8 * h, N - 1);
            wv[{i}][u][rt][h] = ok ? __ldg(reinterpret_cast<const uint4*>({w}) + (size_t)row * CH + chunk) : make_uint4(0u, 0u, 0u, 0u);
            const T s = {s}[(size_t)row * NG + grp];
            const T b = {b}[(size_t)row * NG + grp];
            sc[{i}][u][rt][h] = T2{{s, s}};
            bi[{i}][u][rt][h] = T2{{b, b}};
          }}""")
        comp.append(f"""
        {{
          const unsigned int* w0 = reinterpret_cast<const unsigned int*>(&wv[{i}][u][rt][0]);
          const unsigned int* w1 = reinterpret_cast<const unsigned int*>(&wv[{i}][u][rt][1]);
#pragma unroll
          for (int j = 0; j < VPW; ++j) {{
            const int p0 = 2 * j, p1 = 2 * j + 1;
            const unsigned int a0 = ksq::deq<T, QB>(w0[p0 / PPW], QB * (p0 % PPW), sc[{i}][u][rt][0], bi[{i}][u][rt][0]);
            const unsigned int a1 = ksq::deq<T, QB>(w1[p0 / PPW], QB * (p0 % PPW), sc[{i}][u][rt][1], bi[{i}][u][rt][1]);
            const unsigned int a2 = ksq::deq<T, QB>(w0[p1 / PPW], QB * (p1 % PPW), sc[{i}][u][rt][0], bi[{i}][u][rt][0]);
            const unsigned int a3 = ksq::deq<T, QB>(w1[p1 / PPW], QB * (p1 % PPW), sc[{i}][u][rt][1], bi[{i}][u][rt][1]);
            ksq::mma16816<T>(acc[{i}][rt][0], a0, a1, a2, a3, xp[0][p0], xp[0][p1]);
            if (two_m) {{
              ksq::mma16816<T>(acc[{i}][rt][1], a0, a1, a2, a3, xp[1][p0], xp[1][p1]);
            }}
          }}
        }}""")
    out = ("ksq::silu_mul(acc[0][rt][mt][2 * h + e], acc[1][rt][mt][2 * h + e])" if nmat == 2
           else "acc[0][rt][mt][2 * h + e]")
    return f"""
    constexpr int NMAT = {nmat};
    constexpr int VPW = 32 / QB;   // values per uint32 word
    constexpr int VPC = 4 * VPW;   // values per 16-byte chunk
    constexpr int PPW = VPW / 2;   // field pairs per word
    using T2 = typename ksq::pair_of<T>::type;
    const int M = X_shape[0];
    const int K = X_shape[1];
    const int N = {mats[0]}_shape[0];
    const int KW = {mats[0]}_shape[1];
    const int NG = {scl[0]}_shape[1];
    const int G = K / NG;
    const int CH = KW / 4;
    const int lane = int(threadIdx.x) & 31;
    const int warp = int(threadIdx.x) >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int tw = warp % TW, ks = warp / TW;
    const int row_base = (int(blockIdx.x) * TW + tw) * (16 * RT);
    const bool two_m = M > 8;
    float acc[NMAT][RT][2][4];
#pragma unroll
    for (int i = 0; i < NMAT; ++i)
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][rt][mt][e] = 0.0f;
    const int steps = (CH + 3) / 4;
    for (int s0 = ks * UNROLL; s0 < steps; s0 += KS * UNROLL) {{
      uint4 wv[NMAT][UNROLL][RT][2];
      T2 sc[NMAT][UNROLL][RT][2], bi[NMAT][UNROLL][RT][2];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {{
        const int chunk = (s0 + u) * 4 + c;
        const bool ok = chunk < CH;
        const int grp = ok ? chunk * VPC / G : 0;
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {{
#pragma unroll
          for (int h = 0; h < 2; ++h) {{{''.join(load)}
          }}
        }}
      }}
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {{
        const int chunk = (s0 + u) * 4 + c;
        const bool ok = chunk < CH;
        unsigned int xp[2][2 * VPW];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {{
          const int m = g + 8 * mt;
          const bool live = ok && m < M;
#pragma unroll
          for (int wd = 0; wd < 4; ++wd) {{
            if (QB == 4) {{
              const uint4 xv = live ? *reinterpret_cast<const uint4*>(X + (size_t)m * K + chunk * VPC + wd * 8) : make_uint4(0u, 0u, 0u, 0u);
              xp[mt][wd * 4 + 0] = __byte_perm(xv.x, xv.z, 0x5410);
              xp[mt][wd * 4 + 1] = __byte_perm(xv.x, xv.z, 0x7632);
              xp[mt][wd * 4 + 2] = __byte_perm(xv.y, xv.w, 0x5410);
              xp[mt][wd * 4 + 3] = __byte_perm(xv.y, xv.w, 0x7632);
            }} else {{
              const uint2 xv = live ? *reinterpret_cast<const uint2*>(X + (size_t)m * K + chunk * VPC + wd * 4) : make_uint2(0u, 0u);
              xp[mt][wd * 2 + 0] = __byte_perm(xv.x, xv.y, 0x5410);
              xp[mt][wd * 2 + 1] = __byte_perm(xv.x, xv.y, 0x7632);
            }}
          }}
        }}
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {{{''.join(comp)}
        }}
      }}
    }}
    constexpr int PART = (KS > 1 ? KS - 1 : 1) * TW * NMAT * RT * 8 * 32;
    __shared__ float part[PART];
    if (KS > 1) {{
      if (ks > 0) {{
        float* p = part + ((ks - 1) * TW + tw) * (NMAT * RT * 8 * 32);
#pragma unroll
        for (int i = 0; i < NMAT; ++i)
#pragma unroll
          for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int q = 0; q < 8; ++q) p[((i * RT + rt) * 8 + q) * 32 + lane] = acc[i][rt][q / 4][q % 4];
      }}
      __syncthreads();
      if (ks > 0) return;
      for (int o = 1; o < KS; ++o) {{
        const float* p = part + ((o - 1) * TW + tw) * (NMAT * RT * 8 * 32);
#pragma unroll
        for (int i = 0; i < NMAT; ++i)
#pragma unroll
          for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int q = 0; q < 8; ++q) acc[i][rt][q / 4][q % 4] += p[((i * RT + rt) * 8 + q) * 32 + lane];
      }}
    }}
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {{
            const int m = 8 * mt + 2 * c + e;
            const int n = row_base + rt * 16 + g + 8 * h;
            if (m < M && n < N) Y[(size_t)m * N + n] = static_cast<T>({out});
          }}
"""
