"""Limits and constants: numeric_limits of every width, Limits<T>, FLT_MAX, HALF_MAX, M_PI_F, half literals."""
import numpy as np
from _case import Case

MODELLED_ON = "MLX kernels/utils.h Limits<T> as used by reductions' init values (e.g. reduce ops' Max/Min init)"
FEATURES = ("numeric_limits<int8/short/int/long/uint>", "Limits<float>", "FLT_MAX", "HALF_MAX", "M_PI_F",
            "1.5h literal", "INT_MIN", "bfloat max")


def case() -> Case:
    src = """
        if (thread_position_in_grid.x != 0) return;
        out[0] = float(numeric_limits<char>::lowest());
        out[1] = float(numeric_limits<short>::max());
        out[2] = float(numeric_limits<int>::lowest() == INT_MIN);
        out[3] = float(numeric_limits<uint>::max());
        out[4] = float(numeric_limits<long>::lowest() < 0);
        out[5] = Limits<float>::min;
        out[6] = FLT_MAX;
        out[7] = HALF_MAX;
        out[8] = M_PI_F;
        out[9] = float(1.5h * 2.0h);
        out[10] = float(numeric_limits<bfloat>::max());
        out[11] = float(numeric_limits<half>::epsilon());
    """

    def ref():
        return [np.array([-128, 32767, 1, 4294967296.0, 1, -np.inf, np.float32(3.4028234663852886e38), 65504,
                          np.float32(np.pi), 3, 3.3895313892515355e38, 2 ** -10])]
    return Case(src, {}, {"out": ((12,), "float32")}, lambda: ref(), (1, 1, 1), (1, 1, 1), rtol=1e-6)
