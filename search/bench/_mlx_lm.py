"""``kernsearch bench decode --mlx-lm``: an mlx-lm model, decoded by mlx-lm's own generation loop, with and without
the exported package's ``patch(model)``.

The model is mlx-lm's Llama (``mlx_lm.models.llama``) built from a config (random weights, nothing downloaded) and
quantized by mlx-lm (``mlx_lm.utils.quantize_model``); ``mlx_lm.generate.generate_step`` runs the prompt, then N
greedy tokens, alternately on the model as mlx-lm built it and patched (attention, RoPE and the KV cache are mlx-lm's
in both), round by round in alternating order. It reports tokens/s of the prompt (prefill) and of decoding, and
compares the tokens the two generate: identical for the first 32 (or all, if fewer), or their log-probabilities
within the dtype's tolerance wherever the two had generated the same tokens before.

On MLX's CPU back-end the same code runs (a dry run); its timings are the CPU's, never a GPU's.
"""

from __future__ import annotations

import gc
import importlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._errors import KernsearchError
from .._rules import ratio_interval
from ..artifacts._artifacts import ArtifactStore
from ..exporting._export import export
from ._decode import device_kind, evidence_for

#: The families ``patch`` calls (the fused ones first; the plain ones where a block needs them).
FAMILIES = ("rmsnorm_qmatvec", "qmatvec_residual", "rmsnorm_swiglu_qmatvec", "qmatvec", "swiglu_qmatvec")
#: The exported package's name while the benchmark imports it (a user's installed package stays untouched).
PACKAGE = "kernsearch_bench_lm_kernels"
#: Greedy tokens that must agree (all of them when fewer are generated).
SAME_TOKENS = 32
#: Log-probabilities of the two forms may differ this much (absolute) where their inputs were the same tokens: a
#: few units in the last place of the dtype at |log p| ~ 10.
LOGPROB_TOL = {"float32": 1e-3, "float16": 3e-2, "bfloat16": 2.5e-1}

Say = Callable[[str], None]


class MlxLmError(KernsearchError):
    """The mlx-lm benchmark cannot run as asked (a bad config, mlx-lm missing)."""


@dataclass(frozen=True)
class LmConfig:
    """An mlx-lm Llama model's shape and quantization (``--hidden``, ``--ffn``... of ``bench decode --mlx-lm``)."""

    hidden: int = 4096
    ffn: int = 11008
    layers: int = 32
    heads: int = 32
    kv_heads: int = 32
    vocab: int = 32000
    bits: int = 4
    group: int = 64
    dtype: str = "float16"
    eps: float = 1e-5

    def check(self) -> LmConfig:
        if self.bits not in (4, 8) or self.group not in (32, 64, 128):
            raise MlxLmError(f"{self.bits} bits, groups of {self.group}: mlx-lm's affine quantization as the "
                             "families take it is 4 or 8 bits, groups of 32, 64 or 128")
        if self.dtype not in LOGPROB_TOL:
            raise MlxLmError(f"--dtype {self.dtype}: float16, bfloat16 or float32")
        for name, value in (("--hidden", self.hidden), ("--ffn", self.ffn)):
            if not 0 < value <= 65536 or value % self.group:
                raise MlxLmError(f"{name} {value}: a positive multiple of the group size ({self.group}), at most "
                                 "65536")
        if not (0 < self.layers <= 256 and 0 < self.kv_heads <= self.heads <= self.hidden):
            raise MlxLmError("--layers 1 to 256; --kv-heads at most --heads, --heads at most --hidden")
        if self.hidden % self.heads or self.heads % self.kv_heads or (self.hidden // self.heads) % 2:
            raise MlxLmError(f"--heads {self.heads} must divide --hidden {self.hidden} into even head widths, and "
                             f"--kv-heads {self.kv_heads} divide --heads")
        if not 2 <= self.vocab <= 1 << 20:
            raise MlxLmError(f"--vocab {self.vocab}: 2 to 1048576")
        return self


@dataclass(frozen=True)
class FormRun:
    """One generation of one form: tokens/s of the prompt and of decoding (the tokens after the first)."""

    prefill_tps: float
    decode_tps: float


@dataclass(frozen=True)
class Comparison:
    """The patched model's generation against mlx-lm's: leading identical tokens, and the largest log-probability
    difference over the steps both took from the same tokens."""

    generated: int
    same_tokens: int
    distinct_tokens: int
    max_logprob_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.same_tokens >= min(SAME_TOKENS, self.generated) or self.max_logprob_diff <= self.tolerance


@dataclass
class MlxLmReport:
    """What ``bench decode --mlx-lm`` prints (``to_json``)."""

    device: str
    evidence: str | None  # measured on a GPU; None on the CPU (timings of the CPU, a dry run)
    mlx: str
    mlx_lm: str
    config: LmConfig
    prompt_tokens: int
    tokens: int
    plain: list[FormRun] = field(default_factory=list)
    patched: list[FormRun] = field(default_factory=list)
    comparison: Comparison | None = None
    patched_layers: int = 0
    explain: str = ""
    notes: list[str] = field(default_factory=list)
    #: MLX's settings read from the environment for this run (``MLX_*``: on CUDA, how many ops and MB a command
    #: buffer takes, which sets how many commits a decode token costs): both forms ran under them.
    mlx_settings: dict[str, str] = field(default_factory=dict)

    def _ratios(self, attr: str) -> list[float]:
        return [getattr(p, attr) / getattr(q, attr) for p, q in zip(self.patched, self.plain)]

    @property
    def decode_speedup(self) -> float:
        """Median over rounds of patched / plain decode tokens/s (each round's pair ran back to back)."""
        return statistics.median(self._ratios("decode_tps")) if self.plain else float("nan")

    @property
    def prefill_speedup(self) -> float:
        return statistics.median(self._ratios("prefill_tps")) if self.plain else float("nan")

    @property
    def decode_interval(self) -> tuple[float, float]:
        """The 99 % interval of the median decode ratio (the rules' order-statistic interval, as the gate's): 0 to
        infinity with too few rounds to bound anything, which says so."""
        interval = ratio_interval(self._ratios("decode_tps"))
        return interval.low, interval.high

    def median(self, form: str, attr: str) -> float:
        runs = self.plain if form == "plain" else self.patched
        return statistics.median(getattr(r, attr) for r in runs) if runs else float("nan")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        ratios = self._ratios("decode_tps")
        out["summary"] = {
            "decode_tps": {"plain": self.median("plain", "decode_tps"),
                           "patched": self.median("patched", "decode_tps")},
            "prefill_tps": {"plain": self.median("plain", "prefill_tps"),
                            "patched": self.median("patched", "prefill_tps")},
            "decode_speedup": self.decode_speedup, "decode_speedup_range": [min(ratios), max(ratios)] if ratios else [],
            "decode_interval": list(self.decode_interval),
            "prefill_speedup": self.prefill_speedup,
            "tokens_ok": self.comparison.ok if self.comparison else None}
        return out

    def lines(self) -> list[str]:
        """The report as text (what the CLI prints without --json)."""
        c = self.config
        out = [f"mlx-lm Llama {c.layers} layers, hidden {c.hidden}, FFN {c.ffn}, {c.heads} heads ({c.kv_heads} KV), "
               f"{c.bits}-bit g{c.group}, {c.dtype}, on {self.device} (mlx {self.mlx}, mlx-lm {self.mlx_lm}); "
               f"prompt {self.prompt_tokens}, {self.tokens} tokens, {len(self.plain)} rounds",
               f"decode tokens/s: mlx-lm {self.median('plain', 'decode_tps'):.1f}, patched "
               f"{self.median('patched', 'decode_tps'):.1f}: {self.decode_speedup:.2f}x (99 % interval of the median "
               f"ratio {self.decode_interval[0]:.2f}-{self.decode_interval[1]:.2f})",
               f"prefill tokens/s: mlx-lm {self.median('plain', 'prefill_tps'):.1f}, patched "
               f"{self.median('patched', 'prefill_tps'):.1f}: {self.prefill_speedup:.2f}x"]
        if self.comparison is not None:
            k = self.comparison
            out.append(f"tokens: first {k.same_tokens} of {k.generated} identical ({k.distinct_tokens} distinct); "
                       f"largest log-prob difference {k.max_logprob_diff:.2e} (tolerance {k.tolerance:g}): "
                       f"{'the same' if k.ok else 'DIFFERENT'}")
        settings = [f"MLX's settings (both forms): {' '.join(f'{k}={v}' for k, v in self.mlx_settings.items())}"]
        return out + (settings if self.mlx_settings else []) + self.notes + [self.explain]


# -- building --------------------------------------------------------------------------------------------

def _mlx_lm() -> tuple[Any, Any, Any]:
    """mlx-lm's Llama module, its quantization and its generation loop."""
    try:
        llama = importlib.import_module("mlx_lm.models.llama")
        utils = importlib.import_module("mlx_lm.utils")
        generate = importlib.import_module("mlx_lm.generate")
    except ImportError as exc:
        raise MlxLmError(f"mlx-lm is not installed here ({exc}): pip install 'kernsearch[lm]'") from None
    return llama, utils.quantize_model, generate.generate_step


def build_model(config: LmConfig, seed: int = 0) -> Any:
    """An mlx-lm Llama model of ``config``: mlx-lm's own initialisation (random), in ``config.dtype``, quantized by
    mlx-lm as ``mlx_lm.convert -q`` does; evaluated one layer at a time (a 7B-shaped model never holds all its
    unquantized weights at once)."""
    import mlx.core as mx

    llama, quantize_model, _ = _mlx_lm()
    args = llama.ModelArgs(model_type="llama", hidden_size=config.hidden, num_hidden_layers=config.layers,
                           intermediate_size=config.ffn, num_attention_heads=config.heads,
                           num_key_value_heads=config.kv_heads, rms_norm_eps=config.eps, vocab_size=config.vocab,
                           tie_word_embeddings=False)
    mx.random.seed(seed)
    model = llama.Model(args)
    model.set_dtype(getattr(mx, config.dtype))
    model, _ = quantize_model(model, {}, config.group, config.bits)
    for layer in model.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())
    return model


def import_package(store: ArtifactStore, work: Path) -> Any:
    """The store's current artifacts of :data:`FAMILIES` exported as a package under ``work`` and imported from
    there: every call goes through its dispatcher as in a user's process."""
    from ..family._spec import builtin_family_names

    names = [f for f in FAMILIES if f in builtin_family_names()]
    result = export(names, work, store, package=PACKAGE, version="0.0.1")
    sys.modules.pop(PACKAGE, None)
    sys.path.insert(0, str(result.source_dir))
    try:
        return importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(result.source_dir))


# -- running ---------------------------------------------------------------------------------------------

@dataclass
class _Generation:
    tokens: list[int]
    logprobs: list[Any]
    run: FormRun


def generate(model: Any, prompt: Any, tokens: int, keep: bool) -> _Generation:
    """mlx-lm's generation loop (``generate_step``, greedy): the time to the first token is the prompt's, the rest
    the decoding's (``tokens - 1`` tokens)."""
    _, _, generate_step = _mlx_lm()
    out, lps = [], []
    t0 = time.perf_counter()
    t1 = t0
    for i, (tok, lp) in enumerate(generate_step(prompt, model, max_tokens=tokens)):
        if i == 0:
            t1 = time.perf_counter()
        out.append(int(tok))
        if keep:
            lps.append(lp)
    t2 = time.perf_counter()
    decode = (len(out) - 1) / (t2 - t1) if len(out) > 1 and t2 > t1 else float("nan")
    return _Generation(out, lps, FormRun(int(prompt.size) / (t1 - t0), decode))


def compare(mx: Any, plain: _Generation, patched: _Generation, dtype: str) -> Comparison:
    """Leading identical tokens; the largest log-prob difference over the steps fed the same tokens (up to and
    including the first that differs)."""
    n = min(len(plain.tokens), len(patched.tokens))
    same = next((i for i in range(n) if plain.tokens[i] != patched.tokens[i]), n)
    steps = min(same + 1, n, len(plain.logprobs), len(patched.logprobs))
    diff = 0.0
    for a, b in zip(plain.logprobs[:steps], patched.logprobs[:steps]):
        diff = max(diff, float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()))
    return Comparison(n, same, len(set(plain.tokens)), diff, LOGPROB_TOL[dtype])


def _patched(pkg: Any, model: Any, notes: list[str], always: bool = False) -> Any:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = pkg.patch(model, always=always)
    for w in caught:
        if str(w.message) not in notes:
            notes.append(str(w.message))
    return report


def _setting_notes(kind: str | None, always: bool) -> list[str]:
    """What the report's figures must be read with: a CPU's timings, the patch routing every step."""
    notes = ["MLX's CPU back-end: the timings are the CPU's, not a GPU's (a dry run)"] if kind is None else []
    if always:
        notes.append("patch(model, always=True): every decode step runs through the package, kernels or not")
    return notes


def mlx_settings() -> dict[str, str]:
    """The ``MLX_*`` variables of this process's environment (names and values cut to 64 and 256 characters, at
    most 32 of them): what MLX read when it started."""
    named = sorted((k, v) for k, v in os.environ.items() if k.startswith("MLX_"))[:32]
    return {k[:64]: v[:256] for k, v in named}


def run_mlx_lm(config: LmConfig, prompt_tokens: int = 128, tokens: int = 128, rounds: int = 3,
               store: ArtifactStore | None = None, say: Say = lambda line: None, seed: int = 0,
               always: bool = False) -> MlxLmReport:
    """Build the model, export and import the store's package, then ``rounds`` interleaved pairs of generations
    (mlx-lm's model, then patched; the order reversed every other round), after one untimed pair (warm-up, and the
    pair whose tokens and log-probabilities are compared). ``always``: ``patch(model, always=True)``, every decode
    step through the package whether or not a kernel runs (a dry run of the rebuilt forward on the CPU)."""
    import mlx.core as mx

    config.check()
    if not (1 <= prompt_tokens <= 1 << 16 and 1 <= tokens <= 1 << 16 and 1 <= rounds <= 100):
        raise MlxLmError("--prompt and --tokens 1 to 65536, --rounds 1 to 100")
    kind = device_kind(mx)
    version = importlib.import_module("importlib.metadata").version
    report = MlxLmReport(kind or "cpu", evidence_for(kind),
                         str(getattr(mx, "__version__", "?")), version("mlx-lm") if _has_mlx_lm() else "?", config,
                         prompt_tokens, tokens)
    report.notes.extend(_setting_notes(kind, always))
    report.mlx_settings = mlx_settings()
    with tempfile.TemporaryDirectory(prefix="kernsearch-bench-lm-") as tmp:
        say("exporting the store's package (the families patch(model) calls)")
        pkg = import_package(store or ArtifactStore(), Path(tmp))
        say(f"building the model ({config.layers} layers, random weights, quantized by mlx-lm)")
        model = build_model(config, seed)
        prompt = mx.random.randint(0, config.vocab, (prompt_tokens,), key=mx.random.key(seed + 1))
        say("generating once each, untimed (warm-up; the tokens compared)")
        plain = generate(model, prompt, tokens, keep=True)
        explained = _patched(pkg, model, report.notes, always)
        patched = generate(model, prompt, tokens, keep=True)
        pkg.unpatch(model)
        report.comparison = compare(mx, plain, patched, config.dtype)
        report.patched_layers = explained.patched
        layers = explained.layers
        report.explain = "\n".join([str(explained).splitlines()[0], *(str(layers[0]).splitlines() if layers else [])])
        del plain, patched
        for r in range(rounds):
            for form in (("plain", "patched") if r % 2 == 0 else ("patched", "plain")):
                if form == "patched":
                    _patched(pkg, model, report.notes, always)
                # A fresh patch plans each layer's calls at their first decode step (a one-time cost of ~1 ms a call,
                # once per patch): a user patches once, so it is paid here, untimed. Both forms take the same short
                # generation first, and the garbage of the last patch and unpatch is collected, not mid-generation:
                # on an H200 a config left alone by patch (identical code in both forms) read 0.90x without these.
                generate(model, prompt, 2, keep=False)
                gc.collect()
                run = generate(model, prompt, tokens, keep=False).run
                if form == "patched":
                    pkg.unpatch(model)
                (report.patched if form == "patched" else report.plain).append(run)
            say(f"round {r + 1}/{rounds}: decode tokens/s mlx-lm {report.plain[-1].decode_tps:.1f}, patched "
                f"{report.patched[-1].decode_tps:.1f}")
    return report


def _has_mlx_lm() -> bool:
    try:
        importlib.import_module("importlib.metadata").version("mlx-lm")
        return True
    except Exception:  # noqa: BLE001 - PackageNotFoundError: mlx-lm imported from a path, not installed
        return False


__all__ = ["FAMILIES", "Comparison", "FormRun", "LmConfig", "MlxLmError", "MlxLmReport", "build_model", "compare",
           "generate", "import_package", "run_mlx_lm"]


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m kernsearch.bench._mlx_lm``: the benchmark without the CLI (the GPU machine's command)."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m kernsearch.bench._mlx_lm", description=__doc__.split("\n")[0])
    for name, default in (("hidden", 4096), ("ffn", 11008), ("layers", 32), ("heads", 32), ("kv-heads", 32),
                          ("vocab", 32000), ("bits", 4), ("group", 64), ("prompt", 128), ("tokens", 128),
                          ("rounds", 3)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--store", default=None)
    p.add_argument("--json", default=None, help="write the report's JSON to this file")
    p.add_argument("--always-patch", action="store_true",
                   help="patch(model, always=True): every decode step through the package, kernels or not")
    a = p.parse_args(argv)
    config = LmConfig(a.hidden, a.ffn, a.layers, a.heads, a.kv_heads, a.vocab, a.bits, a.group, a.dtype)
    try:
        report = run_mlx_lm(config, a.prompt, a.tokens, a.rounds, ArtifactStore(a.store) if a.store else None,
                            lambda line: print(line, file=sys.stderr, flush=True), always=a.always_patch)
    except KernsearchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover - the GPU machine's entry point
    raise SystemExit(_main())
