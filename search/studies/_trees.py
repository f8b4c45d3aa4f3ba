"""Extremely randomised regression trees in NumPy, grown level by level for a whole ensemble at once.

The ``forest`` strategy (``_forest``) refits its surrogate after every evaluated config, on at most a few
hundred points, and scores thousands of candidates: a tree per Python recursion would cost tens of
milliseconds a proposal. Here every tree of the ensemble grows one depth level per step, all open nodes of
all trees together, so a fit is a few dozen array operations whatever the number of trees.

Extra-trees (Geurts et al., 2006): at each node a random subset of the features is drawn, each gets one
threshold drawn uniformly between its smallest and largest value in the node, and the split that most
reduces the squared error wins. No bootstrap: the randomness of the splits makes the trees differ, and
their spread is the surrogate's uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Deepest level grown (a node at this depth is a leaf whatever its size).
MAX_DEPTH = 12
#: Most features a split draws from (a wide feature matrix would cost time, not accuracy: the draw is random).
MAX_DRAWN = 16
#: Samples of a node whose range of a feature bounds its random threshold.
RANGE_DRAWS = 4


@dataclass(frozen=True)
class Ensemble:
    """Fitted trees as flat node arrays (node ids are global over the ensemble; ``feature`` -1: a leaf)."""

    roots: np.ndarray  # (trees,) the root node of each tree
    feature: np.ndarray  # (nodes,) the feature a node splits on, -1 at a leaf
    threshold: np.ndarray  # (nodes,) go left when the feature's value is <= this
    left: np.ndarray  # (nodes,) left child (right child is left + 1)
    value: np.ndarray  # (nodes,) the mean target of the node's samples

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Every tree's prediction for every row of ``X``: shape (trees, rows)."""
        flat = np.ascontiguousarray(X, dtype=float).ravel()
        base = np.arange(len(X)) * X.shape[1]
        node = np.repeat(self.roots[:, None], len(X), axis=1)
        feature = np.where(self.feature >= 0, self.feature, 0)
        for _ in range(MAX_DEPTH + 1):
            inner = self.feature[node] >= 0
            if not inner.any():
                break
            right = flat[base + feature[node]] > self.threshold[node]
            node = np.where(inner, self.left[node] + right, node)
        return np.asarray(self.value[node])


def fit(X: np.ndarray, y: np.ndarray, rng: np.random.Generator, *, trees: int = 16, min_leaf: int = 2,
        feature_share: float = 0.6) -> Ensemble:
    """Grow ``trees`` extra-trees on (``X``, ``y``); a node with fewer than ``2 * min_leaf`` samples, or
    no split leaving ``min_leaf`` on each side, or a constant target, is a leaf."""
    n, n_features = X.shape
    k = max(1, min(MAX_DRAWN, round(feature_share * n_features)))
    # per (tree, sample): its node; every tree starts from its own root
    node_of = np.repeat(np.arange(trees)[:, None], n, axis=1).ravel()
    sample = np.tile(np.arange(n), trees)
    feature = [-1] * trees
    threshold = [0.0] * trees
    left = [-1] * trees
    open_nodes = np.arange(trees)
    for _ in range(MAX_DEPTH):
        if len(open_nodes) == 0 or n_features == 0:
            break
        split = _split_level(X, y, rng, node_of, sample, open_nodes, k, min_leaf)
        if split is None:
            break
        nodes, feats, thrs = split
        first = len(feature)
        children = first + 2 * np.arange(len(nodes))
        for nd, f, t, c in zip(nodes.tolist(), feats.tolist(), thrs.tolist(), children.tolist()):
            feature[nd], threshold[nd], left[nd] = f, t, c
        feature += [-1] * (2 * len(nodes))
        threshold += [0.0] * (2 * len(nodes))
        left += [-1] * (2 * len(nodes))
        # move the samples of split nodes to their child
        slot = np.full(len(feature), -1)
        slot[nodes] = np.arange(len(nodes))
        s = slot[node_of]
        moving = s >= 0
        go_right = X[sample[moving], feats[s[moving]]] > thrs[s[moving]]
        node_of[moving] = children[s[moving]] + go_right
        open_nodes = np.arange(first, len(feature))
    value = np.bincount(node_of, weights=y[sample], minlength=len(feature)) / np.maximum(
        1, np.bincount(node_of, minlength=len(feature)))
    feat = np.array(feature)
    # an inner node's value is unused by predict; a leaf that got no sample cannot exist (splits leave min_leaf)
    return Ensemble(np.arange(trees), feat, np.array(threshold), np.array(left), value)


def _split_level(X: np.ndarray, y: np.ndarray, rng: np.random.Generator, node_of: np.ndarray, sample: np.ndarray,
                 open_nodes: np.ndarray, k: int, min_leaf: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The best random split of each open node that can be split: (nodes, features, thresholds), or None.

    Per-node reductions run over the samples sorted by node (``reduceat``; ``ufunc.at`` is far slower)."""
    index = np.full(int(max(node_of.max(), open_nodes.max())) + 1, -1)
    index[open_nodes] = np.arange(len(open_nodes))
    local = index[node_of]
    inside = np.flatnonzero(local >= 0)
    inside = inside[np.argsort(local[inside], kind="stable")]
    loc, smp = local[inside], sample[inside]
    change = np.empty(len(loc), dtype=bool)
    change[0] = True
    np.not_equal(loc[1:], loc[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    nodes = open_nodes[loc[starts]]  # open nodes that hold samples (all of them: a split leaves min_leaf)
    group = np.cumsum(change) - 1  # each sample's row among ``nodes``
    m = len(nodes)
    count = np.diff(np.append(starts, len(loc)))
    yy = y[smp]
    splittable = (count >= 2 * min_leaf) & (np.maximum.reduceat(yy, starts) - np.minimum.reduceat(yy, starts) > 1e-12)
    if not splittable.any():
        return None
    # k random features per node, a threshold each drawn between the smallest and largest of that feature
    # over a few random samples of the node (the node's own range, for a small node)
    feats = rng.integers(0, X.shape[1], (m, k))  # with replacement: a repeat only narrows the draw
    vals = X[smp[:, None], feats[group]]  # (samples in open nodes, k)
    picks = smp[starts[:, None, None] + (rng.random((m, 1, RANGE_DRAWS)) * count[:, None, None]).astype(np.int64)]
    drawn = X[picks, feats[:, :, None]]  # (m, k, RANGE_DRAWS)
    lo, hi = drawn.min(axis=2), drawn.max(axis=2)
    thr = lo + rng.random((m, k)) * (hi - lo)
    go_left = vals <= thr[group]
    ends = np.append(starts[1:], len(loc)) - 1
    n_left = _group_sums(go_left.astype(float), starts, ends)
    s_left = _group_sums(go_left * yy[:, None], starts, ends)
    total = _group_sums(yy[:, None], starts, ends)
    n_right = count[:, None] - n_left
    ok = (n_left >= min_leaf) & (n_right >= min_leaf) & (hi > lo) & splittable[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(ok, s_left ** 2 / n_left + (total - s_left) ** 2 / n_right, -np.inf)
    best = np.argmax(gain, axis=1)
    chosen = np.isfinite(gain[np.arange(m), best])
    if not chosen.any():
        return None
    rows = np.flatnonzero(chosen)
    return nodes[rows], feats[rows, best[rows]], thr[rows, best[rows]]


def _group_sums(a: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Column sums of ``a`` over each run of rows ``starts[i]..ends[i]`` (a cumulative sum, then differences:
    ``reduceat`` along the first axis is far slower)."""
    c = np.cumsum(a, axis=0)
    out = c[ends]
    out[1:] -= c[ends[:-1]]
    return np.asarray(out)
