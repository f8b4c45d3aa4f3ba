"""Transfer: a search warm-started from another chip's or shape's study of the same family.

The best configs of a family at one shape (or on one chip) are often good at another: the same tiles suit the
same kind of problem. A new study therefore evaluates first the best configs that the family's other studies
found (in the same storage), mapped into its own space: knobs both spaces have keep the source's value; a knob
the source lacked, or a value this space does not allow, takes the nearest valid config's value (an enumerated
space) or the family default (a space too big to enumerate; the mapped config must then be valid).
What ``benchmarks/search_landscapes.py --transfer`` measures on replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._vocabulary import TrialStatus
from ..family._space import Config, format_config
from ._storage import StudyKey

if TYPE_CHECKING:
    import optuna

    from ._landscape import Landscape

#: How many transferred configs a study evaluates first (after the default config and published artifacts'):
#: two, measured on replay (benchmarks/search_landscapes.txt, TRANSFER): more crowd out the model prior's start
#: at small budgets.
TRANSFER_LIMIT = 2


def nearest_valid(knobs: dict[str, list[Any]], valid: Sequence[Config]) -> Callable[[Config], Config | None]:
    """Map a source config to the valid config here that agrees with it on the most shared knobs (first in
    ``valid`` order among equals); None when no knob is shared."""
    def complete(source: Config) -> Config | None:
        shared = [k for k in knobs if k in source and source[k] in knobs[k]]
        if not shared or not valid:
            return None
        return dict(max(valid, key=lambda c: sum(c[k] == source[k] for k in shared)))

    return complete


def completed_with(knobs: dict[str, list[Any]], default: Config | None,
                   violation: Callable[[Config], str | None]) -> Callable[[Config], Config | None]:
    """Map a source config to itself on the shared knobs and ``default`` elsewhere, when that is valid here
    (for spaces too big to enumerate)."""
    def complete(source: Config) -> Config | None:
        if default is None:
            return None
        config = {k: source[k] if k in source and source[k] in knobs[k] else default[k] for k in knobs}
        return config if violation(config) is None else None

    return complete


def transfer_configs(ranked: Iterable[Sequence[Config]], complete: Callable[[Config], Config | None],
                     limit: int = TRANSFER_LIMIT, exclude: Iterable[str] = ()) -> list[Config]:
    """Up to ``limit`` distinct configs here, from the sources' configs fastest first (round-robin over the
    sources, so no one source fills the list), each mapped by ``complete``; none whose key is in ``exclude``
    (configs the study evaluates anyway)."""
    lists = [list(r) for r in ranked]
    out: list[Config] = []
    seen: set[str] = set(exclude)
    for rank in range(max((len(r) for r in lists), default=0)):
        for r in lists:
            if rank >= len(r) or len(out) >= limit:
                continue
            mapped = complete(r[rank])
            if mapped is not None and format_config(mapped) not in seen:
                seen.add(format_config(mapped))
                out.append(mapped)
    return out


def ranked_landscape(land: Landscape, top: int = 20) -> list[Config]:
    """A recorded landscape's working configs, fastest first (the ``top`` of them)."""
    ok = sorted((e for e in land.entries.values() if not land.failed(e)), key=lambda e: float(e["time"]))
    return [land.config_of(e) for e in ok[:top]]


def ranked_studies(storage: Any, key: StudyKey, evidence: str, ok: str = TrialStatus.OK,
                   top: int = 20) -> list[list[Config]]:
    """The best configs of every other study of ``key``'s family in ``storage`` (another shape, chip or dtype)
    with the same kind of evidence (measured from measured, modeled from modeled), fastest first per study. A
    study that cannot be read gives nothing; its configs are only ever mapped onto this space's own values.
    ``ok``: the status of a trial timed to the end."""
    import optuna

    out: list[list[Config]] = []
    try:
        summaries = optuna.get_all_study_summaries(storage)
    except Exception:  # noqa: BLE001 - an unreadable storage: no transfer
        return []
    for s in summaries:
        attrs = s.user_attrs
        if attrs.get("family") != key.family or attrs.get("evidence") != evidence or \
                all(attrs.get(k) == v for k, v in key.as_dict().items()):
            continue
        try:
            trials = optuna.load_study(study_name=s.study_name, storage=storage).get_trials(deepcopy=False)
        except Exception:  # noqa: BLE001
            continue
        out.append(_best_configs(trials, ok, top))
    return [r for r in out if r]


def _best_configs(trials: list[optuna.trial.FrozenTrial], ok: str, top: int) -> list[Config]:
    done = [t for t in trials if t.user_attrs.get("status") == ok and t.value is not None
            and isinstance(t.user_attrs.get("config"), dict)]
    done.sort(key=lambda t: (t.value, t.number))
    return [dict(t.user_attrs["config"]) for t in done[:top]]
