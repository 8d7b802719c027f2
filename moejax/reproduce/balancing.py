"""`moejax reproduce balancing`: expert load balancing against current practice.

What serving teams run to balance expert parallelism is DeepSeek's EPLB (replicate the
heaviest experts into redundant slots, pack the replicas onto GPUs; `moejax.placement.eplb`)
re-run every so often on recent load statistics. This study answers, on every routing
recording the project ships (ESFT intent and law, OLMoE-1B-7B, Mixtral-8x7B) and on a
power-law and a drifting generator (`balancing_data`), on `h800x8`, `gh200-nvl32` and
`dgx-b200-4node`:

1. Placements, held out: synchronous EP (`moejax.systems.ep`, hard mode) layer latency and
   max / mean device load (mean and p99 over held-out batches) for contiguous, greedy (LPT
   per layer), EPLB with 0 / 1 / 2 / 4 redundant slots per device (its weights per slot
   against device memory, `placement.slots`), the tuned placement (`moejax tune`, family
   `placement`, per layer) and the tuned placement with replicas (`replicas`: Sinkhorn with
   capacity = slots, learned shares; one redundant slot, EPLB's budget), and the per-batch
   oracle (EPLB with one redundant slot planned on the held-out batch itself). Batches are
   prefill-sized, 512 tokens per device (DP attention), where experts are compute-bound;
   EPLB is also scored at decode size, 16 tokens per device, where they are not.
2. Rebalancing over time (`moejax.systems.rebalancing`): a drifting sequence (the drift
   generator; OLMoE's domains in turn) re-planned by EPLB every R iterations from the last W
   iterations, migration charged over the links (overlapped; in the full run also blocking
   and free, the bound without migration cost, on the first platform), as one vmapped
   (R, W) grid; then (R, W) tuned by the smoothed gradient (`rebalancing_tuning`) against
   that grid.

The claim rules (fixed before any run) are in `balancing_claims`, the figures in
`balancing_figures`; this module computes the rows and declares the study (`STUDY`).
See docs/reproduction/balancing.md for the results and why.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from moejax import tunable as fam
from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.physics.calibration import paper_platform, paper_toml_text
from moejax.placement import eplb_reference, slots
from moejax.reproduce import balancing_data as data
from moejax.reproduce import balancing_figures as figs
from moejax.reproduce.balancing_claims import (  # noqa: F401  (the study's axes, re-exported)
    DECODE_TOKENS_PER_DEVICE,
    LABELS,
    PLACEMENTS,
    PLATFORMS,
    REDUNDANT,
    TOKENS_PER_DEVICE,
    placement_claims,
    rebalance_claim,
)
from moejax.reproduce.study import Check, Figure, Grid, Rows, Study
from moejax.runner import engine
from moejax.systems import ep, rebalancing
from moejax.trace import from_counts
from moejax.trace import io as trace_io
from moejax.trace.core import Trace
from moejax.tune import TuneConfig, tune
from moejax.tune import rebalancing as rebalancing_tuning

# Grid fields: workloads and platforms of the placement study; training and held-out batches
# per workload; tune steps; (workload, platform) pairs tuned (None: all); the rebalancing
# study's (workload, platform) pairs, iterations and layers; platforms also run with blocking
# and free migration; re-plan intervals R (0: plan once) and windows W; smoothed-gradient steps.
QUICK = Grid(True, workloads=tuple(data.WORKLOADS), platforms=PLATFORMS, train_traces=8,
             test_traces=8, tune_steps=40, tune_pairs=(("esft_intent", "gh200-nvl32"),),
             rebalance=(("drift", "h800x8"),), rebalance_iterations=48, rebalance_layers=2,
             blocking_platforms=(), intervals=(1, 2, 4, 8, 16, 0), windows=(1, 4),
             smoothed_steps=3)
FULL = Grid(False, workloads=tuple(data.WORKLOADS), platforms=PLATFORMS, train_traces=32,
            test_traces=32, tune_steps=100, tune_pairs=None,
            rebalance=tuple((w, p) for w in ("drift", "olmoe") for p in PLATFORMS),
            rebalance_iterations=160, rebalance_layers=4, blocking_platforms=("h800x8",),
            intervals=(1, 2, 4, 8, 16, 32, 64, 0), windows=(1, 4, 16), smoothed_steps=20)


def num_layers_of(workload: str, grid: Grid) -> int:
    """Layers of a workload's batches: the recording's (26 ESFT, 3 OLMoE / Mixtral); the
    generators use ESFT's 26 so they share its compiled simulation."""
    w = data.WORKLOADS[workload]
    if w.kind == "generator":
        return 26
    return int(data.recordings()[w.name]["counts"].shape[1])


def counts_traces(counts, top_k: int) -> Trace:
    """Counts-only traces from per-expert loads [T, L, E] (one iteration each) or
    [T, I, L, E]."""
    c = np.asarray(counts, np.float32)
    if c.ndim == 3:
        c = c[:, None]
    t, i, l, e = c.shape
    return Trace(jnp.zeros((t, i, l, 0, top_k), jnp.int32),
                 jnp.zeros((t, i, l, 0, top_k), jnp.float32), jnp.zeros((t, i, 0), bool),
                 jnp.zeros((t, i, 0), jnp.int32), jnp.asarray(c), num_experts=e, top_k=top_k)


@functools.cache
def ep_system(model_name: str, platform: str):
    """(EPConfig, one-iteration EP System), built once so every workload of a model shares
    the compiled sweep."""
    cfg = ep.make_config(paper_platform(platform), load_model(model_name))
    return cfg, ep.build(cfg, 1)


def nodes_of(platform) -> int:
    return platform.topology.nodes if platform.topology.kind == "hierarchical" else 1


def eplb_shares(load_le, model, platform, redundant: int, mode: str = "auto",
                groups: int = 1) -> np.ndarray:
    """EPLB plan [L, E, D] (even split) of mean loads [L, E] with `redundant` slots.
    groups: expert groups (1: none, the recorded models' case, so EPLB's rule is global on
    multi-node platforms, as vLLM runs it; 0: one per node, forcing the hierarchical mode)."""
    d, e = platform.num_devices, model.num_experts
    per = slots.slots_per_device(e, d, redundant)
    nodes = nodes_of(platform)
    phy2log, _, _ = eplb_reference.rebalance(np.asarray(load_le, np.float32), per * d,
                                             groups or nodes, nodes, d, mode)
    return np.asarray(slots.layout_shares(phy2log, e, d), np.float64)


def greedy_shares(load_le, d: int) -> np.ndarray:
    e = load_le.shape[-1]
    ids = np.stack([fam.greedy_balanced_ids(x, d, -(-e // d)) for x in load_le])
    return np.eye(d)[ids]


def oracle_shares(test_counts, model, platform) -> np.ndarray:
    """EPLB (one redundant slot) planned on each held-out batch itself: [T, L, E, D]."""
    return np.stack([eplb_shares(c, model, platform, 1) for c in test_counts])


def load_ratio(counts, shares) -> np.ndarray:
    """max / mean device load per batch (mean over layers): counts [T, L, E], shares
    [L, E, D] or [T, L, E, D] -> [T]."""
    dev = (np.einsum("tle,tled->tld", counts, shares) if shares.ndim == 4
           else np.einsum("tle,led->tld", counts, shares))
    return (dev.max(-1) / np.maximum(dev.mean(-1), 1e-30)).mean(-1)


def evaluate(model_name, platform, shares: dict, counts, top_k) -> dict:
    """Held-out metrics of each placement [L, E, D] on batches counts [T, L, E]: one vmapped
    sweep of EP over every name of PLACEMENTS (a missing one runs contiguous and is left
    out, so every workload of a model shares one compiled call) and, for 'oracle'
    [T, L, E, D], the diagonal of a sweep over the T per-batch placements."""
    _, system = ep_system(model_name, platform)
    contiguous = shares["contiguous"]
    stack = [shares.get(n, contiguous) for n in PLACEMENTS]
    t = np.arange(counts.shape[0])
    stack += list(shares["oracle"])
    params = engine.stack_params([ep.EPParams(placement=jnp.asarray(p, jnp.float32))
                                  for p in stack])
    out = engine.simulate(system, params, counts_traces(counts, top_k), sweep=True,
                          progress=False)
    lat, comm = np.asarray(out["latency_s"]), np.asarray(out["comm_s"])
    res = {n: {"latency_s": lat[i], "comm_s": comm[i],
               "load_ratio": load_ratio(counts, shares[n])}
           for i, n in enumerate(PLACEMENTS) if n in shares}
    k = len(PLACEMENTS)
    res["oracle"] = {"latency_s": lat[k + t, t], "comm_s": comm[k + t, t],
                     "load_ratio": load_ratio(counts, shares["oracle"])}
    return res


def tuned_shares(workload, platform, model, train, test, grid: Grid) -> dict:
    """`moejax tune` on the training batches (a temporary recording whose first part is the
    training batches, the rest held out): per-layer `placement` from greedy and `replicas`
    (one redundant slot) from EPLB. Returns {name: shares [L, E, D], name + "_s": seconds}."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp) / "recording.npz"
        trace_io.save(rec, from_counts(np.concatenate([train, test]), model.top_k),
                      {"workload": workload, "train": int(train.shape[0])})
        # the tuner loads its platform from a file: the catalog's, in its paper reading
        hw = Path(tmp) / f"{platform}.toml"
        hw.write_text(paper_toml_text(load_platform(platform)), encoding="utf-8")
        for name, param, init in (("tuned", "placement", "greedy"),
                                  ("tuned+replicas", "replicas", "eplb")):
            cfg = TuneConfig(system="ep", hardware=str(hw), model=model.name, params=(param,),
                             steps=grid.tune_steps, batch=min(8, train.shape[0]),
                             trace=str(rec), per_layer=True, init=init,
                             every=grid.tune_steps, keep=1, tau_start=0.1, lr=0.02,
                             train_fraction=train.shape[0] / (train.shape[0] + test.shape[0]))
            t0 = time.perf_counter()
            res = tune(cfg, Path(tmp) / name, progress=False, evaluate_heldout=False)
            hard = np.asarray(res.hard[param])
            d = paper_platform(platform).num_devices
            out[name] = np.eye(d)[hard] if param == "placement" else hard
            out[name + "_s"] = time.perf_counter() - t0
    return out


# --- 1. placements, held out -------------------------------------------------------------


def placement_rows(grid: Grid) -> list[dict]:
    """One row per (workload, platform, placement): held-out, decode and training metrics."""
    rows = []
    for wname in grid.workloads:
        w = data.WORKLOADS[wname]
        model = load_model(w.model)
        layers = num_layers_of(wname, grid)
        for pname in grid.platforms:
            plat = paper_platform(pname)
            d, e, k = plat.num_devices, model.num_experts, model.top_k
            tokens = TOKENS_PER_DEVICE * d
            kw = dict(num_layers=layers, num_experts=e, top_k=k)
            train = data.batches(w, "train", grid.train_traces, tokens, **kw)
            test = data.batches(w, "test", grid.test_traces, tokens, **kw)
            decode = data.batches(w, "test", grid.test_traces, DECODE_TOKENS_PER_DEVICE * d, **kw)
            load = train.mean(0)
            most = slots.max_redundant_slots(model, plat)
            shares = {"contiguous": np.broadcast_to(np.asarray(ep.contiguous_placement(e, d)),
                                                    (layers, e, d)),
                      "greedy": greedy_shares(load, d)}
            for s in REDUNDANT:
                if s <= most:
                    shares[f"eplb-{s}"] = eplb_shares(load, model, plat, s)
            if 1 <= most:
                shares["eplb-1-hier"] = eplb_shares(load, model, plat, 1, "hierarchical", 0)
            tuned = {}
            if grid.tune_pairs is None or (wname, pname) in grid.tune_pairs:
                tuned = tuned_shares(wname, pname, model, train, test, grid)
                shares.update({n: tuned[n] for n in ("tuned", "tuned+replicas")})
            shares["oracle"] = oracle_shares(test, model, plat)
            res = evaluate(w.model, pname, shares, test, k)
            dec = evaluate(w.model, pname, shares, decode, k)  # the same compiled sweep
            # the batches it was fitted to (same sweep when train_traces == test_traces):
            # tells a generalisation gap from an optimisation gap
            fit = evaluate(w.model, pname, shares, train, k)
            for name in (*PLACEMENTS, "oracle"):
                s = {"eplb-0": 0, "eplb-1": 1, "eplb-2": 2, "eplb-4": 4, "eplb-1-hier": 1,
                     "tuned+replicas": 1, "oracle": 1}.get(name, 0)
                r = res.get(name)
                lat = r["latency_s"] if r else np.full(1, np.nan)
                ratio = r["load_ratio"] if r else np.full(1, np.nan)
                rows.append({
                    "workload": wname, "platform": pname, "placement": name,
                    "redundant_slots": s, "fits_memory": s <= most,
                    "weight_gb_per_device": slots.device_weight_bytes(model, d, s) / 1e9,
                    "tokens": tokens, "latency_ms_mean": float(np.mean(lat)) * 1e3,
                    "latency_ms_p99": float(np.quantile(lat, 0.99)) * 1e3,
                    "load_ratio_mean": float(np.mean(ratio)),
                    "load_ratio_p99": float(np.quantile(ratio, 0.99)),
                    "comm_ms_mean": float(np.mean(r["comm_s"])) * 1e3 if r else np.nan,
                    "decode_latency_ms_mean": (float(np.mean(dec[name]["latency_s"])) * 1e3
                                               if name in dec and name != "oracle"
                                               else np.nan),
                    "train_latency_ms_mean": (float(np.mean(fit[name]["latency_s"])) * 1e3
                                              if name in fit and name != "oracle"
                                              else np.nan),
                    "tune_s": tuned.get(name + "_s", np.nan),
                })
    return rows


# --- 2. rebalancing over time ------------------------------------------------------------


def _rebalance_points(grid: Grid, iterations: int):
    pts = [(r, w) for r in grid.intervals for w in grid.windows]
    pts.append((0, iterations))  # never planned: contiguous throughout
    pairs = -(-len(pts) // 2)
    pts += [pts[-1]] * (2 * pairs - len(pts))  # pad: the smoothed run's 2 P points share it
    return pts, pairs


def rebalance_rows(grid: Grid) -> tuple[list[dict], dict]:
    """One row per (drifting workload, platform, migration mode, R, W), and the smoothed-
    gradient (R, W) run on the first pair."""
    rows, smoothed = [], {}
    for wname, pname in grid.rebalance:
        w = data.WORKLOADS[wname]
        model = load_model(w.model)
        plat = paper_platform(pname)
        layers = (grid.rebalance_layers if w.kind == "generator"
                  else num_layers_of(wname, grid))
        it = grid.rebalance_iterations
        seq = data.drifting_sequence(w, it, TOKENS_PER_DEVICE * plat.num_devices, layers,
                                     model.num_experts, model.top_k)
        traces = counts_traces(seq[None], model.top_k)
        pts, pairs = _rebalance_points(grid, it)
        modes = ("overlapped", *(("blocking", "free") if pname in grid.blocking_platforms
                                 else ()))
        for mode in modes:
            cfg = rebalancing.make_config(plat, model, redundant_slots=1, migration=mode,
                                          max_window=it)
            system = rebalancing.build(cfg, it)
            base = rebalancing.default_params(cfg)
            params = engine.stack_params([base.replace(interval=jnp.float32(r),
                                                       window=jnp.float32(wi))
                                          for r, wi in pts])
            out = jax.tree_util.tree_map(np.asarray, engine.simulate(
                system, params, traces, sweep=True, progress=False))
            seen = set()
            for i, (r, wi) in enumerate(pts):
                if (r, wi) in seen:
                    continue
                seen.add((r, wi))
                rows.append({"workload": wname, "platform": pname, "migration": mode,
                             "interval": r, "window": wi,
                             "forward_ms": float(out["forward_s"][i].mean()) * 1e3,
                             "layer_ms": float(out["latency_s"][i].mean()) * 1e3,
                             "stall_ms_per_iteration": float(out["stall_s"][i].mean()) * 1e3,
                             "migration_gb": float(out["migration_bytes"][i].mean()) / 1e9,
                             "replans": float(out["replans"][i].mean()),
                             "load_ratio": float(out["max_load_ratio"][i].mean())})
            if mode == "overlapped" and (wname, pname) == grid.rebalance[0]:
                run = rebalancing_tuning.SmoothedRun(
                    interval_range=(1.0, float(max(grid.intervals))),
                    window_range=(1.0, float(max(grid.windows))), steps=grid.smoothed_steps,
                    pairs=pairs)
                smoothed = {"workload": wname, "platform": pname,
                            **rebalancing_tuning.tune_smoothed(system, base, traces, run)}
    return rows, smoothed


# --- the study -----------------------------------------------------------------------------


def placements(grid: Grid) -> Rows:
    return Rows(placement_rows(grid))


def rebalancing_over_time(grid: Grid) -> Rows:
    rows, smoothed = rebalance_rows(grid)
    return Rows(rows, more={"smoothed.json": smoothed})


STUDY = Study(
    name="balancing",
    figures=(
        Figure("placements", placements, (("placements_latency", figs.placements_latency),
                                          ("placements_load", figs.placements_load),
                                          ("redundancy", figs.redundancy))),
        Figure("rebalancing", rebalancing_over_time, figs.rebalancing, more=("smoothed.json",)),
    ),
    quick=QUICK,
    full=FULL,
    checks=(
        Check(("placements",), lambda r, grid: placement_claims(r.cols, grid), grid=True),
        Check(("rebalancing",), lambda r, grid: rebalance_claim(r.cols, grid), grid=True),
    ),
    about=lambda grid: {
        "grid": grid.asdict(), "tokens_per_device": TOKENS_PER_DEVICE,
        "decode_tokens_per_device": DECODE_TOKENS_PER_DEVICE,
        "workloads": {k: dataclasses.asdict(v) for k, v in data.WORKLOADS.items()}},
    timed=True,
)
