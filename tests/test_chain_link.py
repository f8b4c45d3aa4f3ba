"""The chain's link as a decode runs it (issue 38): a family declares which inputs the previous call's output feeds
(``chain_link``); the residual families chain the residual stream (the next call's R is the previous Y), the same
derivation for the kernel and the op; and the op is what a consumer writes (the baseline's plain MLX ops, nothing
``mx.compile``d unless the spec gives a reason). Checked on MLX's CPU back-end through its graph export."""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from test_chain import CpuBackend, dot_graph, one_path, reaches

from kernsearch.evaluation._chain import chained
from kernsearch.evaluation._consumer import chain
from kernsearch.evaluation._verify import make_inputs
from kernsearch.family._render import geometry, render
from kernsearch.family._space import Space, make_problem
from kernsearch.family._spec import load_family
from kernsearch.hardware._chips import get_chip

K_CALLS = 5
#: Small shapes of the fused decode families (N < K for the residual one: its X is padded from Y).
SHAPES = {"qmatvec_residual": "1,128,256,32,4", "rmsnorm_qmatvec": "1,128,256,32,4",
          "swiglu_qmatvec": "1,128,256,32,4", "rmsnorm_swiglu_qmatvec": "1,128,256,32,4",
          "mlp_block": "1,128,256,32,4,64,8"}


@pytest.fixture
def uncompiled() -> Iterator[None]:
    """Each call's primitives as their own graph nodes (the package's kernel call is ``mx.compile``d, and a
    compiled call shares its primitive objects between calls, which ``export_to_dot`` names nodes by)."""
    mx.disable_compile()
    yield
    mx.enable_compile()


class ResidualCpuBackend(CpuBackend):
    """A kernel object whose launch is MLX's quantized matmul plus the residual (the family's fifth input), with a
    marker op (``Sign``) after the matmul, so the candidate's calls are told apart from the op's in the graph."""

    def _make_kernel(self, source: Any, geo: Any) -> Any:
        def launch(inputs: list[Any], output_shapes: Any, **_: Any) -> list[Any]:
            x, w, s, b, r = inputs[:5]
            bits = 32 * w.shape[1] // x.shape[1]
            y = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=x.shape[1] // s.shape[1], bits=bits)
            return [r + mx.sign(y) * y]

        return launch


def setup(family: str) -> tuple[Any, Any, Any, list[dict[str, Any]]]:
    fam = load_family(family)
    space = Space(make_problem(fam, SHAPES[family], "float16", get_chip("M2 Max")), get_chip("M2 Max"))
    return fam, space, ResidualCpuBackend(), [make_inputs(space.problem, 3)]


def residual_calls() -> tuple[Any, Any, Any, Any]:
    fam, space, backend, sets = setup("qmatvec_residual")
    config = dict(fam.default)
    kernel, geo = render(fam, config, "float16", "metal"), geometry(space, config)
    return (backend, fam, backend.consumer_kernel(kernel, geo, fam, space.problem, sets),
            backend.consumer_op(fam, space.problem, sets))


def test_the_fused_decode_families_declare_their_residual_stream_link() -> None:
    assert load_family("qmatvec_residual").chain_inputs == ("R", "X")
    assert load_family("mlp_block").chain_inputs == ("R", "X")
    for name in ("rmsnorm_qmatvec", "rmsnorm_swiglu_qmatvec", "qmatvec", "swiglu_qmatvec", "gemm"):
        fam = load_family(name)
        assert fam.chain_inputs == ("X",) if name != "gemm" else fam.chain_inputs == (fam.inputs[0].name,), name


def test_the_next_calls_residual_is_the_previous_output_for_kernel_and_op() -> None:
    backend, fam, _, _ = residual_calls()
    _, space, _, sets = setup("qmatvec_residual")
    arrays = backend._consumer_arrays(fam, space.problem, sets)
    seen: list[list[Any]] = []

    def run(*xs: Any) -> Any:
        seen.append(list(xs))
        return xs[4] + mx.quantized_matmul(*xs[:4], transpose=True, group_size=64, bits=4)  # K 256, NG 4, KW 32

    call = chained(run, arrays, backend.consumer_link(fam))
    first = call(0)
    call(1, first)
    names = [t.name for t in fam.inputs]
    assert seen[1][names.index("R")] is first  # R <- Y itself: no op between
    assert seen[1][names.index("X")].shape == arrays[0][names.index("X")].shape
    assert seen[1][names.index("W")] is arrays[1 % len(arrays)][names.index("W")]  # weights are never fed


def test_the_residual_chain_is_one_path_through_the_adds_with_the_same_derivation(uncompiled: None) -> None:
    """Through the graph MLX evaluates: each call's residual add takes the previous call's output as R (an edge
    from one add to the next: a decode's residual stream), for the kernel and the op, and the primitives that
    make the next call's X from the previous output are the same for both."""
    _, _, kernel, op = residual_calls()
    between = []
    for call, marker in ((kernel, "Sign"), (op, "QuantizedMatmul")):
        mx.eval(call(0))
        labels, succ = dot_graph(chain(call, 0, K_CALLS))
        adds = [n for n, lab in labels.items() if lab == "Add"]
        assert len(adds) == K_CALLS and one_path(labels, succ, "Add")
        order = sorted(adds, key=lambda n: sum(reaches(succ, m, n) for m in adds))
        # add -> its output array -> the next add: no primitive between (R is the previous output itself)
        assert all(any(b in succ.get(out, set()) for out in succ.get(a, set()) if out not in labels)
                   for a, b in zip(order, order[1:])), "R is not the previous output"
        markers = [n for n, lab in labels.items() if lab == marker]
        assert len(markers) == K_CALLS and one_path(labels, succ, marker)
        # From the first call's output (its add) to the second call's matmul marker: the derivation of X.
        second = min((m for m in markers if reaches(succ, order[0], m)),
                     key=lambda n: sum(reaches(succ, m, n) for m in markers))
        between.append(sorted(lab for n, lab in labels.items() if reaches(succ, order[0], n) and n != order[0]
                              and reaches(succ, n, second) and lab not in ("QuantizedMatmul", "Sign", "Multiply")))
    assert between[0] == between[1] and "Concatenate" in between[0]  # N < K: X is Y padded by the set's own X


def by_hand(family: str, dims: dict[str, int], eps: float = 1e-5) -> Any:
    """The family's op as a user of MLX writes it: one call per operation, each value once."""
    def qmm(x: Any, w: Any, s: Any, b: Any, k: int, kw: int, ng: int) -> Any:
        return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=k // ng, bits=32 * kw // k)

    def swiglu(n: Any, w: Any, s: Any, b: Any, wu: Any, su: Any, bu: Any, k: int, kw: int, ng: int) -> Any:
        g = qmm(n, w, s, b, k, kw, ng)
        return g * mx.sigmoid(g) * qmm(n, wu, su, bu, k, kw, ng)

    d = dims
    if family == "mlp_block":
        def mlp(x: Any, wo: Any, so: Any, bo: Any, r: Any, gamma: Any, *rest: Any) -> Any:
            x1 = r + qmm(x, wo, so, bo, d["H"], d["KWH"], d["NGH"])
            g = swiglu(mx.fast.rms_norm(x1, gamma, eps), *rest[:6], d["H"], d["KWH"], d["NGH"])
            y = x1 + qmm(g, *rest[6:9], d["F"], d["KWF"], d["NGF"])
            return y  # the layer's output alone: a consumer never builds the kernel's scratch
        return mlp
    k = (d["K"], d["KW"], d["NG"])
    return {"qmatvec_residual": lambda x, w, s, b, r: r + qmm(x, w, s, b, *k),
            "rmsnorm_qmatvec": lambda x, w, s, b, gamma: qmm(mx.fast.rms_norm(x, gamma, eps), w, s, b, *k),
            "swiglu_qmatvec": lambda x, *ws: swiglu(x, *ws, *k),
            "rmsnorm_swiglu_qmatvec": lambda x, w, s, b, wu, su, bu, gamma: swiglu(
                mx.fast.rms_norm(x, gamma, eps), w, s, b, wu, su, bu, *k)}[family]


def primitives(outputs: Any) -> Counter[str]:
    buf = io.StringIO()
    mx.export_to_dot(buf, outputs)
    return Counter(re.findall(r'\[label ="(\w+)"', buf.getvalue()))


@pytest.mark.parametrize("family", list(SHAPES))
def test_the_judges_op_is_the_plain_ops_a_consumer_writes(family: str) -> None:
    """Compile on (as in a tune): the op the final round, the gate and rejudge time holds no compiled primitive
    and the same primitives as the ops written by hand, each once (mlp_block's expression repeats X1 and the norm:
    the plan computes them once, as the hand-written layer does)."""
    fam, space, backend, sets = setup(family)
    op = backend.consumer_op(fam, space.problem, sets)
    arrays = backend._consumer_arrays(fam, space.problem, sets)[0]
    mine, theirs = primitives(op(0)), primitives(by_hand(family, space.problem.dims)(*arrays))
    assert not [p for p in mine if p.startswith("Compiled")], mine
    assert mine == theirs, (mine, theirs)


def test_a_family_that_gives_a_reason_keeps_its_compiled_op() -> None:
    """swiglu: mlx-lm's own SwiGLU is ``mx.compile``d (templates/swiglu/family.toml says so)."""
    fam = load_family("swiglu")
    assert fam.compile_baseline
    problem = make_problem(fam, "4,256", "float16", get_chip("M2 Max"))
    op = CpuBackend().consumer_op(fam, problem, [make_inputs(problem, 1)])
    assert [p for p in primitives(op(0)) if p.startswith("Compiled")]


# -- the link's declaration: validated, one line, exit 2 ------------------------------------------------------

@pytest.mark.parametrize(("link", "says"), [
    ('["Q"]', "chain_link: 'Q' is not an input of this family (inputs: X, W, S, Bq)"),
    ('["W"]', "chain_link: 'W' is a weight; a chain feeds activations"),
    ('["X", "X"]', "chain_link: an input is named twice"),
    ('"X"', "chain_link: Input should be a valid list"),
    ("[3]", "chain_link.0: Input should be a valid string"),
    ('["X\\nimport os"]', "chain_link: 'X\\nimport os' is not an input"),
    ('["' + "A" * 5000 + '"]', "chain_link: '" + "A" * 48 + "'... is not an input"),
    ("[" + ", ".join(['"X"'] * 9) + "]", "chain_link: List should have at most 8 items"),
])
def test_a_bad_chain_link_is_a_one_line_error(tmp_path: Any, link: str, says: str) -> None:
    from test_family_library import _user_family

    from kernsearch._errors import SpecError

    folder = _user_family(tmp_path, f'extends = "qmatvec"\nname = "myq"\nchain_link = {link}\n'
                                    '[templates]\nmetal = "k.metal.j2"\n')
    with pytest.raises(SpecError) as caught:
        load_family(str(folder))
    assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert len(str(caught.value)) < 600


def test_a_user_family_declares_its_link_and_the_chain_feeds_those_inputs(tmp_path: Any) -> None:
    from test_family_library import _user_family

    from kernsearch.evaluation._chain import chain_positions

    folder = _user_family(tmp_path, 'extends = "qmatvec_residual"\nname = "myr"\nchain_link = ["R"]\n'
                                    '[templates]\nmetal = "k.metal.j2"\n')
    fam = load_family(str(folder))
    assert fam.chain_inputs == ("R",) and chain_positions(fam.inputs, fam.chain_inputs) == (4,)
    base = load_family("qmatvec_residual")
    assert chain_positions(base.inputs, base.chain_inputs) == (4, 0)


@pytest.mark.slow
def test_the_cli_says_a_bad_chain_link_in_one_line_and_exits_2(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from test_family_library import _user_family

    folder = _user_family(tmp_path, 'extends = "qmatvec"\nname = "myq"\nchain_link = ["../../etc/passwd"]\n'
                                    '[templates]\nmetal = "k.metal.j2"\n')
    done = subprocess.run([sys.executable, "-m", "kernsearch", "space", str(folder)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KERNSEARCH_HOME": str(tmp_path)})
    assert done.returncode == 2 and "chain_link: '../../etc/passwd' is not an input" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


FAMILIES = sorted(p.parent.name for p in (Path(__file__).resolve().parents[1] / "templates").glob("*/family.toml"))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_judges_op_is_one_function_written_from_names_made_here(family: str) -> None:
    """The op is the plan written out as one function (a call costs what hand-written calls cost, not a loop over
    the plan): its code reads only names made from numbers (inputs ``v*``, functions ``f*``, constants ``c*``)
    and the keyword names of the vocabulary's tables; no text of the family's expression reaches it."""
    from kernsearch._rules_expr import KEYWORDS
    from kernsearch.backends._mlx_base import _TRAILING, judge_op

    fam = load_family(family)
    op = judge_op(fam, make_problem(fam, None, fam.problem.default_dtype))
    code = getattr(op, "__code__", None)
    if code is None:  # compiled where the family gives a reason: the written function inside
        assert fam.compile_baseline
        return
    assert code.co_filename == "<kernsearch plain op>"
    made = re.compile(r"[vfc]\d+")
    assert all(made.fullmatch(n) for n in code.co_varnames), code.co_varnames
    allowed = KEYWORDS | {k for ks in _TRAILING.values() for k in ks} | {"tuple", "list", "__class__"}
    assert all(made.fullmatch(n) or n in allowed for n in code.co_names), code.co_names
    assert code.co_argcount == len(fam.inputs)


def test_a_keyword_that_is_not_a_name_never_reaches_the_written_op() -> None:
    from kernsearch._rules_expr import ExpressionError
    from kernsearch.evaluation._plain_op import plain_op

    tree = ["call", "f", [["name", "X"], ["const", 2]], {}]
    with pytest.raises(ExpressionError, match="not a name"):
        plain_op(tree, ["X"], {}, {"f": abs}, {"f": ("a=1)\nimport os\n(",)})
    assert plain_op(tree, ["X"], {}, {"f": lambda x, k: x * k}, {"f": ("k",)})(3) == 6
