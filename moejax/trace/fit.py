"""Fit the synthetic generator families (`moejax.trace.gen`) to a recorded trace.

Method: per-layer method of simulated moments. For each family and each recorded layer,
the parameters are chosen so that traces drawn from the real generator (`gen.generate`,
fixed key: common random numbers), at the recording's token count, have the recorded
moments: skew (max / mean load) for the one-parameter families (powerlaw alpha,
exponential scale, normal std), plus for drift the activated experts of 8-32 consecutive
tokens (coherence of neighbouring tokens) and the lag-1 autocorrelation of load ratios
across iterations; see `fit_family`.
The generators place hot experts at random, so only the shape of the load distribution is
fitted, not which expert is hot. Goodness of fit is measured on a held-out part (fit on
even iterations, evaluate on odd ones): per-layer skew, total-variation distance of the
sorted load profile (the shape beyond its maximum), and the activated-expert curve
(003 §3.2; mean distinct experts of m consecutive tokens) of fresh generated traces.

A fit is saved as a small JSON file (`save_fit`) holding one spec string per recorded layer
and one pooled spec; `--trace-gen FILE.json` generates from it (`generate_fitted`), and
`load_spec` turns it (or a spec string) into a `GenSpec` for `gen.parse_spec` users.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError, TraceError
from moejax.output.results import atomic_write_json
from moejax.trace import gen
from moejax.trace.analysis import (
    activated_curve,
    activated_from_shares,
    sorted_load_profile,
    temporal_locality,
)
from moejax.trace.chunked import ChunkedTraces
from moejax.trace.core import Trace

FIT_FAMILIES = ("powerlaw", "exponential", "normal", "lognormal", "drift")
FIT_FORMAT = 1
ACT_MS = (2, 4, 8, 16, 32, 64)  # batch sizes m of the activated-expert curve
_REPLICAS = 12  # generated layers averaged per grid point (normal and drift draw
# a random popularity per layer, so their moments need several draws)
_DRIFT_MS = (8, 16, 32)  # batch sizes of the activated-expert moments of a drift fit
_MAX_FIT_TOKENS = 16384  # tokens simulated per grid point for static families

# Grids of the search (one parameter for static families; drift: scale x noise x rho).
_GRIDS = {
    "powerlaw": ("alpha", np.geomspace(0.05, 4.0, 32)),
    "exponential": ("scale", np.geomspace(0.01, 10.0, 32)),
    "normal": ("std", np.linspace(0.0, 0.3, 41)),
    "lognormal": ("sigma", np.linspace(0.0, 3.0, 41)),
}
_DRIFT_SCALE = np.geomspace(0.3, 2.0, 8)
_DRIFT_NOISE = np.array([0.0, 0.3, 0.6, 0.9, 1.3])
_DRIFT_RHO = (0.0, 0.8)  # 0.8 tried only when the recording's lag-1 autocorr is > 0.2

# The papers' choices, compared with the fits in docs/traces.md.
PAPER_SPECS = {
    "powerlaw": "powerlaw:alpha=1.5",  # 004 §VI-C (alpha 0.5-2.5, 1.5 typical)
    "normal": "normal:std=0.032",  # 004 §V-B
    "exponential": "exponential:scale=0.5",  # 002 §5 (Dolly, exponential fit)
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Token layout to simulate: iterations and real tokens per iteration (int [I])."""

    tokens_per_iteration: tuple[int, ...]

    @property
    def iterations(self) -> int:
        return len(self.tokens_per_iteration)

    @property
    def tokens(self) -> int:
        return max(self.tokens_per_iteration)


def split_alternate(trace: Trace) -> tuple[Trace, Trace]:
    """(even iterations, odd iterations) of a single trace: fitting and held-out parts."""
    if trace.batch_shape:
        raise TraceError("trace: fit takes a single recording (no [T] axis)")
    if trace.num_iterations < 2:
        raise TraceError(f"trace: held-out evaluation needs >= 2 iterations, got "
                         f"{trace.num_iterations} (pass holdout=False)")
    return _take(trace, slice(0, None, 2)), _take(trace, slice(1, None, 2))


def _take(trace: Trace, sl: slice) -> Trace:
    return dataclasses.replace(
        trace,
        expert_ids=trace.expert_ids[sl],
        gate_weights=trace.gate_weights[sl],
        token_mask=trace.token_mask[sl],
        token_request=trace.token_request[sl],
        counts=trace.counts[sl],
    )


def _layout(trace: Trace) -> Layout:
    tpi = np.rint(np.asarray(trace.tokens_per_iteration())).astype(int)
    return Layout(tuple(int(x) for x in tpi))


def _pooled_layout(layout: Layout, token_level: bool = True) -> Layout:
    """One iteration (static families: popularity is fixed in time) of all the tokens of a
    token-level recording, or of one iteration's tokens of a counts-only one (whose
    iterations are compared one by one, `_sorted_shares`); capped at `_MAX_FIT_TOKENS`."""
    tpi = layout.tokens_per_iteration
    return Layout((min(sum(tpi) if token_level else max(tpi), _MAX_FIT_TOKENS),))


def stats(trace: Trace, ms=ACT_MS) -> dict:
    """Per-layer statistics the fit matches: sorted load shares [L, E], skew [L] (max/mean),
    and activated experts of m consecutive tokens [L, M] (independent-token expectation for
    counts-only traces)."""
    srt = sorted_load_profile(trace)
    if trace.has_tokens:
        act = np.asarray(activated_curve(trace, ms)["measured"], np.float64)
    else:
        act = activated_from_shares(srt, ms, trace.top_k)
    return {"profile": srt, "skew": srt[:, 0] * trace.num_experts, "activated": act}


def _generate(spec, key, layout: Layout, layers: int, num_experts: int, top_k: int) -> Trace:
    t = gen.generate(spec, key, num_traces=1, iterations=layout.iterations, layers=layers,
                     tokens=layout.tokens, num_experts=num_experts, top_k=top_k,
                     tokens_per_iteration=np.asarray(layout.tokens_per_iteration))
    return t[0]


def _grid_points(family: str, autocorr: float = 0.0) -> list[dict]:
    if family == "drift":
        rhos = _DRIFT_RHO if autocorr > 0.2 else _DRIFT_RHO[:1]
        return [{"rho": float(r), "scale": float(s), "noise": float(n), "shared": 1.0,
                 "scenarios": 1, "period": 1 << 20, "quantile": 1}
                for r in rhos for n in _DRIFT_NOISE for s in _DRIFT_SCALE]
    name, values = _GRIDS[family]
    return [{name: float(v)} for v in values]


def moments(trace: Trace, temporal: bool = False) -> dict:
    """The moments a fit matches, per layer: skew [L] (pooled max / mean load); with
    `temporal` (drift) also `activated` [L, M] (mean distinct experts of m consecutive
    tokens, m in `_DRIFT_MS`: coherence of neighbouring tokens) and `autocorr` [L] (lag-1
    autocorrelation of load ratios over iterations, `temporal_locality`)."""
    out = {"skew": sorted_load_profile(trace)[:, 0] * trace.num_experts}
    if temporal:
        out["activated"] = np.asarray(activated_curve(trace, _DRIFT_MS)["measured"])
        out["autocorr"] = np.asarray(temporal_locality(trace)["autocorr"], np.float64)
    return out


def _simulate_grid(family, points, layout, num_experts, top_k, key, token_level) -> dict:
    """Moments of generated traces at each grid point (mean over replica layers); counts
    only when the recording is counts-only, so both sides use the same statistics."""
    drift = family == "drift"
    lay = layout if drift else _pooled_layout(layout, token_level)
    out: dict[str, list] = {}
    for p in points:  # a grid search, not a hot path; float params do not recompile
        tr = _generate(gen.GenSpec(family, p), key, lay, _REPLICAS, num_experts, top_k)
        if not token_level:
            tr = gen.counts_only(tr)
        for name, v in moments(tr, temporal=drift).items():
            out.setdefault(name, []).append(np.nanmean(v, axis=0))
    return {k: np.asarray(v) for k, v in out.items()}


def _invert_monotone(values: np.ndarray, sim: np.ndarray, target: np.ndarray):
    """Parameter whose simulated moment equals `target` [L], by linear interpolation of
    log(moment) over the grid (the moment is monotone in the parameter); also whether the
    target lay outside the simulated range (then the nearest end is returned)."""
    order = np.argsort(sim)
    xs, ys = np.log(sim[order]), values[order]
    xs = np.maximum.accumulate(xs)  # guard against Monte Carlo wiggles
    lt = np.log(target)
    inside = (lt >= xs[0]) & (lt <= xs[-1])
    return np.interp(lt, xs, ys), inside


def _refine_scale(points: list[dict], sim_skew: np.ndarray, g: int, target: float) -> dict:
    """Grid point g with its drift `scale` re-chosen so the simulated skew meets `target`,
    interpolating over the points that differ from g only in scale (skew is monotone in
    scale); the coarse scale grid alone leaves up to ~15% skew error."""
    p = points[g]
    same = [i for i, q in enumerate(points)
            if all(q[k] == p[k] for k in p if k != "scale")]
    scales = np.array([points[i]["scale"] for i in same])
    est, _ = _invert_monotone(scales, np.asarray(sim_skew)[same], np.array([target]))
    return {**p, "scale": float(est[0])}


def fit_family(trace: Trace, family: str, *, key=None) -> dict:
    """Per-layer method-of-moments fit of one family to `trace`.

    powerlaw / exponential / normal (one parameter each): the parameter whose generated
    trace, at the recording's token count, has the recorded layer's skew (max / mean load);
    found on a grid and interpolated (skew is monotone in alpha, scale and std). drift:
    (rho, scale, noise, quantile) on a grid minimizing the squared relative error of skew and
    of the activated experts of 8, 16, 32 consecutive tokens, plus the squared error of the
    lag-1 autocorrelation of load ratios over iterations,
    simulated at the recording's iterations and tokens per iteration (scenarios = 1); then
    `scale` is interpolated per layer to meet the layer's skew (`_refine_scale`).
    """
    if family not in FIT_FAMILIES:
        raise ConfigError(f"family: unknown {family!r}; allowed: {', '.join(FIT_FAMILIES)}")
    if trace.batch_shape:
        raise TraceError("trace: fit takes a single recording (no [T] axis)")
    layout = _layout(trace)
    if family == "drift" and layout.iterations < 4:
        raise TraceError(f"family: drift needs a recording with >= 4 iterations to see "
                         f"change over time; this part has {layout.iterations}")
    layout = Layout(tuple(max(t, 1) for t in layout.tokens_per_iteration))
    key = jax.random.key(0) if key is None else key
    rec = moments(trace, temporal=family == "drift")
    points = _grid_points(family, float(np.nanmean(rec.get("autocorr", [0.0]))))
    sim = _simulate_grid(family, points, layout, trace.num_experts, trace.top_k, key,
                         trace.has_tokens)
    if family == "drift":
        with np.errstate(invalid="ignore", divide="ignore"):
            act_err = (sim["activated"][:, None, :] / rec["activated"][None] - 1) ** 2
        loss = ((sim["skew"][:, None] / rec["skew"][None] - 1) ** 2
                + np.nan_to_num(act_err, nan=0.0).mean(-1)
                + (sim["autocorr"][:, None] - np.nan_to_num(rec["autocorr"])[None]) ** 2)
        best = np.argmin(loss, axis=0)
        specs = [gen.GenSpec("drift", _refine_scale(points, sim["skew"], int(g), target))
                 for g, target in zip(best, rec["skew"], strict=True)]
        pooled = gen.GenSpec("drift", points[int(np.argmin(loss.mean(1)))])
        inside = loss.min(0) < 0.05
    else:
        name, values = _GRIDS[family]
        est, inside = _invert_monotone(values, sim["skew"], rec["skew"])
        specs = [gen.GenSpec(family, {name: float(v)}) for v in est]
        pooled_v, _ = _invert_monotone(values, sim["skew"], np.array([rec["skew"].mean()]))
        pooled = gen.GenSpec(family, {name: float(pooled_v[0])})
    return {
        "family": family,
        "layers": [gen.spec_to_str(s) for s in specs],
        "pooled": gen.spec_to_str(pooled),
        "moments_matched": np.asarray(inside).tolist(),
        "num_experts": trace.num_experts,
        "top_k": trace.top_k,
    }


def _generate_layers(specs, key, layout, num_experts, top_k) -> Trace:
    """One trace whose layer l is generated by specs[l] (counts and ids concatenated)."""
    keys = jax.random.split(key, len(specs))
    parts = [_generate(s, k, layout, 1, num_experts, top_k) for s, k in zip(specs, keys,
                                                                           strict=True)]
    cat = {f: jnp.concatenate([getattr(p, f) for p in parts], axis=1)
           for f in ("expert_ids", "gate_weights", "counts")}
    return dataclasses.replace(parts[0], **cat)


def evaluate(specs, recorded: Trace, *, key=None, repeats: int = 3) -> dict:
    """Compare traces generated from per-layer `specs` (or one spec for every layer) with
    `recorded` at its token layout: per-layer skew and activated-expert curve errors.

    skew_rel_err [L]: generated / recorded max-over-mean load minus 1 (mean of `repeats`
    generated traces). curve_rel_err [M]: the layer-averaged activated-expert curve of m
    consecutive tokens (a prefill batch of one sequence), generated / recorded minus 1, at
    each m in `ACT_MS`; curve_indep_rel_err [M]: the same for m independent tokens (a
    decode batch of m requests), from the load shares. Counts-only recordings have only the
    latter (both fields hold it). profile_tv [L]: TV distance of the sorted load profiles.
    """
    if isinstance(specs, (str, gen.GenSpec)):
        specs = [specs] * recorded.num_layers
    specs = [gen.parse_spec(s) for s in specs]
    if len(specs) != recorded.num_layers:
        raise ConfigError(f"specs: {len(specs)} layer specs for a {recorded.num_layers}-layer "
                          "recording")
    key = jax.random.key(12345) if key is None else key
    layout = _layout(recorded)
    layout = Layout(tuple(max(t, 1) for t in layout.tokens_per_iteration))
    if not recorded.has_tokens:
        layout = _pooled_layout(layout, token_level=False)
    rec = stats(recorded)
    sims = [stats(_generate_layers(specs, k, layout, recorded.num_experts, recorded.top_k))
            for k in jax.random.split(key, repeats)]
    skew = np.mean([s["skew"] for s in sims], 0)
    prof = np.mean([s["profile"] for s in sims], 0)
    act = np.mean([np.nanmean(s["activated"], 0) for s in sims], 0)
    if not recorded.has_tokens:  # counts-only: compare shares-implied independent curves
        act = np.mean([activated_from_shares(s["profile"], ACT_MS, recorded.top_k).mean(0)
                       for s in sims], 0)
    rec_act = np.nanmean(rec["activated"], 0)
    k = recorded.top_k
    rec_ind = activated_from_shares(rec["profile"], ACT_MS, k).mean(0)
    gen_ind = np.mean([activated_from_shares(s["profile"], ACT_MS, k).mean(0) for s in sims], 0)
    return {
        "skew_recorded": rec["skew"].tolist(),
        "skew_generated": skew.tolist(),
        "skew_rel_err": (skew / rec["skew"] - 1).tolist(),
        "curve_m": list(ACT_MS),
        "curve_recorded": rec_act.tolist(),
        "curve_generated": act.tolist(),
        "curve_rel_err": (act / rec_act - 1).tolist(),
        "curve_indep_recorded": rec_ind.tolist(),
        "curve_indep_generated": gen_ind.tolist(),
        "curve_indep_rel_err": (gen_ind / rec_ind - 1).tolist(),
        "profile_tv": (0.5 * np.abs(prof - rec["profile"]).sum(-1)).tolist(),
    }


def verdict(ev: dict, skew_tol: float = 0.10, curve_tol: float = 0.05) -> dict:
    """Done-when check of an `evaluate` result: every layer's skew within `skew_tol` and
    the activated-expert curve within `curve_tol` at every m (`holds`: consecutive tokens;
    `holds_independent`: independent tokens)."""
    s = np.abs(np.asarray(ev["skew_rel_err"]))
    c = np.abs(np.asarray(ev["curve_rel_err"]))
    ci = np.abs(np.asarray(ev["curve_indep_rel_err"]))
    skew_ok = bool((s <= skew_tol).all())
    return {
        "skew_max_abs_err": float(s.max()),
        "skew_mean_abs_err": float(s.mean()),
        "skew_layers_within": int((s <= skew_tol).sum()),
        "curve_max_abs_err": float(np.nanmax(c)),
        "curve_indep_max_abs_err": float(np.nanmax(ci)),
        "holds": skew_ok and bool(np.nanmax(c) <= curve_tol),
        "holds_independent": skew_ok and bool(np.nanmax(ci) <= curve_tol),
    }


def fit(trace: Trace, families=FIT_FAMILIES, *, holdout: bool = True, key=None,
        compare_papers: bool = True, progress=None) -> dict:
    """Fit each family (on even iterations when `holdout`) and evaluate (on odd ones).

    progress(label): called after each family and after the papers' specs (if compared).

    Families that cannot be fitted (drift on < 4 iterations) are reported with an `error`.
    `best` is the family with the smallest mean held-out (else in-sample) profile TV.
    """
    key = jax.random.key(0) if key is None else key
    train, test = split_alternate(trace) if holdout else (trace, trace)
    out = {"method": "per-layer method of simulated moments (skew max/mean; drift also "
           "activated experts at m=8,16,32 and lag-1 autocorr), grid + interpolation",
           "holdout": "odd iterations (fit on even)" if holdout else "none (in-sample)",
           "families": {}}
    for fam in families:
        try:
            res = fit_family(train, fam, key=key)
        except TraceError as err:
            out["families"][fam] = {"error": str(err)}
            if progress is not None:
                progress(f"{fam} (not fitted)")
            continue
        ev = evaluate(res["layers"], test, key=jax.random.fold_in(key, 1))
        res["heldout"] = ev
        res["verdict"] = verdict(ev)
        out["families"][fam] = res
        if progress is not None:
            progress(fam)
    ok = {f: r for f, r in out["families"].items() if "error" not in r}
    if ok:
        out["best"] = min(ok, key=lambda f: float(np.mean(ok[f]["heldout"]["profile_tv"])))
    papers = {}
    for fam, spec in PAPER_SPECS.items() if compare_papers else ():
        ev = evaluate(spec, test, key=jax.random.fold_in(key, 2))
        papers[fam] = {"spec": spec, "verdict": verdict(ev),
                       "skew_generated": float(np.mean(ev["skew_generated"])),
                       "profile_tv": float(np.mean(ev["profile_tv"]))}
    if progress is not None and compare_papers:
        progress("papers' specs")
    out["paper_specs"] = papers
    out["recorded_skew_mean"] = float(np.mean(stats(test)["skew"]))
    if holdout:  # how much the recording's own halves differ: the floor of any fit's error
        out["halves_skew_rel_err"] = (stats(train)["skew"] / stats(test)["skew"] - 1).tolist()
    return out


# ------------------------------------------------------------------ saved fits


def save_fit(path, result: dict, family: str, source: str = "",
             data: dict | None = None) -> Path:
    """Write the fitted specs of `family` from a `fit` result as JSON (atomically); `data`:
    the fitted trace's provenance (`moejax.trace.provenance`), kept under "provenance"."""
    res = result["families"].get(family)
    if res is None or "error" in res:
        why = res["error"] if res else "not fitted"
        raise ConfigError(f"family: no fit for {family!r} ({why})")
    doc = {
        "moejax_fit": FIT_FORMAT,
        "family": family,
        "method": result["method"],
        "source": source,
        "num_experts": res["num_experts"],
        "top_k": res["top_k"],
        "pooled": res["pooled"],
        "layers": res["layers"],
        "moments_matched": res.get("moments_matched"),
        "verdict": res.get("verdict"),
        "provenance": data or {},
    }
    path = Path(path)
    atomic_write_json(path, doc)
    return path


def load_fit(path) -> dict:
    """Read and check a fit JSON written by `save_fit`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"trace-gen: no such fit file {str(path)!r}")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not a JSON fit file ({err})") from None
    if not isinstance(doc, dict) or doc.get("moejax_fit") != FIT_FORMAT:
        raise ConfigError(f"{path}: moejax_fit: expected {FIT_FORMAT} (a file written by "
                          "`moejax trace fit --out`)")
    for name in ("pooled", "layers"):
        if name not in doc:
            raise ConfigError(f"{path}: {name}: missing")
    if not isinstance(doc["layers"], list) or not doc["layers"]:
        raise ConfigError(f"{path}: layers: expected a non-empty list of spec strings")
    doc["pooled"] = gen.parse_spec(doc["pooled"])
    doc["layers"] = [gen.parse_spec(s) for s in doc["layers"]]
    return doc


def load_spec(spec: str | gen.GenSpec) -> gen.GenSpec:
    """A spec string, or a fit JSON path (its pooled spec), as a GenSpec."""
    if isinstance(spec, str) and spec.strip().endswith(".json"):
        return load_fit(spec.strip())["pooled"]
    return gen.parse_spec(spec)


def generate_fitted(path, key, *, num_traces: int, iterations: int, layers: int | None,
                    tokens: int, num_experts: int, top_k: int,
                    chunked: bool = False) -> Trace | ChunkedTraces:
    """A batch of traces from a fit file: layer l uses the fit of recorded layer
    l mod (recorded layers), so each simulated layer keeps a recorded layer's skew.

    layers: None gives the recording's layer count. chunked: return a `ChunkedTraces` that
    makes the batch a chunk at a time (the same traces, for `engine.simulate`).
    """
    doc = load_fit(path)
    layers = len(doc["layers"]) if layers is None else layers
    specs = [doc["layers"][j % len(doc["layers"])] for j in range(layers)]
    keys = jax.random.split(key, layers)
    parts = [gen.generate_chunked(s, k, num_traces=num_traces, iterations=iterations, layers=1,
                                  tokens=tokens, num_experts=num_experts, top_k=top_k)
             for s, k in zip(specs, keys, strict=True)]

    def make(start: int, stop: int) -> Trace:
        chunks = [p.chunk(start, stop) for p in parts]
        cat = {f: jnp.concatenate([getattr(c, f) for c in chunks], axis=2)
               for f in ("expert_ids", "gate_weights", "counts")}
        return dataclasses.replace(chunks[0], **cat)

    batch = ChunkedTraces(num_traces, make, num_experts, top_k, iterations, layers, tokens,
                          scratch_bytes_per_trace=layers * parts[0].scratch_bytes_per_trace)
    return batch if chunked else batch.materialize()


def grid_edge_layers(doc: dict) -> list[int]:
    """Layers of a saved fit whose moments were not matched: the fit ended on the edge of
    its search grid (the recording's skew lies outside what the family reaches)."""
    matched = doc.get("moments_matched")
    if not isinstance(matched, list):
        return []
    return [j for j, ok in enumerate(matched) if not ok]


def grid_edge_warning(family: str, layers: list[int], total: int) -> str:
    """The warning line for the `grid_edge_layers` of a fit of `family` with `total` layers."""
    shown = ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")
    if family == "drift":
        return (f"drift: {len(layers)} of {total} layers (layers {shown}) matched no point of "
                "the search grid within its tolerance: the fit is the nearest grid point, "
                "not the recording")
    return (f"{family}: {len(layers)} of {total} layers ended on the edge of the search grid "
            f"(layers {shown}): the recorded skew is outside what the family reaches, so "
            "those layers are fitted to the grid end, not to the recording")


def format_fit(result: dict) -> str:
    """A readable table of a `fit` result."""
    lines = [f"method: {result['method']}", f"held out: {result['holdout']}",
             f"recorded held-out skew (max/mean, mean over layers): "
             f"{result['recorded_skew_mean']:.3f}",
             "errors: worst layer's skew; worst m of the activated-expert curve, consecutive "
             "tokens (curve err) and independent tokens (indep.)", "",
             f"{'family':<12} {'pooled spec':<44} {'TV':>6} {'skew err':>9} "
             f"{'layers<=10%':>12} {'curve err':>10} {'indep.':>7} {'holds':>6}"]
    for fam, r in result["families"].items():
        if "error" in r:
            lines.append(f"{fam:<12} {r['error']}")
            continue
        v = r["verdict"]
        lines.append(
            f"{fam:<12} {r['pooled']:<44} {np.mean(r['heldout']['profile_tv']):>6.3f} "
            f"{v['skew_max_abs_err']:>8.1%} {v['skew_layers_within']:>5}/"
            f"{len(r['layers']):<6} {v['curve_max_abs_err']:>9.1%} "
            f"{v['curve_indep_max_abs_err']:>6.1%} "
            f"{'yes' if v['holds'] else ('indep.' if v['holds_independent'] else 'no'):>6}")
    if "best" in result:
        lines.append(f"best (held-out profile TV): {result['best']}")
    for fam, r in result["families"].items():
        edge = grid_edge_layers(r)
        if edge:
            lines.append(f"warning: {grid_edge_warning(fam, edge, len(r['layers']))}")
    if "halves_skew_rel_err" in result:
        h = np.abs(result["halves_skew_rel_err"])
        lines.append(f"the recording's own halves differ in skew by up to {h.max():.1%} "
                     f"(mean {h.mean():.1%}; {int((h <= 0.1).sum())}/{len(h)} layers <= 10%)")
    lines += ["", "papers' choices on the held-out part:"]
    for p in result["paper_specs"].values():  # empty unless compare_papers
        v = p["verdict"]
        lines.append(f"  {p['spec']:<24} skew {p['skew_generated']:.3f} (err up to "
                     f"{v['skew_max_abs_err']:.0%}), profile TV {p['profile_tv']:.3f}, "
                     f"curve err {v['curve_max_abs_err']:.1%}")
    return "\n".join(lines)
