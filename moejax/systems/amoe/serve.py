"""Serving runs by name: platform + model + AEP / sync-EP policy + Poisson request streams.

Used by the CLI (`moejax simulate --policy aep-defrag --rate 100 --workload medium`), the
reproduce study and the experiments. The two 002 platforms (Tables 2-3) are read from the
hardware catalog; until the catalog holds them, the same specs are built here.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from moejax.catalog.hardware import Platform, load_platform, parse_platform
from moejax.catalog.models import ModelSpec, load_model
from moejax.catalog.policies import Policy, load_policy
from moejax.errors import UnknownNameError
from moejax.systems import SYSTEMS, names
from moejax.systems.amoe import runner
from moejax.trace import requests

STREAM_SYSTEMS = tuple(names("streams"))  # the registry's systems with input_kind "streams"

# 002 Table 3 (8x A100-SXM4-80GB, NVSwitch 600 GB/s per GPU) and Table 2 (two AWS p4d
# nodes: 8x A100-40GB each, 4x 100 Gbps EFA per node); A100 datasheet numbers. Latencies as
# the catalog files (hardware/a100x8-nvswitch.toml, a100x16-2node.toml, assumed there:
# 0.5 µs NVSwitch, 10 µs EFA), so the fallback and the catalog give the same platform.
_A100 = {
    "a100x8-nvswitch": dict(
        family="gpu", description="8x A100-SXM4-80GB on NVSwitch (002 Table 3)",
        source="002 Table 3; NVIDIA A100 datasheet", num_devices=8,
        device={"peak_flops": {"bf16": 312e12}, "onchip_buffer_bytes": 40e6,
                "memory_capacity_bytes": 80e9, "memory_Bps": 2.039e12, "sm_count": 108},
        topology={"kind": "switch", "link_Bps": 300e9, "hop_latency_s": 500e-9},
    ),
    "a100x16-2node": dict(
        family="gpu", description="2 nodes x 8 A100-SXM4-40GB, NVSwitch + 4x100 Gbps EFA "
        "per node (002 Table 2)", source="002 Table 2; NVIDIA A100 datasheet",
        num_devices=16,
        device={"peak_flops": {"bf16": 312e12}, "onchip_buffer_bytes": 40e6,
                "memory_capacity_bytes": 40e9, "memory_Bps": 1.555e12, "sm_count": 108},
        topology={"kind": "hierarchical", "link_Bps": 300e9, "hop_latency_s": 500e-9,
                  "nodes": 2, "devices_per_node": 8, "inter_Bps": 50e9 / 8,
                  "inter_latency_s": 10e-6},
    ),
    # Fig. 10's grey markers: one of the two AWS p4d nodes alone (8x A100-40GB, NVSwitch)
    "a100x8-40g": dict(
        family="gpu", description="1 node x 8 A100-SXM4-40GB on NVSwitch (002 Table 2, one "
        "node; Fig. 10 reference point)", source="002 Table 2, Fig. 10; NVIDIA A100 datasheet",
        num_devices=8,
        device={"peak_flops": {"bf16": 312e12}, "onchip_buffer_bytes": 40e6,
                "memory_capacity_bytes": 40e9, "memory_Bps": 1.555e12, "sm_count": 108},
        # latency as the catalog's a100x8-nvswitch (500 ns, assumed there): only memory differs
        topology={"kind": "switch", "link_Bps": 300e9, "hop_latency_s": 500e-9},
    ),
}


def platform(name: str | Platform) -> Platform:
    """A platform from the catalog, or the built-in 002 spec of the same name."""
    if isinstance(name, Platform):
        return name
    try:
        return load_platform(name)
    except UnknownNameError:
        if name in _A100:
            return parse_platform(_A100[name], "moejax/systems/amoe/serve.py", name)
        raise


def streams(key, *, num_streams: int, num_requests: int, rate_per_s: float,
            workload: str = "medium"):
    """Poisson request streams of a 002 §5 workload (`trace.requests.request_stream`)."""
    return requests.request_stream(key, num_streams=num_streams, num_requests=num_requests,
                                   rate_per_s=rate_per_s, workload=workload)


def build(hardware, model, policy, num_requests: int, *, top_k: int | None = None,
          overrides: dict | None = None):
    """(System, params, Policy) of a stream-serving policy; `overrides` replace options."""
    p = platform(hardware)
    m = load_model(model) if isinstance(model, str) else model
    pol = load_policy(policy) if isinstance(policy, str) else policy
    if pol.system not in STREAM_SYSTEMS:
        raise UnknownNameError("stream-serving policy system", pol.system, STREAM_SYSTEMS)
    opts = dict(pol.options)
    if top_k:
        opts["top_k"] = int(top_k)
    opts.update(overrides or {})
    pol = dataclasses.replace(pol, options=tuple(sorted(opts.items())))
    system, params = SYSTEMS[pol.system].from_policy(p, m, pol.options_table(), num_requests)
    return system, params, pol


def simulate(hardware, model: str | ModelSpec, policy: str | Policy, *, rate_per_s: float,
             workload: str = "medium", num_streams: int = 1, num_requests: int = 256,
             top_k: int | None = None, seed: int = 0, overrides: dict | None = None,
             chunk_steps: int = 2048, progress=None) -> dict[str, np.ndarray]:
    """Per-stream metrics (leading [T] axis) as NumPy arrays; `progress(text)` hears how far
    the run is (see `runner.run_streams`)."""
    system, params, _ = build(hardware, model, policy, num_requests, top_k=top_k,
                              overrides=overrides)
    k_stream, k_sim = jax.random.split(jax.random.key(seed))
    st = streams(k_stream, num_streams=num_streams, num_requests=num_requests,
                 rate_per_s=rate_per_s, workload=workload)
    out = runner.run_streams(system, params, st, k_sim, chunk_steps=chunk_steps,
                             progress=progress)
    return jax.tree_util.tree_map(np.asarray, out)
