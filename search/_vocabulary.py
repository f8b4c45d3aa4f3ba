"""The words of kernsearch: every evidence kind, trial status, verifier, target, dtype, diagnostic severity,
consumer mode and verdict on the op.

The ground floor. Every other module (and the exported package's dispatcher, which ships this file verbatim
beside ``_rules.py``) names these values through the enums here, never as string literals
(``tests/test_vocabulary.py`` greps for them): a word spelled in one place cannot drift. Each enum is a
``str`` enum that reads as its text: a member equals its stored text (``Evidence.MEASURED == "measured"``), prints
and formats as it (``f"{Evidence.MEASURED}"`` is ``measured``) and JSON holds the text.

Standard library only, Python >= 3.9 (the exported package's floor).
"""

from __future__ import annotations

from enum import Enum
from typing import Dict, Literal, Tuple


class Word(str, Enum):
    """A word of the vocabulary: its text wherever it is printed, formatted or stored (on every Python >= 3.9)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Evidence(Word):
    """What a figure is. Never mixed up: only a real GPU's timing is ``measured``."""

    MEASURED = "measured"  # timed on a real GPU
    INTERPRETED = "interpreted"  # Metal run on the CPU interpreter: correctness only, never a timing
    MODELED = "modeled"  # a prediction of the per-chip performance model


#: How much an evidence kind is worth to the regression gate: a lower kind never replaces a higher one.
EVIDENCE_RANK: Dict[str, int] = {Evidence.INTERPRETED: 0, Evidence.MODELED: 1, Evidence.MEASURED: 2}


class TrialStatus(Word):
    """A trial's outcome, stored as its ``status`` user attribute."""

    OK = "ok"  # evaluated: its time is a result (a finalist if among the fastest)
    FAILED = "failed"  # evaluated: it failed (compile, crash, hang, wrong...), with the reason
    NOT_WINNING = "not_winning"  # timed until it could no longer beat the incumbent (racing): a measured time,
    # slower, told to the strategy; never a finalist, never published
    INVALID = "invalid"  # a constraint rejected it before compiling
    KNOWN = "known"  # the study had evaluated it already: its value told again
    CANCELLED = "cancelled"  # proposed and compiled ahead, but the search stopped before timing it
    INTERRUPTED = "interrupted"  # in flight when a second Ctrl-C stopped the search
    ERROR = "error"  # in flight when kernsearch itself failed (a bug: its traceback is kept)
    RUNNING = "running"  # no status yet: asked for, not told (another process's, or a dead one's)


#: The statuses of configs a study has evaluated (what ``--trials`` counts).
EVALUATED: Tuple[TrialStatus, ...] = (TrialStatus.OK, TrialStatus.FAILED, TrialStatus.NOT_WINNING)


class Verifier(Word):
    """Where a variant was proven correct against the float64 reference."""

    DEVICE = "device"  # on the GPU that timed it
    INTERPRETER = "interpreter"  # the exact Metal source on the CPU interpreter
    RECORDED = "recorded"  # a replayed landscape: recorded on the file's GPU, never run here


class Target(Word):
    """A kind of kernel source (its row of the targets table: ``_rules.TARGETS``)."""

    METAL = "metal"
    CUDA = "cuda"


#: Target names as a type for validated models (family specs, manifests).
TargetName = Literal["metal", "cuda"]

#: The problem dtypes a kernel is rendered for (the element type ``T``).
Dtype = Literal["float32", "float16", "bfloat16"]


class Severity(Word):
    """What a diagnostic (a compiler's, the interpreter's, AddressSanitizer's) is: an error fails the variant."""

    ERROR = "error"
    WARNING = "warning"


class ConsumerMode(Word):
    """How consumers call a family (docs/timing.md): ``graph``: a chain of dependent calls (each call's activation
    derived from the previous call's output), then one evaluation, as a decode step runs; ``eager``: an evaluation
    after every call; ``batch``: independent calls, then one evaluation (their launches overlap on the GPU: only for
    families consumers call side by side, where the family declares it)."""

    GRAPH = "graph"
    EAGER = "eager"
    BATCH = "batch"


#: Consumer mode names as a type for validated models (family specs).
ConsumerModeName = Literal["graph", "eager", "batch"]

#: The consumer modes every final round times (a family's declared modes are timed besides), in that order.
CONSUMER_MODES: Tuple[ConsumerModeName, ...] = ("graph", "eager")


class Verdict(Word):
    """What the interval of a kernel's speedup over the MLX op says (``_rules.decide``): its lower bound is above the
    margin (``faster``: publish), its upper bound below 1 (``slower``: keep the op), or neither after the most rounds
    (``undecided``)."""

    FASTER = "faster"
    SLOWER = "slower"
    UNDECIDED = "undecided"


class Memcheck(Word):
    """What NVIDIA's memcheck (``compute-sanitizer --tool memcheck``) said of a CUDA winner's verification launches
    (``backends._memcheck``): ``clean`` (no error reported), ``reported`` (an error: the winner is refused), ``not
    available`` (no tool here), ``unfinished`` (it ran but gave no verdict: a timeout, the tool's own error). The last
    two are said on the publish line, never taken for a pass."""

    CLEAN = "clean"
    REPORTED = "reported"
    NOT_AVAILABLE = "not available"
    UNFINISHED = "unfinished"
