"""ESFT routing logs (deepseek-ai/ESFT `results/expert_scores/<task>/`): a folder of
`expert_weights_<L>.txt`, one line per sequence, ids then gate weights."""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from pathlib import Path

import numpy as np

from moejax.errors import TraceError
from moejax.trace.core import Trace
from moejax.trace.importers.reading import (
    LAST_ITERATION,
    byte_progress,
    check_experts_top_k,
    check_ids,
    check_weights,
    error,
    read_lines,
    short_last,
    token_trace,
)


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
        raise error(path, line, "line", "truncated (no newline at end of file)")
    ids_s, sep, w_s = text.partition("\t\t")
    if not sep:
        raise error(path, line, "line", "no '\\t\\t' separator between ids and weights")
    ids = _numbers(ids_s, np.int64)
    if ids is None:
        raise error(path, line, "ids", "not all tab-separated integers")
    w = _numbers(w_s, np.float64)
    if w is None:
        raise error(path, line, "weights", "not all tab-separated numbers")
    if ids.size % k:
        raise error(path, line, "ids", f"{ids.size} ids is not a multiple of top_k={k} "
                    "(truncated record or wrong top_k)")
    if w.size != ids.size:
        raise error(path, line, "weights", f"{w.size} weights for {ids.size} ids")
    ids, w = ids.reshape(-1, k), w.reshape(-1, k)
    check_ids(path, line, "ids", ids, num_experts)
    check_weights(path, line, "weights", w)
    return ids, w


def import_esft(src, *, num_experts: int = 64, top_k: int = 6, drop_last_token: bool = True,
                tokens_per_iteration: int | None = None, progress: bool = False,
                last_iteration: str | None = None) -> tuple[Trace, dict]:
    """ESFT per-layer logs of one task folder -> token-level Trace [I, L, N, K] and meta.

    One iteration per sequence (N = longest sequence, shorter ones masked), or, with
    `tokens_per_iteration`, the sequences' tokens concatenated in order and cut into
    iterations of that many tokens (the last one partial). `drop_last_token` drops each
    sequence's final token, whose router puts ~0.99 on one expert (an artifact of the
    logging, SOURCE.md). Weights are the logged softmax probabilities (not renormalized).
    A short last iteration is kept with a warning, or kept / dropped by `last_iteration`
    ("keep" / "drop"); meta["report"] says what was mapped, dropped and assumed and
    meta["warnings"] lists the warnings.
    """
    check_experts_top_k(num_experts, top_k, "esft")
    if last_iteration not in (None, *LAST_ITERATION):
        raise TraceError(f"last_iteration: unknown {last_iteration!r}; allowed: "
                         f"{', '.join(LAST_ITERATION)}")
    if last_iteration is not None and tokens_per_iteration is None:
        raise TraceError("--last-iteration: only with --tokens-per-iteration (one iteration "
                         "per sequence has no short last iteration)")
    folder = Path(src)
    if not folder.is_dir():
        raise TraceError(f"{folder}: esft source must be a folder of expert_weights_<L>.txt")
    files = _esft_files(folder)
    total = sum(p.stat().st_size for p in files)
    seq_ids, seq_w = [], []
    with contextlib.ExitStack() as stack, byte_progress(total, f"esft {folder.name}",
                                                      progress) as advance:
        handles = [stack.enter_context(open(p, "rb")) for p in files]
        iters = [read_lines(h, p, lambda b: "weights" if "\t\t" in b else "ids")
                 for h, p in zip(handles, files, strict=True)]
        line = 0
        while True:
            rows = [next(it, None) for it in iters]
            if all(r is None for r in rows):
                break
            line += 1
            for p, r in zip(files, rows, strict=True):
                if r is None:
                    raise error(p, line, "line", f"file ends before line {line}; other layer "
                                "files have more lines (truncated file)")
            parsed = []
            for p, (_, text, ended) in zip(files, rows, strict=True):
                advance(len(text) + 1)
                parsed.append(_parse_esft_line(p, line, text, ended, top_k, num_experts))
            t0 = parsed[0][0].shape[0]
            for p, (ids, _) in zip(files, parsed, strict=True):
                if ids.shape[0] != t0:
                    raise error(p, line, "ids", f"{ids.shape[0]} tokens but {files[0].name} "
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
        check_experts_top_k(tokens_per_iteration, None, "tokens_per_iteration")
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
    trace = token_trace(ids.transpose(0, 2, 1, 3), w.transpose(0, 2, 1, 3), mask,
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
    report = {"mapped": {"layers": f"{files[0].name} .. {files[-1].name} -> layers 0.."
                         f"{len(files) - 1}", "experts": "ids before the tab-tab",
                         "weights": "numbers after it"},
              "dropped": [f"each sequence's last token ({len(seq_ids)} tokens, a logging "
                          "artifact; --keep-last-token keeps them)"] if drop_last_token else [],
              "assumed": [f"line i of every layer file is the same sequence ({len(seq_ids)} "
                          "sequences)", "one iteration per sequence" if tokens_per_iteration
                          is None else f"sequences concatenated, iterations of "
                          f"{tokens_per_iteration} tokens"]}
    warnings: list[str] = []
    if tokens_per_iteration is not None:
        trace, meta = short_last(trace, meta, tokens_per_iteration, last_iteration, warnings,
                                 report)
    meta["report"], meta["warnings"] = report, warnings
    return trace, meta
