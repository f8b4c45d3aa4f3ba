"""An mlx-lm model decodes through the exported package with one line (issue 43): ``patch(model)``.

On MLX's CPU back-end every family runs its MLX op (no kernel can run here), so ``patch(model)`` leaves every block
to mlx-lm (nothing measured to win), and these tests route the decode steps through the package all the same
(``patch(model, always=True)``) to check what the patch itself must get right — the block's forward rebuilt around
the package's fused calls (Q/K/V concatenated, GQA, biases, the residuals, mlx-lm's RoPE, cache and attention), greedy decoding through mlx-lm's own generation loop,
``unpatch`` — on small random models built from mlx-lm's own model classes and quantized by mlx-lm (nothing
downloaded).
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten, tree_map
from test_export import import_package

from kernsearch import ArtifactStore, export
from kernsearch.bench._mlx_lm import FAMILIES  # the families patch() calls (not a copy kept here)
from kernsearch.family._spec import builtin_family_names

pytestmark = pytest.mark.slow  # mlx-lm's import alone takes seconds here


#: The attributes pytest's collection looks up on every module-level name (fixtures hidden behind wrappers, mocks,
#: test classes); a :class:`_Lazy` has none of them.
PYTEST_PROBES = frozenset({"__wrapped__", "_mock_name", "__test__", "__bases__"})


class _Lazy:
    """A module of mlx-lm imported on first use: collecting this file (every pytest process does, the fast lane
    too, which deselects it) does not pay mlx-lm's import (~2 s of CPU)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):  # noqa: ANN204
        import importlib

        if attr in PYTEST_PROBES:  # what pytest asks of every module-level name at collection: not a reason to
            raise AttributeError(attr)  # import mlx-lm (~2 s of CPU a pytest process)
        return getattr(importlib.import_module(self._name), attr)


llama, qwen2 = _Lazy("mlx_lm.models.llama"), _Lazy("mlx_lm.models.qwen2")


def generate_step(*args, **kw):  # noqa: ANN002, ANN003, ANN201
    from mlx_lm.generate import generate_step

    return generate_step(*args, **kw)


def quantize_model(*args, **kw):  # noqa: ANN002, ANN003, ANN201
    from mlx_lm.utils import quantize_model

    return quantize_model(*args, **kw)

PROMPT = [1, 5, 9, 20, 33, 7]


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("lm")
    names = list(FAMILIES)
    result = export(names, root / "dist", ArtifactStore(root / "store"), package="ks_lm", version="1.0")
    return import_package(result.source_dir, "ks_lm")


def build(module, bits: int = 4, group: int = 32, eps: float = 1e-5, **kw) -> nn.Module:
    """A small random model of ``module`` (llama or qwen2), weights scaled so that greedy decoding wanders over the
    vocabulary (the default init repeats one token), quantized by mlx-lm."""
    args = module.ModelArgs(model_type=module.__name__.rsplit(".", 1)[-1], hidden_size=128, num_hidden_layers=2,
                            intermediate_size=256, num_attention_heads=4, rms_norm_eps=eps, vocab_size=300,
                            **{"num_key_value_heads": 4, **kw})
    mx.random.seed(3)
    model = module.Model(args)
    model.update(tree_map(lambda a: a * 3 if a.ndim == 2 else a, model.parameters()))
    model, _ = quantize_model(model, {}, group, bits)
    mx.eval(model.parameters())
    return model


def greedy(model: nn.Module, steps: int = 32) -> tuple[list[int], mx.array]:
    """mlx-lm's own generation loop: the prompt, then ``steps`` greedy tokens and their log-probabilities."""
    out = list(generate_step(mx.array(PROMPT), model, max_tokens=steps))
    return [t for t, _ in out], mx.stack([lp for _, lp in out])


def counting(pkg, monkeypatch) -> Counter:
    """Count calls of every function the package binds from now on."""
    calls: Counter = Counter()
    bind = pkg._patcher.d.bind

    def counted(family, *weights, **kw):
        fn = bind(family, *weights, **kw)

        def run(*acts):
            calls[family] += 1
            return fn(*acts)

        return run

    monkeypatch.setattr(pkg._patcher.d, "bind", counted)
    return calls


CONFIGS = {
    "llama": (llama, {}),
    "gqa": (llama, {"num_key_value_heads": 1}),
    "8-bit": (llama, {"bits": 8, "group": 64}),
    "qwen2": (qwen2, {"num_key_value_heads": 2}),  # biases on q/k/v
    "biases": (llama, {"attention_bias": True}),  # biases on q/k/v and o: O runs qmatvec, the bias, the residual
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_patched_and_unpatched_decode_the_same_greedy_tokens(pkg, monkeypatch, name: str) -> None:
    module, kw = CONFIGS[name]
    model = build(module, **kw)
    want, want_lp = greedy(model)
    assert len(set(want)) > 8  # a decoding that wanders: a wrong step would show
    calls = counting(pkg, monkeypatch)
    report = pkg.patch(model, always=True, compiled=False)  # each call through the package on every step: counted
    assert report.patched == 2, str(report)
    got, got_lp = greedy(model)
    assert got == want
    assert mx.allclose(got_lp, want_lp, atol=1e-4).item()
    # Every forward of the loop ran each layer's four steps through the package (norm + Q/K/V, O, gate/up, down; one
    # call each, fused or not): the prompt's first 5 tokens (5 rows: a decode-sized step), its last, and one step
    # ahead of each of the 32 tokens yielded; two layers.
    steps = (1 + 1 + 32) * 2
    assert calls["rmsnorm_qmatvec"] + calls["qmatvec"] + calls["qmatvec_residual"] == 3 * steps, calls
    assert calls["rmsnorm_swiglu_qmatvec"] + calls["swiglu_qmatvec"] == steps, calls


@pytest.mark.parametrize("name", ["llama", "qwen2", "8-bit"])
def test_compiled_blocks_decode_the_same_tokens_and_call_the_package_once_a_shape(pkg, monkeypatch, name: str) -> None:
    """patch(model)'s default: each block's package calls and the Python between them traced by mx.compile once per
    row count and replayed (a decode token's host time is MLX's replay, not the package's fronts one by one)."""
    module, kw = CONFIGS[name]
    model = build(module, **kw)
    want, want_lp = greedy(model, 12)
    calls = counting(pkg, monkeypatch)
    assert pkg.patch(model, always=True).patched == 2
    got, got_lp = greedy(model, 12)
    assert got == want and mx.allclose(got_lp, want_lp, atol=1e-4).item()
    # Two row counts (the prompt's first 5 tokens, then one), two layers: each traced once, then replayed.
    assert calls["rmsnorm_qmatvec"] + calls["qmatvec"] == 2 * 2, calls
    assert calls["rmsnorm_swiglu_qmatvec"] + calls["swiglu_qmatvec"] == 2 * 2, calls
    model(mx.array([[3, 4, 5]]))  # a third row count: traced anew
    assert calls["rmsnorm_swiglu_qmatvec"] + calls["swiglu_qmatvec"] == 3 * 2, calls
    assert pkg.unpatch(model) == 2 and greedy(model, 12)[0] == want


def _rope_calls(monkeypatch, cls: type) -> list:
    """(shape, offset is an array) of each call of ``cls.__call__`` (a RoPE module's) from now on."""
    calls: list = []
    rope = cls.__call__

    def counted(self, x, offset=0):  # noqa: ANN001, ANN202
        calls.append((x.shape, isinstance(offset, mx.array)))
        return rope(self, x, offset)

    monkeypatch.setattr(cls, "__call__", counted)
    return calls


@pytest.mark.parametrize("name", ["llama", "gqa"])
def test_one_rope_call_a_layer_turns_the_queries_and_the_keys_heads(pkg, monkeypatch, name: str) -> None:
    """One sequence: RoPE runs once a layer on the queries' and the keys' heads together (a dependent launch fewer
    a layer than mlx-lm's two), inside the compiled step: traced once a layer and row count (its offset an array:
    the same trace at every position), and decodes the same greedy tokens. A one-row step's call takes the values'
    heads too (each head its own offset: the joined step), so that keys and values leave it as one view."""
    module, kw = CONFIGS[name]
    model = build(module, **kw)
    want, want_lp = greedy(model, 8)
    pkg.patch(model, always=True)
    calls = _rope_calls(monkeypatch, nn.RoPE)
    got, got_lp = greedy(model, 8)
    assert got == want and mx.allclose(got_lp, want_lp, atol=1e-4).item()
    kv = model.args.num_key_value_heads or model.args.num_attention_heads
    heads = model.args.num_attention_heads + kv
    # The prompt's first 5 tokens, then one-row steps (its last token, 8 tokens): one trace each; two layers.
    assert calls == [((1, heads, 5, 32), True)] * 2 + [((heads + kv, 1, 1, 32), True)] * 2, calls


def _writes(pkg, monkeypatch) -> list:
    """(how, rows) of each cache update the package's step writes itself from now on: "two" for mlx-lm's KVCache
    written as its update_and_fetch writes it, "one" for a joined cache's one write (mlx-lm's update_and_fetch makes
    the others)."""
    import sys

    step = sys.modules[pkg.__name__ + "._patch_step"]
    rows: list = []
    written, write = step._written, step._Joined.write

    def counted(cache, keys, values, end):  # noqa: ANN001, ANN202
        rows.append(("two", keys.shape[2]))
        return written(cache, keys, values, end)

    def counted_one(self, kv):  # noqa: ANN001, ANN202
        rows.append(("one", kv.shape[2]))
        return write(self, kv)

    monkeypatch.setattr(step, "_written", counted)
    monkeypatch.setattr(step._Joined, "write", counted_one)
    return rows


@pytest.mark.parametrize("joined", [True, False], ids=["one buffer", "two"])
@pytest.mark.parametrize("name", ["gqa", "qwen2"])
def test_the_cache_holds_what_mlx_lm_s_own_forward_puts_there(pkg, monkeypatch, name: str, joined: bool) -> None:
    """Step by step, one token a step across the cache's growth (every 8 positions here): the patched model's
    outputs and its KV cache (RoPE'd keys at each position, values) are mlx-lm's. The step writes mlx-lm's KVCache
    itself: from the second token on, keys and values joined in one buffer with one write a step, grown there;
    where the RoPE does not allow the joined step, as update_and_fetch writes them where it has room (mlx-lm's
    update_and_fetch allocates and grows it)."""
    import sys

    from mlx_lm.models.cache import KVCache, make_prompt_cache

    module, kw = CONFIGS[name]
    monkeypatch.setattr(KVCache, "step", 8)
    if not joined:
        monkeypatch.setattr(sys.modules[pkg.__name__ + "._patch_step"], "WHOLE_ROPES", frozenset())
    model = build(module, **kw)
    tokens = mx.array([PROMPT + [11, 3, 40, 2, 17, 8, 25, 60, 4, 9, 30, 12]])
    want_cache = make_prompt_cache(model)
    want = [model(tokens[:, i:i + 1], cache=want_cache) for i in range(tokens.shape[1])]
    pkg.patch(model, always=True)
    rows = _writes(pkg, monkeypatch)
    cache = make_prompt_cache(model)
    got = [model(tokens[:, i:i + 1], cache=cache) for i in range(tokens.shape[1])]
    assert all(mx.allclose(g, w, atol=1e-4).item() for g, w in zip(got, want))
    for c, w in zip(cache, want_cache):
        assert isinstance(c, KVCache) and type(c).__name__ == "KVCache"
        assert c.offset == w.offset == tokens.shape[1] and c.keys.shape == w.keys.shape
        for a, b in zip(c.keys_and_values(), w.keys_and_values()):
            assert mx.allclose(a, b, atol=1e-4).item()
    n = tokens.shape[1]
    # two layers. Joined: the first token allocates (update_and_fetch), every later one is one write. Two: positions
    # 0, 8 and 16 allocate or grow the cache (mlx-lm's update_and_fetch), the step writes the others.
    assert rows == ([("one", 1)] * 2 * (n - 1) if joined else [("two", 1)] * 2 * (n - 3)), rows


def test_the_joined_step_turns_queries_and_keys_as_the_two_write_step_and_leaves_the_values_exact(pkg) -> None:
    """The joined step's one RoPE call (the values' heads at offset 0) gives the queries and keys of the step that
    turns only theirs, bit for bit, and the values as the projection made them."""
    import sys

    step = sys.modules[pkg.__name__ + "._patch_step"]
    model = build(llama, num_key_value_heads=2)
    pkg.patch(model, always=True)
    state = vars(model.layers[0])["_kernsearch_patch"]
    x = mx.random.normal((1, 1, 128), key=mx.random.key(5)).astype(model.layers[0].input_layernorm.weight.dtype)
    for position in (0, 7, 300):
        queries, kv = state.joined(x, step._offsets(position, 1, 4 + 2, 2))
        want_q, want_k, want_v = state.step(x, step._offset(position))
        assert queries.shape == want_q.shape and kv.shape == (1, 4, 1, 32)
        assert mx.array_equal(queries, want_q).item() and mx.array_equal(kv[:, :2], want_k).item()
        assert mx.array_equal(kv[:, 2:], want_v).item()


def test_a_rope_that_also_scales_its_input_turns_only_the_queries_and_keys(pkg) -> None:
    """mlx-lm's YaRN RoPE scales what it turns (its mscale, here 1.14) before turning it: the values' heads must not
    ride along, so its blocks keep the step that turns only the queries and keys (two cache writes), the caches stay
    mlx-lm's, and the tokens and log-probs are mlx-lm's."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache
    from mlx_lm.models.rope_utils import YarnRoPE

    model = build(llama, num_key_value_heads=2)
    for layer in model.layers:
        layer.self_attn.rope = YarnRoPE(32, scaling_factor=4.0, mscale=1)
    assert model.layers[0].self_attn.rope.mscale > 1.1
    want, want_lp = greedy(model, 8)
    pkg.patch(model, always=True)
    states = [vars(b)["_kernsearch_patch"] for b in model.layers]
    assert all(s.step is not None and s.joined is None for s in states)
    got, got_lp = greedy(model, 8)
    assert got == want and mx.allclose(got_lp, want_lp, atol=1e-4).item()
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=cache)
    model(mx.array([[3]]), cache=cache)
    assert all(type(c) is KVCache for c in cache)


def test_a_joined_cache_saves_loads_trims_and_takes_a_second_prompt_as_mlx_lm_s(pkg, tmp_path: Path) -> None:
    """A cache joined by the patched decode is still mlx-lm's KVCache to mlx-lm: saved by save_prompt_cache and
    loaded by load_prompt_cache as a KVCache, trimmed by trim_prompt_cache, fed a second prompt, its state read and
    set (which turns it back into a plain KVCache) — each time the model (patched or not) computes what it computes
    with mlx-lm's own cache fed the same tokens."""
    from mlx_lm.models.cache import (
        KVCache,
        load_prompt_cache,
        make_prompt_cache,
        save_prompt_cache,
        trim_prompt_cache,
    )

    model = build(llama, num_key_value_heads=2)
    tokens = mx.array([PROMPT + [11, 3, 40, 2]])
    second = mx.array([[8, 25, 60, 4, 9]])
    want_cache = make_prompt_cache(model)
    model(tokens[:, :6], cache=want_cache)
    want = [model(tokens[:, i:i + 1], cache=want_cache) for i in range(6, 10)]
    trim_prompt_cache(want_cache, 2)
    want.append(model(second, cache=want_cache))
    want.append(model(mx.array([[7]]), cache=want_cache))
    pkg.patch(model, always=True)
    cache = make_prompt_cache(model)
    model(tokens[:, :6], cache=cache)
    got = [model(tokens[:, i:i + 1], cache=cache) for i in range(6, 10)]
    assert all("_kv" in vars(c) for c in cache)  # joined
    save_prompt_cache(str(tmp_path / "c.safetensors"), cache)
    import copy
    import pickle

    loaded = load_prompt_cache(str(tmp_path / "c.safetensors"))
    assert [type(c) for c in loaded] == [KVCache, KVCache] and [c.offset for c in loaded] == [10, 10]
    for c in (cache, loaded):
        trim_prompt_cache(c, 2)
    got.append(model(second, cache=cache))  # five rows: the step, into the joined buffer
    copied = [pickle.loads(pickle.dumps(cache)), copy.deepcopy(cache)]  # as mlx-lm's server and prompt cache do
    got.append(model(mx.array([[7]]), cache=cache))
    assert len(got) == len(want) and all(mx.allclose(g, w, atol=1e-4).item() for g, w in zip(got, want))
    assert mx.allclose(model(second, cache=loaded), want[4], atol=1e-4).item()
    assert all(type(c) is KVCache and c.offset == 13 for cs in copied for c in cs)
    assert all(mx.allclose(model(mx.array([[7]]), cache=cs), want[5], atol=1e-4).item() for cs in copied)
    keys, values, offset = cache[0].state
    cache[0].state = (keys, values, offset)  # set: a plain KVCache again, holding the same arrays
    assert type(cache[0]) is KVCache and "_kv" not in vars(cache[0]) and cache[0].offset == 14
    pkg.unpatch(model)
    assert mx.allclose(model(mx.array([[9]]), cache=cache), model(mx.array([[9]]), cache=want_cache),
                       atol=1e-4).item()


def test_a_joined_cache_is_quantized_by_mlx_lm_mid_generation_and_decodes_the_same_tokens(pkg) -> None:
    """mlx-lm quantizes the KV cache once it holds ``quantized_kv_start`` positions (KVCache.to_quantized): a
    joined cache turns into the same QuantizedKVCache, and the tokens are mlx-lm's."""
    model = build(llama, num_key_value_heads=2)
    kw = {"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 10}
    want = [t for t, _ in generate_step(mx.array(PROMPT), model, max_tokens=16, **kw)]
    pkg.patch(model, always=True)
    assert [t for t, _ in generate_step(mx.array(PROMPT), model, max_tokens=16, **kw)] == want


def test_a_cache_of_another_class_is_updated_by_its_own_update_and_fetch(pkg, monkeypatch) -> None:
    """The step writes only the cache whose code it reproduces: a subclass of mlx-lm's KVCache (its own class: its
    methods may differ) is updated by its update_and_fetch on every step, with the same tokens."""
    from mlx_lm.models.cache import KVCache

    class MyCache(KVCache):
        pass

    model = build(llama)
    prompt = mx.array(PROMPT)
    want = [t for t, _ in generate_step(prompt, model, max_tokens=8, prompt_cache=[MyCache(), MyCache()])]
    pkg.patch(model, always=True)
    rows = _writes(pkg, monkeypatch)
    assert [t for t, _ in generate_step(prompt, model, max_tokens=8, prompt_cache=[MyCache(), MyCache()])] == want
    assert rows == [], rows
    # mlx-lm's own KVCache: written by the step at the prompt's last token and the 8 steps after it; two layers
    assert greedy(model, 8)[0] == want and rows == [("one", 1)] * 2 * (1 + 8), rows


@pytest.mark.parametrize("kind", ["quantized", "rotating"])
def test_mlx_lm_s_quantized_and_rotating_caches_decode_the_same_tokens(pkg, monkeypatch, kind: str) -> None:
    """mlx-lm's other caches (a quantized KV cache, a rotating one that wraps past 12 positions) are updated by their
    own update_and_fetch, and the patched model decodes what mlx-lm decodes with them."""
    from mlx_lm.models.cache import RotatingKVCache

    model = build(llama, num_key_value_heads=2)
    prompt = mx.array(PROMPT)

    def generated() -> list:
        kw = ({"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 0} if kind == "quantized" else
              {"prompt_cache": [RotatingKVCache(max_size=12, keep=4) for _ in model.layers]})
        return [t for t, _ in generate_step(prompt, model, max_tokens=16, **kw)]

    want = generated()
    pkg.patch(model, always=True)
    rows = _writes(pkg, monkeypatch)
    assert generated() == want
    assert rows == [], rows


def test_a_rope_of_another_class_runs_as_mlx_lm_runs_it_on_every_step(pkg, monkeypatch) -> None:
    """The compiled step calls only a RoPE whose code it knows passes the offset through (mlx-lm's DynamicNTK
    computes with it in Python): a RoPE of another class runs on every step with the cache's int offset, as mlx-lm
    calls it, and the tokens are the same."""

    class MyRope(nn.RoPE):
        def __call__(self, x, offset=0):  # noqa: ANN001, ANN204
            return super().__call__(x, offset=offset)

    model = build(llama)
    for layer in model.layers:
        layer.self_attn.rope = MyRope(32, traditional=False, base=10000)
    want = greedy(model, 8)[0]
    pkg.patch(model, always=True)
    calls = _rope_calls(monkeypatch, MyRope)
    assert greedy(model, 8)[0] == want
    assert len(calls) == (1 + 1 + 8) * 2 and not any(a for _, a in calls), calls


def test_unpatch_restores_bit_identical_outputs_and_the_same_parameters(pkg) -> None:
    model = build(llama, num_key_value_heads=2)
    before = dict(tree_flatten(model.parameters()))
    tokens = mx.array([PROMPT])
    want = model(tokens)
    pkg.patch(model, always=True)
    assert {k: id(v) for k, v in tree_flatten(model.parameters())} == {k: id(v) for k, v in before.items()}
    patched = model(tokens[:, :1])
    assert pkg.unpatch(model) == 2
    assert all(type(b) is llama.TransformerBlock for b in model.layers)
    assert all("_kernsearch_patch" not in vars(b) for b in model.layers)
    assert mx.array_equal(model(tokens), want).item()
    assert mx.allclose(model(tokens[:, :1]), patched, atol=1e-4).item()
    assert pkg.unpatch(model) == 0


def test_where_no_kernel_was_measured_to_win_every_block_is_left_to_mlx_lm_and_it_says_so(pkg, monkeypatch) -> None:
    """Routed through the package a block would run the same MLX ops plus the package's per-call cost (measured
    0.90-1.02x on an H200 for a config nothing was tuned for): left alone, it runs mlx-lm's own forward."""
    model = build(llama)
    calls = counting(pkg, monkeypatch)
    with pytest.warns(RuntimeWarning, match="2 of 2 layers left alone .no kernel of the package was measured"):
        report = pkg.patch(model)
    assert report.patched == 0 and all(type(b) is llama.TransformerBlock for b in model.layers)
    assert all("measured to beat the MLX op on this chip" in r.left_alone for r in report.layers)
    greedy(model, 4)
    assert sum(calls.values()) == 0
    assert pkg.patch(model, always=True).patched == 2  # asked to, it routes them all the same
    assert pkg.unpatch(model) == 2
    assert "not patched (call patch(model))" in str(pkg.explain(model))


def test_row_counts_with_a_kernel_run_the_package_the_others_mlx_lm(pkg, monkeypatch) -> None:
    """A kernel measured to win at one row (say the chip's store holds M = 1 only): one-row decode steps run through
    the package, five-row ones mlx-lm's own forward."""
    import dataclasses

    model = build(llama)
    want = [model(mx.array([[3]])), model(mx.array([[3, 4, 5, 6, 7]]))]
    explain = pkg._patcher.d.explain

    def one_row_wins(family, *arrays, **kw):
        d = explain(family, *arrays, **kw)
        return dataclasses.replace(d, entry={"config": {}}) if family == "rmsnorm_qmatvec" and \
            arrays[0].shape[0] == 1 else d

    monkeypatch.setattr(pkg._patcher.d, "explain", one_row_wins)
    calls = counting(pkg, monkeypatch)
    report = pkg.patch(model)
    assert report.patched == 2 and all(r.rows == (1,) for r in report.layers)
    assert "decode steps of 1 rows run through the package" in str(report)
    got = model(mx.array([[3]]))
    assert sum(calls.values()) == 8  # two layers, four steps each
    assert mx.allclose(got, want[0], atol=1e-4).item()
    assert mx.allclose(model(mx.array([[3, 4, 5, 6, 7]])), want[1], atol=1e-4).item()
    assert sum(calls.values()) == 8  # five rows: nothing measured there, mlx-lm's own forward


def test_a_one_token_step_runs_the_package_a_prompt_runs_mlx_lm(pkg, monkeypatch) -> None:
    model = build(llama)
    calls = counting(pkg, monkeypatch)
    pkg.patch(model, always=True)
    model(mx.array([list(range(17))]))  # 17 rows: a prompt, mlx-lm's own forward
    assert sum(calls.values()) == 0
    model(mx.array([[3] * 16]))  # 16 rows: the families' largest decode step
    assert sum(calls.values()) == 8


def test_explain_says_what_each_layer_runs_and_why(pkg) -> None:
    model = build(llama)
    before = pkg.explain(model)
    assert before.patched == 0 and "not patched" in str(before)
    text = str(pkg.patch(model, always=True))
    assert text == str(pkg.explain(model))
    assert text.startswith("2 of 2 layers patched")
    for step in ("norm + Q/K/V", "O + residual", "norm + gate/up SwiGLU", "down + residual"):
        assert text.count(step) == 2
    assert "no GPU back-end here" in text  # the package's own decision for each call


def test_an_eps_other_than_the_families_runs_the_norm_then_the_plain_family(pkg, monkeypatch) -> None:
    model = build(llama, eps=1e-6)
    want, _ = greedy(model, 8)
    calls = counting(pkg, monkeypatch)
    text = str(pkg.patch(model, always=True, compiled=False))
    assert greedy(model, 8)[0] == want
    assert calls["rmsnorm_qmatvec"] == calls["rmsnorm_swiglu_qmatvec"] == 0
    assert calls["swiglu_qmatvec"] == (1 + 1 + 8) * 2
    if "rmsnorm_qmatvec" in builtin_family_names():
        assert "the norm's eps 1e-06 is not rmsnorm_qmatvec's 1e-05" in text


def test_blocks_it_does_not_reproduce_are_left_alone_and_it_says_so(pkg) -> None:
    model = build(llama)

    class Other(llama.TransformerBlock):  # a block whose forward differs (another version, another model)
        def __call__(self, x, mask=None, cache=None):
            return super().__call__(x, mask, cache) * 1.0

    model.layers[1].__class__ = Other
    unquantized = llama.Model(llama.ModelArgs("llama", 64, 1, 128, 2, 1e-5, 50))
    with pytest.warns(RuntimeWarning, match="1 of 2 layers left alone"):
        report = pkg.patch(model, always=True)
    assert [r.patched for r in report.layers] == [True, False]
    assert "Other is not a block of mlx-lm's Llama family" in report.layers[1].left_alone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = str(pkg.patch(unquantized, always=True))
    assert "attention: mlx-lm's own modules (q_proj is Linear, not a QuantizedLinear" not in text  # left alone whole
    assert "0 of 1 layers patched" in text and "left alone" in text


def test_the_package_ships_the_patch_modules_byte_for_byte(pkg) -> None:
    from kernsearch.exporting.runtime import _fingerprint, _patch, _patch_step

    for module in (_patch, _patch_step, _fingerprint):
        shipped = Path(pkg.__file__).parent / Path(module.__file__).name
        assert shipped.read_bytes() == Path(module.__file__).read_bytes()


def _tiny_local_model(folder: Path) -> None:
    """What `mlx_lm.load` reads from a local folder: a tiny Llama's config and weights (quantized by mlx-lm, saved by
    mlx-lm) and a word-level tokenizer (nothing downloaded)."""
    import json

    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(253)), *"Write a haiku about GPUs".split()]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    config = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": len(words),
              "tie_word_embeddings": False}
    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs(**config))
    model.update(tree_map(lambda a: a * 3 if a.ndim == 2 else a, model.parameters()))
    model, config = quantize_model(model, config, 32, 4)
    save_model(folder, model)
    save_config(config, folder / "config.json")


def test_the_docs_example_loads_patches_explains_and_generates_what_mlx_lm_generates(tmp_path: Path) -> None:
    """docs/mlx-lm.md's block as written, on a tiny model saved where `load` reads it (the hub's name replaced by the
    folder) with the package exported as kernsearch_kernels; the same block without the patch line generates the
    same text."""
    import os
    import re
    import subprocess
    import sys

    page = (Path(__file__).resolve().parents[1] / "docs" / "mlx-lm.md").read_text()
    block = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    _tiny_local_model(tmp_path / "model")
    names = list(FAMILIES)
    result = export(names, tmp_path / "dist", ArtifactStore(tmp_path / "store"), package="kernsearch_kernels",
                    version="1.0")
    script = block.replace('"mlx-community/Meta-Llama-3.1-8B-Instruct-4bit"', repr(str(tmp_path / "model")))
    assert script != block
    env = {**os.environ, "PYTHONPATH": str(result.source_dir), "HF_HUB_OFFLINE": "1"}

    def run(text: str) -> str:
        r = subprocess.run([sys.executable, "-c", text], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    as_written = run(script)  # here no kernel can run: every block is left to mlx-lm, and explain says why
    assert "0 of 2 layers patched" in as_written and "measured to beat the MLX op on this chip" in as_written
    routed = run(script.replace("kernsearch_kernels.patch(model)", "kernsearch_kernels.patch(model, always=True)"))
    assert "2 of 2 layers patched" in routed and "norm + gate/up SwiGLU" in routed
    plain = run(script.replace("kernsearch_kernels.patch(model)", "pass"))
    assert "0 of 2 layers patched" in plain and "not patched (call patch(model))" in plain
    text = routed.strip().splitlines()[-1]
    assert len(set(text.split())) > 4
    assert text == plain.strip().splitlines()[-1] == as_written.strip().splitlines()[-1]


def test_a_batch_of_four_with_and_without_a_cache_computes_what_mlx_lm_computes(pkg) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    model = build(llama, num_key_value_heads=2)
    tokens = mx.array([[3, 7, 11], [5, 2, 9], [1, 1, 4], [8, 6, 2]])  # 4 rows of 3: 12 rows per step
    caches = [make_prompt_cache(model), make_prompt_cache(model)]
    want = [model(tokens), model(tokens[:, :2], cache=caches[0]), model(tokens[:, 2:], cache=caches[0])]
    pkg.patch(model, always=True)
    got = [model(tokens), model(tokens[:, :2], cache=caches[1]), model(tokens[:, 2:], cache=caches[1])]
    for g, w in zip(got, want):
        assert mx.allclose(g, w, atol=1e-4).item()
    assert not mx.allclose(got[2], model(tokens[:, 2:]), atol=1e-4).item()  # the cache's offset and keys matter


def test_an_mlp_with_biases_runs_mlx_lm_s_modules_and_the_attention_is_still_patched(pkg, monkeypatch) -> None:
    model = build(llama, mlp_bias=True)
    want, _ = greedy(model, 8)
    calls = counting(pkg, monkeypatch)
    report = pkg.patch(model, always=True, compiled=False)
    assert report.patched == 2
    assert "MLP: mlx-lm's own modules (gate_proj or up_proj has a bias" in str(report)
    assert greedy(model, 8)[0] == want
    assert calls["rmsnorm_swiglu_qmatvec"] == calls["swiglu_qmatvec"] == 0 and sum(calls.values()) == 2 * 20


def test_weights_the_package_refuses_leave_that_half_to_mlx_lm(pkg, monkeypatch) -> None:
    model = build(llama)
    want, _ = greedy(model, 8)
    bind = pkg._patcher.d.bind

    def refusing(family, *weights, **kw):
        if family in ("rmsnorm_swiglu_qmatvec", "swiglu_qmatvec"):
            raise ValueError("shapes out of the package's range")
        return bind(family, *weights, **kw)

    monkeypatch.setattr(pkg._patcher.d, "bind", refusing)
    text = str(pkg.patch(model, always=True))
    assert "MLP: mlx-lm's own modules" in text and "refused the block's weights: shapes out of" in text
    assert "norm + Q/K/V" in text and greedy(model, 8)[0] == want


_FINGERPRINT_PROBE = r'''
import ast, hashlib, importlib.util, sys, textwrap
spec = importlib.util.spec_from_file_location("ks_patch_probe", sys.argv[1])
mod = importlib.util.module_from_spec(spec); sys.modules["ks_patch_probe"] = mod; spec.loader.exec_module(mod)
src = open(sys.argv[2]).read()
lines = src.splitlines(True)
found = {}
for node in ast.parse(src).body:
    if isinstance(node, ast.ClassDef) and node.name in ("TransformerBlock", "Attention", "MLP"):
        fn = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__call__")
        text = textwrap.dedent("".join(lines[fn.lineno - 1:fn.end_lineno]))
        found[node.name] = hashlib.sha256(repr(mod._tree_shape(ast.parse(text))).encode()).hexdigest()[:16]
print(found["TransformerBlock"], found["Attention"], found["MLP"])
'''


@pytest.mark.slow
def test_a_forward_has_one_fingerprint_on_every_python(tmp_path: Path) -> None:
    """mlx-lm's forward hashes the same on every Python that can run the package (3.9 to 3.13): Python 3.12's parser
    adds fields (``type_params``) to the same code, which made an ``ast.dump`` hash miss on the GPU machine's 3.12
    (0 of 32 layers patched)."""
    import glob
    import subprocess
    import sys

    import mlx_lm.models.llama as llama

    from kernsearch.exporting.runtime import _fingerprint, _patch

    pythons = sorted({p for v in ("3.9", "3.10", "3.12", "3.13")
                      for p in glob.glob(f"/root/.pyenv/versions/{v}*/bin/python3") + glob.glob(f"/usr/bin/python{v}")})
    if not pythons:
        pytest.skip("no other Python here to compare with")
    probe = tmp_path / "probe.py"
    probe.write_text(_FINGERPRINT_PROBE)
    want = " ".join(next(iter(_patch.FORWARDS)))
    for py in [sys.executable, *pythons]:
        r = subprocess.run([py, str(probe), _fingerprint.__file__, llama.__file__], capture_output=True, text=True,
                           timeout=120, check=False)
        assert r.returncode == 0, (py, r.stderr[-2000:])
        assert r.stdout.strip() == want, py


def test_the_gpu_rope_check_passes_on_the_cpu() -> None:
    """benchmarks/gpu_rope_heads_exact.py (what the joined step rests on, run on the GPU): one RoPE call with one
    offset a head gives the two-call queries and keys bit for bit and leaves the values' heads unchanged."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_rope_heads_exact.py"
    spec = importlib.util.spec_from_file_location("gpu_rope_heads_exact", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--cpu"]) == 0
