"""Load statistics of a routing trace (or batch): per-expert load, skew, Gini, entropy,
activated experts; and a text table of them for `moejax trace inspect`.
"""

from __future__ import annotations

import math

import numpy as np

from moejax.trace.core import Trace


def activated_experts_expected(m, k: int, E: int):
    """Expected distinct experts activated by m tokens choosing k of E uniformly.

    003 §3.2: (1 - (1 - k / E)^m) * E. Exact for uniform routing (each token misses a given
    expert with probability 1 - k / E, independently). `m` may be a number or an array.
    """
    return (1.0 - (1.0 - k / E) ** np.asarray(m, np.float64)) * E


def _gini(x: np.ndarray) -> np.ndarray:
    """Gini coefficient over the last axis (0: equal load; (E - 1) / E: one expert)."""
    x = np.sort(x, axis=-1)
    n = x.shape[-1]
    coef = 2.0 * np.arange(1, n + 1) - n - 1
    total = x.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (coef * x).sum(-1) / (n * total), np.nan)


def _entropy_normalized(p: np.ndarray) -> np.ndarray:
    """Shannon entropy of load fractions over the last axis divided by log E (1 = uniform)."""
    n = p.shape[-1]
    h = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1)
    h = np.where(np.isnan(p).any(-1), np.nan, h)
    return h / math.log(n) if n > 1 else np.where(np.isnan(h), np.nan, 1.0)


def _fractions(c: np.ndarray) -> np.ndarray:
    total = c.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, c / total, np.nan)


def _skew(p: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return p.max(-1) / p.mean(-1)


def _floats(x) -> list | float:
    return np.asarray(x, np.float64).tolist()


def mean_finite(x: np.ndarray, axis=0) -> np.ndarray:
    """Mean over `axis` of the finite values; NaN where there are none (no RuntimeWarning)."""
    x = np.asarray(x, np.float64)
    ok = np.isfinite(x)
    n = ok.sum(axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.where(ok, x, 0.0).sum(axis) / np.maximum(n, 1), np.nan)


def summarize(trace: Trace) -> dict:
    """Plain-Python statistics of a trace or batch (pooled over traces and iterations).

    load: overall per-expert load fraction [E]; load_per_layer [L][E]. skew = max / mean
    load, gini, entropy (normalized by log E), each overall and per layer; skew_iteration_mean
    is the mean single-iteration, single-layer max / mean (002 Fig. 4). activated_experts is
    the mean count of experts with at least one token in an (iteration, layer), against
    003 §3.2's uniform expectation at each iteration's token count. Undefined values (a
    layer with no tokens) are NaN.
    """
    counts = np.asarray(trace.counts, np.float64)
    e, k = trace.num_experts, trace.top_k
    flat = counts.reshape(-1, *counts.shape[-3:])  # [T, I, L, E]
    t, i, l, _ = flat.shape
    per_layer = flat.sum(axis=(0, 1))  # [L, E]
    load_layer = _fractions(per_layer)
    load = _fractions(per_layer.sum(0))
    tokens = np.asarray(trace.tokens_per_iteration(), np.float64).reshape(t, i)
    active = (flat > 0).sum(-1)  # [T, I, L]
    with np.errstate(invalid="ignore"):
        skew_iter = _skew(_fractions(flat))
    skew_iter_mean = float(mean_finite(skew_iter.ravel()))
    # Each trace's own statistics (pooled over its iterations), averaged over traces: the
    # traces of a batch are independent samples whose hot experts differ, so pooling them
    # averages skew away (a batch of 4 powerlaw traces: 1.6 pooled, 2.5 per trace).
    tr_layer = _fractions(flat.sum(1))  # [T, L, E]
    tr_all = _fractions(flat.sum((1, 2)))  # [T, E]
    with np.errstate(invalid="ignore"):
        per_trace = {
            "skew_per_trace": _floats(mean_finite(_skew(tr_all))),
            "skew_per_trace_per_layer": _floats(mean_finite(_skew(tr_layer))),
            "gini_per_trace": _floats(mean_finite(_gini(tr_all))),
            "gini_per_trace_per_layer": _floats(mean_finite(_gini(tr_layer))),
            "entropy_per_trace": _floats(mean_finite(_entropy_normalized(tr_all))),
            "entropy_per_trace_per_layer": _floats(mean_finite(_entropy_normalized(tr_layer))),
            "top_load_per_trace_per_layer": _floats(mean_finite(np.max(tr_layer, -1))),
        }
    return {
        "num_traces": t,
        "num_iterations": i,
        "num_layers": l,
        "num_experts": e,
        "top_k": k,
        "has_tokens": bool(trace.has_tokens),
        "tokens_per_iteration_mean": float(tokens.mean()),
        "load": _floats(load),
        "load_per_layer": _floats(load_layer),
        "skew": float(_skew(load)),
        "skew_per_layer": _floats(_skew(load_layer)),
        "skew_iteration_mean": skew_iter_mean,
        "gini": float(_gini(load)),
        "gini_per_layer": _floats(_gini(load_layer)),
        "entropy": float(_entropy_normalized(load)),
        "entropy_per_layer": _floats(_entropy_normalized(load_layer)),
        "activated_experts": float(active.mean()),
        "activated_experts_per_layer": _floats(active.mean(axis=(0, 1))),
        "activated_experts_expected": float(activated_experts_expected(tokens, k, e).mean()),
        **per_trace,
    }


def format_summary(d: dict) -> str:
    """A readable text table of a `summarize` result."""

    def f(x, spec=".3f"):
        return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    kind = "token-level" if d["has_tokens"] else "counts-only"
    batch = d["num_traces"] > 1 and "skew_per_trace" in d
    what = "traces" if d["num_traces"] != 1 else "trace"
    lines = [
        f"trace: {d['num_traces']} {what} x {d['num_iterations']} iterations x "
        f"{d['num_layers']} layers, E={d['num_experts']}, top_k={d['top_k']}, {kind}, "
        f"{f(d['tokens_per_iteration_mean'], '.1f')} tokens/iteration",
    ]
    if batch:
        lines.append(f"statistics of each trace (its iterations pooled), mean over the "
                     f"{d['num_traces']} traces; 'active' is per iteration")
        skew, gini, ent = (d["skew_per_trace_per_layer"], d["gini_per_trace_per_layer"],
                           d["entropy_per_trace_per_layer"])
        tops = [None] * len(skew)
        top_load = d["top_load_per_trace_per_layer"]
        total = (d["skew_per_trace"], d["gini_per_trace"], d["entropy_per_trace"])
        head = "top share"
    else:
        skew, gini, ent = d["skew_per_layer"], d["gini_per_layer"], d["entropy_per_layer"]
        tops, top_load = [], []
        for load in d["load_per_layer"]:
            finite = np.isfinite(load).any()
            tops.append(int(np.nanargmax(load)) if finite else None)
            top_load.append(load[tops[-1]] if finite else math.nan)
        total = (d["skew"], d["gini"], d["entropy"])
        head = "top expert"
    lines += [
        "",
        f"{'layer':>7} {'max/mean':>9} {'gini':>7} {'entropy':>8} {'active':>8} "
        f"{head:>11} {'load':>7}",
    ]
    rows = zip(skew, gini, ent, d["activated_experts_per_layer"], tops, top_load, strict=True)
    for j, (sk, gi, en, act, top, tl) in enumerate(rows):
        if not np.isfinite(sk):  # a layer with no tokens: say so, not a row of nan
            lines.append(f"{j:>7}   (no tokens routed)")
            continue
        lines.append(
            f"{j:>7} {f(sk):>9} {f(gi):>7} {f(en):>8} {f(act, '.2f'):>8} "
            f"{'-' if top is None else top:>11} {f(100 * tl, '.1f'):>6}%"
        )
    lines.append(
        f"{'all':>7} {f(total[0]):>9} {f(total[1]):>7} {f(total[2]):>8} "
        f"{f(d['activated_experts'], '.2f'):>8}"
    )
    lines += [
        "",
        f"max/mean load is of all of a trace's iterations pooled; within single iterations "
        f"({f(d['tokens_per_iteration_mean'], '.1f')} tokens each) it averages "
        f"{f(d['skew_iteration_mean'])} (fewer tokens, more sampling noise)",
        f"activated experts per iteration: {f(d['activated_experts'], '.2f')} measured, "
        f"{f(d['activated_experts_expected'], '.2f')} expected if uniform (003 §3.2)",
    ]
    if d["num_experts"] <= 32 and not batch:
        loads = " ".join(f(100 * x, ".1f") for x in d["load"])
        lines.append(f"load per expert (%): {loads}")
    return "\n".join(lines)
