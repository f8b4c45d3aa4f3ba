// kernsearch qmatvec (CUDA): Y = X · dequant(W)^T, 4-bit affine quantization, W as MLX packs it [N, K*BITS/32].
template <typename U, int V> struct alignas(sizeof(U) * V) ks_vec { U v[V]; };
