"""One platform prices the same traffic matrix the same way in every system that moves it.

The all-to-all of `physics.comm` is the reference; EP (and so rebalancing and EPLB, which
run on EP's layer), EPS-MoE, DySHARP's unicast baselines (its "measured" link model) and the
wafer system's link-load phase must give the same seconds for the same bytes on the same
calibrated platform.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.cli.main import main
from moejax.errors import ConfigError
from moejax.physics import calibration, comm
from moejax.systems import ep
from moejax.systems.dysharp import schedule
from moejax.systems.dysharp import system as dysystem
from moejax.systems.dysharp.config import make_config as dy_config
from moejax.systems.epsmoe import layer as epslayer
from moejax.systems.epsmoe.config import make_config as eps_config
from moejax.systems.wafer import traffic as wtraffic


def _traffic(d: int, seed: int = 0) -> jnp.ndarray:
    """A skewed traffic matrix [D, D] of bytes, some pairs idle."""
    rng = np.random.default_rng(seed)
    t = rng.lognormal(16.0, 1.0, (d, d)) * (rng.random((d, d)) > 0.2)
    return jnp.asarray(t, jnp.float32)


def _dysharp_phases(platform, model, t):
    """DySHARP's deepep baseline (unicast per rank, serial): dispatch and combine seconds of
    port loads taken from the traffic matrix `t` (bytes)."""
    cfg = dy_config(platform, model, primitive="unicast_rank", schedule="serial")
    off = t * (1.0 - jnp.eye(t.shape[0]))
    loads = jnp.stack([off.sum(-1), off.sum(-2), off.T.sum(-1), off.T.sum(-2)])
    wire = loads / dysystem.efficiency(cfg)
    return schedule.phase_times_s(wire, platform.topology.link_Bps, cfg.latency_s)


@pytest.mark.parametrize("name", ["dgx-h100", "h800x8"])
def test_same_traffic_same_time_on_a_switch(name):
    plat = load_platform(name)
    assert not calibration.is_ideal(plat)  # the physical, calibrated reading
    t = _traffic(plat.num_devices)
    ref = float(comm.alltoall_time_s(t, plat))
    ref_t = float(comm.alltoall_time_s(t.T, plat))
    model = load_model("deepseek-v2")
    cfg = ep.make_config(plat, model)
    assert float(ep.comm_time_s(cfg, t)) == ref
    ecfg = eps_config(plat, model)
    assert float(epslayer.a2a_s(ecfg, t)) == ref
    busy, lat, _ = wtraffic.phase_parts(t, cfg.topo)
    assert float(busy + lat) == ref
    cd, cc = _dysharp_phases(plat, model, t)
    assert float(cd) == pytest.approx(ref, rel=1e-6)
    assert float(cc) == pytest.approx(ref_t, rel=1e-6)


def test_same_traffic_same_time_on_a_mesh():
    plat = load_platform("wsc-4x4")
    t = _traffic(plat.num_devices, 1)
    ref = float(comm.alltoall_time_s(t, plat))
    cfg = ep.make_config(plat, load_model("qwen3-30b-a3b"))
    assert float(ep.comm_time_s(cfg, t)) == ref
    busy, lat, _ = wtraffic.phase_parts(t, cfg.topo)
    assert float(busy + lat) == ref


def test_paper_reading_is_the_ideal_link():
    """The studies' reading: 100% of link_Bps, no SM limit; DySHARP's packet model 80%."""
    plat = calibration.paper_platform("dgx-h100")
    assert calibration.is_ideal(plat)
    t = _traffic(8)
    off = t * (1.0 - jnp.eye(8))
    busiest = float(jnp.maximum(off.sum(-1), off.sum(-2)).max())
    expect = busiest / plat.topology.link_Bps + plat.topology.hop_latency_s
    assert float(comm.alltoall_time_s(t, plat)) == pytest.approx(expect, rel=1e-6)
    model = load_model("deepseek-v2")
    packet = dy_config(plat, model, primitive="unicast_rank", link_model="packet")
    assert dysystem.efficiency(packet) == pytest.approx(0.8)


def test_calibration_rows():
    """The two calibration measurements (docs/physics.md): nccl-tests all-to-all on 4 x H100
    (1,174.14 us) and DeepEP normal intranode dispatch on 8 x H800, 24 SMs (153 GB/s)."""
    nvl4 = load_platform("gh200-nvl4")
    t = jnp.full((4, 4), 524288000 / 4, jnp.float32)
    assert float(comm.alltoall_time_s(t, nvl4)) * 1e6 == pytest.approx(1174.14, rel=0.01)
    h800 = load_platform("h800x8")
    v = 1e9  # logical bytes, 1/8 of them local (DeepEP counts them)
    t = jnp.full((8, 8), v / 8, jnp.float32)
    gbps = v / float(comm.alltoall_time_s(t, h800, sms=24)) / 1e9
    assert gbps == pytest.approx(153.0, rel=0.01)
    # more SMs than the link needs: the link's protocol efficiency is the bound
    assert float(comm.alltoall_time_s(t, h800, sms=132)) == float(comm.alltoall_time_s(t, h800))


def test_sm_limited_kernel_and_fixed_costs():
    """A kernel on S SMs moves at most S x sm_comm_Bps; messages and kernels add their cost."""
    plat = load_platform("h800x8").with_overrides(message_latency_s=1e-6, kernel_latency_s=5e-6)
    t = _traffic(8, 2)
    base = load_platform("h800x8")
    extra = float(comm.alltoall_time_s(t, plat)) - float(comm.alltoall_time_s(t, base))
    peers = int(((np.asarray(t) * (1 - np.eye(8))) > 0).sum(-1).max())
    assert extra == pytest.approx(peers * 1e-6 + 5e-6, rel=1e-4)
    slow = float(comm.alltoall_time_s(t, base, sms=1))
    off = np.asarray(t) * (1 - np.eye(8))
    per_dev = max(off.sum(-1).max(), off.sum(-2).max())
    assert slow == pytest.approx(per_dev / 5.58e9 + base.topology.hop_latency_s, rel=1e-5)


def test_unknown_kernel_is_one_line():
    with pytest.raises(ConfigError, match="comm_kernel = 'nope'; allowed: nccl, deepep_normal"):
        comm.alltoall_time_s(_traffic(4), load_platform("gh200-nvl4"), kernel_name="nope")
    with pytest.raises(ConfigError, match="comm_kernel"):
        ep.make_config(load_platform("h800x8"), load_model("deepseek-v2"), comm_kernel="nope")


def test_an_sm_limit_without_effect_is_refused():
    """comm_sms is an error where it would change nothing: a DeepEP kernel (no SM term) or a
    platform without a measured per-SM rate; it is taken where it applies."""
    h800, v2 = load_platform("h800x8"), load_model("deepseek-v2")
    with pytest.raises(ConfigError, match="comm_sms = 24: comm_kernel = 'deepep_normal'"):
        ep.make_config(h800, v2, comm_kernel="deepep_normal", comm_sms=24)
    with pytest.raises(ConfigError, match="hardware chiplet-2x2 states no"):
        ep.make_config(load_platform("chiplet-2x2"), load_model("qwen3-30b-a3b"), comm_sms=24)
    assert ep.make_config(h800, v2, comm_sms=24).comm_sms == 24


@pytest.mark.parametrize("key, value", [("protocol_efficiency", 1.5),
                                        ("protocol_efficiency", 0.0),
                                        ("gemm_efficiency", -0.1),
                                        ("grouped_gemm_derate", 2)])
def test_calibration_constant_outside_unit_interval(tmp_path, capsys, key, value):
    """A calibration share outside (0, 1]: one line naming file, table and key; exit 2."""
    src = load_platform("h800x8").path
    lines = open(src, encoding="utf-8").read().splitlines()
    lines = [f"{key} = {value}" if ln.partition("=")[0].strip() == key else ln for ln in lines]
    bad = tmp_path / "bad.toml"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"key '{key}' = .* must be in \\(0, 1\\]"):
        load_platform(str(bad))
    out = tmp_path / "out.json"
    assert main(["simulate", "--hardware", str(bad), "--model", "deepseek-v2", "--traces", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and key in err
    assert not out.exists()


def test_gemm_tile_schedules_small_m():
    """Small m: 8 tiles on 132 SMs. Data-parallel waves take one whole tile time; split-K
    (2) half of it; stream-K deals the 8 x 112 k-iterations over the SMs (7 / 112 of it)."""
    from moejax.physics import gemm

    k = 7168
    dp = gemm.GemmProfile()
    assert float(gemm.schedule_waves(8, 132, k, dp)) == 1.0
    sk = gemm.GemmProfile(tile_schedule="split_k", k_splits=2)
    assert float(gemm.schedule_waves(8, 132, k, sk)) == 0.5
    st = gemm.GemmProfile(tile_schedule="stream_k")
    assert float(gemm.schedule_waves(8, 132, k, st)) == pytest.approx(7 / 112)
    # a full machine gains nothing from either (264 tiles = 2 whole waves)
    for p in (sk, st):
        assert float(gemm.schedule_waves(264, 132, k, p)) == pytest.approx(2.0)
