// kernsearch layernorm (CUDA): y = (x - mean) * rsqrt(var + eps) * w + b over the last axis.
template <typename U, int V> struct alignas(sizeof(U) * V) ks_vec { U v[V]; };
