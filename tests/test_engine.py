"""Engine: determinism, sharded == single device, batch errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from moejax import engine
from moejax.errors import MoejaxError


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
    from moejax import engine
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
