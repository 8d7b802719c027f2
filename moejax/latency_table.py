"""`moejax export latency-table`: MoE layer latency vs batch tokens, per placement policy, as a
CSV that request-level serving simulators read for their MoE layers.

A serving simulator (Vidur, SplitwiseSim, LLMServingSim) schedules requests and asks a
per-operator or per-iteration latency model how long a batch takes; this table gives it
moejax's hardware model of the MoE layer (all-to-all over the platform's links, experts by
roofline, placement and replicas included) as a function of the tokens in the batch.

Columns (one row per policy and batch size; times in milliseconds, as the simulators use):

- `policy`, `system`, `hardware`, `model`: what was simulated;
- `num_tokens`: tokens in the batch of the whole EP group (one iteration);
  `tokens_per_device` = num_tokens / devices;
- `moe_layer_ms_mean`, `moe_layer_ms_p50`, `moe_layer_ms_p99`: one MoE layer (dispatch
  all-to-all + the slowest device's experts + combine) over traces and measured iterations;
- `comm_ms_mean`: its dispatch + combine; `forward_ms_mean`: one forward pass (every layer,
  attention and dense blocks);
- `time_stats.mlp_up_proj.median` = `moe_layer_ms_p50`: Vidur's compute-profile (`mlp.csv`)
  column of the MLP up-projection, here the whole MoE layer;
  `time_stats.mlp_down_proj.median`, `time_stats.mlp_act.median` = 0 (already inside it);
- `n_head`, `n_kv_head`, `n_embd`, `n_expanded_embd` (the expert FFN size), `vocab_size`
  (`--vocab-size`), `use_gated_mlp`, `num_tensor_parallel_workers` (1: EP with data-parallel
  attention): Vidur's model-config filter columns.

Mapping: Vidur reads `num_tokens` and the `time_stats.*.median` columns of its compute
profile and fits its per-operator regressors on them (filtering rows by the model-config
columns), so pointing its compute-input file at this table makes it charge moejax's MoE layer
for the MLP of every layer. SplitwiseSim's `perf_model.csv` is per iteration (`prompt_time`
of `batch_size` x `prompt_size` tokens, `token_time` of `batch_size` tokens): take
`forward_ms_mean` at `num_tokens` = batch_size x prompt_size and = batch_size. LLMServingSim
and others that take per-layer latency use `moe_layer_ms_mean` directly.

Routing: counts-only traces of `--trace-gen` (`traces_for`: one popularity per trace, fixed
over its iterations; the dispatching devices share each expert's tokens evenly). Policies
that re-plan (`rebalancing`, e.g. `eplb`) run `window` iterations to gather loads first; the
table reports the iterations after the plan is live (steady state, the migration stall
excluded: `moejax reproduce balancing` charges it).
"""

from __future__ import annotations

import jax
import numpy as np

from moejax import api
from moejax.errors import ConfigError
from moejax.trace import gen
from moejax.trace.core import Trace

COLUMNS = ("policy", "system", "hardware", "model", "num_tokens", "tokens_per_device",
           "moe_layer_ms_mean", "moe_layer_ms_p50", "moe_layer_ms_p99", "comm_ms_mean",
           "forward_ms_mean", "time_stats.mlp_up_proj.median", "time_stats.mlp_down_proj.median",
           "time_stats.mlp_act.median", "n_head", "n_kv_head", "n_embd", "n_expanded_embd",
           "vocab_size", "use_gated_mlp", "num_tensor_parallel_workers")


def settle_iterations(policy) -> int:
    """Iterations before a policy's placement is live: a re-planning policy's window + 1."""
    if policy.system != "rebalancing":
        return 0
    return int(dict(policy.options).get("window", 1)) + 1


def traces_for(model, tokens, *, trace_gen: str, traces: int, iterations: int, layers: int,
               seed: int):
    """Counts-only traces [len(tokens) * traces, I, L, E]: trace i has tokens[i // traces]
    tokens per iteration, whose k choices are drawn from the generator's popularity (one per
    trace, fixed over its iterations); one shape for every batch size, so each policy is
    one compiled call."""
    spec = gen.parse_spec(trace_gen)
    keys = jax.random.split(jax.random.key(seed), len(tokens) * traces)
    pop = np.stack([np.asarray(gen.popularity(spec, k, iterations=iterations, layers=layers,
                                              num_experts=model.num_experts), np.float64)
                    for k in keys])  # [T, I, L, E], host side, once
    pop /= pop.sum(-1, keepdims=True)
    rng = np.random.default_rng(seed)
    n = np.repeat(np.asarray(tokens), traces)
    counts = rng.multinomial(n[:, None, None] * model.top_k, pop).astype(np.float32)
    t, i, l, e = counts.shape
    k = model.top_k
    return Trace(np.zeros((t, i, l, 0, k), np.int32), np.zeros((t, i, l, 0, k), np.float32),
                 np.zeros((t, i, 0), bool), np.zeros((t, i, 0), np.int32), counts,
                 num_experts=e, top_k=k)


def table(hardware: str, model: str, policies, tokens, *, trace_gen: str = "powerlaw:alpha=1.2",
          traces: int = 8, layers: int = 1, iterations: int = 2, seed: int = 0,
          vocab_size: int = 0) -> dict[str, list]:
    """The latency table as columns (see the module docstring); `moejax.cli.export` is the
    command."""
    if not tokens or any(isinstance(t, bool) or not isinstance(t, int) or t < 1
                         for t in tokens):
        raise ConfigError(f"tokens = {tokens!r}; allowed: integers >= 1")
    if not policies:
        raise ConfigError("policy: give at least one policy name")
    setups = [api.resolve(hardware, model, p) for p in policies]  # errors before any run
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    for s in setups:
        m, plat = s.model, s.platform
        skip = settle_iterations(s.policy)
        tr = traces_for(m, tokens, trace_gen=trace_gen, traces=traces,
                        iterations=skip + iterations, layers=layers, seed=seed)
        out = api.simulate(plat, m, s.policy, tr, progress=False)
        lat_all = np.asarray(out["layer_latency_per_iter_s"])[:, skip:].mean(-1)  # [T]
        fwd_all = (np.asarray(out["forward_per_iter_s"])[:, skip:].mean(-1)
                   if "forward_per_iter_s" in out else np.asarray(out["forward_s"]))
        comm_all = np.asarray(out["comm_s"])
        for j, n in enumerate(tokens):
            part = slice(j * traces, (j + 1) * traces)
            lat = lat_all[part]
            row = {"policy": s.policy.name, "system": s.policy.system, "hardware": plat.name,
                   "model": m.name, "num_tokens": n, "tokens_per_device": n / plat.num_devices,
                   "moe_layer_ms_mean": lat.mean() * 1e3,
                   "moe_layer_ms_p50": float(np.median(lat)) * 1e3,
                   "moe_layer_ms_p99": float(np.quantile(lat, 0.99)) * 1e3,
                   "comm_ms_mean": float(comm_all[part].mean()) * 1e3,
                   "forward_ms_mean": float(fwd_all[part].mean()) * 1e3,
                   "time_stats.mlp_up_proj.median": float(np.median(lat)) * 1e3,
                   "time_stats.mlp_down_proj.median": 0.0, "time_stats.mlp_act.median": 0.0,
                   "n_head": m.num_heads, "n_kv_head": m.num_kv_heads, "n_embd": m.hidden_size,
                   "n_expanded_embd": m.expert_ffn_size, "vocab_size": vocab_size,
                   "use_gated_mlp": m.ffn_matrices == 3, "num_tensor_parallel_workers": 1}
            for c in COLUMNS:
                cols[c].append(row[c])
    return cols
