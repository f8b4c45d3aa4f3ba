"""Matrix transpose through a padded 2-D threadgroup tile (bank-conflict padding 33)."""

from _case import Case, rng

MODELLED_ON = "NVIDIA 'An Efficient Matrix Transpose in CUDA C/C++' (tile[32][33]) as ported to Metal"
FEATURES = ("2-D threadgroup array", "threadgroup_barrier", "2-D grid", "thread_position_in_threadgroup")


def case() -> Case:
    n = 64
    a = rng(16).standard_normal((n, n))
    src = """
        threadgroup float tile[16][17];
        uint2 tp = thread_position_in_threadgroup.xy, tg = threadgroup_position_in_grid.xy;
        tile[tp.y][tp.x] = inp[(tg.y * 16 + tp.y) * N + tg.x * 16 + tp.x];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[(tg.x * 16 + tp.y) * N + tg.y * 16 + tp.x] = tile[tp.x][tp.y];
    """
    return Case(src, {"inp": a}, {"out": ((n, n), "float32")}, lambda inp: [inp.T], (n, n, 1), (16, 16, 1),
                header=f"constant constexpr uint N = {n};\n")
