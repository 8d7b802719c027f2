"""Cut and join recorded traces for held-out work: slice (iterations, layers, tokens),
concatenate along iterations (plan on one recording, score on another), split into a
training part and a held-out part. Each keeps the trace's provenance and appends the step
that made it (`moejax.trace.provenance`), so every later output names its data.

All work on one trace (a batch of one is taken as its trace); ranges are Python-style
`START:STOP` over iterations / token slots, layers a list of indices.
"""

from __future__ import annotations

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.trace import provenance
from moejax.trace.core import Trace, from_counts
from moejax.trace.importers.reading import token_trace


def single(tr: Trace, what: str) -> Trace:
    """The one trace of `tr` (a batch of one is unwrapped; a larger batch is refused)."""
    if tr.batch_shape == (1,):
        return tr[0]
    if tr.batch_shape:
        raise ConfigError(f"{what}: holds a batch of {tr.batch_shape[0]} traces; the trace "
                          "tools take one recording")
    return tr


def parse_range(text: str | None, size: int, what: str) -> slice:
    """`"START:STOP"` (either side may be empty) or `"I"` -> a slice within [0, size);
    an empty or out-of-range selection is an error naming `what`."""
    if text is None:
        return slice(0, size)
    a, sep, b = str(text).partition(":")
    try:
        lo = int(a) if a.strip() else 0
        hi = (int(b) if b.strip() else size) if sep else lo + 1
    except ValueError:
        raise ConfigError(f"--{what} {text!r}: expected START:STOP (integers)") from None
    if not 0 <= lo < hi <= size:
        raise ConfigError(f"--{what} {text!r}: allowed 0 <= START < STOP <= {size}")
    return slice(lo, hi)


def parse_layers(text: str | None, size: int) -> list[int]:
    """`"0,3,5"` or `"2:6"` -> layer indices within [0, size)."""
    if text is None:
        return list(range(size))
    if ":" in str(text):
        s = parse_range(text, size, "layers")
        return list(range(s.start, s.stop))
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--layers {text!r}: expected comma-separated integers") from None
    bad = [x for x in out if not 0 <= x < size]
    if not out or bad or len(set(out)) != len(out):
        raise ConfigError(f"--layers {text!r}: allowed distinct indices 0..{size - 1}")
    return out


def _rebuild(tr: Trace, ids, w, mask, req, counts) -> Trace:
    if tr.has_tokens:
        return token_trace(ids, w, mask, tr.num_experts, req)
    return from_counts(counts, tr.top_k)


def slice_trace(tr: Trace, meta: dict, *, iterations: str | None = None,
                layers: str | None = None, tokens: str | None = None) -> tuple[Trace, dict]:
    """Iterations `iterations`, layers `layers`, token slots `tokens` of one trace."""
    tr = single(tr, "trace")
    it = parse_range(iterations, tr.num_iterations, "iterations")
    ly = parse_layers(layers, tr.num_layers)
    if tokens is not None and not tr.has_tokens:
        raise ConfigError("--tokens: a counts-only trace has no tokens to slice")
    tk = parse_range(tokens, tr.num_tokens, "tokens") if tr.has_tokens else slice(0, 0)
    a = {k: np.asarray(v) for k, v in (("ids", tr.expert_ids), ("w", tr.gate_weights),
                                         ("mask", tr.token_mask), ("req", tr.token_request),
                                         ("counts", tr.counts))}
    ids = a["ids"][it][:, ly][:, :, tk]
    w = a["w"][it][:, ly][:, :, tk]
    mask, req = a["mask"][it][:, tk], a["req"][it][:, tk]
    if tr.has_tokens and not mask.any():
        raise ConfigError(f"--tokens {tokens!r}: no real token in the selection")
    out = _rebuild(tr, ids, w, mask, req, a["counts"][it][:, ly])
    step = [f"iterations {it.start}:{it.stop}"]
    if layers is not None:
        step.append(f"layers {layers}")
    if tokens is not None:
        step.append(f"tokens {tk.start}:{tk.stop}")
    m = provenance.derive(meta, "slice " + ", ".join(step))
    if isinstance(m.get("layers"), list) and len(m["layers"]) == tr.num_layers:
        m["layers"] = [m["layers"][j] for j in ly]
    return out, m


def concat(parts: list[tuple[Trace, dict]], names: list[str]) -> tuple[Trace, dict]:
    """The iterations of each part in turn (same experts, top-k and layer count; token
    slots padded to the longest). Meta: the first part's keys, provenance of each part."""
    if len(parts) < 2:
        raise ConfigError("concat: give at least two traces")
    trs = [single(t, n) for (t, _), n in zip(parts, names, strict=True)]
    t0 = trs[0]
    for t, n in zip(trs[1:], names[1:], strict=True):
        for attr in ("num_experts", "top_k", "num_layers", "has_tokens"):
            if getattr(t, attr) != getattr(t0, attr):
                raise ConfigError(f"concat: {n} has {attr} = {getattr(t, attr)}, {names[0]} "
                                  f"has {getattr(t0, attr)}; allowed: equal")
    n = max(t.num_tokens for t in trs)

    def pad(x, axis, fill):
        width = [(0, 0)] * x.ndim
        width[axis] = (0, n - x.shape[axis])
        return np.pad(np.asarray(x), width, constant_values=fill)

    ids = np.concatenate([pad(t.expert_ids, 2, -1) for t in trs])
    w = np.concatenate([pad(t.gate_weights, 2, 0) for t in trs])
    mask = np.concatenate([pad(t.token_mask, 1, False) for t in trs])
    req = np.concatenate([pad(t.token_request, 1, -1) for t in trs])
    counts = np.concatenate([np.asarray(t.counts) for t in trs])
    out = _rebuild(t0, ids, w, mask, req, counts)
    spans, lo = [], 0
    for t, nm in zip(trs, names, strict=True):
        spans.append(f"{nm} -> iterations {lo}:{lo + t.num_iterations}")
        lo += t.num_iterations
    meta = {k: v for k, v in parts[0][1].items() if k not in ("steps", provenance.KEY)}
    meta[provenance.KEY] = {"kind": "concat", "parts": [
        {"file": nm, **provenance.of(m)} for (_, m), nm in zip(parts, names, strict=True)],
        "derived": ["concat " + "; ".join(spans)]}
    return out, meta


def split(tr: Trace, meta: dict, train_fraction: float) -> tuple[tuple[Trace, dict],
                                                                  tuple[Trace, dict]]:
    """(train, held-out): the first round(I * train_fraction) iterations and the rest."""
    tr = single(tr, "trace")
    if not 0 < train_fraction < 1:
        raise ConfigError(f"--train-fraction {train_fraction}: allowed in (0, 1)")
    n = tr.num_iterations
    cut = int(round(n * train_fraction))
    if not 1 <= cut < n:
        raise ConfigError(f"--train-fraction {train_fraction}: the trace has {n} iterations, "
                          f"leaving {cut} to train and {n - cut} held out; allowed: a split "
                          "with at least one of each")
    head = jax.tree_util.tree_map(lambda x: x[:cut], tr)
    tail = jax.tree_util.tree_map(lambda x: x[cut:], tr)
    frac = f"train fraction {train_fraction:g}"
    return ((head, provenance.derive(meta, f"split {frac}: train = iterations 0:{cut}")),
            (tail, provenance.derive(meta, f"split {frac}: held out = iterations {cut}:{n}")))
