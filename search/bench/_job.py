"""``kernsearch bench decode --job FILE``: the job file that tunes every shape the step calls.

A user tunes their model's decode step in one command (``kernsearch flows run FILE``): one job per fused family,
the step's shapes at each M, the chip named, publishing into the store the benchmark reads. Every value written
is a number or a name checked here (the chip is a registry name), quoted as a TOML basic string.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ._step import StepShape


def job_text(shape: StepShape, ms: Sequence[int], chip: str, store: Path, time_budget: str = "15m") -> str:
    """The job file's text (TOML)."""
    lines = [
        "# Written by `kernsearch bench decode --job`: tunes every shape a decode step of "
        f"{shape.layers} layers (hidden {shape.hidden}, FFN {shape.ffn}, {shape.bits}-bit, group {shape.group}) "
        "calls.",
        "# Run it with `kernsearch flows run THIS_FILE`, then `kernsearch bench decode` with the same options.",
        f"artifacts = {json.dumps(str(store))}",
        "",
        "[defaults]",
        'backend = "auto"',
        "trials = 200",
        f"time_budget = {json.dumps(time_budget)}",
        "finalists = 3",
    ]
    shapes: dict[str, list[str]] = {}
    for call in shape.all_calls():
        for m in ms:
            text = ",".join(str(v) for v in shape.dims(m, call).values())
            shapes.setdefault(call.family, [])
            if text not in shapes[call.family]:
                shapes[call.family].append(text)
    for family, texts in shapes.items():
        lines += ["", "[[jobs]]", f"name = {json.dumps('decode-' + family.replace('_', '-'))}",
                  f"family = {json.dumps(family)}", f"shapes = {json.dumps(texts)}",
                  f"dtypes = {json.dumps([shape.dtype])}", f"chips = {json.dumps([chip])}"]
    return "\n".join(lines) + "\n"
