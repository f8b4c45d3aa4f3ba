"""Row argmax of bfloat16 data, one simdgroup per row: the running best starts at Limits<T>::min (a constant
expression), values compared through cast_to<float>, pairs reduced with simd_shuffle_down."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("MLX kernels/arg_reduce.metal: ArgMax<T> with init = Limits<T>::min, IndexValPair reduced across the "
               "simdgroup with simd_shuffle_down")
FEATURES = ("MLX utils: constexpr Limits<T>::min, cast_to", "template parameter T = bfloat16", "simd_shuffle_down",
            "bfloat16 input (input_dtypes)", "uint32 and float32 outputs")

ROWS, COLS = 5, 90


def case() -> Case:
    r = rng(59)
    x = np.round(r.standard_normal((ROWS, COLS)) * 64) / 8  # exact in bfloat16, few ties
    src = """
        const uint row = threadgroup_position_in_grid.x, lane = thread_index_in_simdgroup;
        constexpr T init = Limits<T>::min;
        static_assert(float(init) < -1e30f, "Limits<T>::min of a float type is -inf");
        T best = init;
        uint best_i = 0;
        for (uint i = lane; i < COLS; i += 32) {
            const T v = x[row * COLS + i];
            if (cast_to<float>(v) > cast_to<float>(best)) { best = v; best_i = i; }
        }
        for (ushort d = 16; d > 0; d /= 2) {
            const T other = simd_shuffle_down(best, d);
            const uint other_i = simd_shuffle_down(best_i, d);
            if (cast_to<float>(other) > cast_to<float>(best) ||
                (cast_to<float>(other) == cast_to<float>(best) && other_i < best_i)) {
                best = other;
                best_i = other_i;
            }
        }
        if (lane == 0) {
            index[row] = best_i;
            value[row] = cast_to<float>(best);
        }
    """

    def ref(x):
        return [np.argmax(x, axis=1).astype(np.uint32), x.max(axis=1)]
    return Case(src, {"x": x}, {"index": ((ROWS,), "uint32"), "value": ((ROWS,), "float32")}, ref, (32 * ROWS, 1, 1),
                (32, 1, 1), header=f"constant constexpr uint COLS = {COLS};\n", template=(("T", "bfloat16"),),
                input_dtypes=["bfloat16"], rtol=0, atol=0)
