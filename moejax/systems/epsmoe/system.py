"""EPS-MoE (003) as an engine system: one prefill forward per trace iteration, its layers
vmapped (`layer.block`), the trace's L layers sampling the model's sparse layers.

Metrics per trace (mean over iterations): `ttft_s` (the forward), `latency_s` (one block),
`tokens_per_s`, per-block `comm_s`, `compute_s`, `exposed_comm_s`, `attention_s`, `moe_s`,
`bytes_per_device` (what one device sends per block: ring steps and all2all rows of the
simulated traffic), `dense_fraction` (share of (device, chunk) GEMMs on the dense kernel),
`a2a_s` / `gemm_s` (the pipelined all2alls and the slowest device's routed-expert GEMMs,
summed over chunks: T_comm and T_comp of E12) and `pn`.

A config with `relaxed` knobs (`relaxed.RELAXABLE`) builds the tuning system: it reads
them relaxed at params.tau > 0 (`relaxed.block`) and equals the hard system at tau = 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.system import System
from moejax.systems import metrics
from moejax.systems.epsmoe import relaxed
from moejax.systems.epsmoe.config import (
    DEFAULT_ALPHA_S,
    DEFAULT_C_SAT,
    DEFAULT_PHI_MIN,
    DEFAULT_SWITCH_ROWS,
    DENSE_SCHEDULES,
    GROUPED_KERNELS,
    KERNELS,
    MODES,
    EPSConfig,
    EPSParams,
    default_params,
    divisors,
    make_config,
)
from moejax.systems.epsmoe.layer import block
from moejax.trace import Trace

SUMMED = ("block_s", "attention_s", "moe_s", "comm_s", "compute_s", "exposed_comm_s",
          "bytes_per_device", "dense_fraction", "a2a_s", "gemm_s")


def scale_of(params: EPSParams, token_mask):
    """Real tokens each simulated token stands for (tokens_per_forward / simulated tokens;
    0: the trace's own tokens)."""
    n = jnp.maximum(token_mask.sum(), 1).astype(jnp.float32)
    want = params.tokens_per_forward
    return jnp.where(want > 0, want / n, 1.0)


def forward(cfg: EPSConfig, params: EPSParams, expert_ids, token_mask):
    """(per-layer block metrics, forward seconds, real tokens) of one iteration."""
    scale = scale_of(params, token_mask)
    blk = relaxed.block if cfg.relaxed else block
    layers = jax.vmap(lambda ids: blk(cfg, params, ids, token_mask, scale))(expert_ids)
    m = cfg.model
    n_real = token_mask.sum() * scale
    dense = 0.0
    if m.num_dense_layers and m.dense_ffn_size:  # dense FFN blocks: DP over devices, roofline
        dev = cfg.platform.device
        flops = n_real / cfg.num_devices * 2.0 * m.ffn_matrices * m.hidden_size * m.dense_ffn_size
        dense = m.num_dense_layers * (flops / (dev.flops("bf16") * cfg.profile.eff_dense)
                                      + layers["attention_s"].mean())
    fwd = layers["block_s"].mean() * m.num_sparse_layers + dense
    return layers, fwd, n_real


def build(cfg: EPSConfig, num_iterations: int = 1) -> System:
    """EPS-MoE / baseline as an init / step / finish system."""

    # sums over iterations with tokens: each SUMMED metric of the mean block, the forward,
    # the real tokens
    sums = {**dict.fromkeys(SUMMED, ()), "forward_s": (), "tokens": ()}

    def init(params, trace: Trace, key):
        del key
        return metrics.Running.zeros(sums)

    def step(params: EPSParams, run: metrics.Running, it: metrics.Iteration):
        layers, fwd, n_real = forward(cfg, params, it.expert_ids, it.token_mask)
        values = {k: layers[k].mean() for k in SUMMED}
        run = run.add(metrics.real_iteration(n_real),
                      {**values, "forward_s": fwd, "tokens": n_real})
        return run, layers["block_s"].mean()

    def finish(params, run: metrics.Running, outs):
        mean = run.means()
        out = {("latency_s" if k == "block_s" else k): mean[k] for k in SUMMED}
        out["ttft_s"] = mean["forward_s"]
        out["forward_s"] = mean["forward_s"]
        out["tokens_per_s"] = run.sums["tokens"] / jnp.maximum(run.sums["forward_s"], 1e-30)
        out["pn"] = params.pn
        if "pn" in cfg.relaxed:  # the tuning system reads pn from its divisor index
            divs = jnp.asarray(divisors(cfg.local_experts), jnp.float32)
            out["pn"] = divs[jnp.clip(jnp.round(params.pn_index), 0, len(divs) - 1)
                             .astype(jnp.int32)]
        # share of a block the slowest device's GEMMs (+ LocalReduce, shared experts) run
        out["utilization_mean"] = out["compute_s"] / jnp.maximum(out["latency_s"], 1e-30)
        out["layer_latency_per_iter_s"] = outs
        return out

    return System(name=f"epsmoe-{cfg.mode}", init=init, step=step, finish=finish,
                  num_steps=num_iterations, inputs=metrics.inputs(num_iterations))


# --- policy options ------------------------------------------------------------------------


def _read_options(t):
    opts = dict(
        mode=t.str("mode", "tp-ep", choices=MODES),
        pn=t.int("pn", 1, lo=1),
        overlap=t.bool("overlap", True),
        gemm=t.str("gemm", "group", choices=KERNELS),
        sm_gemm=t.int("sm_gemm", 0, lo=0),
        sm_comm=t.int("sm_comm", DEFAULT_C_SAT, lo=1),
        fp8_comm=t.bool("fp8_comm", False),
        # readings (docs/reproduction/epsmoe.md): send-once vs re-send per chunk, the grouped
        # kernel's MMA share, the dense kernel's tile schedule
        resend=t.bool("resend", False),
        grouped_kernel=t.str("grouped_kernel", "wgmma", choices=tuple(GROUPED_KERNELS)),
        dense_schedule=t.str("dense_schedule", "stream_k", choices=DENSE_SCHEDULES),
        alpha_s=t.float("alpha_s", DEFAULT_ALPHA_S, positive=False),
        c_sat=t.int("c_sat", DEFAULT_C_SAT, lo=1),
        phi_min=t.float("phi_min", DEFAULT_PHI_MIN, hi=1.0),
        seq_len=t.int("seq_len", 2048, lo=1),
        tokens_per_forward=t.int("tokens_per_forward", 0, lo=0),
        # D lists of E_loc chunk ids (beyond 003, `assignment.py`); absent: contiguous
        chunk_assignment=t._get("chunk_assignment", (), False),
    )
    switch = t.float("switch_rows", DEFAULT_SWITCH_ROWS, positive=False)
    auto_pn = t.bool("auto_pn", False)
    t.close()
    return opts, switch, auto_pn


def check_options(t) -> None:
    """Validate a policy's [options] for EPS-MoE (names, types, ranges)."""
    _read_options(t)


def from_policy(platform: Platform, model: ModelSpec, t, num_iterations: int):
    """(System, params) from a policy's options; `auto_pn` picks the largest divisor of the
    local expert count not above the policy's pn (so one policy runs on every model)."""
    opts, switch, auto_pn = _read_options(t)
    if auto_pn:
        e_loc = max(model.num_experts // platform.num_devices, 1)
        opts["pn"] = max(x for x in divisors(e_loc) if x <= max(opts["pn"], 1))
    cfg = make_config(platform, model, **opts)
    return build(cfg, num_iterations), default_params(cfg, switch_rows=switch)
