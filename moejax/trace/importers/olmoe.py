"""OLMoE routing-analysis pickles (allenai/OLMoE `scripts/routing_output/`): per-layer expert
counts (or counts of layer pairs), one file per iteration, unpickled only through an allow
list of globals (`restricted_unpickle`)."""

from __future__ import annotations

import collections
import math
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moejax.errors import ConfigError, TraceError
from moejax.trace.core import Trace, from_counts
from moejax.trace.importers.reading import (
    byte_progress,
    check_experts_top_k,
    error,
)

# The only globals an OLMoE routing pickle may reference (SOURCE.md of the recording).
_ALLOWED_PICKLE_GLOBALS = {
    ("collections", "Counter"): collections.Counter,
    ("collections", "defaultdict"): collections.defaultdict,
    ("numpy.core.multiarray", "scalar"): np.dtype("i8").type(0).__reduce__()[0],
    ("numpy._core.multiarray", "scalar"): np.dtype("i8").type(0).__reduce__()[0],
    ("numpy", "dtype"): np.dtype,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only `_ALLOWED_PICKLE_GLOBALS` (no code execution)."""

    def __init__(self, f, path):
        super().__init__(f)
        self.path = path

    def find_class(self, module, name):
        obj = _ALLOWED_PICKLE_GLOBALS.get((module, name))
        if obj is None:
            allowed = ", ".join(sorted({f"{m}.{n}" for m, n in _ALLOWED_PICKLE_GLOBALS}))
            raise TraceError(f"{self.path}: pickle: disallowed type {module}.{name}; "
                             f"allowed: {allowed}")
        return obj

    def persistent_load(self, pid):
        raise TraceError(f"{self.path}: pickle: persistent ids are not allowed")


def restricted_unpickle(path) -> object:
    """Unpickle `path` allowing only Counter, defaultdict, numpy scalars and dtypes."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    with open(path, "rb") as f:
        try:
            return _RestrictedUnpickler(f, path).load()
        except TraceError:
            raise
        except Exception as err:  # a corrupt or truncated pickle
            raise TraceError(f"{path}: pickle: unreadable ({type(err).__name__}: {err})"
                             ) from None


def _int_key(path, field, k) -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise error(path, None, field, f"expected integer expert ids as keys, got {k!r}")
    return int(k)


def _olmoe_one(path, obj, num_experts: int):
    """(counts [L, E] float, pair matrices [P, E, E] or None) of one unpickled object."""
    if not isinstance(obj, list) or not obj or not all(
        isinstance(c, collections.Counter) for c in obj
    ):
        raise error(path, None, "pickle", "expected a non-empty list of collections.Counter "
                    f"(one per layer or layer pair), got {type(obj).__name__}")
    pair = isinstance(next(iter(obj[0]), None), tuple)
    out = np.zeros((len(obj), num_experts, num_experts) if pair else (len(obj), num_experts))
    for j, counter in enumerate(obj):
        for key, v in counter.items():
            field = f"entry {j} key {key!r}"
            keys = key if pair else (key,)
            if pair and (not isinstance(key, tuple) or len(key) != 2):
                raise error(path, None, field, "expected an (expert_a, expert_b) pair")
            if not pair and isinstance(key, tuple):
                raise error(path, None, field, "mixes pair and single-expert keys")
            idx = tuple(_int_key(path, field, x) for x in keys)
            if any(not 0 <= x < num_experts for x in idx):
                raise error(path, None, field, f"expert id out of range [0, {num_experts})")
            if isinstance(v, bool) or not isinstance(v, (int, np.integer, float, np.floating)) \
                    or not math.isfinite(float(v)) or v < 0:
                raise error(path, None, field, f"count {v!r} is not a finite number >= 0")
            out[(j, *idx)] = float(v)
    if pair:
        # Layer pairs (a, b), (b, c), ...: marginals give per-layer counts a, b, c.
        counts = np.concatenate([out[:, :, :].sum(2), out[-1:].sum(1)], axis=0)
        return counts, out
    return out, None


def import_olmoe(srcs: Sequence, *, num_experts: int, top_k: int,
                 layers: Sequence[int] = (0, 7, 15), progress: bool = False
                 ) -> tuple[Trace, dict]:
    """OLMoE routing-analysis pickles -> counts-only Trace [I = files, L, E] and meta.

    Per-expert count files give the counts directly; cross-layer pair files give per-layer
    counts as the pair matrix's marginals and keep the pair matrices in
    meta["cross_layer_pairs"] (`layers`: the recorded decoder layers, OLMoE's [0, 7, 15]).
    All files must have the same kind and layer count.
    """
    check_experts_top_k(num_experts, top_k, "olmoe")
    if isinstance(srcs, (str, os.PathLike)):
        srcs = [srcs]
    if not srcs:
        raise ConfigError("src: give at least one .pkl file")
    counts, pairs = [], []
    with byte_progress(len(srcs), "olmoe", progress) as advance:
        for p in srcs:
            c, pm = _olmoe_one(p, restricted_unpickle(p), num_experts)
            if counts and (c.shape != counts[0].shape or (pm is None) != (pairs[0] is None)):
                kind = "pairs" if pm is not None else "counts"
                kind0 = "pairs" if pairs[0] is not None else "counts"
                raise error(p, None, "pickle", f"has {c.shape[0]} layers ({kind}) but "
                            f"{srcs[0]} has {counts[0].shape[0]} ({kind0})")
            counts.append(c)
            pairs.append(pm)
            advance(1)
    counts = np.stack(counts)
    totals = counts.sum(-1)  # [I, L]
    for i, p in enumerate(srcs):
        if not np.allclose(totals[i], totals[i, 0]):
            raise error(p, None, "counts", f"layers hold different totals {totals[i].tolist()}; "
                        "every layer routes the same tokens")
        if totals[i, 0] % top_k:
            raise error(p, None, "counts", f"total {totals[i, 0]:.0f} is not a multiple of "
                        f"top_k={top_k} (wrong top_k?)")
    if len(layers) != counts.shape[1]:
        layers = list(range(counts.shape[1]))
    meta = {
        "source": "olmoe",
        "paths": [str(p) for p in srcs],
        "layers": [int(x) for x in layers],
        "tokens_per_iteration": (totals[:, 0] / top_k).tolist(),
    }
    if pairs[0] is not None:
        meta["cross_layer_pairs"] = {
            "layers": [[int(a), int(b)]
                       for a, b in zip(meta["layers"][:-1], meta["layers"][1:], strict=True)],
            "counts": np.stack(pairs).sum(0).astype(np.int64).tolist(),
        }
    return from_counts(counts, top_k), meta
