"""A patched block's decode step: mlx-lm's ``TransformerBlock.__call__`` (0.32) rebuilt around the package's fused
calls, and the parts of it ``mx.compile`` replays. Copied verbatim into every exported package beside ``_patch.py``
(which recognises and binds the blocks); needs ``mlx`` only and never imports mlx-lm.

Where the block's RoPE is one that passes its offset through (:data:`ROPES`), the compiled projection also turns the
heads, its offset an array (one trace for every position): mlx-lm's RoPE is replayed with the projection, not run
op by op on every token. The cache is written outside the trace, as mlx-lm's ``update_and_fetch`` writes it (for its
own ``KVCache``, the same writes and slices with less of MLX's Python indexing: :func:`_written`): writing it inside
the trace would need MLX's dynamic ``slice_update``, which costs more host time than it saves (measured on an H200,
fourteenth session: 0.6 ms a token more of ``mx.async_eval`` for a Llama-7B shape).

For one-row steps of mlx-lm's own ``KVCache`` under a RoPE that is ``mx.fast.rope`` of its whole input
(:data:`WHOLE_ROPES`), keys and values share one cache buffer written by one update (:class:`_Joined`): the compiled
step turns every head of the projection at once — the values' heads at offset 0, which turns nothing (cos 0 = 1,
sin 0 = 0: exact) — so its keys and values leave it as one contiguous [B, 2 * kv_heads, 1, D] view. A layer's two
cache writes become one (measured on an H200, sixteenth session, Llama-7B shape: the host's work on a token 1.02 +
1.99 -> 0.84 + 1.63 ms of forward + ``mx.async_eval``, 326 -> 398 tokens/s).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Tuple

from ._fingerprint import fingerprint

#: Rows of a decode step the fused families take (their ``decode_rows`` constraint: M <= 16); more is a prompt.
DECODE_ROWS = 16
#: Where a patched block keeps its state (the ``_State`` of ``_patch.py``) in its ``__dict__``.
_ATTR = "_kernsearch_patch"
#: RoPE modules that only pass their offset on to ``mx.fast.rope`` (so an array offset is the same computation):
#: (module, class) -> the fingerprint of its ``__call__``. mlx-lm's DynamicNTKScalingRoPE computes with the offset
#: in Python and is not one.
ROPES = {("mlx.nn.layers.positional_encoding", "RoPE"): "f30432778f14e581",
         ("mlx_lm.models.rope_utils", "Llama3RoPE"): "0e77a1bb4ba067ff",
         ("mlx_lm.models.rope_utils", "SuScaledRoPE"): "254ec15894031d59",
         ("mlx_lm.models.rope_utils", "YarnRoPE"): "1b367c4cc948e2ac",
         ("mlx_lm.models.rope_utils", "ProportionalRoPE"): "0705a2392d421344"}
#: mlx-lm's caches whose update the step writes itself (:func:`_updated`), the same writes and slices: (module,
#: class) -> the fingerprints of its ``update_and_fetch`` and ``keys_and_values`` (mlx-lm 0.32).
CACHES = {("mlx_lm.models.cache", "KVCache"): ("1bcdb0f02f35d298", "de48269a055eecec")}
#: The RoPEs of :data:`ROPES` that are ``mx.fast.rope`` of their whole input, nothing else (mlx-lm's SuScaled and
#: Yarn RoPEs also scale it): at offset 0 they return a head unchanged, so the values' heads may ride along.
WHOLE_ROPES = frozenset({("mlx.nn.layers.positional_encoding", "RoPE"), ("mlx_lm.models.rope_utils", "Llama3RoPE")})
#: The most offset arrays kept (:func:`_offsets`); past it the table starts over.
MAX_OFFSETS = 1024


def _patched_class(cls: type) -> type:
    """``cls`` with :func:`_forward` as its ``__call__`` (one subclass per class)."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(cls.__name__, (cls,), {"__call__": _forward, "__module__": cls.__module__,
                                                    "__qualname__": cls.__qualname__ + "[kernsearch]"})
    return _CLASSES[cls]


_CLASSES: Dict[type, type] = {}


def _forward(self: Any, x: Any, mask: Any = None, cache: Any = None) -> Any:
    """mlx-lm's ``TransformerBlock.__call__`` (0.32) with its projections through the package at decode."""
    state = self.__dict__[_ATTR]
    b, length, dim = x.shape
    if b * length > DECODE_ROWS or (state.rows is not None and b * length not in state.rows):
        return state.original.__call__(self, x, mask, cache)
    if state.qkv is not None and state.out is not None:
        output = _attention(self.self_attn, state, x, mask, cache)
        if state.tail is not None:
            return state.tail(output, x)
        h2 = state.out(_merged(output), x.reshape(b * length, dim))
    else:
        h2 = (x + self.self_attn(self.input_layernorm(x), mask, cache)).reshape(b * length, dim)
    if state.mlp is not None:
        out = state.mlp(h2)
    elif state.gate_up is not None and state.down is not None:
        out = state.down(state.gate_up(h2), h2)
    else:
        h = h2.reshape(b, length, dim)
        out = h + self.mlp(self.post_attention_layernorm(h))
    return out.reshape(b, length, dim)


def _heads(attn: Any, state: Any, x: Any) -> Tuple[Any, ...]:
    """The concatenated projection of ``x`` [b, L, dim] cut into heads [b, heads, L, D]: (queries and keys together,
    values) for one sequence, whose RoPE then runs once for both (RoPE treats heads as a batch; the two halves of
    its output stay contiguous views: a dependent launch fewer a layer); else (queries, keys, values)."""
    b, length, dim = x.shape
    qkv = _projected(state, x.reshape(b * length, dim))
    nq, nqk = state.split

    def heads(t: Any, n: int) -> Any:  # one row: the transpose is a reshape (one primitive fewer for MLX to send)
        return t.reshape(b, n, 1, -1) if length == 1 else t.reshape(b, length, n, -1).transpose(0, 2, 1, 3)

    values = heads(qkv[:, nqk:], attn.n_kv_heads)
    if b == 1 and nq * attn.n_kv_heads == (nqk - nq) * attn.n_heads:
        return heads(qkv[:, :nqk], attn.n_heads + attn.n_kv_heads), values
    return heads(qkv[:, :nq], attn.n_heads), heads(qkv[:, nq:nqk], attn.n_kv_heads), values


def _projected(state: Any, rows: Any) -> Any:
    """The concatenated Q/K/V projection of ``rows`` [rows, dim], its biases added where it has them."""
    assert state.qkv is not None
    qkv = state.qkv(rows)
    return qkv if state.qkv_bias is None else qkv + state.qkv_bias


def _roped(attn: Any, parts: Tuple[Any, ...], rope: Callable[[Any], Any]) -> Tuple[Any, Any, Any]:
    """(queries, keys, values) from :func:`_heads`' parts, the queries and keys turned by ``rope``."""
    if len(parts) == 2:
        qk = rope(parts[0])
        return qk[:, :attn.n_heads], qk[:, attn.n_heads:], parts[1]
    return rope(parts[0]), rope(parts[1]), parts[2]


def _attention(attn: Any, state: Any, x: Any, mask: Any, cache: Any) -> Any:
    """mlx-lm's ``Attention.__call__`` (0.32) up to the O projection: the package's Q/K/V projection and RoPE (one
    compiled step where it can: ``state.step``), mlx-lm's cache and attention; the attention's output as it returns
    it, [b, heads, L, D] (:func:`_merged` joins the heads)."""
    queries, keys, values = _cached_heads(attn, state, x, cache)
    sdpa = sys.modules[type(attn).__module__].scaled_dot_product_attention
    return sdpa(queries, keys, values, cache=cache, scale=attn.scale, mask=mask)


def _cached_heads(attn: Any, state: Any, x: Any, cache: Any) -> Tuple[Any, Any, Any]:
    """The step's queries and the cache's keys and values after it: the joined step (one write a layer) where it
    applies, else the compiled or traced projection and RoPE, then the cache's own update."""
    offset = 0 if cache is None else cache.offset
    if state.joined is not None and x.shape[1] == 1 and type(offset) is int and _joinable(cache, x.shape[0]):
        queries, kv = state.joined(x, _offsets(offset, x.shape[0], attn.n_heads + attn.n_kv_heads, attn.n_kv_heads))
        return (queries, *_join(cache).write(kv))
    if state.step is not None and type(offset) is int:
        queries, keys, values = state.step(x, _offset(offset))
    else:
        parts = state.heads(x) if state.heads is not None else _heads(attn, state, x)
        queries, keys, values = _roped(attn, parts, lambda t: attn.rope(t, offset=offset))
    if cache is not None:
        keys, values = _updated(cache, keys, values)
    return queries, keys, values


def _merged(output: Any) -> Any:
    """The attention's output [b, heads, L, D] as the O projection takes it, [b * L, heads * D] (for one row a
    reshape: one primitive fewer for MLX to send)."""
    b, _, length, _ = output.shape
    return output.reshape(b, -1) if length == 1 else output.transpose(0, 2, 1, 3).reshape(b * length, -1)


def _updated(cache: Any, keys: Any, values: Any) -> Tuple[Any, Any]:
    """``cache.update_and_fetch(keys, values)``; for mlx-lm's ``KVCache`` (:data:`CACHES`, the class's own code)
    with room for the rows, its writes and slices here (:func:`_written`)."""
    if _known(type(cache)) and cache.keys is not None:  # known first: another cache's keys may be no array
        end = cache.offset + keys.shape[2]
        if end <= cache.keys.shape[2]:
            return _written(cache, keys, values, end)
    return cache.update_and_fetch(keys, values)  # type: ignore[no-any-return]


def _written(cache: Any, keys: Any, values: Any, end: int) -> Tuple[Any, Any]:
    """``KVCache.update_and_fetch`` (mlx-lm 0.32) for a cache with room: the same two writes and two slices, indexed
    without its ellipses (MLX's Python indexing of ``[:, :, a:b]`` costs about a third less host time than of
    ``[..., a:b, :]``, the same primitive; the cache's arrays are [B, heads, positions, D])."""
    prev = cache.offset
    cache.keys[:, :, prev:end] = keys
    cache.values[:, :, prev:end] = values
    cache.offset = end
    if end < cache.keys.shape[2]:
        return cache.keys[:, :, :end], cache.values[:, :, :end]
    return cache.keys, cache.values


def _known(cls: type) -> bool:
    """``cls`` is a cache of :data:`CACHES` whose methods are the code reproduced there (a subclass, or another
    mlx-lm's, is not; nor is a :class:`_Joined` one)."""
    known = _KNOWN_CACHES.get(cls)
    if known is None:
        prints = tuple(fingerprint(getattr(cls, name, None)) for name in ("update_and_fetch", "keys_and_values"))
        known = _KNOWN_CACHES[cls] = CACHES.get((cls.__module__, cls.__name__)) == prints
    return known


_KNOWN_CACHES: Dict[type, bool] = {}


class _Joined:
    """mlx-lm's ``KVCache`` (0.32) with its keys and values in one buffer ``_kv`` [B, 2 * kv_heads, capacity, D]
    (keys first), so that a step writes both with one update (:meth:`write`). Mixed into a subclass of the cache's
    own class (:func:`_join`: the same name and module, so mlx-lm's ``save_prompt_cache`` records a KVCache and
    loads one); ``keys`` and ``values`` read as views of the buffer, and anything that assigns them (``state``'s
    setter, the class's own code) turns the cache back into its own class first, holding those views."""

    _kv: Any
    offset: int
    step: int

    def _half(self, second: bool) -> Any:
        n = self._kv.shape[1] // 2
        return self._kv[:, n:] if second else self._kv[:, :n]

    keys = property(lambda self: self._half(False), lambda self, v: self._split("keys", v))
    values = property(lambda self: self._half(True), lambda self, v: self._split("values", v))

    def _split(self, name: str, value: Any) -> None:
        """Back to the cache's own class, ``keys`` and ``values`` the buffer's halves, then ``name`` set."""
        keys, values = self._half(False), self._half(True)
        del self._kv
        self.__class__ = self.__class__.__bases__[1]
        self.keys, self.values = keys, values
        setattr(self, name, value)

    def __reduce_ex__(self, protocol: Any) -> Tuple[Any, ...]:
        """Pickled (and deep-copied) as the cache's own class holding the buffer's halves: the joined class is made
        at run time, and pickle finds classes by name."""
        state = {k: v for k, v in vars(self).items() if k != "_kv"}
        state.update(keys=self._half(False), values=self._half(True))
        return object.__new__, (type(self).__bases__[1],), state

    def update_and_fetch(self, keys: Any, values: Any) -> Tuple[Any, Any]:
        """``KVCache.update_and_fetch`` into the joined buffer (a prompt, a step of several rows)."""
        import mlx.core as mx

        return self.write(mx.concatenate([keys, values], axis=1))

    def write(self, kv: Any) -> Tuple[Any, Any]:
        """Keys and values [B, 2 * kv_heads, L, D] written at the offset (the buffer grown as ``KVCache`` grows
        its two); the keys and values up to the new offset."""
        prev = self.offset
        end = prev + kv.shape[2]
        if end > self._kv.shape[2]:
            self._grow(kv)
        self._kv[:, :, prev:end] = kv
        self.offset = end
        return self.keys_and_values()

    def _grow(self, kv: Any) -> None:
        import mlx.core as mx

        b, heads, rows, d = kv.shape
        fresh = mx.zeros((b, heads, (self.step + rows - 1) // self.step * self.step, d), kv.dtype)
        kept = self._kv[:, :, :self.offset] if self.offset % self.step else self._kv
        self._kv = mx.concatenate([kept, fresh], axis=2)

    def keys_and_values(self) -> Tuple[Any, Any]:
        n, end = self._kv.shape[1] // 2, self.offset
        if end < self._kv.shape[2]:
            return self._kv[:, :n, :end], self._kv[:, n:, :end]
        return self._kv[:, :n], self._kv[:, n:]


def _joinable(cache: Any, batch: int) -> bool:
    """``cache`` is joined already, or one of mlx-lm's ``KVCache`` (:func:`_known`) holding keys and values of one
    shape for ``batch`` sequences (it joins at its first one-row step)."""
    if isinstance(cache, _Joined):
        return bool(cache._kv.shape[0] == batch)
    if cache is None or not _known(type(cache)) or cache.keys is None:
        return False
    return bool(cache.keys.shape == cache.values.shape and cache.keys.shape[0] == batch
                and cache.keys.dtype == cache.values.dtype)


def _join(cache: Any) -> _Joined:
    """``cache`` as a :class:`_Joined` of its own class (its keys and values copied into one buffer, once)."""
    if not isinstance(cache, _Joined):
        import mlx.core as mx

        cls = type(cache)
        if cls not in _JOINED:
            _JOINED[cls] = type(cls.__name__, (_Joined, cls), {"__module__": cls.__module__,
                                                                "__qualname__": cls.__qualname__})
        kv = mx.concatenate([cache.keys, cache.values], axis=1)
        del cache.keys, cache.values
        cache.__class__ = _JOINED[cls]
        cache._kv = kv
    return cache  # type: ignore[no-any-return]


_JOINED: Dict[type, type] = {}


def _offset(position: int) -> Any:
    """``position`` as the int32 array of one value the compiled step takes (one a position, shared by the layers)."""
    return _offsets(position, 1, 1, 0)


def _offsets(position: int, batch: int, turned: int, kept: int) -> Any:
    """The int32 offsets of a step's heads, ``batch`` times: ``position`` for the queries' and keys' ``turned``
    heads, 0 for the values' ``kept`` (the joined step's; :func:`_offset` one value). Made once a position and shape,
    shared by the layers; the table starts over past :data:`MAX_OFFSETS`."""
    key = (position, batch, turned, kept)
    arr = _OFFSETS.get(key)
    if arr is None:
        import mlx.core as mx

        if len(_OFFSETS) >= MAX_OFFSETS:
            _OFFSETS.clear()
        arr = _OFFSETS[key] = mx.array(([position] * turned + [0] * kept) * batch, dtype=mx.int32)
    return arr


_OFFSETS: Dict[Tuple[int, int, int, int], Any] = {}


def _passes_offset(rope: Any) -> bool:
    """``rope`` is a module of :data:`ROPES`, its ``__call__`` the code reproduced there."""
    cls = type(rope)
    return ROPES.get((cls.__module__, cls.__name__)) == fingerprint(cls.__call__)


def _turns_whole(attn: Any, state: Any) -> bool:
    """The block's RoPE is one of :data:`WHOLE_ROPES` and its queries', keys' and values' heads are one width:
    one RoPE call may take them all (the joined step)."""
    cls = type(attn.rope)
    nq, nqk = state.split
    heads = attn.n_heads + 2 * attn.n_kv_heads
    width = state.width
    return bool(_passes_offset(attn.rope) and (cls.__module__, cls.__name__) in WHOLE_ROPES and width % heads == 0
                and nq * heads == width * attn.n_heads and (nqk - nq) * heads == width * attn.n_kv_heads)


def _joined_step(attn: Any, state: Any) -> Callable[[Any, Any], Tuple[Any, Any]]:
    """The joined step (see the module's docstring): one row a sequence, every head of the projection turned by
    one RoPE call at per-head offsets (:func:`_offsets`); the queries [B, heads, 1, D] and the keys and values as
    one [B, 2 * kv_heads, 1, D]."""
    nh, heads = attn.n_heads, attn.n_heads + 2 * attn.n_kv_heads

    def joined(x: Any, offsets: Any) -> Tuple[Any, Any]:
        b = x.shape[0]
        qkv = _projected(state, x.reshape(b, x.shape[-1]))
        turned = attn.rope(qkv.reshape(b * heads, 1, 1, -1), offset=offsets).reshape(b, heads, 1, -1)
        return turned[:, :nh], turned[:, nh:]

    return joined


def _trace(state: Any, attn: Any) -> None:
    """Fill ``state``'s compiled halves: the package's calls and the Python between them traced by ``mx.compile``
    once per shape (a decode step's rows; the cache's length for the step) and replayed after. A decode token's host
    time is then MLX's replay, not the package's fronts and mlx-lm's ops one by one, and mlx-lm's pipelined loop
    builds token t + 1 on the host while the GPU runs token t: the slower of the two sets the rate. The step
    (``state.step``) also turns the heads where the RoPE allows (see the module's docstring); the cache and the
    attention run outside, as mlx-lm runs them. The weights are the trace's constants (a patched block's
    weights are not updated; ``unpatch`` then ``patch`` traces anew)."""
    import mlx.core as mx

    out, gate_up, down = state.out, state.gate_up, state.down
    if state.qkv is not None and out is not None:
        def heads(x: Any) -> Tuple[Any, ...]:
            return _heads(attn, state, x)

        state.heads = mx.compile(heads)
        if _passes_offset(attn.rope):
            def step(x: Any, offset: Any) -> Tuple[Any, Any, Any]:
                return _roped(attn, _heads(attn, state, x), lambda t: attn.rope(t, offset=offset))

            state.step = mx.compile(step)
            if _turns_whole(attn, state):
                state.joined = mx.compile(_joined_step(attn, state))
        if gate_up is not None and down is not None:
            def tail(o: Any, x: Any) -> Any:
                h = out(_merged(o), x.reshape(-1, x.shape[-1]))
                return down(gate_up(h), h).reshape(x.shape)

            state.tail = mx.compile(tail)
    elif gate_up is not None and down is not None:
        def mlp(h2: Any) -> Any:
            return down(gate_up(h2), h2)

        state.mlp = mx.compile(mlp)


__all__ = ["CACHES", "DECODE_ROWS", "ROPES"]
