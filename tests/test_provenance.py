"""Every summary and export names its data: simulate's summary.json (command line, version,
seed, the recording's source and importer options, the derivation), tune's summary.json and
exported policy on a recording; simulate's held-out figure for a re-planning policy; the
simulate table's rows say what they are."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from moejax.cli import main as cli
from moejax.trace import importers
from moejax.trace import io as trace_io

ROOT = Path(__file__).resolve().parents[1]
OLMOE = ROOT / "tests" / "data" / "olmoe"
POLICY = ('system = "rebalancing"\ndescription = "EPLB from the first iteration"\n'
          'source = "policies/eplb.toml, window 1"\n[options]\nredundant_slots = 1\n'
          'window = 1\nmigration = "overlapped"\n')


def _cross_task(tmp_path, capsys) -> Path:
    """c4, then arxiv twice (Mixtral counts, shipped): plan on c4, score on arxiv."""
    files = []
    for name in ("c4", "arxiv"):
        path = tmp_path / f"{name}.npz"
        rc = cli.main(["trace", "import", "--format", "olmoe",
                       str(OLMOE / f"mistral_expert_counts_{name}.pkl"), "--experts", "8",
                       "--top-k", "2", "--out", str(path), "--quiet"])
        assert rc == 0
        files.append(str(path))
    out = tmp_path / "cross.npz"
    assert cli.main(["trace", "concat", files[0], files[1], files[1], "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def test_simulate_records_provenance_and_the_held_out_figure(tmp_path, capsys):
    cross = _cross_task(tmp_path, capsys)
    pol = tmp_path / "eplb1.toml"
    pol.write_text(POLICY)
    out = tmp_path / "sim"
    argv = ["simulate", "--hardware", "h800x8", "--model", "mixtral-8x7b", "--policy",
            str(pol), "--trace", str(cross), "--out", str(out), "--quiet", "--seed", "7"]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    prov = s["provenance"]
    assert prov["command"] == "moejax " + " ".join(argv)
    assert prov["seed"] == 7 and prov["moejax_version"]
    data = prov["data"]
    assert data["file"] == str(cross) and data["kind"] == "concat"
    assert [p["format"] for p in data["parts"]] == ["olmoe"] * 3
    assert data["parts"][0]["options"] == {"num_experts": 8, "top_k": 2}
    assert data["parts"][0]["source"] == [str(OLMOE / "mistral_expert_counts_c4.pkl")]
    # the plan, made from iteration 0 (c4), serves from iteration 2 (overlapped): held out
    # is the second arxiv iteration alone
    h = s["held_out"]
    assert h["iterations"] == "2:3"
    per_iter = np.loadtxt(out / "results.csv", delimiter=",", skiprows=1, ndmin=2)
    assert per_iter.shape[0] == 1
    assert h["latency_s"]["mean"] != s["latency_s"]["mean"]
    assert "held out (iterations 2:3)" in table


def test_simulate_stream_reports_the_same_held_out_figure(tmp_path, capsys):
    """--stream summarizes a chunk at a time; the held-out figure of a re-planning policy is
    there too, equal to the in-memory one (mean exact, percentiles within the sketch's
    relative error)."""
    from moejax.runner.stream import ALPHA

    cross = _cross_task(tmp_path, capsys)
    pol = tmp_path / "eplb1.toml"
    pol.write_text(POLICY)
    sums = []
    for name, extra in (("mem", []), ("stream", ["--stream"])):
        out = tmp_path / name
        assert cli.main(["simulate", "--hardware", "h800x8", "--model", "mixtral-8x7b",
                         "--policy", str(pol), "--trace", str(cross), "--out", str(out),
                         "--quiet", *extra]) == 0
        sums.append(json.loads((out / "summary.json").read_text()))
    table = capsys.readouterr().out
    mem, st = (s["held_out"] for s in sums)
    assert st["iterations"] == mem["iterations"] == "2:3"
    assert "held out (iterations 2:3)" in table.split("forward pass")[-1]  # the stream's table
    for name in ("latency_s", "forward_s"):
        np.testing.assert_allclose(st[name]["mean"], mem[name]["mean"], rtol=1e-6)
        np.testing.assert_allclose(st[name]["p50"], mem[name]["p50"], rtol=ALPHA)


def test_simulate_table_labels_memory_as_time_beyond_compute(tmp_path, capsys):
    assert cli.main(["simulate", "--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b",
                     "--traces", "2", "--tokens", "16", "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "memory beyond compute (per layer)" in table
    assert "  memory (per layer)" not in table


def test_tune_on_a_recording_records_its_data(tmp_path, capsys):
    cross = _cross_task(tmp_path, capsys)
    ck, pol = tmp_path / "ck", tmp_path / "tuned.toml"
    rc = cli.main(["tune", "--system", "ep", "--param", "replicas", "--hardware", "h800x8",
                   "--model", "mixtral-8x7b", "--trace", str(cross), "--train-fraction",
                   "0.34", "--per-layer", "--init", "eplb", "--steps", "2", "--batch", "1",
                   "--every", "2", "--tau-start", "0.1", "--out", str(ck), "--export",
                   str(pol), "--quiet"])
    assert rc == 0
    title = " ".join(capsys.readouterr().out.split())  # rich wraps the table's title
    assert "hard mode (the iterations of" in title and "after its first 0.34" in title
    assert "256 traces" not in title
    s = json.loads((ck / "summary.json").read_text())
    assert s["run"]["trace_gen"] is None and s["run"]["trace"] == str(cross)
    data = s["provenance"]["data"]
    assert data["kind"] == "concat" and "first 0.34" in data["split"]
    assert s["provenance"]["command"].startswith("moejax tune --system ep")
    head = pol.read_text().split("system =")[0]
    assert f"recording {cross}" in head and "powerlaw" not in head
    assert "concat" in head and "mistral_expert_counts_c4.pkl (olmoe)" in head
    assert "# command: moejax tune --system ep" in head and "# moejax version: " in head


def test_trace_gen_and_import_record_provenance(tmp_path, capsys):
    out = tmp_path / "g.npz"
    assert cli.main(["trace", "gen", "powerlaw:alpha=1.5", "--out", str(out), "--experts",
                     "8", "--top-k", "2", "--traces", "2", "--seed", "3"]) == 0
    _, meta = trace_io.load(out)
    assert meta["provenance"] == {"kind": "generated", "generator": "powerlaw:alpha=1.5",
                                  "seed": 3, "derived": []}
    tr, meta = importers.import_trace("olmoe", [OLMOE / "mistral_expert_counts_c4.pkl"],
                                      num_experts=8, top_k=2)
    assert "counts only" in meta["report"]["assumed"][0]
    capsys.readouterr()
