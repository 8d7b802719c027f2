"""`moejax export latency-table`: columns, values against `moejax simulate`, bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.cli import main as cli
from moejax.latency_table import COLUMNS, DEFAULT_FIT, settle_iterations, traces_for
from moejax.systems import ep, ep_reference
from moejax.trace import importers
from moejax.trace import io as trace_io

ROOT = Path(__file__).resolve().parents[1]


def test_table_columns_and_values(tmp_path, capsys):
    pol = tmp_path / "replicas.toml"  # a static replica placement: expert 0 on 0 and 1
    pol.write_text('system = "ep"\ndescription = "x"\nsource = "x"\n[options]\nplacement = '
                   '[[0, 1], [1], [2], [3], [4], [5], [6], [7]]\nreplica_shares = [[0.7, 0.3], '
                   '[1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [1.0]]\n')
    out = tmp_path / "table.csv"
    rc = cli.main(["export", "latency-table", "--hardware", "h800x8", "--model",
                   "mixtral-8x7b", "--policy", f"ep,{pol}", "--tokens", "64,1024",
                   "--traces", "2", "--iterations", "1", "--vocab-size", "32000",
                   "--trace-gen", "powerlaw:alpha=1.2", "--out", str(out)])
    assert rc == 0
    assert not out.exists()  # two policies: one file each, Vidur filters by model only
    rows = [r for name in ("table-ep.csv", "table-replicas.csv")
            for r in csv.DictReader((tmp_path / name).open())]
    assert tuple(rows[0]) == COLUMNS
    assert [(r["policy"], int(r["num_tokens"])) for r in rows] == [
        ("ep", 64), ("ep", 1024), ("replicas", 64), ("replicas", 1024)]
    for r in rows:
        assert float(r["moe_layer_ms_p50"]) <= float(r["moe_layer_ms_p99"]) + 1e-9
        assert r["time_stats.mlp_up_proj.median"] == r["moe_layer_ms_p50"]
        assert float(r["time_stats.mlp_down_proj.median"]) == 0.0
        assert (r["n_embd"], r["n_expanded_embd"], r["vocab_size"]) == ("4096", "14336",
                                                                         "32000")
    lat = [float(r["moe_layer_ms_mean"]) for r in rows]
    assert lat[1] > lat[0] and lat[3] > lat[2]  # more tokens take longer
    # the same traces through the plain EP reference give the table's means (the replica
    # rows: an uneven split of expert 0 over devices 0 and 1)
    m = load_model("mixtral-8x7b")
    tr = traces_for(m, [64, 1024], trace_gen="powerlaw:alpha=1.2", traces=2, iterations=1,
                    layers=1, seed=0)
    cfg = ep.make_config(load_platform("h800x8"), m)
    place = np.eye(8)
    place[0] = [0.7, 0.3, 0, 0, 0, 0, 0, 0]
    for j, part in enumerate((slice(0, 2), slice(2, 4))):
        ref = ep_reference.layer_latency(cfg, place, tr.expert_ids[part], tr.token_mask[part],
                                         tr.counts[part])
        np.testing.assert_allclose(ref.mean() * 1e3, lat[2 + j], rtol=1e-5)
    # tokens are conserved by the replica split
    c = np.asarray(tr.counts)
    np.testing.assert_allclose((c @ place).sum(-1), c.sum(-1), rtol=1e-6)
    capsys.readouterr()


def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys):
    out = tmp_path / "table.csv"
    for args, msg in ((["--policy", "no-such-policy"], "unknown policy 'no-such-policy'"),
                      (["--out", str(tmp_path / "table.txt")], "must end in .csv")):
        argv = ["export", "latency-table", "--hardware", "h800x8", "--model", "mixtral-8x7b",
                "--tokens", "64", "--out", str(out), *args]
        rc = cli.main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2 and "\n" not in err and msg in err, err
    assert list(tmp_path.iterdir()) == []


def test_traces_too_large_for_memory_are_refused_before_any_is_made(tmp_path, capsys,
                                                                     monkeypatch):
    from moejax import latency_table
    from moejax.runner import budget

    monkeypatch.setattr(budget, "available_bytes", lambda: 100_000)

    def never(*a, **k):
        raise AssertionError("traces made before the memory check")

    monkeypatch.setattr(latency_table, "traces_for", never)
    out = tmp_path / "t.csv"
    rc = cli.main(["export", "latency-table", "--hardware", "h800x8", "--model",
                   "mixtral-8x7b", "--tokens", "64,256", "--traces", "1000", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "2000 traces held" in err, err
    assert "fewer --traces" in err, err
    assert list(tmp_path.iterdir()) == []


def _table(tmp_path, *extra, policy="eplb", tokens="256,4096"):
    out = tmp_path / "t.csv"
    rc = cli.main(["export", "latency-table", "--hardware", "h800x8", "--model",
                   "mixtral-8x7b", "--policy", policy, "--tokens", tokens, "--traces", "2",
                   "--iterations", "2", "--out", str(out), *map(str, extra)])
    assert rc == 0
    return out, list(csv.DictReader(out.open()))


def test_eplb_columns_are_over_the_iterations_the_plan_serves(tmp_path, capsys):
    """The comm column of a re-planning policy averages the same held-out iterations as the
    layer column (the window before the plan excluded), so it never exceeds the layer."""
    _, rows = _table(tmp_path, "--trace-gen", "powerlaw:alpha=1.2")
    m = load_model("mixtral-8x7b")
    from moejax import api
    s = api.resolve("h800x8", "mixtral-8x7b", "eplb")
    skip = settle_iterations(s.policy)
    assert skip == 9  # window 8, overlapped migration: the plan serves from iteration 9
    tr = traces_for(m, [256, 4096], trace_gen="powerlaw:alpha=1.2", traces=2,
                    iterations=skip + 2, layers=1, seed=0)
    out = api.simulate(s.platform, m, s.policy, tr, progress=False)
    comm = np.asarray(out["comm_per_iter_s"])[:, skip:].mean(-1)
    for j, r in enumerate(rows):
        assert float(r["comm_ms_mean"]) < float(r["moe_layer_ms_mean"])
        np.testing.assert_allclose(float(r["comm_ms_mean"]), comm[2 * j:2 * j + 2].mean() * 1e3,
                                   rtol=1e-5)
    capsys.readouterr()


def test_routing_sources_and_provenance(tmp_path, capsys):
    """Default: the measured fit shipped with moejax; --trace-gen takes a fit file too;
    --trace a recording; each file says its routing and records its provenance."""
    assert Path(DEFAULT_FIT).is_file()
    _, rows = _table(tmp_path, policy="ep")
    assert rows[0]["routing"] == "shipped fit esft-intent.json (drift)"
    prov = json.loads((tmp_path / "t.csv.provenance.json").read_text())
    assert prov["data"]["kind"] == "fit" and prov["seed"] == 0
    assert prov["command"].startswith("moejax export latency-table")
    _, rows2 = _table(tmp_path, "--trace-gen", DEFAULT_FIT, policy="ep")
    assert [r["moe_layer_ms_mean"] for r in rows2] == [r["moe_layer_ms_mean"] for r in rows]
    rec = ROOT / "tests" / "data" / "olmoe"
    tr, meta = importers.import_trace("olmoe", [rec / "mistral_expert_counts_c4.pkl"],
                                      num_experts=8, top_k=2)
    trace_io.save(tmp_path / "c4.npz", tr, meta)
    _, rows3 = _table(tmp_path, "--trace", tmp_path / "c4.npz", "--layers", 3, policy="ep")
    assert rows3[0]["routing"].startswith("recording")
    lat = [float(r["moe_layer_ms_mean"]) for r in rows3]
    assert lat[1] > lat[0]
    # a recording's shares: the 4096-token batch's counts follow c4's expert shares
    t = traces_for(load_model("mixtral-8x7b"), [4096], trace_gen=tr, traces=1, iterations=1,
                   layers=3, seed=0)
    share = np.asarray(t.counts)[0, 0] / np.asarray(t.counts)[0, 0].sum(-1, keepdims=True)
    rec_share = np.asarray(tr.counts)[0] / np.asarray(tr.counts)[0].sum(-1, keepdims=True)
    np.testing.assert_allclose(share, rec_share, atol=0.03)
    capsys.readouterr()


def test_vidur_profile_loader_reads_the_table(tmp_path, capsys):
    """Vidur's own compute-profile loader (`SklearnExecutionTimePredictor._load_compute_df`,
    vidur 0.0.26) filters the table by a Vidur model config of the same shape, and every
    column its `_train_general_models` fits on `num_tokens` is there and finite; a Vidur
    polynomial regressor (its LinearRegression predictor's estimator) fitted on them
    follows the MoE-layer column. Skipped without the `vidur` extra."""
    sk = pytest.importorskip(
        "vidur.execution_time_predictor.sklearn_execution_time_predictor")
    lin = pytest.importorskip(
        "vidur.execution_time_predictor.linear_regression_execution_time_predictor")
    from vidur.config.model_config import Llama2ModelConfig

    out, _ = _table(tmp_path, "--vocab-size", 32000, "--trace-gen", "powerlaw:alpha=1.2",
                    policy="ep", tokens="64,256,1024,4096,16384")
    # Mixtral-8x7B's attention and shapes in Vidur's own config class (Vidur ships no MoE
    # model; the filter columns are what it matches)
    mc = Llama2ModelConfig(num_layers=32, num_q_heads=32, num_kv_heads=8,
                           embedding_dim=4096, mlp_hidden_dim=14336, vocab_size=32000)
    # the predictor without its __init__ (which trains on every profile file at once):
    # only the two configs the loader reads
    class Loader(lin.LinearRegressionExecutionTimePredictor):
        # abstract in vidur 0.0.26's base class, not defined by this subclass; the loader
        # never calls it
        def _get_kv_parallel_communication_time(self, batch):
            return 0.0

    pred_obj = object.__new__(Loader)
    assert isinstance(pred_obj, sk.SklearnExecutionTimePredictor)
    pred_obj._model_config = mc
    pred_obj._replica_config = SimpleNamespace(tensor_parallel_size=1)
    df = pred_obj._load_compute_df(str(out))
    assert len(df) == 5
    for name in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj",
                 "mlp_act", "input_layernorm", "post_attention_layernorm", "attn_rope",
                 "add"):  # the list of Vidur's _train_general_models
        y = df[f"time_stats.{name}.median"].to_numpy(float)
        assert np.isfinite(y).all() and (y >= 0).all(), name
    est = pred_obj._get_estimator()
    est.set_params(polynomialfeatures__degree=2)
    est.fit(df[["num_tokens"]], df["time_stats.mlp_up_proj.median"])
    pred = est.predict(df[["num_tokens"]])
    y = df["time_stats.mlp_up_proj.median"].to_numpy(float)
    np.testing.assert_allclose(pred, y, atol=0.05, rtol=0.05)  # ms; a quadratic in tokens
    capsys.readouterr()


def test_a_recording_of_another_expert_count_is_refused(tmp_path, capsys):
    tr, meta = importers.import_trace(
        "olmoe", [ROOT / "tests" / "data" / "olmoe" / "mistral_expert_counts_c4.pkl"],
        num_experts=8, top_k=2)
    trace_io.save(tmp_path / "c4.npz", tr, meta)
    out = tmp_path / "t.csv"
    rc = cli.main(["export", "latency-table", "--hardware", "h800x8", "--model",
                   "deepseek-moe-16b", "--trace", str(tmp_path / "c4.npz"), "--tokens", "64",
                   "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert "--trace: 8 experts per layer, the model has 64" in err
    assert not out.exists() and not list(tmp_path.glob("t*.csv*"))
