"""Gather rows of a float16 embedding table by int32 ids into float32 rows."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_get_rows_f16 (int32 row ids, half source, float destination)"
FEATURES = ("int32 ids beside a float16 table", "half to float", "2-D grid", "mixed dtypes")


def case() -> Case:
    vocab, d, n = 10, 16, 5
    r = rng(29)
    table = r.standard_normal((vocab, d)).astype(np.float16)
    ids = r.integers(0, vocab, size=n).astype(np.int32)
    src = """
        uint i = thread_position_in_grid.x, j = thread_position_in_grid.y;
        int r = ids[j];
        dst[j * D + i] = float(table[r * D + i]);
    """
    return Case(src, {"table": table, "ids": ids}, {"dst": ((n, d), "float32")},
                lambda table, ids: [table[ids].astype(np.float64)], (d, n, 1), (16, 1, 1),
                header=f"constant constexpr uint D = {d};\n", input_dtypes=["float16", "int32"])
