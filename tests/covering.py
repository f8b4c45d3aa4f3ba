"""Covering samples for sweeps: the fewest configs (greedy) such that every combination of ``strength`` knob values
that occurs in some candidate occurs in a chosen one. A sweep of a t-way covering sample runs every interaction of
t knobs (dtype counted as a knob) that the whole space has, at a fraction of its size: what a larger random
sample or the whole space adds is more configs of interactions already run."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np


def covering_sample(candidates: list[dict[str, Any]], strength: int, seed: int = 0,
                    must: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Configs of ``candidates`` (all with the same keys) covering every ``strength``-way combination of values
    found among them, ``must`` first (they count as covering what they hold). Deterministic for a seed."""
    if not candidates:
        return []
    keys = sorted(candidates[0])
    values = [sorted({repr(c[k]) for c in candidates}) for k in keys]
    index = [{v: i for i, v in enumerate(vs)} for vs in values]
    width = max(len(vs) for vs in values)
    combos = list(itertools.combinations(range(len(keys)), min(strength, len(keys))))

    def codes(rows: list[dict[str, Any]]) -> np.ndarray:
        """One integer per (config, combination of knobs): the combination and the values it takes."""
        v = np.array([[index[i][repr(c[k])] for i, k in enumerate(keys)] for c in rows], dtype=np.int64)
        out = np.zeros((len(rows), len(combos)), dtype=np.int64)
        for j, combo in enumerate(combos):
            code = np.full(len(rows), j, dtype=np.int64)
            for i in combo:
                code = code * width + v[:, i]
            out[:, j] = code
        return out

    pool = list(candidates)
    random.Random(seed).shuffle(pool)
    table = codes(pool)
    universe, inverse = np.unique(table, return_inverse=True)
    inverse = inverse.reshape(table.shape)
    covered = np.zeros(len(universe), dtype=bool)
    # the candidates holding each combination, to lower their gains once it is covered (greedy, kept up to date)
    order = np.argsort(inverse.ravel(), kind="stable")
    bounds = np.searchsorted(inverse.ravel()[order], np.arange(len(universe) + 1))
    gain = np.full(len(pool), len(combos), dtype=np.int64)
    chosen: list[dict[str, Any]] = []

    def cover(held: np.ndarray) -> None:
        for code in held[~covered[held]]:
            covered[code] = True
            np.subtract.at(gain, order[bounds[code]:bounds[code + 1]] // len(combos), 1)

    for cfg in must or []:
        held = codes([cfg])[0]
        found = np.minimum(np.searchsorted(universe, held), len(universe) - 1)
        cover(found[universe[found] == held])
        chosen.append(cfg)
    while not covered.all():
        best = int(gain.argmax())
        cover(inverse[best])
        chosen.append(pool[best])
    return chosen
