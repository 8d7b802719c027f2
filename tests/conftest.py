"""Shared fixtures: small platforms and models built in code (no catalog dependency)."""

from __future__ import annotations

import os

# No persistent compilation cache in the suite (a test that wants one sets it to a tmp dir):
# results must not depend on what an earlier run left in ~/.cache. Set before the CLI and
# any subprocess reads it.
os.environ["MOEJAX_COMPILATION_CACHE"] = "off"

import jax  # noqa: E402
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.catalog.hardware import parse_platform
from moejax.catalog.models import ModelSpec
from moejax.trace.core import Trace


def make_platform(kind="mesh2d", **topo):
    base = {
        "mesh2d": dict(rows=2, cols=2),
        "ring": {},
        "switch": {},
        "hierarchical": dict(nodes=2, devices_per_node=2, inter_Bps=25e9, inter_latency_s=2e-6),
        "multi_wafer_mesh": dict(rows=2, cols=2, wafer_rows=1, wafer_cols=2, border_Bps=100e9),
    }[kind]
    base.update(topo)
    n = {
        "mesh2d": base.get("rows", 0) * base.get("cols", 0),
        "multi_wafer_mesh": base.get("rows", 0) * base.get("cols", 0) * base.get("wafer_rows", 1)
        * base.get("wafer_cols", 1),
        "hierarchical": base.get("nodes", 0) * base.get("devices_per_node", 0),
    }.get(kind, base.pop("devices", 4))
    data = {
        "family": "chiplet",
        "description": "test",
        "source": "test",
        "num_devices": n,
        "device": {
            "peak_flops": {"bf16": 5e12},
            "onchip_buffer_bytes": 4e6,
            "memory_capacity_bytes": 8e9,
            "memory_Bps": 25.6e9,
        },
        "topology": {"kind": kind, "link_Bps": 288e9, "hop_latency_s": 4e-9, **base},
    }
    return parse_platform(data, "test.toml", f"test-{kind}")


def interrupt_at_second_part(monkeypatch):
    """Make `moejax.runner.stream` raise KeyboardInterrupt (Ctrl-C) when it encodes its 2nd Parquet
    part: a streamed run is cut after one whole part is written. Returns the real encoder,
    to put back for a resume."""
    from moejax.runner import stream

    real, calls = stream._parquet_bytes, []

    def ctrl_c_on_second_part(cols):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(cols)

    monkeypatch.setattr(stream, "_parquet_bytes", ctrl_c_on_second_part)
    return real


def make_model(num_experts=16, top_k=2, shared=0, **kw):
    args = dict(
        name="tiny", source="test", hidden_size=256, expert_ffn_size=128,
        num_experts=num_experts, top_k=top_k, num_shared_experts=shared,
        shared_ffn_size=128 if shared else 0, num_sparse_layers=4, num_layers=6,
        dense_ffn_size=512, num_heads=4, num_kv_heads=2, head_dim=64, attention_kind="GQA",
    )
    args.update(kw)
    return ModelSpec(**args)


def random_trace(key, t, i, l, n, e, k, valid=None) -> Trace:
    """Uniform top-k routing without replacement; `valid` tokens per iteration (else all).

    Drawn with NumPy, seeded by the key's bits: nothing is compiled per shape (a vmapped
    `jax.random.choice` compiled a shuffle, ~1 s, for every trace shape a test asked for)."""
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    ids = np.argsort(rng.random((t, i, l, n, e)), axis=-1)[..., :k].astype(np.int32)
    mask = np.ones((t, i, n), bool)
    if valid is not None:
        mask = np.arange(n)[None, None, :] < np.asarray(valid)[..., None]
    ids = np.where(mask[:, :, None, :, None], ids, -1).astype(np.int32)
    counts = (ids[..., None] == np.arange(e)).sum(axis=(-3, -2)).astype(np.float32)
    return Trace(
        expert_ids=jnp.asarray(ids),
        gate_weights=jnp.asarray(np.where(ids >= 0, np.float32(1.0 / k), np.float32(0.0))),
        token_mask=jnp.asarray(mask),
        token_request=jnp.asarray(-np.ones((t, i, n), np.int32)),
        counts=jnp.asarray(counts),
        num_experts=e,
        top_k=k,
    )


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_after_module():
    """Free each module's compiled executables when it ends: the suite's peak memory is the sum
    of every module's jit caches otherwise (measured 2.47 -> 1.46 GB over five modules)."""
    yield
    jax.clear_caches()
