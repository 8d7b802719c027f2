"""The command line: main job, result files, one-line errors with exit code 2."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from moejax.cli import reproduce as reproduce_cli
from moejax.cli.main import main


def test_simulate_writes_results_and_summary(tmp_path, capsys):
    out = tmp_path / "ep"
    rc = main(["simulate", "--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b",
               "--policy", "ep", "--tokens", "64", "--traces", "8", "--out", str(out),
               "--quiet"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("hardware", "model", "policy", "tokens", "traces", "latency_s",
                "utilization_mean"):
        assert key in summary
    assert summary["traces"] == 8 and summary["tokens"] == 64
    lat = summary["latency_s"]
    assert 0 < lat["p50"] <= lat["p99"] and lat["mean"] > 0
    assert 0 <= summary["utilization_mean"] <= 1
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 8 and float(rows[0]["latency_s"]) > 0
    assert "MoE layer latency" in capsys.readouterr().out


@pytest.mark.parametrize("hardware,model", [
    ("wsc-4x4", "qwen3-235b-a22b"), ("dgx-b200-1node", "deepseek-v3"),
    ("a100x8-nvswitch", "mixtral-8x7b"), ("h800x8", "deepseek-v2"),
    ("gh200-nvl32", "dysharp-m"),
])
def test_simulate_on_one_platform_of_each_paper(tmp_path, hardware, model):
    rc = main(["simulate", "--hardware", hardware, "--model", model, "--tokens", "32",
               "--traces", "4", "--out", str(tmp_path), "--quiet"])
    assert rc == 0 and (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "--hardware", "chiplet-9x9"], "unknown hardware 'chiplet-9x9'"),
    (["simulate", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["simulate", "--policy", "nope"], "unknown policy 'nope'"),
    (["simulate", "--trace-gen", "zipf:alpha=1"], "zipf"),
    (["simulate", "--trace-gen", "powerlaw:alpha=-1"], "alpha"),
    (["simulate", "--trace", "/nonexistent/t.npz"], "t.npz"),
    (["reproduce", "nothing", "--out", "x"], "unknown study 'nothing'"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys, tmp_path):
    rc = main([*argv, "--quiet"] if argv[0] == "simulate" else argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and needle in err, err
    assert "Traceback" not in err


def test_trace_with_wrong_expert_count_is_rejected(tmp_path, capsys):
    path = tmp_path / "t.npz"
    assert main(["trace", "gen", "uniform", "--experts", "16", "--top-k", "2", "--tokens",
                 "8", "--traces", "2", "--out", str(path)]) == 0
    out = tmp_path / "res"
    rc = main(["simulate", "--model", "qwen3-30b-a3b", "--trace", str(path), "--out",
               str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "num_experts=16" in err
    assert not out.exists()  # nothing half-written


def test_bad_policy_toml_names_file_and_key(tmp_path, capsys):
    bad = tmp_path / "mine.toml"
    bad.write_text('system = "ep"\ndescription = "x"\nsource = "y"\n'
                   '[options]\nplacment = "contiguous"\n')
    rc = main(["simulate", "--policy", str(bad), "--traces", "2", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "mine.toml" in err and "placment" in err


def test_trace_gen_then_inspect_then_simulate(tmp_path, capsys):
    path = tmp_path / "t.npz"
    assert main(["trace", "gen", "powerlaw:alpha=1.5", "--experts", "128", "--top-k", "8",
                 "--tokens", "64", "--traces", "4", "--out", str(path)]) == 0
    assert main(["trace", "inspect", str(path)]) == 0
    assert "activated" in capsys.readouterr().out.lower()
    assert main(["simulate", "--trace", str(path), "--quiet"]) == 0


@pytest.mark.parametrize("what", ["hardware", "models", "policies"])
def test_catalog_lists(what, capsys):
    assert main(["catalog", what]) == 0
    out = capsys.readouterr().out
    assert {"hardware": "chiplet-2x2", "models": "qwen3-30b-a3b", "policies": "ep"}[what] in out


def test_console_script_runs_and_exits_2_on_error():
    exe = os.path.join(os.path.dirname(sys.executable), "moejax")
    r = subprocess.run([exe, "simulate", "--hardware", "nope"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_reproduce_table_abridges_nested_claim_values():
    assert reproduce_cli._brief({"gain": 0.123456, "per": {"a": 1}}) == "gain: 0.123\nper: {...}"
    assert reproduce_cli._brief([1.0, 2.5, 3, 4, 5, 6, 7]) == "[1, 2.5, 3, 4, 5, 6, ...]"
    assert reproduce_cli._brief(True) == "True"
