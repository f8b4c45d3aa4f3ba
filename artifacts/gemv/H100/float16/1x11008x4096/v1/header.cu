// kernsearch gemv (CUDA): Y[M,N] = X[M,K] · W with W given as [N,K] (y = W x), float32 accumulation.
template <typename U, int V> struct alignas(sizeof(U) * V) ks_vec { U v[V]; };
