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
    LAST_ITERATION,
    Grow,
    byte_progress,
    check_experts_top_k,
    check_ids,
    check_weights,
    error,
    read_lines,
    short_last,
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


def _map_record(path, n, rec: dict, fields: dict[str, str], ignore_unknown: bool,
                dropped: set | None = None) -> dict:
    """The record under moejax's field names: mapped fields taken from the recorder's keys,
    unknown keys an error (or dropped with `ignore_unknown`, their names added to
    `dropped`)."""
    out = {}
    used = set()
    for ours in JSONL_FIELDS:
        theirs = fields.get(ours, ours)
        v = _dig(rec, theirs)
        used.add(theirs.split(".")[0])
        if v is not _MISSING:
            out[ours] = v
    unknown = set(rec) - used
    if dropped is not None and len(dropped) < 64:
        dropped.update(unknown)
    if unknown and not ignore_unknown:
        raise error(path, n, sorted(unknown)[0], "unknown field; allowed: layer, experts, "
                    "weights, step, request(s), token (--ignore-unknown-fields drops others; "
                    "--field OURS=THEIRS maps a recorder's names)")
    return out


def import_jsonl(src, *, num_experts: int | None = None, top_k: int | None = None,
                 progress: bool = False, fields: dict[str, str] | None = None,
                 ignore_unknown: bool = False, ragged: str = "error",
                 tokens_per_iteration: int | None = None,
                 last_iteration: str | None = None) -> tuple[Trace, dict]:
    """JSONL per-token or per-step routing records -> token-level Trace and meta.

    Real recorders name fields their own way and add their own (a dataset name, a token
    text): `fields` maps moejax's names to theirs ({"layer": "layer_idx"}, dotted paths for
    nested objects) and `ignore_unknown` drops the rest. A recorder that drops records (on
    ties, say) leaves the layers of one step with different token counts; `ragged="error"`
    refuses that, `ragged="truncate"` keeps, for every step, the first n tokens of each
    layer in record order, n = the step's smallest layer, and reports how many token
    records it dropped in meta["dropped_tokens"] (positions are matched by record order, as
    the Trace has one token axis shared by all layers).

    With a `token` field (an integer per token record, a list per step record) tokens are
    lined up across layers by their id, not by record order: every layer of a step must
    route the same token ids (`ragged="truncate"` keeps the ids every layer routed), and a
    token id twice in one step and layer is an error. A `--field` whose recorder key appears
    in no record is an error, never a silent default. Without any `step` field the records
    are one iteration (a warning says so) unless `tokens_per_iteration` cuts each layer's
    tokens (in token-id order when there are ids, else record order) into iterations of
    that many; a short last iteration is kept with a warning (`last_iteration="keep"`
    keeps it silently, `"drop"` drops it). meta["report"] says what was mapped, dropped
    and assumed; meta["warnings"] lists the warnings.
    """
    check_experts_top_k(num_experts, top_k, "jsonl")
    if ragged not in RAGGED:
        raise ConfigError(f"ragged: unknown {ragged!r}; allowed: {', '.join(RAGGED)}")
    fields = dict(fields or {})
    if last_iteration not in (None, *LAST_ITERATION):
        raise ConfigError(f"last_iteration: unknown {last_iteration!r}; allowed: "
                          f"{', '.join(LAST_ITERATION)}")
    if tokens_per_iteration is not None:
        check_experts_top_k(tokens_per_iteration, None, "tokens_per_iteration")
    path = Path(src)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    k = top_k
    step, layer, req, line = Grow(np.int64), Grow(np.int64), Grow(np.int64), Grow(np.int64)
    tok = Grow(np.int64)
    ids_g = w_g = None
    has_weights = has_token = None
    seen: set[str] = set()  # moejax field names found in some record
    dropped_keys: set[str] = set()
    header = None
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
                header = {"num_experts": he, "top_k": hk}
                continue
            rec = _map_record(path, n, rec, fields, ignore_unknown, dropped_keys)
            seen.update(rec)
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
            if has_token is None:
                has_token = "token" in rec
            if ("token" in rec) != has_token:
                raise error(path, n, "token", "present in some records and not others")
            tk = rec.get("token", -1)
            tk = np.asarray(tk) if nested else np.asarray([tk])
            if has_token and (tk.shape != (len(ids),) or tk.dtype.kind not in "iu"
                              or (tk < 0).any()):
                want = "a list of one integer >= 0 per token" if nested else "an integer >= 0"
                raise error(path, n, "token", f"expected {want}, got {rec['token']!r:.60}")
            if ids_g is None:
                ids_g, w_g = Grow(np.int32, k), Grow(np.float32, k)
            tok.extend(np.broadcast_to(tk, (len(ids),)))
            ids_g.extend(ids)
            w_g.extend(w)
            step.extend(np.full(len(ids), rec.get("step", 0)))
            layer.extend(np.full(len(ids), rec["layer"]))
            req.extend(r)
            line.extend(np.full(len(ids), n))
    if ids_g is None:
        raise TraceError(f"{path}: no routing records")
    for ours, theirs in fields.items():
        if ours not in seen:
            raise ConfigError(f"--field {ours}={theirs}: key {theirs!r} appears in none of "
                              f"the records of {path}; their keys: "
                              f"{', '.join(sorted(dropped_keys | seen)[:12])}")
    report = {"mapped": {f: fields.get(f, f) for f in JSONL_FIELDS if f in seen},
              "dropped": sorted(dropped_keys) if ignore_unknown else [], "assumed": []}
    if header is not None:
        report["assumed"].append(f"num_experts={header['num_experts']}, "
                                 f"top_k={header['top_k']} from the header line")
    if not has_weights:
        report["assumed"].append(f"no weights field: uniform gate weights 1/{k}")
    if not {"request", "requests"} & seen:
        report["assumed"].append("no request field: tokens not tied to requests (-1)")
    warnings: list[str] = []
    steps_arr, tok_arr = step.array(), tok.array() if has_token else None
    if "step" not in seen:
        if tokens_per_iteration is None:
            warnings.append(f"{path}: no step field in any record: every layer's tokens are "
                            "one iteration (prefill and decode steps blended?); --field "
                            "step=KEY maps the recorder's step, --tokens-per-iteration N cuts "
                            "the tokens into iterations")
        else:
            steps_arr = _cut_steps(layer.array(), tok_arr, tokens_per_iteration)
            report["assumed"].append(f"no step field: iterations of {tokens_per_iteration} "
                                     "tokens cut in " + ("token-id" if has_token else "record")
                                     + " order")
    elif tokens_per_iteration is not None:
        raise ConfigError(f"--tokens-per-iteration: {path} records steps (field "
                          f"{fields.get('step', 'step')!r}); it cuts only a trace without steps")
    if not has_token:
        report["assumed"].append("no token field: tokens lined up across layers by record "
                                 "order within each step and layer")
    trace, meta = _assemble(path, steps_arr, layer.array(), req.array(), ids_g.array(),
                            w_g.array(), num_experts, line.array(), ragged, tok_arr)
    if tokens_per_iteration is not None and "step" not in seen:
        trace, meta = short_last(trace, meta, tokens_per_iteration, last_iteration, warnings,
                                 report)
    meta["report"], meta["warnings"] = report, warnings
    return trace, meta


def _cut_steps(layer_ids, tok, tokens_per_iteration: int):
    """Step of each token row when the records carry none: each layer's tokens in order
    (token-id rank over the whole recording when ids are given, else record order) cut into
    iterations of `tokens_per_iteration`."""
    if tok is not None:
        _, rank = np.unique(tok, return_inverse=True)
        return rank // tokens_per_iteration
    _, li = np.unique(layer_ids, return_inverse=True)
    order = np.lexsort((np.arange(len(li)), li))
    pos = np.empty(len(li), np.int64)
    first = np.r_[0, np.flatnonzero(np.diff(li[order])) + 1]
    sizes = np.diff(np.r_[first, len(li)])
    pos[order] = np.arange(len(li)) - np.repeat(first, sizes)
    return pos // tokens_per_iteration


def _assemble(path, step, layer_ids, req, ids, w, num_experts, line, ragged="error",
              tok=None):
    """Token rows -> [I, L, N, K]: steps sorted, recorded layers in increasing order (their
    ids kept in meta["layers"]), tokens in record order per (step, layer), or in token-id
    order when `tok` (the token id of every row) is given."""
    steps, si = np.unique(step, return_inverse=True)
    layers, layer = np.unique(layer_ids, return_inverse=True)
    num_layers = len(layers)
    if tok is not None:
        return _assemble_by_token(path, steps, si, layers, layer, req, ids, w, num_experts,
                                  line, ragged, tok)
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
    keep = pos < common[s_o]  # the first `common` tokens of each (step, layer)
    return _fill(path, steps, layers, order[keep], s_o[keep], l_o[keep], pos[keep], common,
                 dropped, req, ids, w, num_experts, ragged)


def _assemble_by_token(path, steps, si, layers, layer, req, ids, w, num_experts, line, ragged,
                       tok):
    """`_assemble` with token ids: a token's row at every layer lands in one slot."""
    num_layers = len(layers)
    _, ti = np.unique(tok, return_inverse=True)
    num_t = int(ti.max()) + 1
    cell = (si * num_layers + layer) * num_t + ti  # (step, layer, token)
    uc, first_row, n_rows = np.unique(cell, return_index=True, return_counts=True)
    if (n_rows > 1).any():
        c = int(uc[np.argmax(n_rows > 1)])
        rows = np.flatnonzero(cell == c)
        raise error(path, int(line[rows[1]]), "token", f"token {int(tok[rows[0]])} routed "
                    f"twice at layer {layers[layer[rows[0]]]} of step {steps[si[rows[0]]]} "
                    f"(lines {int(line[rows[0]])} and {int(line[rows[1]])})")
    st = si * num_t + ti  # (step, token)
    ust, n_layers = np.unique(st, return_counts=True)
    full = n_layers == num_layers
    complete = np.isin(st, ust[full])
    dropped = int((~complete).sum())
    if ragged == "error" and dropped:
        r = int(np.argmax(~complete))
        have = set(layer[st == st[r]].tolist())
        miss = next(j for j in range(num_layers) if j not in have)
        raise error(path, int(line[r]), "token", f"token {int(tok[r])} of step "
                    f"{steps[si[r]]} is routed at layer {layers[layer[r]]} but not at layer "
                    f"{layers[miss]} (every layer of a step must route the same tokens; "
                    "--truncate-to-common keeps the tokens every layer routed and counts what "
                    "it drops)")
    rows = np.flatnonzero(complete)
    rows = rows[np.lexsort((ti[rows], layer[rows], si[rows]))]
    s_k, l_k = si[rows], layer[rows]
    kept_st, pos_in = np.unique(st[rows], return_inverse=True)  # sorted: step, then token
    step_of = kept_st // num_t
    first = np.searchsorted(step_of, np.arange(len(steps)))
    pos = pos_in - first[s_k]
    common = np.bincount(step_of, minlength=len(steps))
    return _fill(path, steps, layers, rows, s_k, l_k, pos, common, dropped, req, ids, w,
                 num_experts, ragged)


def _fill(path, steps, layers, rows, s_k, l_k, p_k, common, dropped, req, ids, w,
          num_experts, ragged):
    """The trace from the kept rows: row rows[j] goes to (step s_k[j], layer l_k[j], slot
    p_k[j]); steps without a token common to every layer are dropped."""
    num_layers = len(layers)
    keep_step = common > 0
    if not keep_step.any():
        raise TraceError(f"{path}: layer: no step has a token at every layer "
                         f"({len(layers)} layers recorded)")
    new_step = np.cumsum(keep_step) - 1
    s_k = new_step[s_k]
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
