"""Routing statistics beyond `summary`: activated experts vs batch size, cross-layer
affinity, temporal locality across iterations (`moejax.trace.figure` plots them).

Runs on host (NumPy) over recorded or generated traces; shapes as in `moejax.trace.core`.
"""

from __future__ import annotations

import math

import numpy as np

from moejax.trace.core import Trace
from moejax.trace.summary import activated_experts_expected, mean_finite

DEFAULT_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _token_stream(trace: Trace) -> np.ndarray:
    """Real tokens' ids in recorded order, int [L, M, K] (iterations and traces in order)."""
    ids = np.asarray(trace.expert_ids)
    mask = np.asarray(trace.token_mask)
    ids = ids.reshape(-1, *ids.shape[-3:])  # [B*I, L, N, K]
    mask = mask.reshape(-1, mask.shape[-1])  # [B*I, N]
    ids = ids.transpose(1, 0, 2, 3)[:, mask]  # [L, M, K]
    return ids


def layer_shares(trace: Trace) -> np.ndarray:
    """Pooled share of each expert in each layer's top-k selections, float64 [L, E]."""
    c = np.asarray(trace.counts, np.float64).reshape(-1, *trace.counts.shape[-2:]).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return c / c.sum(-1, keepdims=True)


def sorted_load_profile(trace: Trace) -> np.ndarray:
    """Descending-sorted load shares per layer, float64 [L, E].

    Token-level traces: pooled over iterations. Counts-only traces: the mean over
    iterations of each iteration's sorted shares, since such an iteration is a whole
    recording of its own (e.g. one text domain of OLMoE) whose hot experts differ from the
    next one's; pooling them would average hot experts away.
    """
    if trace.has_tokens:
        return -np.sort(-layer_shares(trace), axis=-1)
    c = np.asarray(trace.counts, np.float64).reshape(-1, *trace.counts.shape[-2:])
    c = c[c.sum((-1, -2)) > 0]
    p = c / c.sum(-1, keepdims=True)
    return (-np.sort(-p, axis=-1)).mean(0)


def activated_from_shares(shares: np.ndarray, ms, top_k: int) -> np.ndarray:
    """Expected distinct experts of m independent tokens, float64 [..., len(ms)].

    shares [..., E] are per-selection shares (sum 1), so q = k * share is each expert's
    per-token inclusion probability and E[active] = sum_e 1 - (1 - q_e)^m. With q = k / E
    this is 003 §3.2's (1 - (1 - k/E)^m) E; it is exact for independent tokens whatever the
    popularity.
    """
    q = np.clip(top_k * np.asarray(shares, np.float64), 0.0, 1.0)[..., None, :]
    m = np.asarray(ms, np.float64)[:, None]
    return (1.0 - (1.0 - q) ** m).sum(-1)


def activated_curve(trace: Trace, ms=DEFAULT_MS, contiguous: bool = True) -> dict:
    """Mean activated experts per layer for batches of m tokens, float [L, len(ms)].

    Token-level traces: non-overlapping windows of m consecutive recorded tokens (so
    correlation between neighbouring tokens of a sequence shows), or, with
    `contiguous=False`, the independent-token expectation from the pooled shares. Counts-only
    traces only have the latter. `uniform` is 003 §3.2's formula at each m.
    """
    ms = [int(m) for m in ms]
    e, k = trace.num_experts, trace.top_k
    shares = layer_shares(trace)
    out = {"m": ms, "uniform": activated_experts_expected(np.asarray(ms), k, e).tolist(),
           "independent": activated_from_shares(shares, ms, k).tolist()}
    if trace.has_tokens and contiguous:
        ids = _token_stream(trace)
        num_l, num_m, _ = ids.shape
        curve = np.full((num_l, len(ms)), np.nan)
        for j, m in enumerate(ms):  # a handful of batch sizes
            w = num_m // m
            if w == 0:
                continue
            win = ids[:, : w * m].reshape(num_l, w, m * k)
            hit = np.zeros((num_l, w, e), bool)
            li, wi = np.meshgrid(np.arange(num_l), np.arange(w), indexing="ij")
            hit[li[..., None], wi[..., None], win] = True
            curve[:, j] = hit.sum(-1).mean(-1)
        out["measured"] = curve.tolist()
    else:
        out["measured"] = out["independent"]
    return out


def joint_affinity(joint: np.ndarray) -> dict:
    """Affinity of a joint count matrix C[a, b] of (expert at layer l, expert at layer l+1).

    nmi: mutual information / min(H(A), H(B)) (0: independent, 1: one determines the
    other). predictability: P(b = argmax_b' C[a, b']) summed over a, i.e. how often the most
    likely successor of a token's expert is its actual expert, against `baseline` =
    max_b P(b), the same guess made without knowing a.
    """
    c = np.asarray(joint, np.float64)
    p = c / c.sum()
    pa, pb = p.sum(1), p.sum(0)
    indep = pa[:, None] * pb[None, :]
    nz = p > 0
    mi = float((p[nz] * np.log(p[nz] / indep[nz])).sum())

    def h(x):
        x = x[x > 0]
        return float(-(x * np.log(x)).sum())

    denom = min(h(pa), h(pb))
    return {
        "nmi": mi / denom if denom > 0 else math.nan,
        "predictability": float(p.max(1).sum()),
        "baseline": float(pb.max()),
    }


def cross_layer_affinity(trace: Trace, meta: dict | None = None) -> list[dict]:
    """Affinity of each consecutive layer pair (l, l+1).

    Token-level traces: the full co-activation matrix (a token counts every pair of its k
    experts at l and k at l+1). Counts-only traces: only if the recording kept pair counts
    (`meta["cross_layer_pairs"]`, e.g. OLMoE's rank-aligned pairs); else an empty list.
    """
    if trace.has_tokens:
        ids = _token_stream(trace)  # [L, M, K]
        e = trace.num_experts
        res = []
        for layer in range(ids.shape[0] - 1):  # layer pairs, static structure
            a = ids[layer][:, :, None]
            b = ids[layer + 1][:, None, :]
            flat = (a * e + b).ravel()
            joint = np.bincount(flat, minlength=e * e).reshape(e, e)
            res.append({"layers": [layer, layer + 1], **joint_affinity(joint)})
        return res
    pairs = (meta or {}).get("cross_layer_pairs")
    if not pairs:
        return []
    return [{"layers": ab, **joint_affinity(np.asarray(c))}
            for ab, c in zip(pairs["layers"], pairs["counts"], strict=True)]


def temporal_locality(trace: Trace, min_tokens: int = 1) -> dict:
    """How stable per-expert load ratios are across iterations (001 §V-B).

    For each layer: total-variation distance between the load-ratio vectors of consecutive
    iterations (`consecutive`), and between random iteration pairs (`random`, all pairs at
    lag >= 2). Locality means consecutive < random. `autocorr`: lag-1 correlation over
    iterations of each expert's load ratio minus its mean, pooled over experts. Iterations
    with fewer than `min_tokens` tokens are skipped. NaN with fewer than 3 iterations.
    """
    c = np.asarray(trace.counts, np.float64).reshape(-1, *trace.counts.shape[-2:])  # [I, L, E]
    tot = c.sum(-1)
    keep = tot.min(-1) >= max(min_tokens, 1e-9)
    c = c[keep]
    num_i, num_l = c.shape[0], c.shape[1]
    if num_i < 3:
        nan = [math.nan] * num_l
        return {"consecutive": nan, "random": nan, "autocorr": nan, "iterations": int(num_i)}
    p = c / c.sum(-1, keepdims=True)
    tv = 0.5 * np.abs(p[:, None] - p[None, :]).sum(-1)  # [I, I, L]
    lag = np.abs(np.arange(num_i)[:, None] - np.arange(num_i)[None, :])
    cons = tv[lag == 1].mean(0)
    rand = tv[lag >= 2].mean(0)
    d = p - p.mean(0, keepdims=True)
    num = (d[1:] * d[:-1]).sum((0, 2))
    den = (d * d).sum((0, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        ac = num / den
    return {"consecutive": cons.tolist(), "random": rand.tolist(), "autocorr": ac.tolist(),
            "iterations": int(num_i)}


def analyze(trace: Trace, meta: dict | None = None, ms=DEFAULT_MS) -> dict:
    """Activated-expert curve, cross-layer affinity and temporal locality of a trace."""
    return {
        "activated": activated_curve(trace, ms),
        "affinity": cross_layer_affinity(trace, meta),
        "temporal": temporal_locality(trace),
    }


def format_analysis(a: dict) -> str:
    """Text lines of an `analyze` result for `moejax trace inspect`."""
    act = a["activated"]
    meas = mean_finite(np.asarray(act["measured"], np.float64), axis=0)
    lines = ["", "activated experts per layer vs batch size m (mean over layers):",
             f"{'m':>6} {'measured':>9} {'indep.':>8} {'uniform':>8}"]
    indep = mean_finite(np.asarray(act["independent"], np.float64), axis=0)
    skipped = [m for j, m in enumerate(act["m"]) if not np.isfinite(meas[j])]
    for j, m in enumerate(act["m"]):
        if np.isfinite(meas[j]):
            lines.append(f"{m:>6} {meas[j]:>9.2f} {indep[j]:>8.2f} {act['uniform'][j]:>8.2f}")
    if skipped:
        lines.append(f"(m = {', '.join(map(str, skipped))}: the trace has fewer than m "
                     "recorded tokens per layer, so no measured batch)")
    if a["affinity"]:
        nmi = float(mean_finite([x["nmi"] for x in a["affinity"]]))
        pred = np.mean([x["predictability"] for x in a["affinity"]])
        base = np.mean([x["baseline"] for x in a["affinity"]])
        lines.append(f"cross-layer affinity (consecutive recorded layers, mean): NMI {nmi:.3f}, "
                     f"next-layer expert predictability {pred:.3f} vs {base:.3f} blind")
    t = a["temporal"]
    if t["iterations"] >= 3:
        lines.append(
            f"temporal locality over {t['iterations']} iterations: TV distance of load "
            f"ratios {mean_finite(t['consecutive']):.3f} between consecutive iterations vs "
            f"{mean_finite(t['random']):.3f} random pairs; lag-1 autocorr "
            f"{mean_finite(t['autocorr']):.3f}")
    return "\n".join(lines)
