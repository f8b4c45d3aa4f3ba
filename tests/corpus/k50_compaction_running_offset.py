"""Stream compaction, one segment per simdgroup: a running output offset in threadgroup memory that every lane
reads and lane 0 then advances (no barrier), simd prefix sums for the positions within each chunk."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("Billeter, Olsson, Assarsson, 'Efficient Stream Compaction on Wide SIMD Many-Core Architectures' "
               "(HPG 2009): per-warp compaction with a running offset kept in shared memory")
FEATURES = ("lockstep simdgroup: running offset read by every lane then advanced by one", "simd_prefix_exclusive_sum",
            "simd_sum", "uint32 output", "init_value=0")

NSG, CHUNKS = 2, 3
SEG = 32 * CHUNKS


def case() -> Case:
    x = rng(50).standard_normal(NSG * SEG)
    src = """
        uint sg = simdgroup_index_in_threadgroup, lane = thread_index_in_simdgroup;
        threadgroup uint at[NSG];
        if (lane == 0) at[sg] = 0;
        for (uint c = 0; c < CHUNKS; ++c) {
            const float v = inp[sg * SEG + c * 32 + lane];
            const uint keep = v > 0.0f ? 1u : 0u;
            const uint before = simd_prefix_exclusive_sum(keep);
            const uint total = simd_sum(keep);
            const uint offset = at[sg];
            if (keep) out[sg * SEG + offset + before] = v;
            if (lane == 0) at[sg] = offset + total;
        }
        if (lane == 0) count[sg] = at[sg];
    """

    def ref(inp):
        out = np.zeros(NSG * SEG)
        count = np.zeros(NSG, dtype=np.uint32)
        for s in range(NSG):
            kept = inp[s * SEG:(s + 1) * SEG]
            kept = kept[kept > 0]
            out[s * SEG:s * SEG + len(kept)] = kept
            count[s] = len(kept)
        return [out, count]
    return Case(src, {"inp": x}, {"out": ((NSG * SEG,), "float32"), "count": ((NSG,), "uint32")}, ref,
                (32 * NSG, 1, 1), (32 * NSG, 1, 1), header=f"constant constexpr uint NSG = {NSG}, CHUNKS = {CHUNKS}, "
                f"SEG = {SEG};\n", init_value=0.0, lockstep=True)
