"""`moejax trace compare A B`: how far a recording, or a fitted generator, is from a
reference recording, with the pass / fail thresholds of `docs/traces.md`.

A is a trace file (.npz) or a fit (.json from `moejax trace fit --out`); B is a trace file.
Compared per layer: skew (max / mean load, `fit.stats`), and over batch sizes m the
activated-expert curve (mean distinct experts of m consecutive tokens; of m independent
tokens from the load shares, `analysis.activated_from_shares`). A fit is compared by
generating at B's token layout (`fit.evaluate`, the same held-out check `trace fit` runs).
Thresholds are `fit.verdict`'s: every layer's skew within 10% and the curve within 5% at
every m. A fit describes one workload (one task's token mix), not a model: the shipped
ESFT tasks of one model differ from each other about as much as a fit of one does from the
other (numbers in docs/traces.md).
"""

from __future__ import annotations

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.trace import fit
from moejax.trace import io as trace_io
from moejax.trace.analysis import activated_from_shares
from moejax.trace.core import Trace

SKEW_TOL = 0.10  # docs/traces.md "Done-when check": every layer's skew within 10%
CURVE_TOL = 0.05  # and the activated-expert curve within 5% (fit.verdict's default)


def _single(tr: Trace, path) -> Trace:
    if tr.batch_shape:
        if tr.batch_shape != (1,):
            raise ConfigError(f"{path}: compare takes one recording, this file holds "
                              f"{tr.batch_shape[0]} traces")
        tr = tr[0]
    return tr


def compare_recordings(a: Trace, b: Trace) -> dict:
    """Per-layer skew and activated-expert curves of recording `a` against reference `b`
    (same keys as `fit.evaluate`, so `fit.verdict` applies). Consecutive-token curves need
    both recordings token-level; otherwise both fields hold the independent-token curve."""
    if (a.num_experts, a.top_k) != (b.num_experts, b.top_k):
        raise ConfigError(f"A has num_experts={a.num_experts}, top_k={a.top_k} but B has "
                          f"num_experts={b.num_experts}, top_k={b.top_k}; compare recordings "
                          "of the same expert layout")
    if a.num_layers != b.num_layers:
        raise ConfigError(f"A has {a.num_layers} layers but B has {b.num_layers}; compare "
                          "recordings of the same layers")
    sa, sb = fit.stats(a), fit.stats(b)
    k, ms = b.top_k, list(fit.ACT_MS)
    ind_a = activated_from_shares(sa["profile"], ms, k).mean(0)
    ind_b = activated_from_shares(sb["profile"], ms, k).mean(0)
    if a.has_tokens and b.has_tokens:
        cur_a, cur_b = np.nanmean(sa["activated"], 0), np.nanmean(sb["activated"], 0)
    else:
        cur_a, cur_b = ind_a, ind_b
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "skew_recorded": sb["skew"].tolist(),
            "skew_generated": sa["skew"].tolist(),
            "skew_rel_err": (sa["skew"] / sb["skew"] - 1).tolist(),
            "curve_m": ms,
            "curve_recorded": cur_b.tolist(),
            "curve_generated": cur_a.tolist(),
            "curve_rel_err": (cur_a / cur_b - 1).tolist(),
            "curve_indep_recorded": ind_b.tolist(),
            "curve_indep_generated": ind_a.tolist(),
            "curve_indep_rel_err": (ind_a / ind_b - 1).tolist(),
            "profile_tv": (0.5 * np.abs(sa["profile"] - sb["profile"]).sum(-1)).tolist(),
        }


def compare(a_path, b_path, *, seed: int = 12345) -> dict:
    """Compare A (trace .npz or fit .json) with recording B; the result holds the per-layer
    numbers, `verdict` (fit.verdict at SKEW_TOL / CURVE_TOL) and `warnings`."""
    b, _ = trace_io.load(b_path)
    b = _single(b, b_path)
    warnings = []
    if str(a_path).endswith(".json"):
        doc = fit.load_fit(a_path)
        if (doc.get("num_experts"), doc.get("top_k")) != (b.num_experts, b.top_k):
            raise ConfigError(f"{a_path}: fitted for num_experts={doc.get('num_experts')}, "
                              f"top_k={doc.get('top_k')} but {b_path} has "
                              f"num_experts={b.num_experts}, top_k={b.top_k}")
        specs = [doc["layers"][j % len(doc["layers"])] for j in range(b.num_layers)]
        if len(doc["layers"]) != b.num_layers:
            warnings.append(f"the fit has {len(doc['layers'])} layers and {b_path} has "
                            f"{b.num_layers}: layer l uses fitted layer l mod "
                            f"{len(doc['layers'])}")
        edge = fit.grid_edge_layers(doc)
        if edge:
            warnings.append(fit.grid_edge_warning(doc.get("family", "?"), edge,
                                                  len(doc["layers"])))
        ev = fit.evaluate(specs, b, key=jax.random.key(seed))
        kind = f"fit ({doc.get('family')}, from {doc.get('source') or 'unknown'})"
    else:
        a, _ = trace_io.load(a_path)
        ev = compare_recordings(_single(a, a_path), b)
        kind = "recording"
    v = fit.verdict(ev, SKEW_TOL, CURVE_TOL)
    return {"a": str(a_path), "b": str(b_path), "a_kind": kind, "skew_tol": SKEW_TOL,
            "curve_tol": CURVE_TOL, **ev, "verdict": v, "warnings": warnings}


def format_compare(r: dict) -> str:
    """The per-layer table, the curve, the verdict and warnings of a `compare` result."""
    v = r["verdict"]
    lines = [f"A: {r['a']} ({r['a_kind']})", f"B: {r['b']} (reference recording)", "",
             f"{'layer':>6} {'skew A':>8} {'skew B':>8} {'A/B-1':>8} {'profile TV':>11}"]
    for j, (sa, sb, e, tv) in enumerate(zip(r["skew_generated"], r["skew_recorded"],
                                            r["skew_rel_err"], r["profile_tv"], strict=True)):
        flag = "" if abs(e) <= r["skew_tol"] else "  > {:.0%}".format(r["skew_tol"])
        lines.append(f"{j:>6} {sa:>8.3f} {sb:>8.3f} {e:>+8.1%} {tv:>11.3f}{flag}")
    lines += ["", "activated experts, mean over layers (consecutive tokens where both are "
              "token-level; independent tokens from the load shares):",
              f"{'m':>6} {'A':>8} {'B':>8} {'A/B-1':>8} {'indep. A/B-1':>13}"]
    for m, ca, cb, e, ei in zip(r["curve_m"], r["curve_generated"], r["curve_recorded"],
                                r["curve_rel_err"], r["curve_indep_rel_err"], strict=True):
        lines.append(f"{m:>6} {ca:>8.2f} {cb:>8.2f} {e:>+8.1%} {ei:>+13.1%}")
    ok = "PASS" if v["holds"] else "FAIL"
    lines += ["", f"{ok}: skew within {r['skew_tol']:.0%} on {v['skew_layers_within']}/"
              f"{len(r['skew_rel_err'])} layers (worst {v['skew_max_abs_err']:.1%}, mean "
              f"{v['skew_mean_abs_err']:.1%}); activated-expert curve worst "
              f"{v['curve_max_abs_err']:.1%} (independent tokens "
              f"{v['curve_indep_max_abs_err']:.1%}), threshold {r['curve_tol']:.0%}"]
    lines += [f"warning: {w}" for w in r["warnings"]]
    return "\n".join(lines)
