// kernsearch softmax (CUDA): y = exp(x - max) / sum(exp(x - max)) over the last axis.
template <typename U, int V> struct alignas(sizeof(U) * V) ks_vec { U v[V]; };
