"""DySHARP's unicast baselines under the `comm_kernel` option: nccl is today's port model
unchanged, DeepEP's normal and low-latency kernels price one hand-computed layer as their
published time models say, and meaningless combinations are one-line exit-2 errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model, with_overrides
from moejax.errors import ConfigError
from moejax.systems.dysharp import system as dys
from moejax.systems.dysharp.config import DyParams, contiguous_placement, make_config

G, E = 8, 16  # two experts per GPU (contiguous placement: expert e on GPU e // 2)
# DeepEP profile constants, restated from the DeepEP README calibration (physics.internode):
NVL_EFF, NORMAL_FIXED_S, LL_FIXED_S = 0.69, 16e-6, 22e-6


@pytest.fixture(scope="module")
def setup():
    platform = load_platform("gh200-nvl8")
    model = with_overrides(load_model("dysharp-s"), num_experts=E, top_k=3)
    # token n (owned by GPU n) picks one expert of its own GPU and both of GPU n + 1's
    ids = np.array([[2 * n, 2 * ((n + 1) % G), 2 * ((n + 1) % G) + 1] for n in range(G)],
                   np.int32)
    counts = np.bincount(ids.ravel(), minlength=E).astype(np.float32)
    return platform, model, jnp.asarray(ids), jnp.ones(G, bool), jnp.asarray(counts)


def _layer(setup, **kw):
    platform, model, ids, mask, counts = setup
    cfg = make_config(platform, model, schedule="serial", **kw)
    # tau a Python 0.0: the exact layer without its `lax.cond`, which an eager call compiles
    # anew (both branches) every time
    params = DyParams(placement=jnp.asarray(contiguous_placement(E, G)), tau=0.0)
    return {k: float(v) for k, v in dys.moe_layer(cfg, params, ids, mask, counts).items()
            if jnp.ndim(v) == 0}


def test_default_is_nccl_bit_identical(setup):
    for prim in ("unicast_pair", "unicast_rank"):
        assert _layer(setup, primitive=prim) == _layer(setup, primitive=prim,
                                                       comm_kernel="nccl")


@pytest.mark.parametrize("prim,remote", [("unicast_pair", 2), ("unicast_rank", 1)])
@pytest.mark.parametrize("kernel", ["deepep_normal", "deepep_low_latency"])
def test_kernel_phase_times_hand_computed(setup, prim, remote, kernel):
    """Every GPU sends `remote` copies to its neighbour and keeps 1 local: both DeepEP
    kernels see one node (a switch platform), so no NIC term. Normal: fixed + hop latency +
    busiest NVLink port at 0.69 of link_Bps; low latency: fixed + the same NVLink term + the
    receiver's HBM read + write of everything it got (remote + local)."""
    platform, model = setup[0], setup[1]
    top = platform.topology
    tb = model.hidden_size * 2.0  # BF16 token vector
    nvl = remote * tb / (top.link_Bps * NVL_EFF)
    if kernel == "deepep_normal":
        phase = NORMAL_FIXED_S + top.hop_latency_s + nvl
    else:
        phase = LL_FIXED_S + nvl + 2.0 * (remote + 1) * tb / platform.device.memory_Bps
    base = _layer(setup, primitive=prim)
    got = _layer(setup, primitive=prim, comm_kernel=kernel)
    assert got["comm_s"] == pytest.approx(2 * phase, rel=1e-5)
    # serial schedule: the GEMMs are untouched, the layer moves by the comm difference
    assert got["gemm_s"] == base["gemm_s"]
    assert got["latency_s"] - base["latency_s"] == pytest.approx(
        got["comm_s"] - base["comm_s"], rel=1e-4)
    # nccl's phase at the platform's measured unicast rate, for the direction of the change
    nccl = remote * tb / (top.link_Bps * top.protocol_efficiency) + top.hop_latency_s
    assert base["comm_s"] == pytest.approx(2 * nccl, rel=1e-5)
    assert (got["comm_s"] > base["comm_s"]) == (phase > nccl)


@pytest.mark.parametrize("kw,word", [
    ({"primitive": "dymultimem", "comm_kernel": "deepep_normal"}, "unicast"),
    ({"primitive": "nvls", "comm_kernel": "deepep_low_latency"}, "unicast"),
    ({"primitive": "unicast_rank", "schedule": "fused", "comm_kernel": "deepep_normal"},
     "fused"),
    ({"primitive": "unicast_rank", "comm_kernel": "rdma"}, "allowed"),
])
def test_bad_combinations_raise(setup, kw, word):
    with pytest.raises(ConfigError, match=word):
        make_config(setup[0], setup[1], **kw)


@pytest.mark.parametrize("opts", ['primitive = "dymultimem"\ncomm_kernel = "deepep_normal"',
                                  'primitive = "unicast_rank"\ncomm_kernel = "rdma"'])
def test_cli_bad_comm_kernel_is_one_line_exit_2(capsys, tmp_path, opts):
    from moejax.cli.main import main

    pol = tmp_path / "p.toml"
    pol.write_text(f'system = "dysharp"\ndescription = "t"\nsource = "t"\n[options]\n{opts}\n')
    rc = main(["simulate", "--hardware", "gh200-nvl8", "--model", "dysharp-s", "--policy",
               str(pol), "--traces", "1", "--tokens", "64", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "comm_kernel" in err
    assert not (tmp_path / "o").exists()
