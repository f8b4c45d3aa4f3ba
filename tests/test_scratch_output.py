"""A scratch output (a kernel's working memory, e.g. mlp_block's intermediates and counters) is verified like any
output, but the op the kernel is judged against computes only what a consumer reads: a consumer writing the layer
in MLX never builds mlp_block's scratch, so an op that did would flatter the kernel."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from kernsearch import load_family, make_problem
from kernsearch._errors import KernsearchError
from kernsearch.backends._mlx_base import judge_op
from kernsearch.family._spec import builtin_families_dir

mx = pytest.importorskip("mlx.core")


def test_mlp_blocks_judged_op_computes_the_layer_output_alone() -> None:
    fam = load_family("mlp_block")
    assert [t.scratch for t in fam.outputs] == [False, True]
    problem = make_problem(fam, "1,256,512,32,4,64,8", "float32")
    rng = np.random.default_rng(0)
    arrays = []
    for t in fam.inputs:
        shape = [int(v) for v in t.shape(dict(problem.dims))]
        arrays.append(mx.array(rng.integers(0, 2**32, shape, dtype=np.uint32)) if t.dtype == "uint32"
                      else mx.array(rng.uniform(0.1, 0.2, shape).astype(np.float32)))
    out = judge_op(fam, problem)(*arrays)
    assert not isinstance(out, (list, tuple)) and out.shape == (1, 256)  # Y alone: no scratch built
    assert "and" not in fam.baseline_name and "concatenate" not in fam.baseline_name


@pytest.mark.parametrize(("edit", "says"), [
    (lambda text: text.replace('name = "y"\nshape = "[R, N]"', 'name = "y"\nshape = "[R, N]"\nscratch = true'),
     "every output is scratch"),
    (lambda text: text.replace('name = "x"\n', 'name = "x"\nscratch = true\n', 1), "scratch is for outputs"),
])
def test_a_spec_whose_judged_op_would_compute_nothing_is_refused(tmp_path: Path, edit, says: str) -> None:  # noqa: ANN001
    folder = tmp_path / "rmsnorm"
    shutil.copytree(builtin_families_dir() / "rmsnorm", folder)
    spec = folder / "family.toml"
    text = spec.read_text()
    changed = edit(text)
    assert changed != text
    spec.write_text(changed)
    with pytest.raises(KernsearchError, match=says):
        load_family(folder)
