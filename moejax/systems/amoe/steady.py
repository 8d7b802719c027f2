"""AEP serving at a steady operating point on the exact CPU event core (`core.py`).

002 §5: the paper sweeps a Poisson input rate "until
the throughput reaches saturation" and reads throughput and inter-token latency (ITL) in
steady state, at thousands of concurrent requests. Two workloads:

* `run_open`: an open-loop Poisson stream (arrivals over T seconds), run until every request
  completes; metrics over a steady window [w0, w1) (default: the second half of the
  arrivals, after the ramp-up, before the drain);
* `run_closed`: a closed loop keeping N requests in the system (each completion submits a
  fresh request at once), from an aligned start (every request at block 0, no output yet)
  or a spread one (random block and progress), measured over the horizon's second half.

Window metrics (`window_metrics`): delivered output tokens per second (tokens emitted in the
window), ITL mean and p99 of the tokens emitted in it, time-averaged concurrency (requests
arrived and not completed), request arrival rate and mean sojourn of the requests arriving
in it (Little's law N = λ W), offered token rate, and the share of requests finished at the
last arrival (Fig. 12).
"""

from __future__ import annotations

import numpy as np

from moejax.errors import ConfigError
from moejax.systems.amoe import core, rounds_io
from moejax.systems.amoe.aep import AEPConfig, stream_ticks
from moejax.systems.amoe.config import BIG_TICK, SCHEDULERS, TICK_S

SCHED = {name: i for i, name in enumerate(SCHEDULERS)}  # defrag 0, mtfs 1, flfs 2
ITL_EDGES_S = np.geomspace(1e-5, 100.0, 1201)  # 0.77 % wide log bins for p99
BIN_S = 0.1  # emitted-token series resolution


def _cost(cfg: AEPConfig):
    c = cfg.cost
    return tuple(np.float32(getattr(c, f)) for f in (
        "exp_comp", "exp_weight", "exp_act", "exp_fixed", "att_comp", "att_ctx_comp",
        "att_weight", "att_kv", "att_act", "att_fixed", "att_per_token"))


def _call(cfg: AEPConfig, arrival, inp, outl, n0, closed, horizon, new_inp, new_outl, seed,
          decay, init_block, init_done, window, conc_cap, max_events, plain, path="core"):
    w0, w1 = (int(round(x / TICK_S)) for x in window)
    bin_ticks = int(round(BIN_S / TICK_S))
    t_end = max(int(horizon) if closed else int(arrival[:n0].max(initial=0)) * 4, w1) + 1
    tok_bins = np.zeros(t_end // bin_ticks + 2, np.int64)
    itl_hist = np.zeros(len(ITL_EDGES_S) + 1, np.int64)
    edges = np.ceil(ITL_EDGES_S / TICK_S).astype(np.int64)
    if path not in ("core", "rounds"):
        raise ConfigError(f"path = {path!r}; allowed: 'core', 'rounds'")
    if path == "rounds":  # the JAX path (rounds.py), equal to the core
        fn = rounds_io.simulate
    else:
        fn = core.simulate_py if plain else core.simulate
    out = fn(arrival, inp, outl, int(n0), int(closed), int(horizon), new_inp, new_outl,
             SCHED[cfg.scheduler], cfg.num_blocks, cfg.model.top_k, cfg.num_ranks,
             cfg.num_devices, np.asarray(cfg.gpu_of_unit, np.int64),
             np.asarray(cfg.attention_gpus, np.int64), np.asarray(cfg.expert_gpus, np.int64),
             int(cfg.kv_capacity_tokens), _cost(cfg), np.asarray(cfg.lat_s, np.float32),
             np.asarray(cfg.per_token_s, np.float32), np.asarray(cfg.cdf, np.float32),
             np.uint32(seed), np.float32(decay), int(cfg.lookahead), int(max_events),
             init_block, init_done, w0, w1, bin_ticks, edges, tok_bins, itl_hist,
             int(conc_cap))
    keys = ("complete", "first_tok", "last_tok", "tokens_done", "rank", "admitted",
            "arrival", "output_len", "busy", "execs", "exec_tokens", "events", "clock",
            "n_req", "itl_sum", "itl_n", "exhausted")
    res = dict(zip(keys, out, strict=True))
    for k in ("complete", "admitted"):
        res[k] = np.where(res[k] >= core.BIG, BIG_TICK, res[k])
    res.update(tok_bins=tok_bins, itl_hist=itl_hist, window=(w0, w1), bin_ticks=bin_ticks,
               closed=int(closed), horizon=int(horizon))
    return res


def run_open(cfg: AEPConfig, arrival_s, input_len, output_len, seed: int, decay: float = 0.5,
             *, window_s=None, plain: bool = False, max_events: int = 2**62,
             path: str = "core") -> dict:
    """One open-loop stream to completion (real requests only: pass unmasked arrays).

    path: 'core' (numba; `plain` runs its plain-Python form) or 'rounds' (the JAX path,
    `rounds.py`, equal to the core): the values of the AEP policy option of that name.
    """
    arrival = stream_ticks(np, arrival_s).astype(np.int64)
    inp = np.asarray(input_len, np.int64).copy()
    outl = np.asarray(output_len, np.int64).copy()
    if not (len(arrival) == len(inp) == len(outl)) or len(arrival) == 0:
        raise ConfigError("stream: arrival_s, input_len, output_len need one equal length >= 1")
    t_last = float(np.asarray(arrival_s)[-1])
    window_s = (t_last / 2, t_last) if window_s is None else window_s
    z = np.zeros(0, np.int64)
    res = _call(cfg, arrival, inp, outl, len(arrival), 0, 0, inp, outl, seed, decay, z, z,
                window_s, len(arrival), max_events, plain, path)
    res["input_len"] = inp
    return res


def run_closed(cfg: AEPConfig, concurrency: int, horizon_s: float, seed: int,
               decay: float = 0.5, *, workload=((50, 150), (50, 250)), spread: bool = True,
               rng_seed: int = 0, plain: bool = False, max_events: int = 2**62,
               path: str = "core") -> dict:
    """N requests kept in the system for `horizon_s` (uniform lengths from `workload`).

    spread: start each request at a random block with random progress (a stationary-like
    state); else aligned (all at block 0, nothing emitted). Metrics over [horizon/2, horizon).
    path: as `run_open`.
    """
    n = int(concurrency)
    if n < 1:
        raise ConfigError(f"concurrency = {concurrency!r}; allowed: an integer >= 1")
    rng = np.random.default_rng(rng_seed)
    (ilo, ihi), (olo, ohi) = workload
    # room for resubmissions: every request can finish at most horizon / (olo x a floor of
    # 1 µs per block step) times; in practice far fewer (`exhausted` flags a shortfall)
    turns = int(np.ceil(horizon_s / (olo * cfg.num_blocks * 2e-4))) + 2
    rmax = n * min(turns, 64)
    inp = rng.integers(ilo, ihi + 1, rmax).astype(np.int64)
    outl = rng.integers(olo, ohi + 1, rmax).astype(np.int64)
    arrival = np.full(rmax, core.BIG, np.int64)
    arrival[:n] = 0
    if spread:
        init_block = rng.integers(0, cfg.num_blocks, n).astype(np.int64)
        init_done = (rng.random(n) * outl[:n]).astype(np.int64)
    else:
        init_block = np.zeros(0, np.int64)
        init_done = np.zeros(0, np.int64)
    horizon = int(round(horizon_s / TICK_S))
    res = _call(cfg, arrival, inp.copy(), outl.copy(), n, n, horizon, inp, outl, seed, decay,
                init_block, init_done, (horizon_s / 2, horizon_s), n, max_events, plain,
                path)
    if res["exhausted"]:
        raise ConfigError(f"closed loop: more than {rmax} completions in {horizon_s} s; "
                          "shorten horizon_s")
    res["input_len"] = inp[:res["n_req"]]
    return res


def window_metrics(cfg: AEPConfig, res: dict) -> dict:
    """Steady-window metrics of a `run_open` / `run_closed` result (see module doc)."""
    w0, w1 = res["window"]
    span_s = (w1 - w0) * TICK_S
    bt = res["bin_ticks"]
    b0, b1 = -(-w0 // bt), w1 // bt  # whole bins inside the window
    bins_s = (b1 - b0) * bt * TICK_S
    tok = res["tok_bins"][b0:b1].sum()
    arr = res["arrival"]
    comp = np.where(res["complete"] >= BIG_TICK, np.iinfo(np.int64).max, res["complete"])
    if res["closed"]:  # requests of the spread start entered at 0 with their progress
        arr = np.where(np.arange(len(arr)) < res["closed"], 0, arr)
    lo, hi = np.maximum(arr, w0), np.minimum(comp, w1)
    conc = np.clip(hi - lo, 0, None).sum() / max(w1 - w0, 1)
    inw = (arr >= w0) & (arr < w1)
    lam = inw.sum() / span_s
    fin = inw & (comp < np.iinfo(np.int64).max)
    sojourn = ((comp[fin] - arr[fin]).mean() * TICK_S) if fin.any() else float("nan")
    h = res["itl_hist"].astype(np.float64)
    if h.sum() > 0:
        c = np.cumsum(h) / h.sum()
        edges = np.concatenate([ITL_EDGES_S, [np.inf]])
        p99 = float(edges[int(np.searchsorted(c, 0.99))])
    else:
        p99 = float("nan")
    makespan = max(float(res["clock"]), 1.0)
    is_exp = np.zeros(cfg.num_devices, bool)
    is_exp[list(cfg.expert_gpus)] = True
    is_att = np.zeros(cfg.num_devices, bool)
    is_att[list(cfg.attention_gpus)] = True
    ex, nt = res["execs"], res["exec_tokens"]
    out = {
        "throughput_tok_s": tok / bins_s,
        "itl_mean_s": res["itl_sum"] / max(res["itl_n"], 1) * TICK_S,
        "itl_p99_s": p99,
        "concurrency": conc,
        "request_rate_per_s": lam,
        "sojourn_s": sojourn,
        "little_n": lam * sojourn,
        "offered_tok_s": res["output_len"][inw].sum() / span_s,
        "expert_busy": float(res["busy"][is_exp].sum() / makespan / is_exp.sum()),
        "attention_busy": float(res["busy"][is_att].sum() / makespan / is_att.sum()),
        "mean_expert_batch": float(nt[is_exp].sum() / max(ex[is_exp].sum(), 1)),
        "mean_attention_batch": float(nt[is_att].sum() / max(ex[is_att].sum(), 1)),
        "events": int(res["events"]),
    }
    if not res["closed"]:
        t_last = res["arrival"].max()
        out["finished_at_last_arrival"] = float((res["complete"] <= t_last).mean())
    return out
