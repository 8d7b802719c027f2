"""Engine: determinism, sharded == single device, batch errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from moejax.errors import MoejaxError
from moejax.runner import engine


def test_batch_size_disagreement_is_an_error():
    with pytest.raises(MoejaxError, match="leading"):
        engine.batch_size({"a": np.zeros(3), "b": np.zeros(4)})


def test_percentile_summary():
    s = engine.percentile_summary(np.arange(101.0))
    assert s["mean"] == 50 and s["p50"] == 50 and s["p99"] == 99 and s["max"] == 100


SHARDED = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
    import jax, numpy as np
    from conftest import make_model, make_platform, random_trace
    from moejax.runner import engine
    from moejax.systems import ep
    assert jax.device_count() == 2, jax.devices()
    cfg = ep.make_config(make_platform("mesh2d"), make_model())
    system, params = ep.build(cfg, 2), ep.default_params(cfg)
    tr = random_trace(jax.random.key(0), 4, 2, 1, 16, 16, 2)
    sharded = engine.simulate(system, params, tr)["latency_s"]
    assert len(sharded.sharding.device_set) == 2, sharded.sharding
    single = jax.vmap(lambda t: engine.run_one(system, params, t, jax.random.key(0)))(tr)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(single["latency_s"]), rtol=1e-6)
    print("OK")
""")


def test_sharded_over_two_devices_equals_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", SHARDED], env=env, cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU default chunk")
def test_default_chunk_caps_trace_bytes_per_call_on_cpu():
    small = {"ids": np.zeros((8, 256, 8), np.int32)}  # 8 kB per trace: the count default
    assert engine.default_chunk(small) == engine.default_chunk() == engine.DEFAULT_CHUNK["cpu"]
    big = {"ids": np.zeros((4, 2**18), np.int32), "mask": np.zeros((4,), bool)}  # ~1 MB
    chunk = engine.default_chunk(big)
    assert chunk == 16 and chunk * 4 * 2**18 <= engine.CPU_CHUNK_BYTES
    huge = {"ids": np.zeros((2, 2**23), np.int32)}  # 32 MB per trace: one per call
    assert engine.default_chunk(huge) == 1


def test_a_system_sets_its_own_accelerator_chunk(monkeypatch):
    """On an accelerator a system's `accelerator_chunk` replaces the engine's default (EP:
    larger calls; the wafer layer: smaller, for XLA's compile time); CPU ignores it."""
    def system(chunk):
        return engine.System("s", None, None, None, 1, accelerator_chunk=chunk)

    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert engine.default_chunk(None, system(65536)) == engine.DEFAULT_CHUNK["cpu"]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert engine.default_chunk(None, system(None)) == engine.DEFAULT_CHUNK_ACCELERATOR
    assert engine.default_chunk(None, system(65536)) == 65536
    assert engine.default_chunk({"ids": np.zeros((2, 8))}, system(4096)) == 4096


def test_resident_batch_is_sliced_on_its_device_with_the_same_results(monkeypatch):
    """A batch already on an accelerator is sliced there (one compiled slice for every
    offset, a short last chunk included), with the results of host slicing. CPU stands in
    for the accelerator here."""
    from moejax.catalog.hardware import load_platform
    from moejax.catalog.models import load_model
    from moejax.systems import ep
    from moejax.trace import gen

    model = load_model("qwen3-30b-a3b")
    cfg = ep.make_config(load_platform("chiplet-2x2"), model)
    system, params = ep.build(cfg, 1), ep.default_params(cfg)
    tr = gen.generate("powerlaw:alpha=1.2", jax.random.key(3), num_traces=5, iterations=1,
                      layers=1, tokens=16, num_experts=model.num_experts, top_k=model.top_k)
    host = engine.simulate(system, params, tr, chunk_size=2, progress=False)
    monkeypatch.setattr(engine, "_on_accelerator", lambda traces: True)
    dev = engine.simulate(system, params, tr, chunk_size=2, progress=False)
    for k in host:
        np.testing.assert_array_equal(np.asarray(dev[k]), np.asarray(host[k]), err_msg=k)


def _counter(num_steps: int) -> engine.System:
    """A system run until done: member t counts up by params until its input target."""
    import jax.numpy as jnp

    def finish(p, s, outs):
        assert outs is None  # segments of unknown number: no stacked outputs
        return {"n": s["n"]}

    return engine.System(
        "count", init=lambda p, x, key: {"n": jnp.int32(0), "target": x},
        step=lambda p, s, t: ({"n": s["n"] + p, "target": s["target"]}, None),
        finish=finish, num_steps=num_steps, is_done=lambda s: s["n"] >= s["target"])


def test_run_until_done_in_segments_with_per_member_params():
    """A system with `is_done` runs segments of `num_steps` steps until every member is
    done, with the same result for every segment length; a done member is frozen; params
    may carry the batch axis; a member not done after `max_steps` is one error."""
    targets = np.array([0, 3, 10, 7], np.int32)
    for num_steps in (1, 4, 64):
        out = engine.simulate(_counter(num_steps), np.int32(1), targets)
        np.testing.assert_array_equal(np.asarray(out["n"]), targets)
    out, state = engine.simulate(_counter(4), np.array([1, 2, 3, 4], np.int32), targets,
                                 params_batched=True, return_state=True)
    np.testing.assert_array_equal(np.asarray(out["n"]), [0, 4, 12, 8])
    np.testing.assert_array_equal(np.asarray(state["target"]), targets)
    with pytest.raises(MoejaxError, match="max_steps = 4"):
        engine.simulate(_counter(2), np.int32(1), targets, max_steps=4)
