"""Importers of recorded expert routing into `Trace`s: ESFT text logs, OLMoE count pickles,
a documented JSONL per-token format, and a per-layer per-expert counts CSV.

Every importer reads its input line by line (never the whole file as one string), shows a
rich progress bar over the bytes read when asked, and on bad input raises `TraceError`
naming the file, the line (1-based) and the field. Truncated records, ids out of range, a
top-k that differs between records and non-finite weights are errors, never padded over.

Formats (see `docs/traces.md` for examples):

`esft`       a folder of `expert_weights_<L>.txt`, L = 1..num_layers (ESFT,
             deepseek-ai/ESFT `results/expert_scores/<task>/`). One line per sequence:
             tab-separated ids `[T, K]` row-major, then `\\t\\t`, then the gate weights in the
             same layout. Line i of every layer file is the same sequence.
`olmoe`      one or more pickles of OLMoE's routing analysis (allenai/OLMoE
             `scripts/routing_output/`): a list of `Counter{expert -> count}` per recorded
             layer, or of `Counter{(e_a, e_b) -> count}` per layer pair. Each file becomes one
             iteration of a counts-only trace. Unpickled by `restricted_unpickle` only.
`jsonl`      one JSON object per line. Optional first line, a header:
             `{"num_experts": 64, "top_k": 2}`. Then records, either one token:
             `{"layer": 0, "experts": [5, 12], "weights": [0.6, 0.4], "step": 3,
             "request": 7}` or one step of one layer: `{"layer": 0, "experts": [[5, 12],
             [1, 2]], "weights": [[...], [...]], "step": 3, "requests": [7, 8]}`. `weights`,
             `step` (default 0) and `request(s)` (default -1) are optional. Steps become
             iterations (in increasing order); within a step and layer, tokens keep the order
             of their records, and every layer of a step must hold the same token count
             (or `ragged="truncate"`). `fields` maps these names to a recorder's own keys;
             `ignore_unknown` drops the recorder's other fields.
`counts-csv` a header `layer,0,1,...,E-1` (or `iteration,layer,0,...`), then one row per
             (iteration, layer) of token counts per expert; every pair exactly once.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import io
import json
import math
import os
import pickle
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from moejax.errors import ConfigError, TraceError
from moejax.trace.core import Trace, from_counts, validate

FORMATS = ("esft", "olmoe", "jsonl", "counts-csv")

# The only globals an OLMoE routing pickle may reference (SOURCE.md of the recording).
_ALLOWED_PICKLE_GLOBALS = {
    ("collections", "Counter"): collections.Counter,
    ("collections", "defaultdict"): collections.defaultdict,
    ("numpy.core.multiarray", "scalar"): np.dtype("i8").type(0).__reduce__()[0],
    ("numpy._core.multiarray", "scalar"): np.dtype("i8").type(0).__reduce__()[0],
    ("numpy", "dtype"): np.dtype,
}


# ------------------------------------------------------------------------ plumbing


def _err(path, line: int | None, field: str, msg: str) -> TraceError:
    where = f"{path}:{line}" if line is not None else f"{path}"
    return TraceError(f"{where}: {field}: {msg}")


@contextlib.contextmanager
def _progress(total_bytes: int, label: str, enabled: bool):
    """Yield `advance(nbytes)`; a rich progress bar over bytes when `enabled`."""
    if not enabled:
        yield lambda n: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=max(total_bytes, 1))
        pending = [0]

        def advance(n: int) -> None:
            pending[0] += n
            if pending[0] >= 1 << 20:
                bar.advance(task, pending[0])
                pending[0] = 0

        yield advance
        bar.advance(task, pending[0])


def _lines(f, path, field_at=None) -> Iterator[tuple[int, str, bool]]:
    """(1-based line number, text without newline, whether it ended with a newline) of a
    file opened in binary mode; a line that is not UTF-8 is a TraceError naming the file,
    the line and the field (`field_at(text before the bad byte)`, else "encoding"), never a
    UnicodeDecodeError traceback."""
    for n, raw in enumerate(f, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            before = raw[: err.start].decode("utf-8", "replace")
            field = (field_at(before) if field_at else None) or "encoding"
            raise _err(path, n, field, f"byte 0x{raw[err.start]:02x} at column "
                       f"{err.start + 1} is not UTF-8 (save the file as UTF-8)") from None
        if n == 1 and text.startswith("\ufeff"):  # a UTF-8 byte-order mark
            text = text[1:]
        ended = text.endswith("\n")
        yield n, text.rstrip("\r\n"), ended


def _check_e_k(num_experts, top_k, what: str) -> None:
    for name, v in (("num_experts", num_experts), ("top_k", top_k)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{name}: expected an integer >= 1 for {what}, got {v!r}")


class _Grow:
    """A growable NumPy buffer (amortized doubling) so streaming never builds Python lists
    of every value."""

    def __init__(self, dtype, width: int = 0):
        self.width, self.n = width, 0
        self.buf = np.empty((1024, width) if width else (1024,), dtype)

    def extend(self, rows) -> None:
        rows = np.asarray(rows)
        m = len(rows)
        while self.n + m > len(self.buf):
            self.buf = np.concatenate([self.buf, np.empty_like(self.buf)])
        self.buf[self.n : self.n + m] = rows
        self.n += m

    def array(self) -> np.ndarray:
        return self.buf[: self.n]


def _check_ids(path, line, field, ids: np.ndarray, num_experts: int) -> None:
    """ids [T, K]: in range and no expert twice in one token."""
    bad = (ids < 0) | (ids >= num_experts)
    if bad.any():
        t, k = np.argwhere(bad)[0]
        raise _err(path, line, field, f"token {t} choice {k}: expert id {ids[t, k]} out of "
                   f"range [0, {num_experts})")
    s = np.sort(ids, axis=-1)
    dup = np.diff(s, axis=-1) == 0
    if dup.any():
        t = int(np.argwhere(dup)[0][0])
        raise _err(path, line, field, f"token {t} chose the same expert twice: "
                   f"{ids[t].tolist()}")


def _check_weights(path, line, field, w: np.ndarray) -> None:
    bad = ~np.isfinite(w)
    if bad.any():
        idx = tuple(int(x) for x in np.argwhere(bad)[0])
        raise _err(path, line, field, f"non-finite weight {w[idx]} at {idx}")


def _token_trace(ids, w, mask, num_experts: int, request) -> Trace:
    """A validated token-level Trace from NumPy [I, L, N, K] ids / weights and [I, N] mask.

    Counts come from a bincount (O(ids) memory), not from a one-hot [I, L, N, K, E], so a
    large recording imports in bounded memory.
    """
    import jax.numpy as jnp

    ids = np.where(mask[:, None, :, None], ids, -1).astype(np.int32)
    i, l = ids.shape[:2]
    flat = (np.arange(i * l).reshape(i, l, 1, 1) * num_experts + ids)[ids >= 0]
    counts = np.bincount(flat, minlength=i * l * num_experts).reshape(i, l, num_experts)
    t = Trace(
        expert_ids=jnp.asarray(ids),
        gate_weights=jnp.asarray(w, jnp.float32),
        token_mask=jnp.asarray(mask, bool),
        token_request=jnp.asarray(request, jnp.int32),
        counts=jnp.asarray(counts, jnp.float32),
        num_experts=num_experts,
        top_k=ids.shape[-1],
    )
    validate(t, raw=(ids, np.asarray(w, np.float32), mask))
    return t


# ------------------------------------------------------------------------ ESFT


def _esft_files(folder: Path) -> list[Path]:
    pat = re.compile(r"^expert_weights_(\d+)\.txt$")
    found = {int(m.group(1)): folder / p for p in os.listdir(folder) if (m := pat.match(p))}
    if not found:
        raise TraceError(f"{folder}: no expert_weights_<L>.txt files (esft format)")
    if max(found) < 1:  # ESFT logs MoE layers from 1 (layer 0 of DeepSeek-V2-Lite is dense)
        raise TraceError(f"{folder}: only expert_weights_0.txt; esft layer files are "
                         "numbered from 1 (expert_weights_1.txt, expert_weights_2.txt, ...)")
    want = list(range(1, max(found) + 1))
    missing = sorted(set(want) - set(found))
    if missing:
        raise TraceError(f"{folder}: layer files missing: expert_weights_{missing[0]}.txt "
                         f"(found layers {min(found)}..{max(found)})")
    return [found[i] for i in want]


def _numbers(text: str, dtype) -> np.ndarray | None:
    """Tab-separated numbers of one field (C parser), or None if any cell is malformed."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            out = np.fromstring(text, dtype=dtype, sep="\t")
        except (ValueError, DeprecationWarning):
            return None
    return out if out.size == text.count("\t") + 1 and text.strip() else None


def _parse_esft_line(path, line: int, text: str, ended: bool, k: int, num_experts: int):
    if not ended:
        raise _err(path, line, "line", "truncated (no newline at end of file)")
    ids_s, sep, w_s = text.partition("\t\t")
    if not sep:
        raise _err(path, line, "line", "no '\\t\\t' separator between ids and weights")
    ids = _numbers(ids_s, np.int64)
    if ids is None:
        raise _err(path, line, "ids", "not all tab-separated integers")
    w = _numbers(w_s, np.float64)
    if w is None:
        raise _err(path, line, "weights", "not all tab-separated numbers")
    if ids.size % k:
        raise _err(path, line, "ids", f"{ids.size} ids is not a multiple of top_k={k} "
                   "(truncated record or wrong top_k)")
    if w.size != ids.size:
        raise _err(path, line, "weights", f"{w.size} weights for {ids.size} ids")
    ids, w = ids.reshape(-1, k), w.reshape(-1, k)
    _check_ids(path, line, "ids", ids, num_experts)
    _check_weights(path, line, "weights", w)
    return ids, w


def import_esft(src, *, num_experts: int = 64, top_k: int = 6, drop_last_token: bool = True,
                tokens_per_iteration: int | None = None, progress: bool = False
                ) -> tuple[Trace, dict]:
    """ESFT per-layer logs of one task folder -> token-level Trace [I, L, N, K] and meta.

    One iteration per sequence (N = longest sequence, shorter ones masked), or, with
    `tokens_per_iteration`, the sequences' tokens concatenated in order and cut into
    iterations of that many tokens (the last one partial). `drop_last_token` drops each
    sequence's final token, whose router puts ~0.99 on one expert (an artifact of the
    logging, SOURCE.md). Weights are the logged softmax probabilities (not renormalized).
    """
    _check_e_k(num_experts, top_k, "esft")
    folder = Path(src)
    if not folder.is_dir():
        raise TraceError(f"{folder}: esft source must be a folder of expert_weights_<L>.txt")
    files = _esft_files(folder)
    total = sum(p.stat().st_size for p in files)
    seq_ids, seq_w = [], []
    with contextlib.ExitStack() as stack, _progress(total, f"esft {folder.name}",
                                                      progress) as advance:
        handles = [stack.enter_context(open(p, "rb")) for p in files]
        iters = [_lines(h, p, lambda b: "weights" if "\t\t" in b else "ids")
                 for h, p in zip(handles, files, strict=True)]
        line = 0
        while True:
            rows = [next(it, None) for it in iters]
            if all(r is None for r in rows):
                break
            line += 1
            for p, r in zip(files, rows, strict=True):
                if r is None:
                    raise _err(p, line, "line", f"file ends before line {line}; other layer "
                               "files have more lines (truncated file)")
            parsed = []
            for p, (_, text, ended) in zip(files, rows, strict=True):
                advance(len(text) + 1)
                parsed.append(_parse_esft_line(p, line, text, ended, top_k, num_experts))
            t0 = parsed[0][0].shape[0]
            for p, (ids, _) in zip(files, parsed, strict=True):
                if ids.shape[0] != t0:
                    raise _err(p, line, "ids", f"{ids.shape[0]} tokens but {files[0].name} "
                               f"has {t0} on this line")
            ids = np.stack([x[0] for x in parsed], axis=1)  # [T, L, K]
            w = np.stack([x[1] for x in parsed], axis=1)
            if drop_last_token:
                ids, w = ids[:-1], w[:-1]
            seq_ids.append(ids.astype(np.int32))
            seq_w.append(w.astype(np.float32))
    if not seq_ids:
        raise TraceError(f"{folder}: the layer files are empty")
    lengths = np.array([len(x) for x in seq_ids])
    if tokens_per_iteration is None:
        n = int(lengths.max())
        i = len(seq_ids)
        ids = np.full((i, n, len(files), top_k), -1, np.int32)
        w = np.zeros((i, n, len(files), top_k), np.float32)
        mask = np.arange(n)[None, :] < lengths[:, None]
        ids[mask] = np.concatenate(seq_ids)
        w[mask] = np.concatenate(seq_w)
        request = np.where(mask, np.arange(i)[:, None], -1)
    else:
        _check_e_k(tokens_per_iteration, None, "tokens_per_iteration")
        n = tokens_per_iteration
        flat_ids, flat_w = np.concatenate(seq_ids), np.concatenate(seq_w)
        flat_req = np.repeat(np.arange(len(seq_ids)), lengths)
        total_t = len(flat_ids)
        i = -(-total_t // n)
        pad = i * n - total_t
        ids = np.concatenate([flat_ids, np.full((pad, *flat_ids.shape[1:]), -1, np.int32)])
        w = np.concatenate([flat_w, np.zeros((pad, *flat_w.shape[1:]), np.float32)])
        request = np.concatenate([flat_req, np.full(pad, -1)]).reshape(i, n)
        ids, w = ids.reshape(i, n, len(files), top_k), w.reshape(i, n, len(files), top_k)
        mask = request >= 0
    trace = _token_trace(ids.transpose(0, 2, 1, 3), w.transpose(0, 2, 1, 3), mask,
                         num_experts, request.astype(np.int32))
    meta = {
        "source": "esft",
        "path": str(folder),
        "layers": [int(p.stem.rsplit("_", 1)[1]) for p in files],
        "sequences": len(seq_ids),
        "tokens": int(lengths.sum()),
        "drop_last_token": drop_last_token,
        "weights": "softmax probability over all experts (not renormalized over top-k)",
    }
    return trace, meta


# ------------------------------------------------------------------------ OLMoE pickles


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
        raise _err(path, None, field, f"expected integer expert ids as keys, got {k!r}")
    return int(k)


def _olmoe_one(path, obj, num_experts: int):
    """(counts [L, E] float, pair matrices [P, E, E] or None) of one unpickled object."""
    if not isinstance(obj, list) or not obj or not all(
        isinstance(c, collections.Counter) for c in obj
    ):
        raise _err(path, None, "pickle", "expected a non-empty list of collections.Counter "
                   f"(one per layer or layer pair), got {type(obj).__name__}")
    pair = isinstance(next(iter(obj[0]), None), tuple)
    out = np.zeros((len(obj), num_experts, num_experts) if pair else (len(obj), num_experts))
    for j, counter in enumerate(obj):
        for key, v in counter.items():
            field = f"entry {j} key {key!r}"
            keys = key if pair else (key,)
            if pair and (not isinstance(key, tuple) or len(key) != 2):
                raise _err(path, None, field, "expected an (expert_a, expert_b) pair")
            if not pair and isinstance(key, tuple):
                raise _err(path, None, field, "mixes pair and single-expert keys")
            idx = tuple(_int_key(path, field, x) for x in keys)
            if any(not 0 <= x < num_experts for x in idx):
                raise _err(path, None, field, f"expert id out of range [0, {num_experts})")
            if isinstance(v, bool) or not isinstance(v, (int, np.integer, float, np.floating)) \
                    or not math.isfinite(float(v)) or v < 0:
                raise _err(path, None, field, f"count {v!r} is not a finite number >= 0")
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
    _check_e_k(num_experts, top_k, "olmoe")
    if isinstance(srcs, (str, os.PathLike)):
        srcs = [srcs]
    if not srcs:
        raise ConfigError("src: give at least one .pkl file")
    counts, pairs = [], []
    with _progress(len(srcs), "olmoe", progress) as advance:
        for p in srcs:
            c, pm = _olmoe_one(p, restricted_unpickle(p), num_experts)
            if counts and (c.shape != counts[0].shape or (pm is None) != (pairs[0] is None)):
                kind = "pairs" if pm is not None else "counts"
                kind0 = "pairs" if pairs[0] is not None else "counts"
                raise _err(p, None, "pickle", f"has {c.shape[0]} layers ({kind}) but "
                           f"{srcs[0]} has {counts[0].shape[0]} ({kind0})")
            counts.append(c)
            pairs.append(pm)
            advance(1)
    counts = np.stack(counts)
    totals = counts.sum(-1)  # [I, L]
    for i, p in enumerate(srcs):
        if not np.allclose(totals[i], totals[i, 0]):
            raise _err(p, None, "counts", f"layers hold different totals {totals[i].tolist()}; "
                       "every layer routes the same tokens")
        if totals[i, 0] % top_k:
            raise _err(p, None, "counts", f"total {totals[i, 0]:.0f} is not a multiple of "
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


# ------------------------------------------------------------------------ JSONL


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
        raise _err(path, line, name, "ragged or non-numeric list") from None
    if arr.ndim != (2 if nested else 1) or arr.size == 0:
        shape = "[tokens][k] list" if nested else "non-empty list"
        raise _err(path, line, name, f"expected a {shape}, got {v!r:.60}")
    if name == "experts":
        if arr.dtype.kind not in "iu":
            raise _err(path, line, name, f"expert ids must be integers, got {v!r:.60}")
        arr = arr.astype(np.int64)
    arr = arr.reshape(-1, arr.shape[-1])
    if k is not None and arr.shape[-1] != k:
        raise _err(path, line, name, f"{arr.shape[-1]} choices per token, expected top_k={k}")
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
        raise _err(path, n, sorted(unknown)[0], "unknown field; allowed: layer, experts, "
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
    _check_e_k(num_experts, top_k, "jsonl")
    if ragged not in RAGGED:
        raise ConfigError(f"ragged: unknown {ragged!r}; allowed: {', '.join(RAGGED)}")
    fields = dict(fields or {})
    path = Path(src)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    k = top_k
    step, layer, req, line = _Grow(np.int64), _Grow(np.int64), _Grow(np.int64), _Grow(np.int64)
    ids_g = w_g = None
    has_weights = None
    with open(path, "rb") as f, _progress(path.stat().st_size, f"jsonl {path.name}",
                                          progress) as advance:
        for n, text, ended in _lines(f, path, _json_key_before):
            advance(len(text) + 1)
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as err:
                what = "truncated record" if not ended else "invalid JSON"
                raise _err(path, n, "record", f"{what} ({err.msg}, column {err.colno})"
                           ) from None
            if not isinstance(rec, dict):
                raise _err(path, n, "record", f"expected a JSON object, got {type(rec).__name__}")
            if fields.get("layer", "layer") not in rec and (
                    "num_experts" in rec or "top_k" in rec):
                if step.n:
                    raise _err(path, n, "header", "header must be the first line")
                hk = rec.get("top_k", k)
                he = rec.get("num_experts", num_experts)
                _check_e_k(he, hk, f"{path}:{n} header")
                if (num_experts is not None and he != num_experts) or (
                        top_k is not None and hk != top_k):
                    raise _err(path, n, "header", f"num_experts={he}, top_k={hk} disagree with "
                               f"the given num_experts={num_experts}, top_k={top_k}")
                num_experts, k = he, hk
                continue
            rec = _map_record(path, n, rec, fields, ignore_unknown)
            if num_experts is None:
                raise _err(path, n, "num_experts", "unknown: give --experts or a header line "
                           '{"num_experts": E, "top_k": K}')
            if "layer" not in rec:
                hint = (f" (mapped from {fields['layer']!r})" if "layer" in fields else
                        "; --field layer=NAME maps a recorder's name")
                raise _err(path, n, "layer", f"missing: every record names its layer{hint}")
            for name in ("layer", "step"):
                v = rec.get(name, 0)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise _err(path, n, name, f"expected an integer >= 0, got {v!r}")
            if "experts" not in rec:
                raise _err(path, n, "experts", "missing")
            nested = isinstance(rec["experts"], list) and bool(rec["experts"]) and isinstance(
                rec["experts"][0], list)
            ids = _jsonl_ids(path, n, rec, "experts", nested, k)
            k = ids.shape[-1]
            if k > num_experts:
                raise _err(path, n, "experts", f"top_k {k} > num_experts {num_experts}")
            _check_ids(path, n, "experts", ids, num_experts)
            if has_weights is None:
                has_weights = "weights" in rec
            if ("weights" in rec) != has_weights:
                raise _err(path, n, "weights", "present in some records and not others")
            if has_weights:
                w = _jsonl_ids(path, n, rec, "weights", nested, k)
                if w.shape != ids.shape:
                    raise _err(path, n, "weights", f"shape {w.shape} != experts {ids.shape}")
                _check_weights(path, n, "weights", w)
            else:
                w = np.full(ids.shape, 1.0 / k)
            r = rec.get("requests" if nested else "request", -1)
            r = np.broadcast_to(np.asarray(r), (len(ids),)) if np.ndim(r) == 0 else np.asarray(r)
            if r.shape != (len(ids),) or r.dtype.kind not in "iu":
                raise _err(path, n, "requests" if nested else "request",
                           f"expected {'one integer per token' if nested else 'an integer'}")
            if ids_g is None:
                ids_g, w_g = _Grow(np.int32, k), _Grow(np.float32, k)
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
        raise _err(path, where, "layer", f"step {steps[i]} has {per[i, bad]} tokens at layer "
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
    trace = _token_trace(out_ids, out_w, mask, num_experts, request)
    meta = {"source": "jsonl", "path": str(path), "steps": steps_kept.tolist()[:10000],
            "layers": layers.tolist(), "tokens": int(common.sum())}
    if ragged != "error":
        meta.update(ragged=ragged, dropped_tokens=dropped,
                    dropped_steps=int((~keep_step).sum()))
    return trace, meta


# ------------------------------------------------------------------------ counts CSV


def import_counts_csv(src, *, top_k: int, num_experts: int | None = None,
                      progress: bool = False) -> tuple[Trace, dict]:
    """Per-layer per-expert counts CSV -> counts-only Trace [I, L, E] and meta."""
    _check_e_k(num_experts, top_k, "counts-csv")
    if top_k is None:
        raise ConfigError("top_k: required for counts-csv (counts do not say it)")
    path = Path(src)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    rows: dict[tuple[int, int], np.ndarray] = {}
    with open(path, "rb") as f, _progress(
        path.stat().st_size, f"csv {path.name}", progress
    ) as advance:
        header = None

        def csv_column(before: str) -> str | None:
            col = before.count(",")
            if header is None or col >= len(header):
                return "header" if header is None else None
            return f"count of expert {header[col]}" if col >= lead else header[col]

        for n, text, ended in _lines(f, path, csv_column):
            advance(len(text) + 1)
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            cells = next(csv.reader(io.StringIO(text)))
            cells = [c.strip() for c in cells]
            if header is None:
                header = cells
                lead = 2 if header[:2] == ["iteration", "layer"] else 1
                if header[:lead][-1] != "layer":
                    raise _err(path, n, "header", "must start with 'layer' or "
                               f"'iteration,layer', got {','.join(header[:2])!r}")
                experts = header[lead:]
                if experts != [str(e) for e in range(len(experts))] or not experts:
                    raise _err(path, n, "header", "expert columns must be 0,1,...,E-1")
                if num_experts is not None and len(experts) != num_experts:
                    raise _err(path, n, "header", f"{len(experts)} expert columns, expected "
                               f"num_experts={num_experts}")
                continue
            if len(cells) != len(header):
                what = "truncated row" if not ended or len(cells) < len(header) else "extra"
                raise _err(path, n, "row", f"{len(cells)} cells, header has {len(header)} "
                           f"({what})")
            try:
                idx = tuple(int(c) for c in cells[:lead])
            except ValueError:
                raise _err(path, n, header[lead - 1], f"not an integer: {cells[:lead]}") from None
            if lead == 1:
                idx = (0, *idx)
            if min(idx) < 0:
                raise _err(path, n, "layer", f"negative index {idx}")
            try:
                vals = np.array(cells[lead:], dtype=np.float64)
            except ValueError:
                raise _err(path, n, "count", "not all numbers") from None
            if not np.isfinite(vals).all() or (vals < 0).any():
                e = int(np.argmax(~np.isfinite(vals) | (vals < 0)))
                raise _err(path, n, f"count of expert {e}", f"{cells[lead + e]!r} is not a "
                           "finite number >= 0")
            if idx in rows:
                raise _err(path, n, "layer", f"(iteration, layer) {idx} given twice")
            rows[idx] = vals
    if not rows:
        raise TraceError(f"{path}: no count rows")
    num_i = max(i for i, _ in rows) + 1
    num_l = max(layer for _, layer in rows) + 1
    missing = [(i, j) for i in range(num_i) for j in range(num_l) if (i, j) not in rows]
    if missing:
        raise TraceError(f"{path}: layer: (iteration, layer) {missing[0]} has no row "
                         f"({len(missing)} missing; truncated file?)")
    counts = np.stack([np.stack([rows[(i, j)] for j in range(num_l)]) for i in range(num_i)])
    return from_counts(counts, top_k), {"source": "counts-csv", "path": str(path)}


# ------------------------------------------------------------------------ dispatch


def import_trace(fmt: str, srcs: Sequence, *, num_experts: int | None = None,
                 top_k: int | None = None, progress: bool = False, **options
                 ) -> tuple[Trace, dict]:
    """Import `srcs` (one path; several for `olmoe`) in format `fmt` (one of FORMATS)."""
    if fmt not in FORMATS:
        raise ConfigError(f"format: unknown {fmt!r}; allowed: {', '.join(FORMATS)}")
    srcs = [srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs)
    if fmt != "olmoe" and len(srcs) != 1:
        raise ConfigError(f"src: format {fmt} takes one source, got {len(srcs)}")
    if fmt == "esft":
        kw = {k: v for k, v in (("num_experts", num_experts), ("top_k", top_k)) if v}
        return import_esft(srcs[0], progress=progress, **kw, **options)
    if fmt == "olmoe":
        if num_experts is None or top_k is None:
            raise ConfigError("num_experts / top_k: required for olmoe pickles (OLMoE-1B-7B: "
                              "--experts 64 --top-k 8; Mixtral-8x7B: --experts 8 --top-k 2)")
        return import_olmoe(srcs, num_experts=num_experts, top_k=top_k, progress=progress,
                            **options)
    if fmt == "jsonl":
        return import_jsonl(srcs[0], num_experts=num_experts, top_k=top_k, progress=progress,
                            **options)
    return import_counts_csv(srcs[0], top_k=top_k, num_experts=num_experts, progress=progress)
