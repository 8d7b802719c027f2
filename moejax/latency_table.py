"""`moejax export latency-table`: MoE layer latency vs batch tokens, per placement policy, as
CSV that request-level serving simulators read (Vidur's compute profile, SplitwiseSim's
per-iteration model, per-layer models).

A serving simulator (Vidur, SplitwiseSim, LLMServingSim) schedules requests and asks a
per-operator or per-iteration latency model how long a batch takes; this table gives it
moejax's hardware model of the MoE layer (all-to-all over the platform's links, experts by
roofline, placement and replicas included) as a function of the tokens in the batch.

Rows: one per batch size; one file per policy (`write`: `table.csv` for one policy,
`table-<policy>.csv` for each of several), because Vidur filters its profile rows only by
the model-config columns, so rows of two policies in one file would be fitted as one. The
`policy` column names the rows' policy all the same. Columns (times in milliseconds, as
Vidur's profiles are):

- `policy`, `system`, `hardware`, `model`, `routing`: what was simulated, on which routing;
- `num_tokens`: tokens of one iteration's batch of the whole EP group (all devices, one
  Vidur replica); `tokens_per_device` = num_tokens / devices (each device attends its own
  share: data-parallel attention);
- `moe_layer_ms_mean`, `moe_layer_ms_p50`, `moe_layer_ms_p99`: one MoE layer (dispatch
  all-to-all + the slowest device's experts + combine) over traces and measured iterations;
- `comm_ms_mean`: its dispatch + combine, over the same measured iterations;
  `forward_ms_mean`: one forward pass (every layer, attention and dense blocks);
- Vidur's compute-profile columns (`mlp.csv`, read by its sklearn predictor, one regressor
  per column on `num_tokens`): `time_stats.mlp_up_proj.median` = `moe_layer_ms_p50` (the
  whole MoE layer); `time_stats.mlp_down_proj.median`, `time_stats.mlp_act.median` = 0
  (inside it); `time_stats.attn_pre_proj.median` (Q, K, V projections) and
  `time_stats.attn_post_proj.median` (O projection): moejax's roofline of one device's
  share of the batch; `time_stats.attn_rope.median`: reading and writing Q and K once;
  `time_stats.input_layernorm.median`, `time_stats.post_attention_layernorm.median`,
  `time_stats.add.median` = 0 (not modelled; Vidur fills them with 0 when absent). Vidur
  takes the attention kernel itself (prefill / decode) from its separate attention profile.
- `n_head`, `n_kv_head`, `n_embd`, `n_expanded_embd` (the expert FFN size), `vocab_size`
  (`--vocab-size`), `use_gated_mlp`, `num_tensor_parallel_workers` (1: EP with data-parallel
  attention): Vidur's model-config filter columns (match them in Vidur's model config).

SplitwiseSim's `perf_model.csv` is per iteration (`prompt_time` of `batch_size` x
`prompt_size` tokens, `token_time` of `batch_size` tokens): take `forward_ms_mean` at
`num_tokens` = batch_size x prompt_size and = batch_size. LLMServingSim and others that take
per-layer latency use `moe_layer_ms_mean` directly.

Routing: counts-only traces whose expert popularity comes from (`routing`) a measured fit
shipped with moejax (default, `DEFAULT_FIT`: DeepSeek-V2-Lite on ESFT's intent task), a fit
file of `moejax trace fit --out`, a generator spec, or a recording (`--trace`: the
recording's per-iteration, per-layer expert shares, trace j starting at its own iteration).
Policies that re-plan (`rebalancing`, e.g. `eplb`) first run their window; every column is
over the iterations the plan serves (`rebalancing.held_out_from`: steady state, migration
stall excluded; `moejax reproduce balancing` charges it).
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from moejax import api
from moejax.errors import ConfigError
from moejax.physics.roofline import compute_time_s, memory_time_s
from moejax.runner import budget
from moejax.systems import rebalancing
from moejax.trace import fit, gen
from moejax.trace.core import Trace

DEFAULT_FIT = str(Path(fit.__file__).parent / "fits" / "esft-intent.json")

VIDUR = ("time_stats.attn_pre_proj.median", "time_stats.attn_post_proj.median",
         "time_stats.attn_rope.median", "time_stats.mlp_up_proj.median",
         "time_stats.mlp_down_proj.median", "time_stats.mlp_act.median",
         "time_stats.input_layernorm.median", "time_stats.post_attention_layernorm.median",
         "time_stats.add.median")
COLUMNS = ("policy", "system", "hardware", "model", "routing", "num_tokens",
           "tokens_per_device", "moe_layer_ms_mean", "moe_layer_ms_p50", "moe_layer_ms_p99",
           "comm_ms_mean", "forward_ms_mean", *VIDUR, "n_head", "n_kv_head", "n_embd",
           "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tensor_parallel_workers")


def settle_iterations(policy) -> int:
    """Iterations before a policy's placement is live (a re-planning policy's window, and
    one more when its plan goes live at the next iteration); 0 for static placements."""
    if policy.system != "rebalancing":
        return 0
    return rebalancing.held_out_from(policy.options)


def popularity(routing, key, *, traces: int, iterations: int, layers: int,
               num_experts: int) -> np.ndarray:
    """Expert popularity float64 [traces, I, L, E] (rows sum to 1) from `routing`: a
    generator spec, a fit file (.json; layer l uses recorded layer l mod the fit's layers)
    or a recording (a Trace: its per-iteration per-layer shares, trace j starting at
    iteration j * I_rec // traces and wrapping around)."""
    if isinstance(routing, Trace):
        c = np.asarray(routing.counts, np.float64)
        if c.ndim == 4:  # a batch: its traces' iterations in turn
            c = c.reshape(-1, *c.shape[2:])
        if c.shape[-1] != num_experts:
            raise ConfigError(f"--trace: {c.shape[-1]} experts per layer, the model has "
                              f"{num_experts}; allowed: a recording of this model")
        if layers > c.shape[1]:
            raise ConfigError(f"--layers {layers}: the recording has {c.shape[1]} layers; "
                              f"allowed: 1 .. {c.shape[1]}")
        n = c.shape[0]
        idx = (np.arange(traces)[:, None] * n // traces + np.arange(iterations)) % n
        pop = c[idx][:, :, :layers]
        empty = pop.sum(-1, keepdims=True) == 0
        pop = np.where(empty, 1.0, pop)
    elif str(routing).strip().endswith(".json"):
        specs = fit.load_fit(routing)["layers"]
        keys = jax.random.split(key, traces * layers).reshape(traces, layers)
        pop = np.stack([np.stack([np.asarray(gen.popularity(
            specs[j % len(specs)], keys[t, j], iterations=iterations, layers=1,
            num_experts=num_experts), np.float64)[:, 0] for j in range(layers)], axis=1)
            for t in range(traces)])
    else:
        spec = gen.parse_spec(routing)
        keys = jax.random.split(key, traces)
        pop = np.stack([np.asarray(gen.popularity(spec, k, iterations=iterations,
                                                  layers=layers, num_experts=num_experts),
                                   np.float64) for k in keys])
    return pop / pop.sum(-1, keepdims=True)


def traces_for(model, tokens, *, trace_gen: str | Trace = DEFAULT_FIT, traces: int,
               iterations: int, layers: int, seed: int):
    """Counts-only traces [len(tokens) * traces, I, L, E]: trace i has tokens[i // traces]
    tokens per iteration, whose k choices are drawn from `popularity` (the same `traces`
    popularities for every batch size); one shape for every batch size, so each policy is
    one compiled call."""
    pop = popularity(trace_gen, jax.random.key(seed), traces=traces, iterations=iterations,
                     layers=layers, num_experts=model.num_experts)
    pop = np.tile(pop, (len(tokens), 1, 1, 1))
    rng = np.random.default_rng(seed)
    n = np.repeat(np.asarray(tokens), traces)
    counts = rng.multinomial(n[:, None, None] * model.top_k, pop).astype(np.float32)
    t, i, l, e = counts.shape
    k = model.top_k
    return Trace(np.zeros((t, i, l, 0, k), np.int32), np.zeros((t, i, l, 0, k), np.float32),
                 np.zeros((t, i, 0), bool), np.zeros((t, i, 0), np.int32), counts,
                 num_experts=e, top_k=k)


def attention_ms(model, platform, tokens_per_device: float) -> dict[str, float]:
    """Vidur's attention operators outside the kernel, by roofline on one device (ms):
    Q/K/V projections, O projection, rope (read and write Q and K once)."""
    dev, m = platform.device, model
    peak, bw = dev.flops("bf16"), dev.memory_Bps
    qkv = m.hidden_size * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim
    o = m.hidden_size * m.num_heads * m.head_dim

    def gemm_ms(weights: float) -> float:
        return 1e3 * max(compute_time_s(2.0 * tokens_per_device * weights, peak),
                         memory_time_s(weights * m.weight_bytes, bw))

    rope_bytes = 2.0 * tokens_per_device * (m.num_heads + m.num_kv_heads) * m.head_dim
    return {"time_stats.attn_pre_proj.median": gemm_ms(qkv),
            "time_stats.attn_post_proj.median": gemm_ms(o),
            "time_stats.attn_rope.median": 1e3 * memory_time_s(rope_bytes * m.weight_bytes, bw)}


def check_memory(setups, tokens, *, traces: int, layers: int, iterations: int) -> None:
    """ConfigError (one line) before any trace is made when one policy's traces (all batch
    sizes held at once: float32 counts, plus the float64 popularities they are drawn from)
    do not fit memory (`budget.check_traces_fit`, as simulate and sweep check)."""
    for s in setups:
        i, e = settle_iterations(s.policy) + iterations, s.model.num_experts
        budget.check_traces_fit(held=len(tokens) * traces, working=1,
                                trace_bytes=4 * i * layers * e, shape=None, scratch_bytes=0,
                                extra_bytes=8 * len(tokens) * traces * i * layers * e)


def table(hardware: str, model: str, policies, tokens, *, trace_gen: str | Trace = DEFAULT_FIT,
          routing_label: str | None = None, traces: int = 8, layers: int = 1,
          iterations: int = 2, seed: int = 0, vocab_size: int = 0) -> dict[str, list]:
    """The latency table as columns (see the module docstring), all policies' rows in turn;
    `moejax.cli.export` is the command and writes one file per policy."""
    if not tokens or any(isinstance(t, bool) or not isinstance(t, int) or t < 1
                         for t in tokens):
        raise ConfigError(f"tokens = {tokens!r}; allowed: integers >= 1")
    if not policies:
        raise ConfigError("policy: give at least one policy name")
    setups = [api.resolve(hardware, model, p) for p in policies]  # errors before any run
    check_memory(setups, tokens, traces=traces, layers=layers, iterations=iterations)
    label = routing_label or str(trace_gen)
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
        comm_all = (np.asarray(out["comm_per_iter_s"])[:, skip:].mean(-1)
                    if "comm_per_iter_s" in out else np.asarray(out["comm_s"]))
        for j, n in enumerate(tokens):
            part = slice(j * traces, (j + 1) * traces)
            lat = lat_all[part]
            p50 = float(np.median(lat)) * 1e3
            row = {"policy": s.policy.name, "system": s.policy.system, "hardware": plat.name,
                   "model": m.name, "routing": label, "num_tokens": n,
                   "tokens_per_device": n / plat.num_devices,
                   "moe_layer_ms_mean": lat.mean() * 1e3, "moe_layer_ms_p50": p50,
                   "moe_layer_ms_p99": float(np.quantile(lat, 0.99)) * 1e3,
                   "comm_ms_mean": float(comm_all[part].mean()) * 1e3,
                   "forward_ms_mean": float(fwd_all[part].mean()) * 1e3,
                   **{c: 0.0 for c in VIDUR},
                   **attention_ms(m, plat, n / plat.num_devices),
                   "time_stats.mlp_up_proj.median": p50,
                   "n_head": m.num_heads, "n_kv_head": m.num_kv_heads, "n_embd": m.hidden_size,
                   "n_expanded_embd": m.expert_ffn_size, "vocab_size": vocab_size,
                   "use_gated_mlp": m.ffn_matrices == 3, "num_tensor_parallel_workers": 1}
            for c in COLUMNS:
                cols[c].append(row[c])
    return cols


def per_policy(cols: dict[str, list], out: str | Path) -> dict[Path, dict[str, list]]:
    """{path: columns} of one file per policy: `out` itself for one policy, else
    `<stem>-<policy>.csv` beside it."""
    out = Path(out)
    names = list(dict.fromkeys(cols["policy"]))
    files = {}
    for name in names:
        rows = [i for i, p in enumerate(cols["policy"]) if p == name]
        path = out if len(names) == 1 else out.with_name(f"{out.stem}-{name}{out.suffix}")
        files[path] = {c: [v[i] for i in rows] for c, v in cols.items()}
    return files
