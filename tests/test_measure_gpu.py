"""benchmarks/measure_gpu.py: the smoke mode runs in seconds without a GPU, and its MoE layer
computes what a plain per-token reference computes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

_spec = importlib.util.spec_from_file_location(
    "measure_gpu", Path(__file__).resolve().parents[1] / "benchmarks" / "measure_gpu.py")
measure_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(measure_gpu)


def test_smoke_mode_writes_table_and_says_so(tmp_path, capsys):
    assert measure_gpu.main(["--smoke", "--repeat", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "smoke mode" in out and "ratios mean nothing" in out
    csv = (tmp_path / "measure_gpu.csv").read_text().splitlines()
    assert csv[0] == "what,shape,measured_s,moejax_s,ratio,gpu"
    assert len(csv) == 1 + 2 + 2 + 1 + 1 and all(line.endswith(",0") for line in csv[1:])
    assert "| measurement |" in (tmp_path / "measure_gpu.md").read_text()


def test_moe_layer_matches_reference():
    e, h, i, k, t = 4, 8, 6, 2, 5
    ks = jax.random.split(jax.random.PRNGKey(1), 4)
    x = jax.random.normal(ks[0], (t, h))
    router = jax.random.normal(ks[1], (h, e))
    w_up = jax.random.normal(ks[2], (e, h, 2 * i))
    w_down = jax.random.normal(ks[3], (e, i, h))
    got = measure_gpu.moe_layer_fn(k)(x, router, w_up, w_down)
    scores, idx = jax.lax.top_k(x @ router, k)
    weights = jax.nn.softmax(scores, axis=-1)
    want = np.zeros((t, h))
    for n in range(t):
        for j in range(k):
            g, u = jnp.split(x[n] @ w_up[idx[n, j]], 2)
            want[n] += weights[n, j] * np.asarray((jax.nn.silu(g) * u) @ w_down[idx[n, j]])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
