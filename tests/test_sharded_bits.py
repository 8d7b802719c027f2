"""Sharded == single device, bit for bit: every output column of a run on 4 host devices
(the traces split 16 per device) equals the run on one device (64 traces in one call)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

RUN = """
import sys
import jax, numpy as np
from moejax import api
from moejax.trace import gen
res = {}
# (platform, model, policy, iterations, layers, tokens): the CLI's default run (`moejax
# simulate`), whose forward time differed in its last bit (a product fused into a sum);
# EP over several iterations, whose per-device compute time and utilization did (a sum of
# per-expert times, a vector divided by a scalar); DeepEP's per-port byte means (the same)
CASES = (("chiplet-2x2", "qwen3-30b-a3b", "ep", 1, 1, 256),
         ("dgx-h100", "phi-3.5-moe", "ep", 3, 1, 32),
         ("gh200-nvl8", "dysharp-s", "deepep", 3, 2, 64))
for hw, model, policy, iters, layers, tokens in CASES:
    m = api.resolve(hw, model, policy).model
    tr = gen.generate("powerlaw:alpha=1.2", jax.random.key(0), num_traces=64, iterations=iters,
                      layers=layers, tokens=tokens, num_experts=m.num_experts, top_k=m.top_k)
    out = api.simulate(hw, model, policy, tr, key=jax.random.key(1))
    res.update({f"{hw}/{policy}/{k}": v for k, v in out.items()})
print(jax.device_count())
np.savez(sys.argv[1], **res)
"""


def test_four_host_devices_equal_one_device_bit_for_bit(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = {}
    for n in (1, 4):
        env = dict(os.environ, JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        path = tmp_path / f"{n}.npz"
        r = subprocess.run([sys.executable, "-c", RUN, str(path)], env=env, cwd=root,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and r.stdout.split()[0] == str(n), r.stderr[-2000:]
        out[n] = dict(np.load(path))
    assert out[1].keys() == out[4].keys()
    for k, v in out[1].items():
        np.testing.assert_array_equal(out[4][k], v, err_msg=k)
