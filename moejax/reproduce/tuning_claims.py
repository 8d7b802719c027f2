"""Claim rules of `moejax reproduce tuning` (fixed before any run): the budget table and
the targets of the comparison.

- Within 1 %: a method reaches it at the first budget point whose incumbent's held-out mean
  latency is at most 1.01 x the best held-out value any method or heuristic found on that
  family and seed (the black-box curves are the incumbents at log-spaced points, so the
  budget is an upper bound within a factor of about 1.5; the gradient's points are the end
  results of separate runs of a quarter, a half and all of the budget).
- Placements (100+ discrete decisions; also the EPS-MoE chunk assignment, 64 decisions
  with no capacity, judged by the same rules): the family's random decisions spread by at least
  `SPREAD_MIN_PCT` (else the workload does not test the target); the gradient (the better
  of its random and greedy starts) reaches within 1 % with at least `FEWER` x fewer
  simulated layer-traces than the best black-box method (TPE, CMA-ES, random search; one
  that never reaches counts as infinitely many) on every seed; and its final held-out
  latency beats the best heuristic's (mean over seeds).
- Small knob spaces (a few integers and thresholds): gradients are not expected to pay:
  the best black-box method or the grid reaches within 1 % with no more layer-traces than
  the gradient (median over seeds).
- Co-design: at the same budget, the gradient's final held-out latency is below the best
  black-box method's (mean over seeds), both inside the Eq. (1)-(2) budget.
"""

from __future__ import annotations

import numpy as np

from moejax.reproduce.study import Claim, Rows

SPREAD_MIN_PCT = 3.0
WITHIN = 0.01
FEWER = 10.0
GRADS = ("grad", "grad-greedy")
BLACK_BOX = ("tpe", "cmaes", "random", "grid")
FIXED = ("default", "best-heuristic", "random-median")  # no search, no budget


def _f(x) -> float:
    return float("nan") if x in ("", None) else float(x)


def _g(x) -> float:
    """x to 9 significant digits (a CSV column mixing numbers and "" is written as text)."""
    return float(f"{float(x):.9g}")


def _key(v):
    return v if isinstance(v, str) else int(v)


def _best(curve, final, fam, seed) -> float:
    vals = [_f(r["heldout_ms"]) for r in curve if r["family"] == fam and r["seed"] == seed]
    vals += [_f(r["heldout_ms"]) for r in final if r["family"] == fam and r["seed"] == seed
             and r["method"] != "random-median"]
    return float(np.nanmin(vals))


def to_within(curve, final, fam, seed, method) -> tuple[float, float]:
    """(layer-traces, wall s) at which `method` first came within 1 % of the best."""
    best = _best(curve, final, fam, seed)
    pts = sorted((_f(r["layer_traces"]), _f(r["wall_s"]), _f(r["heldout_ms"])) for r in curve
                 if r["family"] == fam and r["seed"] == seed and r["method"] == method)
    for traces, wall, v in pts:
        if v <= best * (1 + WITHIN):
            return traces, wall
    return float("inf"), float("inf")


def budget_table(curve: list, final: list) -> list[dict]:
    """Per family and method: mean final held-out latency, its excess over the best (mean
    over seeds, %), seeds that came within 1 %, the median layer-traces and wall seconds to
    get there (over those seeds), the budget spent, the random spread."""
    out = []
    for fam in dict.fromkeys(r["family"] for r in final):
        seeds = sorted({_key(r["seed"]) for r in final if r["family"] == fam})
        spread = np.mean([_f(r["spread_pct"]) for r in final if r["family"] == fam
                          and r["method"] == "random-median"])
        for m in dict.fromkeys(r["method"] for r in final if r["family"] == fam):
            rows = [r for r in final if r["family"] == fam and r["method"] == m]
            excess = [(_f(r["heldout_ms"]) / _best(curve, final, fam, _key(r["seed"])) - 1)
                      * 100 for r in rows]
            reach = [to_within(curve, final, fam, s, m) for s in seeds] if m not in FIXED \
                else []
            hit = [x for x in reach if np.isfinite(x[0])]
            out.append({
                "family": fam, "method": m,
                "heldout_ms": float(np.mean([_f(r["heldout_ms"]) for r in rows])),
                "over_best_pct": float(np.mean(excess)),
                "within_1pct_seeds": f"{len(hit)}/{len(seeds)}" if reach else "",
                "layer_traces_to_1pct": float(np.median([x[0] for x in hit])) if hit else "",
                "wall_s_to_1pct": float(np.median([x[1] for x in hit])) if hit else "",
                "layer_traces_spent": float(np.mean([_f(r["layer_traces"]) for r in rows])),
                "wall_s_spent": float(np.mean([_f(r["wall_s"]) for r in rows])),
                "random_spread_pct": float(spread),
                "heuristic": next((r["heuristic"] for r in rows if r.get("heuristic")), "")})
    return out


def equal_wall(curve: list, final: list) -> list[dict]:
    """Per family and searching method, the comparison at equal search wall time: per seed,
    W = the shortest whole-budget search wall time among the family's methods (every method
    ran at least that long), and the method's held-out latency at W: its last budget point
    by W (a black box's incumbent there; the gradient's longest run that ended by W). Mean
    over seeds: W (s), the held-out latency (ms) and its excess over the best any method
    found (%, as in the budget table); empty where a method had no point by W. The
    black-box points are log-spaced, so a value at W is its incumbent at up to ~1.5x
    fewer trials (an upper bound on its latency at W)."""
    out = []
    for fam in dict.fromkeys(r["family"] for r in final):
        mine = [r for r in final if r["family"] == fam]
        seeds = sorted({_key(r["seed"]) for r in mine})
        methods = [m for m in dict.fromkeys(r["method"] for r in mine) if m not in FIXED]
        wall = {s: min(_f(r["wall_s"]) for r in mine if _key(r["seed"]) == s
                       and r["method"] in methods) for s in seeds}
        for m in methods:
            vals, excess = [], []
            for s in seeds:
                pts = [(_f(r["wall_s"]), _f(r["heldout_ms"])) for r in curve
                       if r["family"] == fam and _key(r["seed"]) == s and r["method"] == m
                       and _f(r["wall_s"]) <= wall[s]]
                if pts:
                    vals.append(max(pts)[1])
                    excess.append((vals[-1] / _best(curve, final, fam, s) - 1) * 100)
            out.append({"family": fam, "method": m,
                        "equal_wall_s": _g(np.mean(list(wall.values()))),
                        "seeds_with_a_point": f"{len(vals)}/{len(seeds)}",
                        "heldout_ms": _g(np.mean(vals)) if vals else "",
                        "over_best_pct": _g(np.mean(excess)) if vals else ""})
    return out


def _overfit_note(curve, fam) -> str:
    """Training and held-out latency of the shortest and longest gradient runs."""
    tr = [r for r in curve if r["family"] == fam and r["method"] == "grad"]
    if not tr:
        return ""
    lo, hi = min(_f(x["evals"]) for x in tr), max(_f(x["evals"]) for x in tr)
    first = [r for r in tr if _f(r["evals"]) == lo]
    last = [r for r in tr if _f(r["evals"]) == hi]
    return (f"grad runs of {lo:.0f} -> {hi:.0f} steps (mean over seeds): training "
            f"{np.mean([_f(r['train_ms']) for r in first]):.4g} -> "
            f"{np.mean([_f(r['train_ms']) for r in last]):.4g} ms, held-out "
            f"{np.mean([_f(r['heldout_ms']) for r in first]):.4g} -> "
            f"{np.mean([_f(r['heldout_ms']) for r in last]):.4g} ms")


def _traces(curve, final, fam, seeds, methods) -> tuple[list, list]:
    """Per seed: the fewest layer-traces to 1 % over `methods`, and which method."""
    out, who = [], []
    for s in seeds:
        got = {m: to_within(curve, final, fam, s, m)[0] for m in methods}
        m = min(got, key=got.get)
        out.append(got[m])
        who.append(m)
    return out, who


def family_claims(rows: Rows) -> list[Claim]:
    curve, final, table = rows.extra["curve"], rows.extra["final"], rows.extra["table"]
    fam = rows.extra["family"]
    name = fam.name
    seeds = sorted({r["seed"] for r in final})
    by = {r["method"]: r for r in table}
    present = set(by)
    grads = [m for m in GRADS if m in present]
    boxes = [m for m in BLACK_BOX if m in present]
    spread = table[0]["random_spread_pct"]
    g, _ = _traces(curve, final, name, seeds, grads)
    b, bw = _traces(curve, final, name, seeds, boxes)
    detail = "; ".join(f"seed {s}: grad {x:.0f}, best black box {y:.0f} ({w})"
                       for s, x, y, w in zip(seeds, g, b, bw, strict=True))
    grad_ms = min(by[m]["heldout_ms"] for m in grads)
    gm = min(grads, key=lambda m: by[m]["heldout_ms"])
    out = []
    if fam.placement:
        out.append(Claim(
            id=f"spread_at_least_3pct_{name}",
            paper=f"the workload tests the target: random decisions spread by >= "
                  f"{SPREAD_MIN_PCT:g} % on held-out traces",
            simulated=round(spread, 2), holds=spread >= SPREAD_MIN_PCT))
        ratios = [y / x if np.isfinite(x) else 0.0 for x, y in zip(g, b, strict=True)]
        out.append(Claim(
            id=f"grad_10x_fewer_traces_{name}",
            paper=f"gradient within 1 % of the best with >= {FEWER:g}x fewer simulated "
                  f"layer-traces than the best black-box method (random spread "
                  f"{spread:.1f} %)",
            simulated=[round(x, 2) for x in ratios], holds=all(x >= FEWER for x in ratios),
            note=detail + " (inf: never within 1 %)"))
        heur = by["best-heuristic"]
        out.append(Claim(
            id=f"grad_beats_best_heuristic_{name}",
            paper="gradient's final held-out latency below the best heuristic's",
            simulated={"grad_ms": round(grad_ms, 6),
                       "best_heuristic_ms": round(heur["heldout_ms"], 6),
                       "best_heuristic": heur["heuristic"], "grad_variant": gm},
            holds=grad_ms < heur["heldout_ms"], note=_overfit_note(curve, name)))
    elif name == "codesign":
        bb = min(boxes, key=lambda m: by[m]["heldout_ms"])
        out.append(Claim(
            id="codesign_grad_beats_black_box",
            paper="hardware + micro-slices under Eq. (1)-(2): the gradient's final held-out "
                  "latency below the best black-box method's at the same layer-traces",
            simulated={"grad_ms": round(grad_ms, 6), "best_black_box_ms":
                       round(by[bb]["heldout_ms"], 6), "best_black_box": bb,
                       "layer_traces": by["grad"]["layer_traces_spent"]},
            holds=grad_ms < by[bb]["heldout_ms"], note=detail))
    else:
        med = [float(np.median(x)) for x in (g, b)]
        out.append(Claim(
            id=f"black_box_no_costlier_{name}",
            paper="a small knob space (gradients are not expected to pay): the best "
                  "black-box method or the grid reaches within 1 % with no more "
                  "layer-traces than the gradient",
            simulated={"grad": med[0], "best_black_box": med[1]},
            holds=med[1] <= med[0], note=detail + "; " + _overfit_note(curve, name)))
    return out
