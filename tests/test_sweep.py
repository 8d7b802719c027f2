"""`moejax sweep`: --vary parsing, one vmapped batch of design points == separate runs of
each point's platform, the CLI's tidy CSV / PNG, and bad input (one line, exit 2, nothing
written)."""

from __future__ import annotations

import csv

import jax
import numpy as np
import pytest

from moejax import api
from moejax.cli.main import main
from moejax.errors import ConfigError
from moejax.runner import sweep
from moejax.trace import gen

SMALL = ["--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b", "--policy", "ep",
         "--tokens", "16", "--traces", "4", "--quiet"]


@pytest.mark.parametrize("text, values", [
    ("link_Bps=1e9:4e9:4", (1e9, 2e9, 3e9, 4e9)),
    ("hop_latency_s=0:2e-6:3", (0.0, 1e-6, 2e-6)),
    ("memory_Bps=1:100:3log", (1.0, 10.0, 100.0)),
    ("num_microslices=8,16", (8.0, 16.0)),
    ("link_Bps=5e9:5e9:1", (5e9,)),
])
def test_parse_vary(text, values):
    v = sweep.parse_vary(text)
    np.testing.assert_allclose(v.values, values, rtol=1e-12)


@pytest.mark.parametrize("text", ["link_Bps", "link_Bps=", "=1:2:3", "link_Bps=1:2:0",
                                  "link_Bps=1:2", "link_Bps=a:b:3", "link_Bps=0:1e9:2",
                                  "hop_latency_s=-1:0:2", "link_Bps=,", "x=1:2:3log0"])
def test_parse_vary_rejects(text):
    with pytest.raises(ConfigError, match="--vary"):
        sweep.parse_vary(text)


def test_grid_is_the_cartesian_product():
    g = sweep.grid([sweep.Vary("a", (1.0, 2.0)), sweep.Vary("b", (3.0, 4.0, 5.0))])
    assert list(zip(g["a"], g["b"], strict=True)) == [(1, 3), (1, 4), (1, 5), (2, 3), (2, 4),
                                                       (2, 5)]
    with pytest.raises(ConfigError, match="each key once"):
        sweep.grid([sweep.Vary("a", (1.0,)), sweep.Vary("a", (2.0,))])


def test_cli_sweep_of_traced_platform_values_equals_a_separate_run(tmp_path):
    """Link bandwidth and hop latency traced into EP's build (one vmapped call, the CLI's
    tidy CSV and PNG) give the metrics of a separate run on a platform built with them."""
    out = tmp_path / "sw"
    assert main(["sweep", *SMALL, "--vary", "link_Bps=20e9,300e9", "--vary",
                 "hop_latency_s=5e-6", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert len(rows) == 2 and {"link_Bps", "hop_latency_s", "latency_s_mean", "latency_s_p50",
                               "latency_s_p99", "comm_s_mean"} <= set(rows[0])
    assert (out / "sweep.png").stat().st_size > 1000 and (out / "summary.json").exists()
    assert float(rows[0]["comm_s_mean"]) > float(rows[1]["comm_s_mean"])  # slower links
    setup = api.resolve("chiplet-2x2", "qwen3-30b-a3b", "ep")
    m, key = setup.model, jax.random.key(0)  # the CLI's default seed and generator
    tr = gen.generate(gen.parse_spec("powerlaw:alpha=1.2"), key, num_traces=4, iterations=1,
                      layers=1, tokens=16, num_experts=m.num_experts, top_k=m.top_k)
    p = setup.platform.with_overrides(link_Bps=20e9, hop_latency_s=5e-6)
    ref = sweep.summarize({"x": np.zeros(1)}, {k: v[None] for k, v in api.simulate(
        p, m, setup.policy, tr, key=key).items() if np.ndim(v) == 1})
    for k in ("latency_s_mean", "latency_s_p50", "latency_s_p99", "comm_s_mean"):
        np.testing.assert_allclose(float(rows[0][k]), ref[k][0], rtol=1e-5, err_msg=k)


@pytest.mark.parametrize("vary, field", [
    ("link_Bps=1:2:0", "empty range"),
    ("link_Bps=1e9:2e9", "KEY=LO:HI:N"),
    ("bogus_key=1:2:2", "allowed keys: "),
])
def test_cli_bad_vary_is_one_line_and_writes_nothing(vary, field, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(["sweep", *SMALL, "--vary", vary, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err
    assert not out.exists()
    if field == "allowed keys: ":
        assert "link_Bps" in err and "hop_latency_s" in err  # EP traces every platform key


def test_cli_pn_over_a_fixed_chunk_assignment_is_refused(tmp_path, capsys):
    """EPS-MoE: a policy's chunk_assignment holds ids for its own pn; a pn sweep over it
    would count GEMMs of chunks that get no all2all, so it is refused in one line."""
    pol = tmp_path / "eps.toml"
    pol.write_text('system = "epsmoe"\ndescription = "t"\nsource = "t"\n'
                   '[options]\nmode = "tp-ep"\npn = 2\n'
                   'chunk_assignment = [[0, 1], [1, 0], [0, 1], [1, 0]]\n')
    out = tmp_path / "bad"
    args = ["sweep", "--hardware", "h800x4", "--model", "mixtral-8x7b", "--policy", str(pol),
            "--tokens", "16", "--traces", "2", "--quiet", "--out", str(out)]
    assert main([*args, "--vary", "pn=1,2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "chunk_assignment" in err, err
    assert not out.exists()
    assert main([*args, "--vary", "assign=0,1"]) == 2  # tuning-only fields are not design keys
    assert "allowed keys: " in capsys.readouterr().err


SERVE = ["--hardware", "a100x8-nvswitch", "--model", "mixtral-8x7b", "--workload", "short",
         "--streams", "2", "--requests", "4", "--quiet"]


@pytest.mark.parametrize("policy, vary", [
    ("aep-defrag", ["--vary", "rate=100,400", "--vary", "link_Bps=1e9,300e9"]),
    ("ep-sync", ["--rate", "200", "--vary", "link_Bps=1e9,300e9"]),
])
def test_serving_sweep_rows_equal_separate_runs(policy, vary, tmp_path):
    """AMoE in `moejax sweep` (002 §5 request streams): one row per design point (a PNG
    too); 1 GB/s links give a slower mean ITL than 300 GB/s at every rate; and an AEP row
    (every point in one vmapped rounds call, Consts batched) equals `moejax simulate`'s
    serving run of that point's platform and rate (the same streams: the sweep's seed)."""
    from moejax.runner import engine
    from moejax.systems.amoe import serve
    from moejax.systems.amoe.config import p99_from_hist

    out = tmp_path / "sw"
    assert main(["sweep", *SERVE, "--policy", policy, *vary, "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert (out / "sweep.png").stat().st_size > 1000
    assert all(r["all_done"] == "True" for r in rows)
    for slow, fast in zip(rows[::2], rows[1::2], strict=True):  # 1 vs 300 GB/s, same rate
        assert float(slow["itl_mean_s"]) > float(fast["itl_mean_s"])
    if policy != "aep-defrag":  # ep_serving: one engine call per platform point
        return
    row = rows[-2]  # one reference run (a compile): rate 400, 1 GB/s links
    base = api.resolve("a100x8-nvswitch", "mixtral-8x7b", policy).platform
    system, params, _ = serve.build(base.with_overrides(link_Bps=1e9), "mixtral-8x7b", policy,
                                    4)
    k_stream, k_sim = serve.stream_keys(0)
    st = serve.streams(k_stream, num_streams=2, num_requests=4, rate_per_s=400.0,
                       workload="short")
    ref = jax.tree_util.tree_map(np.asarray, engine.simulate(system, params, st, k_sim))
    assert row["rate"] == "400" and float(row["link_Bps"]) == 1e9
    for k in ("throughput_tok_s", "itl_mean_s", "ttft_mean_s"):
        np.testing.assert_allclose(float(row[k]), np.mean(ref[k], dtype=np.float64),
                                   rtol=1e-6, err_msg=k)
    np.testing.assert_allclose(float(row["itl_p99_s"]), p99_from_hist(ref["itl_hist"].sum(0)),
                               rtol=1e-8)  # %.9g in the CSV


@pytest.mark.parametrize("extra, field", [
    (["--vary", "rate=100,200", "--workload", "huge"], "--workload"),
    (["--vary", "link_Bps=1e9,2e9"], "--rate"),
    (["--vary", "bogus=1,2", "--rate", "10"], "allowed keys: rate"),
])
def test_serving_sweep_bad_input_is_one_line(extra, field, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(["sweep", *SERVE, "--policy", "aep-defrag", *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err
    assert not out.exists()
