"""What a new user's probes hit: a run too large for memory, a full disk, an option without
effect, two runs on one folder, file permissions, a corrupt checkpoint. Each is one line,
exit 2, and nothing half-written (a resumable run stays resumable)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from moejax.cli.main import main
from moejax.errors import CheckpointError, ConfigError, OutputError
from moejax.output import results
from moejax.output.lock import LOCK, folder_lock
from moejax.output.staging import staged_dir
from moejax.runner import budget, stream
from moejax.tune import TuneConfig, tune

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(system="ep", hardware="chiplet-2x2", model="phi-3.5-moe", steps=4, traces=8,
             batch=4, eval_traces=8, tokens=16, iterations=2, layers=1, every=2, lr=0.2,
             warmup=2, trace_gen="powerlaw:alpha=1.5")
SIM = ["simulate", "--traces", "8", "--tokens", "16", "--quiet"]


def _one_line(capsys, rc, *words):
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- memory: one trace that cannot fit is refused before any work --------------------------


def test_plan_chunk_refuses_one_trace_larger_than_memory():
    kw = dict(metric_bytes=40, metric_scalars=10, chunk_given=False, available=10**9)
    assert budget.plan_chunk(4, 4, trace_bytes=10**6, scratch_bytes=0, **kw) == 4
    with pytest.raises(ConfigError, match=r"^tokens: one trace of 1 iteration x 2 layers x "
                                          r"100 tokens needs about 4 GB; 1 GB .* use at most "
                                          r"12 --tokens"):
        budget.plan_chunk(4, 4, trace_bytes=10**9, scratch_bytes=0, shape=(1, 2, 100), **kw)


@pytest.mark.parametrize("extra", [[], ["--stream"]])
def test_simulate_refuses_a_trace_too_large_for_memory(extra, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(budget, "available_bytes", lambda: 100_000)  # 4096 tokens: 262 kB
    out = tmp_path / "res"
    rc = main(["simulate", "--traces", "1", "--tokens", "4096", "--out", str(out), "--quiet",
               *extra])
    _one_line(capsys, rc, "tokens: one trace of 1 iteration x 1 layer x 4096 tokens needs",
              "use at most")
    assert list(tmp_path.iterdir()) == []


def test_sweep_and_tune_refuse_traces_too_large_for_memory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(budget, "available_bytes", lambda: 20_000)
    rc = main(["sweep", "--traces", "4", "--tokens", "64", "--vary", "ddr_Bps=1e11,2e11",
               "--out", str(tmp_path / "s"), "--quiet"])
    _one_line(capsys, rc, "tokens: 4 traces held", "--tokens")
    rc = main(["tune", "--steps", "2", "--traces", "8", "--batch", "4", "--eval-traces", "8",
               "--tokens", "16", "--model", "phi-3.5-moe", "--out", str(tmp_path / "t"),
               "--quiet"])
    _one_line(capsys, rc, "tokens: 16 traces held", "--tokens")
    assert list(tmp_path.iterdir()) == []


# --- options that must have their effect ------------------------------------------------------


@pytest.mark.parametrize("argv,words", [
    (SIM + ["--layers", "1000"], ["layers: the trace has 1000 MoE layers", "has 48", "1 .. 48"]),
    (["sweep", "--traces", "2", "--tokens", "8", "--layers", "49", "--vary", "ddr_Bps=1e11,2e11",
      "--quiet"], ["layers: the trace has 49 MoE layers"]),
    (["tune", "--steps", "1", "--layers", "49", "--quiet"], ["layers = 49", "1 .. 48"]),
    (SIM + ["--rate", "10"], ["--rate: policy 'ep' simulates routing traces"]),
    (["simulate", "--policy", "aep-defrag", "--rate", "10", "--layers", "2", "--quiet"],
     ["--layers: policy 'aep-defrag' serves Poisson request streams"]),
    (["tune", "--steps", "2", "--warmup", "-3", "--quiet"], ["warmup = -3; allowed"]),
    (["tune", "--steps", "2", "--sim-tau-scale", "-1", "--quiet"], ["sim_tau_scale = -1"]),
    (SIM + ["--tokens", "0"], ["moejax simulate: error: argument --tokens: '0' must be >= 1",
                               "(see moejax simulate --help)"]),
])
def test_an_option_without_effect_or_out_of_range_is_refused(argv, words, tmp_path, capsys):
    out = tmp_path / "o"
    try:
        rc = main([*argv, "--out", str(out)])
    except SystemExit as e:  # a usage error, from argparse
        rc = e.code
    _one_line(capsys, rc, *words)
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_whose_runs_do_not_finish_is_refused(tmp_path, capsys):
    """FSE-DP at 2 micro-slices (too coarse for the weight buffer): every metric read 0."""
    rc = main(["sweep", "--policy", "fsedp", "--traces", "2", "--tokens", "8", "--vary",
               "num_microslices=2,8", "--out", str(tmp_path / "w"), "--quiet"])
    _one_line(capsys, rc, "1 of 2 design points (the first at num_microslices=2) leave fsedp "
                          "layers unfinished")
    assert list(tmp_path.iterdir()) == []


def test_simulate_a_recording_refuses_layers(tmp_path, capsys):
    rec = tmp_path / "t.npz"
    assert main(["trace", "gen", "uniform", "--experts", "128", "--top-k", "8", "--traces",
                 "2", "--tokens", "8", "--layers", "2", "--out", str(rec)]) == 0
    capsys.readouterr()
    rc = main(["simulate", "--trace", str(rec), "--layers", "1", "--quiet"])
    _one_line(capsys, rc, "--layers: --trace", "as recorded")


@pytest.mark.parametrize("opt", ["--layers", "--iterations", "--tokens", "--traces",
                                 "--eval-traces"])
def test_tune_on_a_recording_refuses_the_generator_shape(opt, tmp_path, capsys):
    """tune --trace trains on the recording's own shape: these options would be ignored."""
    rec = tmp_path / "t.npz"
    assert main(["trace", "gen", "uniform", "--experts", "128", "--top-k", "8", "--traces",
                 "4", "--tokens", "8", "--out", str(rec)]) == 0
    capsys.readouterr()
    rc = main(["tune", "--trace", str(rec), opt, "1", "--steps", "1", "--out",
               str(tmp_path / "ck"), "--quiet"])
    _one_line(capsys, rc, f"{opt}: --trace {rec}", "drop them")
    assert not (tmp_path / "ck").exists()


def test_tune_resume_on_a_missing_folder_is_a_checkpoint_error(tmp_path, capsys):
    out = tmp_path / "none"
    rc = main(["tune", "--resume", "--steps", "2", "--out", str(out), "--quiet"])
    _one_line(capsys, rc, f"--resume: {out}: no such checkpoint folder", "leave --resume out")
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        tune(TuneConfig(**SMALL), out, resume=True, progress=False)
    assert list(tmp_path.iterdir()) == []


# --- permissions: the umask decides, as for any new file --------------------------------------


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755),
                                                     (0o077, 0o600, 0o700)])
def test_output_files_respect_the_umask(mask, file_mode, dir_mode, tmp_path):
    old = os.umask(mask)
    try:
        results.atomic_write_text(tmp_path / "a" / "x.txt", "x")
        with staged_dir(tmp_path / "study") as d:
            results.atomic_write_text(d / "y.txt", "y")
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "x.txt").stat().st_mode & 0o777 == file_mode
    assert (tmp_path / "study" / "y.txt").stat().st_mode & 0o777 == file_mode
    assert (tmp_path / "study").stat().st_mode & 0o777 == dir_mode


def test_simulate_results_are_readable_by_others_under_umask_022(tmp_path):
    old = os.umask(0o022)
    try:
        assert main([*SIM, "--out", str(tmp_path / "r")]) == 0
    finally:
        os.umask(old)
    for name in ("results.csv", "summary.json"):
        assert (tmp_path / "r" / name).stat().st_mode & 0o777 == 0o644


# --- a full disk --------------------------------------------------------------------------------


def full_disk(monkeypatch, when):
    """Make writes of temp files fail with ENOSPC where `when(name)` is true, `name` the
    destination file's name (atomic_file's temp file is `.NAME.XXXX.tmp`)."""
    real = os.fdopen

    def fdopen(fd, *a, **k):
        f = real(fd, *a, **k)
        target = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if target.endswith(".tmp") and when(target[1:].rsplit(".", 2)[0]):
            write = f.write

            def refuse(data):
                write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            f.write = refuse
        return f

    monkeypatch.setattr(os, "fdopen", fdopen)


def test_simulate_on_a_full_disk_leaves_nothing(tmp_path, capsys, monkeypatch):
    full_disk(monkeypatch, lambda name: True)
    rc = main([*SIM, "--out", str(tmp_path / "new" / "res")])
    _one_line(capsys, rc, "No space left on device", "nothing was written")
    assert list(tmp_path.iterdir()) == []  # no empty folder left


def test_simulate_on_a_full_disk_keeps_the_previous_results_whole(tmp_path, capsys,
                                                                  monkeypatch):
    out = tmp_path / "res"
    assert main([*SIM, "--seed", "1", "--out", str(out)]) == 0
    before = {p: (out / p).read_bytes() for p in ("results.csv", "summary.json")}
    capsys.readouterr()
    full_disk(monkeypatch, lambda name: name == "summary.json")  # results.csv would fit
    rc = main([*SIM, "--seed", "2", "--out", str(out)])
    _one_line(capsys, rc, "summary.json: No space left on device")
    assert {p: (out / p).read_bytes() for p in before} == before  # the old pair, both
    assert _files(out) == ["results.csv", "summary.json"]


STREAM = ["simulate", "--traces", "12", "--tokens", "8", "--chunk", "4", "--quiet", "--stream"]


def test_stream_on_a_full_disk_stays_resumable(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(stream, "PART_ROWS", 4)  # 12 traces: parts of 4, 4, 4
    whole = tmp_path / "whole"
    assert main([*STREAM, "--out", str(whole)]) == 0
    out = tmp_path / "run"
    seen = []

    def second_state(name):  # the state that would count the second part
        seen.append(name)
        return name == stream.STATE and seen.count(stream.STATE) == 2

    capsys.readouterr()
    with monkeypatch.context() as m:
        full_disk(m, second_state)
        rc = main([*STREAM, "--out", str(out)])
    _one_line(capsys, rc, "No space left on device", "keeps the first 4 of 12 traces",
              "--resume")
    assert _files(out) == ["results", "results/part-000000.parquet", stream.STATE]
    assert stream.load_state(out)[1:3] == (4, 1)
    assert main([*STREAM[:-1], "--resume", "--out", str(out)]) == 0
    assert pq.read_table(out / stream.PARTS).equals(pq.read_table(whole / stream.PARTS))


def test_stream_on_a_full_disk_at_the_first_part_leaves_nothing(tmp_path, capsys,
                                                                monkeypatch):
    full_disk(monkeypatch, lambda name: name == stream.STATE)
    rc = main([*STREAM, "--out", str(tmp_path / "run")])
    _one_line(capsys, rc, "No space left on device", "nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_tune_on_a_full_disk_names_the_last_saved_step_and_resumes(tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    cfg = TuneConfig(**SMALL)
    full = tune(cfg, tmp_path / "full", progress=False, evaluate_heldout=False)
    real, calls = ocp.CheckpointManager.save, []

    def save(self, step, *a, **k):
        calls.append(step)
        if step == 4:  # as tensorstore reports ENOSPC from orbax's writer thread
            raise ValueError("OUT_OF_RANGE: Error writing in OCDBT database: Failed to write "
                             "3171 bytes: No space left on device [os_error_code='28']")
        return real(self, step, *a, **k)

    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(ocp.CheckpointManager, "save", save)
        with pytest.raises(OutputError, match=r"cannot write checkpoint step 4 in .*: No space "
                                              r"left on device; nothing of step 4 is left, step "
                                              r"2 is the last saved: .* --resume"):
            tune(cfg, out, progress=False, evaluate_heldout=False)
    assert sorted(p.name for p in out.iterdir()) == ["2"]  # no orbax temp folder
    res = tune(cfg, out, resume=True, progress=False, evaluate_heldout=False)
    assert res.history == full.history


FSIZE_RUN = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
    from moejax.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_tune_against_a_real_write_limit_is_one_line(tmp_path):
    """orbax and tensorstore for real, with files capped at 3000 bytes (RLIMIT_FSIZE: the
    kernel refuses the write as a full disk would, no root needed): their worker threads'
    tracebacks are not shown, and no temporary step folder is left."""
    out = tmp_path / "t"
    r = subprocess.run([sys.executable, "-c", FSIZE_RUN, "tune", "--steps", "2", "--every",
                        "2", "--traces", "8", "--batch", "4", "--eval-traces", "8",
                        "--tokens", "16", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert "cannot write checkpoint step 2" in err and "File too large" in err, err
    assert list(tmp_path.iterdir()) == []


# --- two runs, one folder -----------------------------------------------------------------------


def test_a_folder_lock_refuses_a_second_holder_and_cleans_up(tmp_path):
    out = tmp_path / "new"
    with folder_lock(out):
        assert (out / LOCK).read_text().strip() == str(os.getpid())
        with pytest.raises(OutputError, match=rf"--out {out}: another moejax run \(process "
                                              rf"{os.getpid()}\) is writing this folder"):
            with folder_lock(out):
                pass
    assert list(tmp_path.iterdir()) == []  # the folder made for the lock, empty: removed


HOLD = textwrap.dedent("""
    import sys, time
    from moejax.output.lock import folder_lock
    with folder_lock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
""")


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_dead_holder_blocks_nothing(
        tmp_path, capsys):
    out = tmp_path / "res"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (SIM, STREAM, ["sweep", "--traces", "2", "--tokens", "8", "--vary",
                                   "ddr_Bps=1e11,2e11", "--quiet"]):
            rc = main([*argv, "--out", str(out)])
            _one_line(capsys, rc, f"--out {out}: another moejax run (process {holder.pid})")
        assert _files(out) == [LOCK]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert _files(out) == [LOCK]  # a killed holder's lock file stays, and blocks nothing
    assert main([*SIM, "--out", str(out)]) == 0
    assert _files(out) == ["results.csv", "summary.json"]


def test_two_streamed_runs_on_one_out(tmp_path):
    """Two real CLI runs on one --out, the second started while the first works: the first
    writes every row, the second is refused in one line."""
    out = tmp_path / "res"
    argv = [sys.executable, "-m", "moejax.cli.main", *STREAM[:2], "8000", *STREAM[3:],
            "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             text=True, env=env)
    while not (out / LOCK).exists() and first.poll() is None:
        time.sleep(0.05)
    second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    first_err = first.communicate(timeout=600)[1]
    assert first.returncode == 0, first_err
    err = second.stderr.strip()
    assert second.returncode == 2 and len(err.splitlines()) == 1, err
    assert f"another moejax run (process {first.pid})" in err, err
    assert pq.read_table(out / stream.PARTS)["trace"].to_pylist() == list(range(8000))


# --- a corrupt checkpoint names the intact step ---------------------------------------------------


def test_a_corrupt_checkpoint_names_the_intact_step_and_how_to_resume(tmp_path, capsys):
    cfg = TuneConfig(**SMALL)
    full = tune(cfg, tmp_path / "full", progress=False, evaluate_heldout=False)
    out = tmp_path / "run"
    shutil.copytree(tmp_path / "full", out)
    for f in (out / "4" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=rf"step 4: arrays cannot be restored.*; step 2 "
                                              rf"is intact: remove {out / '4'} .* --resume to "
                                              rf"continue from step 2"):
        tune(cfg, out, resume=True, progress=False, evaluate_heldout=False)
    (out / "4" / "meta" / "metadata").write_text("{not json")
    with pytest.raises(CheckpointError, match="metadata cannot be read.*step 2 is intact"):
        tune(cfg, out, resume=True, progress=False, evaluate_heldout=False)
    shutil.rmtree(out / "4")  # as the message says
    res = tune(cfg, out, resume=True, progress=False, evaluate_heldout=False)
    assert res.history == full.history
    np.testing.assert_array_equal(np.asarray(res.raw["placement"]),
                                  np.asarray(full.raw["placement"]))
    for f in (out / "2" / "state").rglob("*"):  # now nothing is intact
        if f.is_file():
            f.write_bytes(b"garbage")
    shutil.rmtree(out / "4")
    with pytest.raises(CheckpointError, match="no earlier step is intact"):
        tune(cfg, out, resume=True, progress=False, evaluate_heldout=False)
