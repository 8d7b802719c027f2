"""Gradient-free tuning: a hard-mode grid search on training workloads, judged on held-out
ones; the exhaustive reference for the gradient paths of the same knobs.

Not gradient descent, and named so. The knobs it covers, and what else exists for them:

- AEP (002 §3.4 Algorithm 1) defragging-scheduler decay delta (`AEPParams.decay`): the
  discrete-event simulation reads delta only through an argmax over mu-queue scores
  (`schedulers.select`), so the metrics are piecewise constant in delta. The gradient path
  is `moejax tune --system aep --relaxation smoothed` (`moejax.tune.smoothed`: Gaussian
  smoothing of this same hard objective, antithetic score-function gradient). A grid costs
  one hard run per value and is exact.
- Wafer-scale NI-Balancer trigger alpha (001 Eq. 2, `WaferParams.alpha`): the gradient path
  is `moejax tune --system wafer --param alpha --relaxation system` (the wafer step blends
  its balancer decisions with `balancer.eq2_gate`); its hard effect is piecewise constant
  (it changes which iterations re-plan), which this grid measures exactly.
- Wafer shadow-slot count (001 §V-B/C, static `WaferConfig.shadow_slots`, a scan length):
  `moejax tune --system wafer --param shadow_slots --relaxation lattice` interpolates hard
  runs of one System per count (alone); `tune_wafer_alpha(slots=...)` grids it jointly
  with alpha.

`grid_search` evaluates `objective(value)` (a scalar, lower is better) at every grid
point and returns them all; the callers below pick the best on training workloads and then
evaluate it, the paper's default and the baselines on held-out workloads.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax import systems
from moejax.errors import ConfigError
from moejax.runner import engine
from moejax.systems.amoe import serve
from moejax.systems.wafer import system as wsys
from moejax.systems.wafer.tuning import WAFER_ALPHA_GRID
from moejax.trace.popularity import fixed_popularity, sample_from_popularity

AEP_DECAY_GRID = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)  # the policy allows delta in [0, 1]
AEP_METRICS = ("throughput_tok_s", "itl_mean_s", "ttft_mean_s")


@dataclasses.dataclass(frozen=True)
class GridResult:
    grid: tuple[float, ...]
    values: tuple[float, ...]  # objective at each grid point (lower is better)

    @property
    def best(self) -> float:
        return self.grid[int(np.argmin(self.values))]  # first of equal values


def grid_search(objective, grid) -> GridResult:
    """objective(value) -> float at each point of `grid` (a host loop over a handful of
    parameter values, each a full hard-mode simulation)."""
    grid = tuple(float(g) for g in grid)
    if not grid:
        raise ConfigError("grid: give at least one value")
    return GridResult(grid, tuple(float(objective(g)) for g in grid))


def _sign(metric: str) -> float:
    if metric not in AEP_METRICS:
        raise ConfigError(f"metric = {metric!r}; allowed: {', '.join(AEP_METRICS)}")
    return -1.0 if metric == "throughput_tok_s" else 1.0


def tune_aep_decay(hardware: str = "a100x8-nvswitch", model: str = "mixtral-8x7b",
                   policy: str = "aep-defrag", *, grid=AEP_DECAY_GRID, requests: int = 16,
                   rate_per_s: float = 200.0, workload: str = "medium", train_streams: int = 2,
                   eval_streams: int = 2, seed: int = 0, metric: str = "throughput_tok_s",
                   baselines=("aep-mtfs", "aep-flfs")) -> dict:
    """Grid search of Algorithm 1's delta on training request streams; the best, the
    policy's default and the strawman schedulers evaluated on held-out streams (same rate
    and workload, other Poisson draws). Returns a JSON-able summary."""
    sign = _sign(metric)
    system, params, pol = serve.build(hardware, model, policy, requests)
    if pol.system != "aep" or dict(pol.options).get("scheduler", "defrag") != "defrag":
        raise ConfigError(f"policy {policy!r}: delta tuning needs an 'aep' policy with "
                          "scheduler = 'defrag' (Algorithm 1)")
    k_train, k_eval, k_sim = jax.random.split(jax.random.key(seed), 3)
    kw = dict(num_requests=requests, rate_per_s=rate_per_s, workload=workload)
    train = serve.streams(k_train, num_streams=train_streams, **kw)
    heldout = serve.streams(k_eval, num_streams=eval_streams, **kw)

    def run(sys_params, streams, system=system):
        out = engine.simulate(system, sys_params, streams, k_sim)
        return {k: float(np.mean(np.asarray(out[k]))) for k in AEP_METRICS}

    def objective(delta):
        return sign * run(params.replace(decay=jnp.float32(delta)), train)[metric]

    res = grid_search(objective, grid)
    default = float(params.decay)
    rows = {"tuned": run(params.replace(decay=jnp.float32(res.best)), heldout),
            "default": run(params, heldout)}
    for b in baselines:
        bsys, bparams, _ = serve.build(hardware, model, b, requests)
        rows[b] = run(bparams, heldout, bsys)
    return {"method": "hard-mode grid search (not gradient-based; moejax/tune/zeroth.py)",
            "system": "aep", "hardware": hardware, "model": model, "policy": policy,
            "param": "decay", "metric": metric, "requests": requests,
            "rate_per_s": rate_per_s, "workload": workload, "train_streams": train_streams,
            "eval_streams": eval_streams, "seed": seed,
            "grid": list(res.grid), "train_objective": [sign * v for v in res.values],
            "tuned": res.best, "default": default, "heldout": rows}


def tune_wafer_alpha(hardware: str = "wsc-4x4", model: str = "qwen3-30b-a3b",
                     policy: str = "er-mapping", *, grid=WAFER_ALPHA_GRID, slots=(None,),
                     tokens: int = 256, iterations: int = 16, layers: int = 2,
                     traces: int = 16, eval_traces: int = 32,
                     trace_gen: str = "powerlaw:alpha=1.2", seed: int = 0,
                     overrides: dict | None = None) -> dict:
    """Grid search of the Eq. 2 trigger alpha (001), and optionally of the shadow-slot
    count (`slots`: values of the static `shadow_slots`, one system build each; None = the
    policy's), on training traces by mean forward time per iteration (migration stalls
    included); then held-out evaluation of the best pair, the policy default and 'never
    balance' (alpha = 1e9). Returns a JSON-able summary."""
    s = systems.resolve(hardware, model, policy)
    if s.policy.system != "wafer":
        raise ConfigError(f"policy {policy!r} is for system {s.policy.system!r}; alpha "
                          "tuning needs a 'wafer' policy with a balancer")

    built = {}

    def build(extra):  # one System per option set, so its compiled runs are reused
        opts = {**dict(s.policy.options), **(overrides or {}), **extra}
        key = tuple(sorted((k, str(v)) for k, v in opts.items()))
        if key not in built:
            pol = dataclasses.replace(s.policy, options=tuple(sorted(opts.items())))
            built[key] = wsys.from_policy(s.platform, s.model, pol.options_table(),
                                          iterations)
        return built[key]

    k_pop, k_train, k_eval = jax.random.split(jax.random.key(seed), 3)
    pop = fixed_popularity(trace_gen, k_pop, iterations=iterations, layers=layers,
                           num_experts=s.model.num_experts)
    kw = dict(tokens=tokens, top_k=s.model.top_k)
    train = sample_from_popularity(pop, k_train, num_traces=traces, **kw)
    heldout = sample_from_popularity(pop, k_eval, num_traces=eval_traces, **kw)
    grid = tuple(float(g) for g in grid)
    train_fwd, best = {}, None
    for n in slots:
        system, base = build({} if n is None else {"shadow_slots": int(n)})
        sweep = engine.stack_params([base.replace(alpha=jnp.float32(a)) for a in grid])
        fwd = np.asarray(engine.simulate(system, sweep, train, sweep=True)["forward_s"])
        res = GridResult(grid, tuple(float(x) for x in fwd.mean(1)))
        train_fwd["policy" if n is None else str(int(n))] = list(res.values)
        if best is None or min(res.values) < best[2]:
            best = (n, res.best, min(res.values))

    def held(extra, alphas):
        system, base = build(extra)
        padded = list(alphas) + [alphas[-1]] * max(0, len(grid) - len(alphas))  # same shape
        out = engine.simulate(system, engine.stack_params(
            [base.replace(alpha=jnp.float32(a)) for a in padded]), heldout, sweep=True)
        return [{k: float(np.asarray(out[k])[i].mean()) for k in
                 ("forward_s", "latency_s", "max_over_mean", "migrations")}
                for i in range(len(alphas))]

    _, base = build({})
    default = float(base.alpha)
    d_row, never = held({}, (default, 1e9))
    t_row = held({} if best[0] is None else {"shadow_slots": int(best[0])}, (best[1],))[0]
    return {"method": "hard-mode grid search (not gradient-based; moejax/tune/zeroth.py)",
            "system": "wafer", "hardware": hardware, "model": model, "policy": policy,
            "overrides": dict(overrides or {}), "param": "alpha, shadow_slots",
            "metric": "forward_s", "tokens": tokens, "iterations": iterations,
            "layers": layers, "traces": traces, "eval_traces": eval_traces,
            "trace_gen": trace_gen, "seed": seed, "grid": list(grid),
            "train_forward_s": train_fwd, "tuned": best[1],
            "tuned_shadow_slots": best[0], "default": default,
            "heldout": {"tuned": t_row, "default": d_row, "never (alpha = 1e9)": never}}
