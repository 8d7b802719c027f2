"""`moejax reproduce amoe`: paper 002 (AMoE) Fig. 4, 9-12 at the paper's operating point.

The faithful workload of the independent review (shared/reviews/amoe.md §5): the paper reads
throughput and ITL in steady state under a Poisson input rate raised "until the throughput
reaches saturation" (§5.2), which its own numbers place at thousands of concurrent requests
(review §2). So:

* achievable throughput (Fig. 9, 10): closed-loop concurrency sweeps (N requests kept in the
  system, spread start), AEP on the exact CPU event core (`systems/amoe/core.py`), the
  synchronous baseline on `sync.py`'s own iteration step (`sync_closed.py`); the maximum
  over N below the KV bound;
* the Fig. 9(b) curve: open-loop Poisson streams (arrivals over T seconds) at the review's
  rate grid up to saturation, throughput / ITL (mean, p99) / concurrency over the second
  half of the arrivals, offered vs delivered;
* the schedulers (Fig. 11, 12): open loop at 80% of defrag's achievable input rate (top-1
  and top-2), the finished share at the last arrival.

Every cost is the catalog policy's (`aep-defrag`, `aep-mtfs`, `aep-flfs`, `ep-sync`); nothing
is fitted to a claim. docs/reproduction/amoe.md says what differs from the paper and why.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
from pathlib import Path

import jax
import numpy as np

from moejax.catalog.models import load_model
from moejax.catalog.policies import load_policy
from moejax.errors import ConfigError
from moejax.output.progress import study_progress
from moejax.output.results import atomic_write_csv, atomic_write_rows
from moejax.reproduce import Claim, Report, amoe_figures
from moejax.systems.amoe import aep, serve, steady, sync, sync_closed
from moejax.systems.amoe import policy as amoe_policy
from moejax.trace.requests import WORKLOADS, request_stream

MODEL = "mixtral-8x7b"
ONE_NODE, TWO_NODES, ONE_NODE_40G = "a100x8-nvswitch", "a100x16-2node", "a100x8-40g"
PAPER_GAIN = {"short": 2.7, "medium": 2.3, "reasonable": 2.0}  # 002 §5.1, Fig. 9 (a)-(c)
SEED = 1  # routing seed of every run


@dataclasses.dataclass(frozen=True)
class Grid:
    concurrency: tuple[int, ...]  # closed-loop N
    horizon_s: float  # closed-loop AEP horizon (window: second half)
    sync_iters: int  # closed-loop sync iterations (first quarter discarded)
    rates: tuple[float, ...]  # open-loop medium top-1 (review §5: 25-500 req/s)
    arrivals_s: float  # open-loop arrivals span T (window: [T/2, T])
    top2_workloads: tuple[str, ...]
    roofline_workloads: tuple[str, ...] = tuple(WORKLOADS)  # ep-sync-roofline beside ep-sync


QUICK = Grid(concurrency=(256, 2048, 8192, 32768), horizon_s=3.0, sync_iters=16,
             rates=(50.0, 250.0, 400.0), arrivals_s=24.0, top2_workloads=("medium",),
             roofline_workloads=("medium",))
FULL = Grid(concurrency=(256, 1024, 2048, 4096, 8192, 16384, 32768), horizon_s=8.0,
            sync_iters=40, rates=(25.0, 50.0, 100.0, 200.0, 250.0, 300.0, 350.0, 400.0, 500.0),
            arrivals_s=80.0, top2_workloads=tuple(WORKLOADS))


def _table(policy: str, top_k: int, over: dict | None):
    pol = load_policy(policy)
    opts = dict(pol.options)
    opts["top_k"] = int(top_k)
    opts.update(over or {})
    return dataclasses.replace(pol, options=tuple(sorted(opts.items()))).options_table()


def _model(experts: int):
    return dataclasses.replace(load_model(MODEL), num_experts=experts)


def aep_config(platform: str, policy: str, top_k: int, experts: int = 8, over=None):
    """(AEPConfig, decay) of an AEP catalog policy with option overrides."""
    o, decay, use_mqa, k = amoe_policy._aep_options(_table(policy, top_k, over))
    m = amoe_policy._model(_model(experts), use_mqa, k)
    return aep.make_config(serve.platform(platform), m, num_requests=1, **o), decay


def sync_config(platform: str, top_k: int, n: int, experts: int = 8, over=None,
                policy: str = "ep-sync"):
    """The sync baseline's SyncConfig; one object per distinct arguments, so the closed
    loop's compiled iteration (`sync_closed._loop`, cached by config) is shared by every
    workload at the same N (one XLA compilation instead of three)."""
    return _sync_config(platform, int(top_k), int(n), int(experts),
                        tuple(sorted((over or {}).items())), policy)


@functools.lru_cache(maxsize=128)
def _sync_config(platform, top_k, n, experts, over, policy):
    o, use_mqa, k = amoe_policy._sync_options(_table(policy, top_k, dict(over)))
    m = amoe_policy._model(_model(experts), use_mqa, k)
    return sync.make_config(serve.platform(platform), m, num_requests=n, **o)


def closed_point(system: str, platform: str, top_k: int, workload: str, n: int, grid: Grid,
                 experts: int = 8, policy: str = "aep-defrag", spread: bool = True,
                 over=None) -> dict:
    """One closed-loop point: steady throughput / ITL at N concurrent requests."""
    wl = WORKLOADS[workload]
    row = {"system": system, "platform": platform, "top_k": top_k, "workload": workload,
           "experts": experts, "concurrency_target": n, "start": "spread" if spread
           else "aligned"}
    if system == "aep":
        cfg, decay = aep_config(platform, policy, top_k, experts, over)
        res = steady.run_closed(cfg, n, grid.horizon_s, SEED, decay, workload=wl,
                                spread=spread)
        m = steady.window_metrics(cfg, res)
        row.update(throughput_tok_s=m["throughput_tok_s"], itl_mean_s=m["itl_mean_s"],
                   itl_p99_s=m["itl_p99_s"], concurrency=m["concurrency"],
                   stall_fraction=1 - min(m["expert_busy"], 1.0),
                   mean_batch=m["mean_expert_batch"])
        return row
    pol = policy if policy.startswith("ep-sync") else "ep-sync"
    row["system"] = "sync" if pol == "ep-sync" else "sync_roofline"
    try:
        cfg = sync_config(platform, top_k, n, experts, over, pol)
        # SGLang's running-request cap: requests beyond D x max_running wait in its queue,
        # so the engine runs at the cap (throughput and ITL of the running batch)
        n_run = min(n, cfg.max_running * cfg.num_devices)
        if n_run < n:
            cfg = sync_config(platform, top_k, n_run, experts, over, pol)
        m = sync_closed.run_closed(cfg, grid.sync_iters, grid.sync_iters // 4, SEED,
                                   workload=wl, spread=spread)
    except ConfigError:  # beyond the KV bound of this platform
        m = dict.fromkeys(("throughput_tok_s", "itl_mean_s", "itl_p99_s", "concurrency",
                           "stall_fraction", "mean_batch"), float("nan"))
    row.update({k: m[k] for k in ("throughput_tok_s", "itl_mean_s", "itl_p99_s",
                                  "concurrency", "stall_fraction", "mean_batch")})
    return row


def open_point(policy: str, platform: str, top_k: int, workload: str, rate: float,
               arrivals_s: float, experts: int = 8, over=None, keep: bool = False) -> dict:
    """One open-loop Poisson stream (arrivals over `arrivals_s`), steady-window metrics."""
    cfg, decay = aep_config(platform, policy, top_k, experts, over)
    n = max(int(rate * arrivals_s), 200)
    st = request_stream(jax.random.key(int(rate * 10) + top_k), num_streams=1,
                        num_requests=n, rate_per_s=float(rate), workload=workload)
    arr = np.asarray(st.arrival_s[0], np.float64)
    res = steady.run_open(cfg, arr, np.asarray(st.input_len[0]), np.asarray(st.output_len[0]),
                          SEED, decay)
    m = steady.window_metrics(cfg, res)
    row = {"policy": policy, "platform": platform, "top_k": top_k, "workload": workload,
           "rate_per_s": rate, "requests": n, **m}
    if keep:
        row["_res"] = res
    return row


def _best(rows, **match) -> float:
    sel = [r["throughput_tok_s"] for r in rows if all(r[k] == v for k, v in match.items())
           and np.isfinite(r["throughput_tok_s"])]
    return max(sel) if sel else float("nan")


def _plot_curves(path: Path, rows, panels, title: str, x="throughput_tok_s") -> None:
    amoe_figures.curves(path, rows, panels, title, x)


def _parallel(jobs):
    """Run (fn, args, kwargs) jobs on 2 threads (the numba core releases the GIL)."""
    with cf.ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(f, *a, **k) for f, a, k in jobs]
        return [f.result() for f in futs]


def run(out_dir: Path, quick: bool) -> Report:
    grid = QUICK if quick else FULL
    out_dir = Path(out_dir)
    claims: list[Claim] = []
    files: list[str] = []
    with study_progress("amoe", 6) as tick:
        # Fig. 9: closed-loop concurrency sweeps, AEP vs sync, top-1 / top-2
        curves = [(1, wl) for wl in WORKLOADS] + [(2, wl) for wl in grid.top2_workloads]
        jobs = [(closed_point, (s, ONE_NODE, k, wl, n, grid), {})
                for k, wl in curves for s in ("aep", "sync") for n in grid.concurrency]
        # the idealised baseline beside the SGLang-calibrated one (issue 15 part 3)
        jobs += [(closed_point, ("sync", ONE_NODE, k, wl, n, grid),
                  {"policy": "ep-sync-roofline"})
                 for k, wl in curves if wl in grid.roofline_workloads
                 for n in grid.concurrency]
        jobs.append((closed_point, ("aep", ONE_NODE, 1, "medium", 8192, grid),
                     {"spread": False}))
        rows9 = _parallel(jobs)
        atomic_write_rows(out_dir / "fig9_closed_loop.csv", rows9)
        panels = [(f"top-{k} {w}", {"top_k": k, "workload": w}) for k, w in curves]
        _plot_curves(out_dir / "fig9_closed_loop.png", rows9, panels,
                     "002 Fig. 9: closed-loop sweeps N = "
                     f"{min(grid.concurrency)}-{max(grid.concurrency)}, 8x A100")
        files += ["fig9_closed_loop.csv", "fig9_closed_loop.png"]
        tick("Fig. 9 closed loop")
        gains, roof = {}, {}
        for k, wl in curves:
            a = _best(rows9, system="aep", top_k=k, workload=wl, start="spread")
            gains[(k, wl)] = a / _best(rows9, system="sync", top_k=k, workload=wl)
            if wl in grid.roofline_workloads:
                roof[(k, wl)] = a / _best(rows9, system="sync_roofline", top_k=k,
                                          workload=wl)
        for wl in WORKLOADS:
            g, paper = gains[(1, wl)], PAPER_GAIN[wl]
            claims.append(Claim(
                id=f"amoe.throughput_top1_{wl}",
                paper=f"{paper}x throughput over synchronous EP, top-1 {wl} (§5.1, Fig. 9)",
                simulated={"over_sglang": round(g, 3)} | (
                    {"over_roofline_sync": round(roof[(1, wl)], 3)} if (1, wl) in roof
                    else {}),
                holds=bool(paper / 2 <= g <= paper * 2),
                note="achievable throughput = max over closed-loop N of the steady window; "
                     "holds if the ratio over the SGLang-calibrated baseline (ep-sync) is "
                     "within 2x of the paper's; over the roofline upper bound "
                     "(ep-sync-roofline) beside it"))
        g1, g2 = gains[(1, "medium")], gains[(2, "medium")]
        claims.append(Claim(
            id="amoe.top2_smaller_gain",
            paper="AMoE keeps a throughput advantage with top-2, smaller than top-1 (§5.1)",
            simulated={"top1_medium": round(g1, 3), "top2_medium": round(g2, 3),
                       "over_roofline_sync": {"top1_medium": round(roof[(1, "medium")], 3),
                                              "top2_medium": round(roof[(2, "medium")], 3)}},
            holds=bool(1.0 < g2 < g1)))
        low = min(grid.concurrency)
        pick = {s: [r for r in rows9 if r["system"] == s and r["top_k"] == 1
                    and r["workload"] == "medium" and r["concurrency_target"] == low
                    and r["start"] == "spread"][0] for s in ("aep", "sync")}
        claims.append(Claim(
            id="amoe.low_load_itl",
            paper="at low load synchronous EP has lower ITL than AMoE (§5.1, §5.2)",
            simulated={"concurrency": low,
                       "aep_itl_ms": round(pick["aep"]["itl_mean_s"] * 1e3, 2),
                       "sync_itl_ms": round(pick["sync"]["itl_mean_s"] * 1e3, 2)},
            holds=bool(pick["aep"]["itl_mean_s"] > pick["sync"]["itl_mean_s"])))
        srows = [r for r in rows9 if r["system"] == "sync" and r["top_k"] == 1
                 and r["workload"] == "medium" and np.isfinite(r["stall_fraction"])]
        stall = max(r["stall_fraction"] for r in srows)
        atomic_write_csv(out_dir / "fig4_sync_stall.csv", {
            "concurrency": np.asarray([r["concurrency_target"] for r in srows]),
            "stall_fraction": np.asarray([r["stall_fraction"] for r in srows])})
        files.append("fig4_sync_stall.csv")
        claims.append(Claim(
            id="amoe.ep_stall_fraction",
            paper="synchronous EP GPUs stall up to ~70% of the time under skew (§2.1, Fig. 4)",
            simulated=round(stall, 3), holds=bool(0.35 <= stall <= 1.0),
            note="max over N of the barrier-wait share of GPU time (SGLang-calibrated "
                 "baseline); holds if >= 35%. Not independent: the routing skew is "
                 "calibrated to this figure (docs/reproduction/amoe.md)"))

        # Fig. 10: 16 experts top-1 on 2 nodes vs one 8-GPU node (40 GB as the paper's
        # grey markers, 80 GB beside it)
        jobs = [(closed_point, (s, plat, 1, "medium", n, grid), {"experts": 16 if
                                                                 plat == TWO_NODES else 8})
                for plat in (TWO_NODES, ONE_NODE_40G) for s in ("aep", "sync")
                for n in grid.concurrency]
        rows10 = _parallel(jobs)
        atomic_write_rows(out_dir / "fig10_scaling.csv", rows10)
        _plot_curves(out_dir / "fig10_scaling.png", rows10,
                     [("16 GPUs (2 nodes, 40 GB)", {"platform": TWO_NODES}),
                      ("8 GPUs (1 node, 40 GB)", {"platform": ONE_NODE_40G})],
                     "002 Fig. 10: scaling to 2 nodes, medium top-1")
        files += ["fig10_scaling.csv", "fig10_scaling.png"]
        tick("Fig. 10 scaling")
        scale = {}
        for s in ("aep", "sync"):
            b16 = _best(rows10, system=s, platform=TWO_NODES)
            scale[s] = {"over_40g": b16 / _best(rows10, system=s, platform=ONE_NODE_40G),
                        "over_80g": b16 / _best(rows9, system=s, top_k=1, workload="medium",
                                                start="spread") if s == "sync" else
                        b16 / _best(rows9, system=s, top_k=1, workload="medium",
                                    start="spread")}
        claims.append(Claim(
            id="amoe.scaling_16gpu",
            paper="8 -> 16 GPUs (16 experts): synchronous EP flat, AMoE ~1.92x (§5.2, Fig. 10)",
            simulated={s: {k: round(v, 3) for k, v in d.items()} for s, d in scale.items()},
            holds=bool(scale["sync"]["over_40g"] < 1.2 and scale["aep"]["over_40g"] >= 1.5),
            note="holds if sync gains < 1.2x and AMoE >= 1.5x over the 40 GB one-node point "
                 "(the paper's grey markers); the 80 GB node is reported beside it"))

        # Fig. 9(b) open loop: the rate grid to saturation (AEP, medium, top-1)
        rows_o = _parallel([(open_point, ("aep-defrag", ONE_NODE, 1, "medium", r,
                                          grid.arrivals_s), {}) for r in grid.rates])
        atomic_write_rows(out_dir / "fig9b_open_loop.csv", rows_o)
        amoe_figures.open_loop(out_dir / "fig9b_open_loop.png", rows_o)
        files += ["fig9b_open_loop.csv", "fig9b_open_loop.png"]
        tick("Fig. 9(b) open loop")

        # Fig. 11 / 12: schedulers at 80% of defrag's achievable input rate
        mean_out = float(np.mean(WORKLOADS["medium"][1]))
        sat = max(_best(rows_o), _best(rows9, system="aep", top_k=1, workload="medium",
                                       start="spread"))
        rate1 = round(0.8 * sat / mean_out, 1)
        sat2 = _best(rows9, system="aep", top_k=2, workload="medium", start="spread")
        rate2 = round(0.8 * sat2 / mean_out, 1)
        pols = ("aep-defrag", "aep-mtfs", "aep-flfs")
        jobs = [(open_point, (p, ONE_NODE, k, "medium", rate, grid.arrivals_s),
                 {"keep": k == 1}) for k, rate in ((1, rate1), (2, rate2)) for p in pols]
        rows11 = _parallel(jobs)
        atomic_write_rows(out_dir / "fig11_schedulers.csv", rows11)
        files.append("fig11_schedulers.csv")
        tick("Fig. 11 schedulers")
        by = {(r["policy"], r["top_k"]): r for r in rows11}
        ok = True
        for k in (1, 2):
            d, m, f = (by[(p, k)] for p in pols)
            best_t = max(r["throughput_tok_s"] for r in (d, m, f))
            ok &= (d["throughput_tok_s"] >= 0.98 * best_t
                   and d["itl_mean_s"] <= min(m["itl_mean_s"], f["itl_mean_s"]))
        claims.append(Claim(
            id="amoe.defrag_beats_mtfs_flfs",
            paper="at ~80% load the defragging scheduler has higher throughput and lower ITL "
                  "than MTFS and FLFS (§5.3, Fig. 11)",
            simulated={f"top{k}_{p}": {"tok_s": round(by[(p, k)]["throughput_tok_s"]),
                                       "itl_ms": round(by[(p, k)]["itl_mean_s"] * 1e3, 1)}
                       for k in (1, 2) for p in pols} | {"rate_top1": rate1,
                                                          "rate_top2": rate2},
            holds=bool(ok),
            note="open loop below saturation: every scheduler delivers about the offered "
                 "load, so holds if defrag has the lowest ITL and a throughput within 2% of "
                 "the best, for top-1 and top-2"))
        share = {p: by[(p, 1)]["finished_at_last_arrival"] for p in pols}
        claims.append(Claim(
            id="amoe.flfs_starvation",
            paper="under continuous arrivals FLFS completes requests slower than they arrive; "
                  "the defragging scheduler keeps up better (§5.3, Fig. 12)",
            simulated={"share_done_at_last_arrival": {p: round(v, 3) for p, v in share.items()},
                       "itl_ms": {p: round(by[(p, 1)]["itl_mean_s"] * 1e3, 1) for p in pols}},
            holds=bool(share["aep-flfs"] < share["aep-defrag"]
                       and by[("aep-flfs", 1)]["itl_mean_s"]
                       > by[("aep-defrag", 1)]["itl_mean_s"])))
        _fig12(out_dir, by, grid)
        files += ["fig12_rates.csv", "fig12_rates.png"]
        tick("Fig. 12 series")
        extra = {
            "grid": dataclasses.asdict(grid), "rate80_top1": rate1, "rate80_top2": rate2,
            "gains": {f"top{k}_{w}": round(v, 4) for (k, w), v in gains.items()},
            "gains_over_roofline_sync": {f"top{k}_{w}": round(v, 4)
                                         for (k, w), v in roof.items()},
            "aligned_vs_spread_n8192": {
                s: round(_best(rows9, system="aep", top_k=1, workload="medium",
                               concurrency_target=8192, start=s), 1)
                for s in ("spread", "aligned")},
        }
        tick("claims")
    return Report("amoe", claims, files, extra=extra)


def _fig12(out_dir: Path, by, grid: Grid) -> None:
    bin_s = 1.0
    edges = np.arange(int(grid.arrivals_s * 1.5) + 1) * bin_s
    cols = {"t_s": edges[:-1]}
    for pol in ("aep-flfs", "aep-defrag", "aep-mtfs"):
        res = by[(pol, 1)]["_res"]
        arr = res["arrival"] * 1e-6
        comp = res["complete"] * 1e-6
        cols[f"{pol}_input_per_s"] = np.histogram(arr, edges)[0] / bin_s
        cols[f"{pol}_done_per_s"] = np.histogram(comp, edges)[0] / bin_s
    amoe_figures.rates(out_dir / "fig12_rates.png", cols,
                       "002 Fig. 12: arrivals vs completions, top-1, 80% load")
    atomic_write_csv(out_dir / "fig12_rates.csv", cols)
