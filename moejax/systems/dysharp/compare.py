"""Several catalog systems on the same routing in one compiled call (one load pass shared).

`configs(platform, model, names)` reads the catalog policies (`policies/NAME.toml`) into
DyConfigs; `compare(cfgs)` returns a jitted function of one batch of layers that evaluates
every config on the same `traffic.port_loads`, with the simulated tokens per GPU as a traced
argument (a sequence-length sweep needs no recompile).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.catalog.policies import load_policy
from moejax.systems.dysharp import system, traffic
from moejax.systems.dysharp.config import DyConfig, DyParams, make_config

# 004 Fig. 15 / 14 baselines and DySHARP, and the Fig. 16 ablation points
BASELINES = ("deepep", "nvls", "fastermoe", "tutel", "ccfuser", "comet")
ABLATION = ("dysharp-basic", "dysharp-comet", "fusion-only", "explicit-fused")
ALL = (*BASELINES, "dualpipe", "dysharp", *ABLATION)


def configs(platform: Platform, model: ModelSpec, names=ALL, **overrides) -> tuple:
    """DyConfigs of catalog policies (their [options]), with keyword overrides."""
    out = []
    for name in names:
        opts, _, _ = system._read_options(load_policy(name).options_table())
        out.append(make_config(platform, model, **{**opts, **overrides}))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def compare(cfgs: tuple[DyConfig, ...]):
    """jit(vmap) of (placement [E, G], ids [T, N, K], mask [T, N], counts [T, E],
    tokens_per_gpu, tile_tokens=None) -> {name: metrics with a leading [T] axis}.
    tile_tokens: a traced tile height for every config (a tile sweep compiles once); None:
    each config's own."""
    g = cfgs[0].num_devices

    def one(placement, ids, mask, counts, tokens_per_gpu, tile_tokens=None):
        params = DyParams(placement=placement, tau=0.0, tile_tokens=tile_tokens)  # hard mode
        n_real = (mask & (ids >= 0).any(-1)).sum().astype(jnp.float32)
        loads = traffic.port_loads(ids, mask, placement, exact=True)
        scale = tokens_per_gpu * g / jnp.maximum(n_real, 1.0)
        return {cfg.name: system.layer_from_loads(cfg, params, loads, counts, n_real, scale)
                for cfg in cfgs}

    return jax.jit(jax.vmap(one, in_axes=(None, 0, 0, 0, None, None)))


def layers_of_traces(traces):
    """(ids [T*I*L, N, K], mask [..., N], counts [..., E]): every layer of every trace as one
    independent sample."""
    ids = traces.expert_ids
    n, k = ids.shape[-2:]
    e = traces.counts.shape[-1]
    lay = ids.shape[-3]
    mask = jnp.broadcast_to(traces.token_mask[..., None, :], (*ids.shape[:-3], lay, n))
    return ids.reshape(-1, n, k), mask.reshape(-1, n), traces.counts.reshape(-1, e)
