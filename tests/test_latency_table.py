"""`moejax export latency-table`: columns, values against `moejax simulate`, bad input."""

from __future__ import annotations

import csv

import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.cli import main as cli
from moejax.latency_table import COLUMNS, traces_for
from moejax.systems import ep, ep_reference


def test_table_columns_and_values(tmp_path, capsys):
    pol = tmp_path / "replicas.toml"  # a static replica placement: expert 0 on 0 and 1
    pol.write_text('system = "ep"\ndescription = "x"\nsource = "x"\n[options]\nplacement = '
                   '[[0, 1], [1], [2], [3], [4], [5], [6], [7]]\nreplica_shares = [[0.7, 0.3], '
                   '[1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [1.0]]\n')
    out = tmp_path / "table.csv"
    rc = cli.main(["export", "latency-table", "--hardware", "h800x8", "--model",
                   "mixtral-8x7b", "--policy", f"ep,{pol}", "--tokens", "64,1024",
                   "--traces", "2", "--iterations", "1", "--vocab-size", "32000",
                   "--out", str(out)])
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
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
