"""Transfer: a search warm-started from another chip's or shape's study of the same family.

The best configs of a family at one shape (or on one chip) are often good at another: the same tiles suit the
same kind of problem. A new study therefore evaluates first the best configs that the family's other studies
found (in the same storage), mapped into its own space: knobs both spaces have keep the source's value; a knob
the source lacked, or a value this space does not allow, takes whatever the nearest valid config here has.
What ``benchmarks/search_landscapes.py --transfer`` measures on replay.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..family._space import Config, format_config

if TYPE_CHECKING:
    import optuna

    from ._landscape import Landscape

#: How many transferred configs a study evaluates first.
TRANSFER_LIMIT = 5


def map_config(source: Config, knobs: dict[str, list[Any]], valid: Sequence[Config]) -> Config | None:
    """The valid config here that agrees with ``source`` on the most shared knobs (first in ``valid`` order
    among equals); None when no knob is shared."""
    shared = [k for k in knobs if k in source and source[k] in knobs[k]]
    if not shared or not valid:
        return None
    best = max(valid, key=lambda c: sum(c.get(k) == source[k] for k in shared))
    return dict(best)


def transfer_configs(ranked: Iterable[Sequence[Config]], knobs: dict[str, list[Any]], valid: Sequence[Config],
                     limit: int = TRANSFER_LIMIT) -> list[Config]:
    """Up to ``limit`` distinct valid configs here, from the sources' configs fastest first (round-robin over
    the sources, so no one source fills the list)."""
    lists = [list(r) for r in ranked]
    out: list[Config] = []
    seen: set[str] = set()
    for rank in range(max((len(r) for r in lists), default=0)):
        for r in lists:
            if rank >= len(r) or len(out) >= limit:
                continue
            mapped = map_config(r[rank], knobs, valid)
            if mapped is not None and format_config(mapped) not in seen:
                seen.add(format_config(mapped))
                out.append(mapped)
    return out


def ranked_landscape(land: Landscape, top: int = 20) -> list[Config]:
    """A recorded landscape's working configs, fastest first (the ``top`` of them)."""
    ok = sorted((e for e in land.entries.values() if not land.failed(e)), key=lambda e: float(e["time"]))
    return [land.config_of(e) for e in ok[:top]]


def ranked_studies(storage: Any, key: dict[str, str], top: int = 20) -> list[list[Config]]:
    """The best configs of every other study of ``key``'s family in ``storage`` (another shape, chip or dtype;
    the same back-end kind of evidence), fastest first per study. A study that cannot be read gives nothing."""
    import optuna

    from ._study import STATUS_OK

    out: list[list[Config]] = []
    try:
        summaries = optuna.get_all_study_summaries(storage)
    except Exception:  # noqa: BLE001 - an unreadable storage: no transfer
        return []
    for s in summaries:
        attrs = s.user_attrs
        if attrs.get("family") != key.get("family") or all(attrs.get(k) == v for k, v in key.items()):
            continue
        try:
            trials = optuna.load_study(study_name=s.study_name, storage=storage).get_trials(deepcopy=False)
        except Exception:  # noqa: BLE001
            continue
        out.append(_best_configs(trials, STATUS_OK, top))
    return [r for r in out if r]


def _best_configs(trials: list[optuna.trial.FrozenTrial], ok: str, top: int) -> list[Config]:
    done = [t for t in trials if t.user_attrs.get("status") == ok and t.value is not None
            and isinstance(t.user_attrs.get("config"), dict)]
    done.sort(key=lambda t: (t.value, t.number))
    return [dict(t.user_attrs["config"]) for t in done[:top]]
