"""v2 CUDA body: persistent balanced tiles, K split across the block's warps, X staged once in shared memory
(pair-permuted), a PF-deep register ring of weight loads. NMAT=2: silu(X Wg^T) * (X Wu^T)."""


def body2(nmat: int = 1) -> str:
    mats = [("W", "S", "Bq"), ("Wu", "Su", "Bu")][:nmat]
    loads = "".join(f"""
          w[{i}][slot_][h] = ok ? __ldg(reinterpret_cast<const uint4*>({W}) + (size_t)row * CH + chunk) : make_uint4(0u, 0u, 0u, 0u);
          sb[{i}][slot_][h] = ok ? ksq::pack2({S}[(size_t)row * NG + grp], {B}[(size_t)row * NG + grp]) : 0u;"""
                    for i, (W, S, B) in enumerate(mats))
    comp = "".join(f"""
        {{
          const unsigned int* w0 = reinterpret_cast<const unsigned int*>(&w[{i}][J][0]);
          const unsigned int* w1 = reinterpret_cast<const unsigned int*>(&w[{i}][J][1]);
          const T2 s0v = ksq::lo2<T2>(sb[{i}][J][0]), b0v = ksq::hi2<T2>(sb[{i}][J][0]);
          const T2 s1v = ksq::lo2<T2>(sb[{i}][J][1]), b1v = ksq::hi2<T2>(sb[{i}][J][1]);
#pragma unroll
          for (int jj = 0; jj < VPW; ++jj) {{
            const int p0 = 2 * jj, p1 = 2 * jj + 1;
            const unsigned int a0 = ksq::deq<T, QB>(w0[p0 / PPW], QB * (p0 % PPW), s0v, b0v);
            const unsigned int a1 = ksq::deq<T, QB>(w1[p0 / PPW], QB * (p0 % PPW), s1v, b1v);
            const unsigned int a2 = ksq::deq<T, QB>(w0[p1 / PPW], QB * (p1 % PPW), s0v, b0v);
            const unsigned int a3 = ksq::deq<T, QB>(w1[p1 / PPW], QB * (p1 % PPW), s1v, b1v);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ksq::mma16816<T>(acc[{i}][mt], a0, a1, a2, a3, xp[mt][p0], xp[mt][p1]);
          }}
        }}""" for i in range(nmat))
    out = "ksq::silu_mul(v[0], v[1])" if nmat == 2 else "v[0]"
    return f"""
    constexpr int NMAT = {nmat};
    constexpr int VPW = 32 / QB;   // values per uint32 word
    constexpr int PPW = VPW / 2;   // field pairs per word
    constexpr int PPC = 2 * VPW;   // pairs per 16-byte chunk
    using T2 = typename ksq::pair_of<T>::type;
    const int M = X_shape[0];
    const int K = X_shape[1];
    const int N = {mats[0][0]}_shape[0];
    const int KW = {mats[0][0]}_shape[1];
    const int NG = {mats[0][1]}_shape[1];
    const int G = K / NG;
    const int CH = KW / 4;               // 16-byte chunks per row of W
    const int NSTEP = (CH + 3) / 4;      // steps per row: four chunks, one per thread of a quad
    const int TILES = (N + 15) / 16;
    const int B = int(gridDim.x);
    const int t0 = int((long long)blockIdx.x * TILES / B);
    const int t1 = int((long long)(blockIdx.x + 1) * TILES / B);
    const int lane = int(threadIdx.x) & 31, ks = int(threadIdx.x) >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int s0 = ks * NSTEP / KS, ns = (ks + 1) * NSTEP / KS - s0;
    const int items = (t1 - t0) * ns;
    extern __shared__ unsigned int smem[];
    unsigned int* xs = smem;                                          // [M][K/2] value pairs
    float* part = reinterpret_cast<float*>(smem + (size_t)M * (K / 2));  // [tiles][KS][32][NMAT*MT*4]
    uint4 w[NMAT][PF][2];
    unsigned int sb[NMAT][PF][2];
#define KSQ_LOAD(I, J) {{ \\
      const int i_ = (I); \\
      const int tl_ = ns > 0 ? i_ / ns : 0; \\
      const int chunk = (s0 + (ns > 0 ? i_ - tl_ * ns : 0)) * 4 + c; \\
      const bool ok = i_ < items && chunk < CH; \\
      const int grp = ok ? chunk * (4 * VPW) / G : 0; \\
      const int slot_ = (J); \\
      _Pragma("unroll") for (int h = 0; h < 2; ++h) {{ \\
          const int row = min((t0 + tl_) * 16 + g + 8 * h, N - 1); \\
          {loads.replace(chr(10), ' ')} \\
      }} }}
#pragma unroll
    for (int p_ = 0; p_ < PF - 1; ++p_) KSQ_LOAD(p_, p_)
    // X, once per block, as the (k, k + VPW/2) pairs the tensor-core fragments take
    for (int q = int(threadIdx.x); q < M * (K / 8); q += int(blockDim.x)) {{
      const int m = q / (K / 8), r = q - m * (K / 8);
      const uint4 v = *reinterpret_cast<const uint4*>(X + (size_t)m * K + r * 8);
      uint4 o;
      if (QB == 4) {{
        o.x = __byte_perm(v.x, v.z, 0x5410); o.y = __byte_perm(v.x, v.z, 0x7632);
        o.z = __byte_perm(v.y, v.w, 0x5410); o.w = __byte_perm(v.y, v.w, 0x7632);
      }} else {{
        o.x = __byte_perm(v.x, v.y, 0x5410); o.y = __byte_perm(v.x, v.y, 0x7632);
        o.z = __byte_perm(v.z, v.w, 0x5410); o.w = __byte_perm(v.z, v.w, 0x7632);
      }}
      *reinterpret_cast<uint4*>(xs + (size_t)m * (K / 2) + r * 4) = o;
    }}
    __syncthreads();
    float acc[NMAT][MT][4];
#pragma unroll
    for (int a = 0; a < NMAT; ++a)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[a][mt][e] = 0.0f;
    for (int i0 = 0; i0 < items; i0 += PF) {{
#pragma unroll
      for (int J = 0; J < PF; ++J) {{
        KSQ_LOAD(i0 + J + PF - 1, (J + PF - 1) % PF)
        const int i = i0 + J;
        if (i < items) {{
          const int tl = i / ns;
          const int st = i - tl * ns;
          const int chunk = (s0 + st) * 4 + c;
          unsigned int xp[MT][PPC];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {{
            const int m = g + 8 * mt;
            if (m < M && chunk < CH) {{
              const uint4* src = reinterpret_cast<const uint4*>(xs + (size_t)m * (K / 2) + (size_t)chunk * PPC);
#pragma unroll
              for (int v = 0; v < PPC / 4; ++v) {{
                const uint4 t = src[v];
                xp[mt][4 * v] = t.x; xp[mt][4 * v + 1] = t.y; xp[mt][4 * v + 2] = t.z; xp[mt][4 * v + 3] = t.w;
              }}
            }} else {{
#pragma unroll
              for (int v = 0; v < PPC; ++v) xp[mt][v] = 0u;
            }}
          }}
{comp}
          if (st == ns - 1) {{
            float* dst = part + ((size_t)(tl * KS + ks) * 32 + lane) * (NMAT * MT * 4);
#pragma unroll
            for (int a = 0; a < NMAT; ++a)
#pragma unroll
              for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {{
                  dst[(a * MT + mt) * 4 + e] = acc[a][mt][e];
                  acc[a][mt][e] = 0.0f;
                }}
          }}
        }}
      }}
    }}
#undef KSQ_LOAD
    __syncthreads();
    for (int tl = ks; tl < t1 - t0; tl += KS) {{
      float r[NMAT][MT][4];
#pragma unroll
      for (int a = 0; a < NMAT; ++a)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) r[a][mt][e] = 0.0f;
      for (int o = 0; o < KS; ++o) {{
        if ((o + 1) * NSTEP / KS == o * NSTEP / KS) continue;  // that warp had no steps
        const float* src = part + ((size_t)(tl * KS + o) * 32 + lane) * (NMAT * MT * 4);
#pragma unroll
        for (int a = 0; a < NMAT; ++a)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) r[a][mt][e] += src[(a * MT + mt) * 4 + e];
      }}
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {{
            const int m = 8 * mt + 2 * c + e;
            const int n = (t0 + tl) * 16 + g + 8 * h;
            float v[NMAT];
#pragma unroll
            for (int a = 0; a < NMAT; ++a) v[a] = r[a][mt][2 * h + e];
            if (m < M && n < N) Y[(size_t)m * N + n] = static_cast<T>({out});
          }}
    }}
"""
