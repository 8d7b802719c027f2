"""`moejax validate`: every published row in its stated band, the DeepEP constants refit from
the calibration rows alone, the internode kernels against their closed forms, bad input."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.catalog.hardware import load_platform
from moejax.cli.main import main
from moejax.errors import ConfigError
from moejax.physics import internode
from moejax.validation import fit, predict, rows, table

ROWS = rows.load()


@pytest.fixture(scope="module")
def results():
    return {r["id"]: r for r in table.evaluate(ROWS)}


@pytest.mark.parametrize("m", ROWS, ids=lambda m: m.id)
def test_row_stays_in_its_stated_band(results, m):
    """A row stated "in" is within its band; a row stated "outside" (with its measured
    reason) is still outside, so fixing it means updating the table, not drifting silently."""
    r = results[m.id]
    deviation = abs(r["ratio"] - 1.0)
    if m.status == "in":
        assert deviation <= m.band, f"{m.id}: moejax / measured = {r['ratio']:.3f}"
    else:
        assert deviation > m.band, f"{m.id} is back in its band: set status = \"in\""


def test_rows_are_documented():
    assert len({m.id for m in ROWS}) == len(ROWS) >= 40
    kinds = {m.kind for m in ROWS}
    assert {"nccl_alltoall_time", "nccl_allreduce_busbw", "deepep_normal",
            "deepep_low_latency", "gemm_grouped", "moe_layer"} <= kinds
    for m in ROWS:
        assert m.source.startswith("https://") and m.config
        assert m.band <= 0.15  # the held-out target; no row loosened
    assert sum(m.role == "held-out" for m in ROWS) > 3 * sum(m.role == "calibration"
                                                             for m in ROWS)


def test_deepep_constants_are_the_calibration_fit():
    fitted = fit.fit_profile(ROWS)
    d = internode.DEFAULT_PROFILE
    assert fitted.nvl_efficiency == pytest.approx(d.nvl_efficiency, rel=0.01)
    assert fitted.rdma_efficiency == pytest.approx(d.rdma_efficiency, rel=0.01)
    assert fitted.ll_fixed_s == pytest.approx(d.ll_fixed_s, rel=0.03)


def test_fit_ignores_held_out_rows():
    held_moved = [dataclasses.replace(m, measured=m.measured * 3) if m.role == "held-out"
                  else m for m in ROWS]
    assert fit.fit_profile(held_moved) == fit.fit_profile(ROWS)


H800_2 = load_platform("h800-2node")


@pytest.mark.parametrize("ep", [8, 16, 32, 64])
def test_deepep_routing_matches_the_benchmarks_sampling(ep):
    """The closed-form hit probabilities equal DeepEP's test routing, sampled: scores
    |N(0, 1)| + 1, the top-min(nodes, 4) node groups by their best score, top-8 inside."""
    experts, topk, tokens = 256, 8, 20000
    nodes = max(ep // 8, 1)
    rng = np.random.default_rng(0)
    scores = np.abs(rng.standard_normal((tokens, experts))) + 1
    best = scores.reshape(tokens, nodes, -1).max(-1)
    groups = np.argsort(-best, axis=1)[:, :min(nodes, 4)]
    allowed = np.zeros((tokens, nodes), bool)
    np.put_along_axis(allowed, groups, True, axis=1)
    scores = np.where(np.repeat(allowed, experts // nodes, axis=1), scores, -np.inf)
    top = np.argsort(-scores, axis=1)[:, :topk]
    gpu_hit = np.mean([np.any(top // (experts // ep) == 0, axis=1)])
    node_hit = np.mean([np.any(top // (experts // nodes) == 0, axis=1)])
    r = predict.deepep_routing(ep, experts, topk)
    assert r.gpu_hit == pytest.approx(gpu_hit, abs=0.01)
    assert r.node_hit == pytest.approx(node_hit, abs=0.01)


def test_normal_single_node_is_nvlink_port_time():
    p = load_platform("h800x8")
    prof = internode.DEFAULT_PROFILE
    traffic = jnp.full((8, 8), 1e6)
    t = internode.deepep_normal_time_s(traffic, None, p)
    port = 7e6 / (p.topology.link_Bps * prof.nvl_efficiency)
    assert float(t) == pytest.approx(prof.normal_fixed_s + p.topology.hop_latency_s + port,
                                     rel=1e-5)


def test_normal_forwards_over_the_rail():
    """GPU 0 sends 1 MB to GPU 9 (node 1, local rank 1): RDMA to GPU 8 (rail 0), NVLink 8 -> 9."""
    traffic = jnp.zeros((16, 16)).at[0, 9].set(1e6)
    nvl = internode.forwarded_nvlink_bytes(traffic, H800_2)
    assert float(nvl[8, 9]) == 1e6 and float(nvl.sum()) == 1e6
    to_rail = jnp.zeros((16, 16)).at[0, 8].set(1e6)  # the rail GPU is the destination
    assert float(internode.forwarded_nvlink_bytes(to_rail, H800_2).sum()) == 0.0
    expected = np.zeros((16, 2))
    expected[0, 1] = 1e6  # GPU 0 -> node 1
    assert np.allclose(internode.node_bytes(traffic, H800_2), expected)


def test_low_latency_is_nic_bound_between_nodes():
    p, prof = H800_2, internode.DEFAULT_PROFILE
    traffic = jnp.zeros((16, 16)).at[:8, 8:].set(1e5).at[8:, :8].set(1e5)
    t = float(internode.deepep_low_latency_time_s(traffic, None, p))
    nic = 8e5 / (p.topology.inter_Bps * prof.rdma_efficiency)
    pack = 2 * 8e5 / p.device.memory_Bps
    assert t == pytest.approx(prof.ll_fixed_s + nic + pack, rel=1e-5)


@pytest.mark.parametrize("fn", [internode.deepep_normal_time_s,
                                internode.deepep_low_latency_time_s])
def test_kernels_vmap_and_jit(fn):
    xs = jax.random.uniform(jax.random.PRNGKey(0), (3, 16, 16)) * 1e6
    one = jnp.stack([fn(x, None, H800_2) for x in xs])
    batched = jax.jit(jax.vmap(lambda x: fn(x, None, H800_2)))(xs)
    assert np.allclose(one, batched, rtol=1e-6)
    assert np.allclose(fn(xs, None, H800_2), one, rtol=1e-6)


@pytest.mark.parametrize("gpu", ["h800", "h100"])
@pytest.mark.parametrize("nodes", [2, 4, 8, 32])
def test_multi_node_platforms(gpu, nodes):
    p = load_platform(f"{gpu}-{nodes}node")
    assert p.num_devices == 8 * nodes and internode.node_shape(p) == (nodes, 8)
    assert p.topology.inter_Bps == 50e9


def test_cli_writes_table_csv_and_plot(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["validate", "--only", "deepep-ll-ep1", "--out", str(out), "--check"]) == 0
    text = capsys.readouterr().out
    assert "deepep-ll-ep16-dispatch" in text and "calibration" in text
    csv = (out / "validation.csv").read_text().splitlines()
    assert csv[0].startswith("id,") and len(csv) == 1 + 4  # ep16, ep128 x dispatch, combine
    assert (out / "validation.png").stat().st_size > 10_000


@pytest.mark.parametrize("body,field", [
    ('[[row]]\nid = "x"\nkind = "nope"\n', "kind"),
    ('[[row]]\nid = "x"\nkind = "gemm_dense"\nplatform = "h800x8"\nparams = {m = 1}\n'
     'measured = 1.0\nunit = "us"\n', "unit"),
    ('[[row]]\nid = "x"\nkind = "gemm_dense"\nplatform = "h800x8"\nparams = {m = 1}\n'
     'measured = 1.0\nunit = "TFLOP/s"\nband = 2.0\n', "band"),
    ('[[row]]\nid = "x"\nkind = "gemm_dense"\nplatform = "h800x8"\nparams = {m = 1}\n'
     'measured = 1.0\nunit = "TFLOP/s"\nband = 0.1\nrole = "held-out"\nstatus = "outside"\n'
     'source = "https://x"\nconfig = "c"\n', "reason"),
])
def test_bad_measurements_file(tmp_path, capsys, body, field):
    f = tmp_path / "m.toml"
    f.write_text(body)
    with pytest.raises(ConfigError, match=field):
        rows.load(f)
    out = tmp_path / "never"
    assert main(["validate", "--measurements", str(f), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
    assert not out.exists()
