"""`moejax reproduce fsedp`: params sweeps == per-point runs, claim rules, CLI errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model, make_platform, random_trace

from moejax.cli import main as cli
from moejax.reproduce import fsedp as study
from moejax.reproduce import fsedp_claims as claims
from moejax.runner import engine
from moejax.systems import fsedp

BUF = 4e5


def _system(**kw):
    plat = make_platform("mesh2d", **kw)
    cfg = fsedp.make_config(plat, make_model(num_experts=8, top_k=2), ablation="A3",
                            weight_buffer_bytes=BUF)
    return plat, cfg, fsedp.build(cfg, 1)


def test_design_space_sweep_equals_per_point_runs():
    _, _, system = _system()
    tr = random_trace(jax.random.key(0), 3, 1, 1, 12, 8, 2)
    pts = [fsedp.FSEDPParams(num_microslices=jnp.float32(m), ddr_Bps=jnp.float32(d),
                             link_Bps=jnp.float32(lk), weight_buffer_bytes=jnp.float32(b))
           for m, d, lk, b in ((4.0, 12.8e9, 64e9, BUF), (6.0, 51.2e9, 512e9, 2 * BUF))]
    swept = engine.simulate(system, engine.stack_params(pts), tr, sweep=True)
    assert swept["latency_s"].shape == (2, 3)
    for i, p in enumerate(pts):
        one = engine.simulate(system, p, tr)
        np.testing.assert_allclose(swept["latency_s"][i], one["latency_s"], rtol=1e-6)
        np.testing.assert_allclose(swept["utilization_mean"][i], one["utilization_mean"],
                                   rtol=1e-6)
    # more DDR and D2D bandwidth and a larger buffer never make the layer slower here
    assert np.all(swept["latency_s"][1] < swept["latency_s"][0])


def test_params_bandwidth_equals_platform_bandwidth():
    """FSEDPParams.ddr_Bps / link_Bps / weight_buffer_bytes == the same values as config."""
    plat, cfg, system = _system()
    tr = random_trace(jax.random.key(1), 2, 1, 1, 12, 8, 2)
    dev = dataclasses.replace(plat.device, memory_Bps=40e9)
    plat2 = dataclasses.replace(plat, device=dev)
    cfg2 = fsedp.make_config(plat2, cfg.model, ablation="A3", weight_buffer_bytes=2 * BUF)
    base = fsedp.FSEDPParams(num_microslices=jnp.float32(4.0))
    want = engine.simulate(fsedp.build(cfg2, 1), base, tr)
    got = engine.simulate(system, dataclasses.replace(
        base, ddr_Bps=jnp.float32(40e9), weight_buffer_bytes=jnp.float32(2 * BUF)), tr)
    np.testing.assert_allclose(got["latency_s"], want["latency_s"], rtol=1e-6)
    assert np.all(np.asarray(got["latency_s"]) > 0)


def test_padded_traces_mark_each_points_tokens():
    tr = study.traces_for("qwen3-30b-a3b", (16, 64), traces=2, layers=1)
    real = np.asarray(tr.token_mask).sum(-1)[:, 0]
    assert real.tolist() == [16, 16, 64, 64]
    assert np.asarray(tr.counts).sum(-1)[:, 0, 0].tolist() == [128, 128, 512, 512]


def _f17_rows(lat):
    ms = [2.0, 4.0, 8.0, 16.0, 32.0]
    return {"model": ["qwen3-30b-a3b"] * 5 + ["phi-3.5-moe"],
            "buffer_mb": [40.0] * 5 + [99.0], "num_microslices": ms + [4.0],
            "latency_s": lat + [0.0]}


def test_microslice_claim_needs_an_interior_minimum_below_10():
    assert claims.fig17_claim(_f17_rows([3.0, 1.0, 2.0, 4.0, 5.0])).holds
    assert not claims.fig17_claim(_f17_rows([5.0, 4.0, 3.0, 2.0, 1.0])).holds  # monotone
    assert not claims.fig17_claim(_f17_rows([5.0, 4.0, 3.0, 1.0, 2.0])).holds  # best 16
    # with the transfer-overhead rows at the claim buffer, those decide
    rows = _f17_rows([5.0, 4.0, 3.0, 2.0, 1.0])
    rows["overhead"] = ["ctrl 0.5us"] * 6
    primary = next(iter(claims.OVERHEAD_READINGS))
    for m, v in zip([2.0, 4.0, 8.0, 16.0], [3.0, 1.0, 2.0, 4.0], strict=True):
        for k, x in (("model", "qwen3-30b-a3b"), ("buffer_mb", claims.CLAIM_BUFFER_MB),
                     ("num_microslices", m), ("latency_s", v), ("overhead", primary)):
            rows[k].append(x)
    c = claims.fig17_claim(rows)
    assert c.holds and c.simulated["best"] == 4.0
    assert not c.simulated["by_reading"]["ctrl 0.5us"]["holds"]


def test_speedup_claims_from_rows():
    rows = {"model": [], "tokens": [], "system": [], "latency_s": [], "onchip_bytes": [],
            "needed_bytes": []}
    for mname in claims.MODELS:
        for t in claims.TOKENS:
            for s, lat in (("EP", 2.0), ("Hydra", 1.5), ("FSE-DP", 1.0),
                           ("FSE-DP+paired", 0.8 if t <= 64 else 1.0)):
                rows["model"].append(mname)
                rows["tokens"].append(t)
                rows["system"].append(s)
                rows["latency_s"].append(lat)
                rows["onchip_bytes"].append(10e6 if s.startswith("FSE") else 50e6)
                rows["needed_bytes"].append(10e6 if s.startswith("FSE") else 50e6)
    got = {c.id: c for c in claims.fig9_claims(rows)}
    ep = got["fsedp.speedup_vs_ep"].simulated
    assert ep["min"] == pytest.approx(2.0) and ep["max"] == pytest.approx(2.5)
    assert got["fsedp.speedup_vs_ep"].holds
    assert got["fsedp.paired_load_low_tokens"].holds
    assert got["fsedp.onchip_memory_vs_ep"].holds  # 10 MB, ratio 5


def test_cli_reproduce_rejects_unknown_flag_and_study(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["reproduce", "fsedp", "--bogus", "--out", "x"])
    assert e.value.code == 2
    assert cli.main(["reproduce", "no-such-study", "--quick", "--out", "x"]) == 2
    assert "study" in capsys.readouterr().err


def test_cli_reproduce_only_rejects_an_unknown_figure_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["reproduce", "fsedp", "--quick", "--out", str(out),
                     "--only", "fig9_layer_latency,fig99"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "fig99" in err and "fig18_scaling" in err  # names the known figures
    assert not out.exists()  # nothing started


def test_study_is_data():
    names = study.STUDY.figure_names()
    assert names == ["fig9_layer_latency", "fig12_onchip_memory", "fig15_ablation",
                     "fig16_design_space", "fig17_microslices", "fig18_scaling"]
    assert study.STUDY.grid(True) is study.QUICK and study.STUDY.grid(False) is study.FULL
    assert [f.name for f in study.STUDY.select(["fig18_scaling", "fig9_layer_latency"])] == [
        "fig9_layer_latency", "fig18_scaling"]  # the study's order, not the caller's
