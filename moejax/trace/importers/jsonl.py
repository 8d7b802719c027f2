"""The documented JSONL per-token (or per-step) routing format, with a field map for a
recorder's own keys and an optional cut of ragged steps (`docs/traces.md`)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moejax.errors import ConfigError, TraceError
from moejax.trace.core import Trace
from moejax.trace.importers.reading import (
    Grow,
    byte_progress,
    check_experts_top_k,
    check_ids,
    check_weights,
    error,
    read_lines,
    token_trace,
)


def _json_key_before(text: str) -> str | None:
    """The last JSON object key before the end of `text` (to name a field that holds a
    byte that is not UTF-8)."""
    keys = re.findall(r'"((?:[^"\\]|\\.)*)"\s*:', text)
    return keys[-1] if keys else None


def _jsonl_ids(path, line, rec, name, nested: bool, k: int | None):
    v = rec.get(name)
    try:
        arr = np.asarray(v, dtype=np.float64 if name == "weights" else None)
    except (ValueError, TypeError):
        raise error(path, line, name, "ragged or non-numeric list") from None
    if arr.ndim != (2 if nested else 1) or arr.size == 0:
        shape = "[tokens][k] list" if nested else "non-empty list"
        raise error(path, line, name, f"expected a {shape}, got {v!r:.60}")
    if name == "experts":
        if arr.dtype.kind not in "iu":
            raise error(path, line, name, f"expert ids must be integers, got {v!r:.60}")
        arr = arr.astype(np.int64)
    arr = arr.reshape(-1, arr.shape[-1])
    if k is not None and arr.shape[-1] != k:
        raise error(path, line, name, f"{arr.shape[-1]} choices per token, expected top_k={k}")
    return arr


JSONL_FIELDS = ("layer", "experts", "weights", "step", "request", "requests", "token")
RAGGED = ("error", "truncate")


def parse_field_map(items: Sequence[str] | None) -> dict[str, str]:
    """`["layer=layer_idx", "experts=routing.topk_ids"]` -> {"layer": "layer_idx", ...}.

    Keys are moejax's JSONL field names (JSONL_FIELDS); values are the recorder's keys, a
    dotted path for a nested object (`routing.topk_ids`).
    """
    out: dict[str, str] = {}
    for item in items or ():
        ours, sep, theirs = str(item).partition("=")
        ours, theirs = ours.strip(), theirs.strip()
        if not sep or not ours or not theirs:
            raise ConfigError(f"--field: expected OURS=THEIRS (e.g. layer=layer_idx), got "
                              f"{item!r}")
        if ours not in JSONL_FIELDS:
            raise ConfigError(f"--field: unknown field {ours!r}; allowed: "
                              f"{', '.join(JSONL_FIELDS)}")
        if ours in out:
            raise ConfigError(f"--field: {ours} mapped twice ({out[ours]!r}, {theirs!r})")
        out[ours] = theirs
    return out


_MISSING = object()


def _dig(rec: dict, dotted: str):
    cur = rec
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _map_record(path, n, rec: dict, fields: dict[str, str], ignore_unknown: bool) -> dict:
    """The record under moejax's field names: mapped fields taken from the recorder's keys,
    unknown keys an error (or dropped with `ignore_unknown`)."""
    out = {}
    used = set()
    for ours in JSONL_FIELDS:
        theirs = fields.get(ours, ours)
        v = _dig(rec, theirs)
        used.add(theirs.split(".")[0])
        if v is not _MISSING:
            out[ours] = v
    unknown = set(rec) - used
    if unknown and not ignore_unknown:
        raise error(path, n, sorted(unknown)[0], "unknown field; allowed: layer, experts, "
                    "weights, step, request(s), token (--ignore-unknown-fields drops others; "
                    "--field OURS=THEIRS maps a recorder's names)")
    return out


def import_jsonl(src, *, num_experts: int | None = None, top_k: int | None = None,
                 progress: bool = False, fields: dict[str, str] | None = None,
                 ignore_unknown: bool = False, ragged: str = "error") -> tuple[Trace, dict]:
    """JSONL per-token or per-step routing records -> token-level Trace and meta.

    Real recorders name fields their own way and add their own (a dataset name, a token
    text): `fields` maps moejax's names to theirs ({"layer": "layer_idx"}, dotted paths for
    nested objects) and `ignore_unknown` drops the rest. A recorder that drops records (on
    ties, say) leaves the layers of one step with different token counts; `ragged="error"`
    refuses that, `ragged="truncate"` keeps, for every step, the first n tokens of each
    layer in record order, n = the step's smallest layer, and reports how many token
    records it dropped in meta["dropped_tokens"] (positions are matched by record order, as
    the Trace has one token axis shared by all layers).
    """
    check_experts_top_k(num_experts, top_k, "jsonl")
    if ragged not in RAGGED:
        raise ConfigError(f"ragged: unknown {ragged!r}; allowed: {', '.join(RAGGED)}")
    fields = dict(fields or {})
    path = Path(src)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    k = top_k
    step, layer, req, line = Grow(np.int64), Grow(np.int64), Grow(np.int64), Grow(np.int64)
    ids_g = w_g = None
    has_weights = None
    with open(path, "rb") as f, byte_progress(path.stat().st_size, f"jsonl {path.name}",
                                              progress) as advance:
        for n, text, ended in read_lines(f, path, _json_key_before):
            advance(len(text) + 1)
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as err:
                what = "truncated record" if not ended else "invalid JSON"
                raise error(path, n, "record", f"{what} ({err.msg}, column {err.colno})"
                            ) from None
            if not isinstance(rec, dict):
                raise error(path, n, "record", f"expected a JSON object, got {type(rec).__name__}")
            if fields.get("layer", "layer") not in rec and (
                    "num_experts" in rec or "top_k" in rec):
                if step.n:
                    raise error(path, n, "header", "header must be the first line")
                hk = rec.get("top_k", k)
                he = rec.get("num_experts", num_experts)
                check_experts_top_k(he, hk, f"{path}:{n} header")
                if (num_experts is not None and he != num_experts) or (
                        top_k is not None and hk != top_k):
                    raise error(path, n, "header", f"num_experts={he}, top_k={hk} disagree with "
                                f"the given num_experts={num_experts}, top_k={top_k}")
                num_experts, k = he, hk
                continue
            rec = _map_record(path, n, rec, fields, ignore_unknown)
            if num_experts is None:
                raise error(path, n, "num_experts", "unknown: give --experts or a header line "
                            '{"num_experts": E, "top_k": K}')
            if "layer" not in rec:
                hint = (f" (mapped from {fields['layer']!r})" if "layer" in fields else
                        "; --field layer=NAME maps a recorder's name")
                raise error(path, n, "layer", f"missing: every record names its layer{hint}")
            for name in ("layer", "step"):
                v = rec.get(name, 0)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise error(path, n, name, f"expected an integer >= 0, got {v!r}")
            if "experts" not in rec:
                raise error(path, n, "experts", "missing")
            nested = isinstance(rec["experts"], list) and bool(rec["experts"]) and isinstance(
                rec["experts"][0], list)
            ids = _jsonl_ids(path, n, rec, "experts", nested, k)
            k = ids.shape[-1]
            if k > num_experts:
                raise error(path, n, "experts", f"top_k {k} > num_experts {num_experts}")
            check_ids(path, n, "experts", ids, num_experts)
            if has_weights is None:
                has_weights = "weights" in rec
            if ("weights" in rec) != has_weights:
                raise error(path, n, "weights", "present in some records and not others")
            if has_weights:
                w = _jsonl_ids(path, n, rec, "weights", nested, k)
                if w.shape != ids.shape:
                    raise error(path, n, "weights", f"shape {w.shape} != experts {ids.shape}")
                check_weights(path, n, "weights", w)
            else:
                w = np.full(ids.shape, 1.0 / k)
            r = rec.get("requests" if nested else "request", -1)
            r = np.broadcast_to(np.asarray(r), (len(ids),)) if np.ndim(r) == 0 else np.asarray(r)
            if r.shape != (len(ids),) or r.dtype.kind not in "iu":
                raise error(path, n, "requests" if nested else "request",
                            f"expected {'one integer per token' if nested else 'an integer'}")
            if ids_g is None:
                ids_g, w_g = Grow(np.int32, k), Grow(np.float32, k)
            ids_g.extend(ids)
            w_g.extend(w)
            step.extend(np.full(len(ids), rec.get("step", 0)))
            layer.extend(np.full(len(ids), rec["layer"]))
            req.extend(r)
            line.extend(np.full(len(ids), n))
    if ids_g is None:
        raise TraceError(f"{path}: no routing records")
    return _assemble(path, step.array(), layer.array(), req.array(), ids_g.array(),
                     w_g.array(), num_experts, line.array(), ragged)


def _assemble(path, step, layer_ids, req, ids, w, num_experts, line, ragged="error"):
    """Token rows -> [I, L, N, K]: steps sorted, recorded layers in increasing order (their
    ids kept in meta["layers"]), tokens in record order per (step, layer)."""
    steps, si = np.unique(step, return_inverse=True)
    layers, layer = np.unique(layer_ids, return_inverse=True)
    num_layers = len(layers)
    order = np.lexsort((np.arange(len(step)), layer, si))
    s_o, l_o = si[order], layer[order]
    group = s_o * num_layers + l_o
    first = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
    sizes = np.diff(np.r_[first, len(group)])
    pos = np.arange(len(group)) - np.repeat(first, sizes)
    per = np.zeros((len(steps), num_layers), np.int64)
    per[s_o[first], l_o[first]] = sizes
    first_line = np.zeros((len(steps), num_layers), np.int64)
    first_line[s_o[first], l_o[first]] = line[order][first]
    common = per.min(1)  # [I] tokens every layer of the step holds
    dropped = int((per - common[:, None]).sum())
    if ragged == "error" and dropped:
        i = int(np.argmax(per.max(1) != common))
        bad = int(np.argmin(per[i]))
        full = int(np.argmax(per[i]))
        where = int(first_line[i, bad] or first_line[i, full])
        raise error(path, where, "layer", f"step {steps[i]} has {per[i, bad]} tokens at layer "
                    f"{layers[bad]} but {per[i, full]} at layer {layers[full]} (every layer of "
                    "a step must route the same tokens; --truncate-to-common keeps the common "
                    "tokens and counts what it drops)")
    keep_step = common > 0
    if not keep_step.any():
        raise TraceError(f"{path}: layer: no step has a token at every layer "
                         f"({len(layers)} layers recorded)")
    keep = pos < common[s_o]  # the first `common` tokens of each (step, layer)
    new_step = np.cumsum(keep_step) - 1
    s_k, l_k, p_k = new_step[s_o[keep]], l_o[keep], pos[keep]
    rows = order[keep]
    steps_kept = steps[keep_step]
    n = int(common.max())
    k = ids.shape[-1]
    out_ids = np.full((len(steps_kept), num_layers, n, k), -1, np.int32)
    out_w = np.zeros((len(steps_kept), num_layers, n, k), np.float32)
    out_ids[s_k, l_k, p_k] = ids[rows]
    out_w[s_k, l_k, p_k] = w[rows]
    mask = np.arange(n)[None, :] < common[keep_step][:, None]
    request = np.full((len(steps_kept), n), -1, np.int32)
    l0 = l_k == 0
    request[s_k[l0], p_k[l0]] = req[rows][l0]
    trace = token_trace(out_ids, out_w, mask, num_experts, request)
    meta = {"source": "jsonl", "path": str(path), "steps": steps_kept.tolist()[:10000],
            "layers": layers.tolist(), "tokens": int(common.sum())}
    if ragged != "error":
        meta.update(ragged=ragged, dropped_tokens=dropped,
                    dropped_steps=int((~keep_step).sum()))
    return trace, meta
