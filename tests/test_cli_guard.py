"""A new user's path through the CLI: output paths checked before any work, a
reproduce run that Ctrl-C leaves without a partial --out, honest --help."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from moejax import reproduce
from moejax.cli.main import build_parser, main

STUDY = textwrap.dedent("""
    import time
    from pathlib import Path
    from moejax.reproduce import Claim, Report
    from moejax.output.progress import step

    def steps(quick):
        return 2

    def run(out_dir, quick):
        (Path(out_dir) / "figure.csv").write_text("x\\n1\\n")
        step("Fig. 1")
        (Path(out_dir) / "sub").mkdir()
        (Path(out_dir) / "sub" / "table.csv").write_text("y\\n2\\n")
        step("Table 2")
        print("started", flush=True)
        time.sleep(float(__import__("os").environ.get("STUDY_SLEEP_S", "0")))
        return Report("fake", [Claim("c1", "paper", 1.0, True)], ["figure.csv"])
""")


@pytest.fixture
def fake_study(tmp_path, monkeypatch):
    """A registered study `fake` that writes two files (then sleeps STUDY_SLEEP_S)."""
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "fake_study.py").write_text(STUDY)
    monkeypatch.syspath_prepend(str(mod))
    monkeypatch.setitem(reproduce.STUDIES, "fake", "fake_study")
    return mod


def _one_line_exit_2(argv, capsys):
    rc = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc == 2, (rc, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


SIM = ["simulate", "--traces", "2", "--tokens", "8", "--quiet"]
GEN = ["trace", "gen", "uniform", "--experts", "4", "--top-k", "2", "--traces", "1",
       "--tokens", "4"]


@pytest.mark.parametrize("argv,needle", [
    (SIM + ["--out", "{file}"], "is an existing file; a folder is expected"),
    (SIM + ["--out", "{file}/sub"], "is a file, so the folder cannot be made"),
    (SIM + ["--out", "/proc/moejax-out"], "cannot write in /proc"),
    (["reproduce", "fake", "--out", "{file}"], "is an existing file"),
    (["reproduce", "fake", "--out", "/proc/moejax-out/x"], "cannot write in /proc"),
    (["tune", "--steps", "1", "--out", "{file}"], "is an existing file"),
    (["tune", "--steps", "1", "--out", "{dir}/ck", "--export", "{dir}"], "--export"),
    (GEN + ["--out", "{dir}"], "is a folder; a file name is expected"),
    (GEN + ["--out", "{dir}/no/such/t.npz"], "does not exist"),
    (["trace", "fit", "x.npz", "--report", "{dir}/"], "--report"),
    (["trace", "inspect", "x.npz", "--plot", "{file}/p.png"], "is a file, not a folder"),
    (["export", "latency-table", "--hardware", "h", "--model", "m", "--out", "/proc/x.csv"],
     "cannot write in /proc"),
    (["validate", "--out", "{file}"], "is an existing file"),
])
def test_bad_output_path_is_one_line_exit_2_before_any_work(argv, needle, tmp_path, capsys,
                                                            fake_study):
    work = tmp_path / "work"
    work.mkdir()
    (work / "afile").write_text("keep")
    argv = [a.format(file=work / "afile", dir=work) for a in argv]
    err = _one_line_exit_2(argv, capsys)
    assert needle in err, err
    assert sorted(p.name for p in work.iterdir()) == ["afile"]  # nothing written
    assert (work / "afile").read_text() == "keep"


def test_reproduce_writes_the_whole_folder_at_the_end(tmp_path, fake_study, capsys):
    out = tmp_path / "res"
    assert main(["reproduce", "fake", "--quick", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()  # progress per step, quick mode included
    assert err[0] == "[fake] 2 steps; the first includes compiling", err
    assert err[1].startswith("[fake] 1/2 Fig. 1 (") and err[2].startswith("[fake] 2/2 Table 2")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "figure.csv", "sub", "sub/table.csv", "summary.json"]
    assert json.loads((out / "summary.json").read_text())["claims"][0]["id"] == "c1"
    (out / "figure.csv").write_text("old")
    (out / "mine.txt").write_text("user file")  # a non-empty --out: files replaced one by one
    assert main(["reproduce", "fake", "--out", str(out)]) == 0
    assert (out / "figure.csv").read_text() == "x\n1\n" and (out / "mine.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mods", "res"]  # no temporary sibling


def test_ctrl_c_in_reproduce_exits_130_and_leaves_no_partial_out(tmp_path, fake_study):
    out = tmp_path / "new" / "res"  # its parent is made too, and removed again
    script = ("import sys, moejax.reproduce as r\n"
              f"sys.path.insert(0, {str(fake_study)!r})\n"
              "r.STUDIES['fake'] = 'fake_study'\n"
              "from moejax.cli import main as cli\n"
              f"sys.argv = ['moejax', 'reproduce', 'fake', '--out', {str(out)!r}]\n"
              "sys.exit(cli.main())\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, STUDY_SLEEP_S="120"),
                         # a background shell's children inherit SIGINT ignored
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.readline().strip() == "started"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == "moejax: interrupted", err
    assert "Traceback" not in err
    assert [x.name for x in tmp_path.iterdir()] == ["mods"]  # no --out, no sibling


def test_simulate_from_a_fit_uses_every_recorded_layer_by_default(tmp_path, capsys):
    import jax

    from moejax.trace import fit

    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"moejax_fit": 1, "family": "powerlaw", "pooled": "powerlaw",
                                "layers": ["powerlaw:alpha=0.5", "uniform", "powerlaw"]}))
    lazy = fit.generate_fitted(path, jax.random.key(0), num_traces=2, iterations=1,
                               layers=None, tokens=8, num_experts=8, top_k=2, chunked=True)
    assert lazy.num_layers == 3  # the CLI's default (--layers left out)
    assert build_parser().parse_args(["simulate"]).layers is None
    out = tmp_path / "one"
    assert main(["simulate", "--trace-gen", str(path), "--model", "mixtral-8x7b", "--traces",
                 "2", "--tokens", "8", "--quiet", "--layers", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip()
    assert "--layers 1 simulates recorded layers 0-0 of the fit's 3" in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace_source"].endswith("(1 of 3 recorded layers)")


def test_progress_says_compiling_until_the_first_chunk(capsys):
    from moejax.output.status import live_status
    from moejax.runner import engine

    shown = engine.progress_bar(True, 3, "ep")
    advance = shown.__enter__()
    task = shown.bar.tasks[0]
    assert task.description.startswith("compiling ep")
    advance()
    assert task.description == "simulating ep" and task.completed == 1
    shown.__exit__(None, None, None)
    with live_status("simulating aep") as say:  # off a terminal: plain lines on stderr
        say("compiling")
        say("2048 events simulated")  # within PLAIN_EVERY_S of the first: not printed
    assert capsys.readouterr().err.strip() == "[simulating aep] compiling (0 s)"


def test_trace_fit_reports_each_family():
    import jax
    import numpy as np

    from moejax.trace import fit, from_counts

    counts = np.random.default_rng(0).integers(0, 20, (2, 2, 8)).astype(float)
    seen = []
    res = fit.fit(from_counts(counts, 2), ("drift",), holdout=False, compare_papers=False,
                  key=jax.random.key(0), progress=seen.append)
    assert "error" in res["families"]["drift"] and seen == ["drift (not fitted)"]


def test_help_lists_every_command_the_studies_and_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    top = capsys.readouterr().out
    assert e.value.code == 0
    parser = build_parser()
    commands = next(a for a in parser._actions if hasattr(a, "choices") and a.choices).choices
    for name in [*commands, *reproduce.STUDIES]:
        assert name in top, name
    assert {"reproduce", "tune"} <= set(commands)
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    sim = " ".join(capsys.readouterr().out.split())
    assert "(default: chiplet-2x2)" in sim and "default: 1024" in sim and "default: 0" in sim
