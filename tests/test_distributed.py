"""Multi-process runs (moejax.runner.distributed): 2 CPU processes over loopback (gloo collectives)
and 4 host devices in one process give the single-process results bit for bit; process 0
alone writes; bad launches fail in one line with exit code 2.

Every 2-process check shares one launch (`two`: tests/two_process_worker.py runs simulate,
simulate --stream, --resume, sweep and tune in turn in each process), so the suite pays one
jax import and one rendezvous per process for all of them. The single-process references run
first, in this process, into a JAX persistent compilation cache of this module's own
(`compile_cache`); the 2 processes (and the 4-device run) then read their programs from it
instead of compiling them again, and never write to it (so no process can read a half-written
entry)."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import interrupt_at_second_part

from moejax.cli.main import main
from moejax.runner import distributed, stream

# a small EP run: 37 traces (not a multiple of 2 or 4: the last block is padded), 2 chunks
ARGS = ["simulate", "--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b", "--tokens", "16",
        "--traces", "37", "--chunk", "24", "--quiet"]
# the same run streamed in 5 chunks (8, 8, 8, 8, 5) to Parquet parts of 16 rows (16, 16, 5);
# over 2 processes in rounds of one chunk a process: [0, 16), [16, 32), [32, 37) (in the
# last round process 1 has no chunk)
STREAM = [*ARGS[:-2], "8", "--quiet", "--stream"]
SMALL = {"moejax.runner.stream.PART_ROWS": 16, "moejax.runner.stream.ROUND_TRACES": 8}
TUNE = ["tune", "--steps", "3", "--traces", "8", "--batch", "4", "--eval-traces", "8",
        "--tokens", "16", "--iterations", "1", "--every", "2", "--quiet"]
SWEEP = ["sweep", "--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b", "--policy", "ep",
         "--tokens", "16", "--traces", "4", "--quiet", "--vary", "link_Bps=20e9:300e9:5",
         "--points-per-call", "2"]  # 3 blocks of points: process 0 gets 2, process 1 one


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(extra, env_extra=None, timeout=120):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "moejax.cli.main", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _small_parts(mp):
    for name, v in SMALL.items():
        mp.setattr(stream, name.rpartition(".")[2], v)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """This module's persistent compilation cache: written by this process (the single-process
    references), read-only for the subprocesses (`_read_cache_env`); off again afterwards."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    d = tmp_path_factory.mktemp("jax_cache")
    keep = jax.config.jax_persistent_cache_min_compile_time_secs
    cc.set_cache_dir(str(d))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    cc.reset_cache()  # a worker that compiled before has checked "no cache" once for all
    yield d
    cc.set_cache_dir(None)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", keep)
    cc.reset_cache()


def _read_cache_env(cache) -> dict:
    """A subprocess reads `cache` and writes nothing to it (no compile takes 1e9 s)."""
    return {"JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1e9"}


@pytest.fixture(scope="module")
def two(tmp_path_factory, compile_cache, single, stream_one, tune_one, sweep_one):
    """The 2-process launch, started after the single-process references are made (their
    programs are in `compile_cache` then). First, in this process, a streamed run interrupted
    by Ctrl-C at its 2nd part, which the 2 processes then resume. Yields (folder, the 2
    Popen)."""
    d = tmp_path_factory.mktemp("two")
    with pytest.MonkeyPatch.context() as mp:
        _small_parts(mp)
        interrupt_at_second_part(mp)
        assert main([*STREAM, "--out", str(d / "cut")]) == 130
    shutil.copytree(d / "cut", d / "cut_before")
    flags = ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", "2",
             "--distributed-timeout", "60"]
    procs = []
    for r in range(2):  # folders named ...{r}: process 1's must never appear
        runs = [[*ARGS, "--out", str(d / f"sim{r}")], [*STREAM, "--out", str(d / f"st{r}")],
                # process 1 gets a folder it cannot read (as on another host)
                [*STREAM, "--resume", "--out", str(d / ("cut" if r == 0 else "cut1"))],
                [*SWEEP, "--out", str(d / f"sweep{r}")], [*TUNE, "--out", str(d / f"tune{r}")]]
        (d / f"plan{r}.json").write_text(json.dumps({"flags": flags, "set": SMALL,
                                                     "runs": runs}))
        worker = Path(__file__).with_name("two_process_worker.py")
        procs.append(subprocess.Popen(
            [sys.executable, str(worker), str(d / f"plan{r}.json"), str(r)],
            env={**os.environ, "JAX_PLATFORMS": "cpu", **_read_cache_env(compile_cache)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
    yield d, procs
    for p in procs:
        if p.poll() is None:
            p.kill()


@pytest.fixture(scope="module")
def two_done(two):
    """The 2-process launch, finished: every run exited 0,
    process 0 alone wrote."""
    d, procs = two
    res = [p.communicate(timeout=900) for p in procs]  # a loaded machine: minutes
    for p, (_, e) in zip(procs, res, strict=True):
        assert p.returncode == 0, e[-3000:]
    codes = [json.loads(o.strip().splitlines()[-1]) for o, _ in res]
    assert codes == [[0] * 5] * 2, (codes, [e[-3000:] for _, e in res])
    assert "wrote" in res[0][0] and "wrote" not in res[1][0]  # process 0 alone prints
    assert not list(d.glob("*1")), list(d.glob("*1"))  # process 1 made no folder
    return d


@pytest.fixture(scope="module")
def single(compile_cache, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("single")
    assert main([*ARGS, "--out", str(out)]) == 0
    return (out / "results.csv").read_text()


def test_partition_covers_every_index_once_in_whole_chunks():
    for total in (1, 5, 37, 64):
        for chunk in (1, 4, 24):
            chunk = min(chunk, total)
            for count in (2, 3, 4):
                parts = [distributed.partition(total, chunk, r, count) for r in range(count)]
                got = np.concatenate([p.take(np.arange(total))[: p.hi - p.lo] for p in parts])
                np.testing.assert_array_equal(got, np.arange(total))
                for p in parts:  # blocks start on a chunk boundary of the single-process run
                    assert p.rows >= 1 and (p.lo % chunk == 0 or p.lo == total)


def test_two_processes_equal_one_bit_for_bit(single, two_done):
    out = two_done / "sim0"
    assert sorted(x.name for x in out.iterdir()) == ["results.csv", "summary.json"]
    assert (out / "results.csv").read_text() == single  # %.9g of float32: bit for bit


@pytest.fixture(scope="module")
def stream_one(compile_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stream") / "one"
    with pytest.MonkeyPatch.context() as mp:
        _small_parts(mp)
        assert main([*STREAM, "--out", str(out)]) == 0
    return out


def _stream_result(out: Path):
    files = sorted(p.name for p in (out / stream.PARTS).iterdir())
    summ = json.loads((out / "summary.json").read_text())
    for k in ("wall_s", "streamed"):
        summ.pop(k)
    # the command lines differ (the two-process run names its processes); the data may not
    summ["provenance"] = {k: v for k, v in summ["provenance"].items() if k != "command"}
    return files, [pq.read_table(out / stream.PARTS / f) for f in files], summ


def test_two_process_stream_equals_one_and_resumes_a_one_process_run(stream_one, two_done):
    """`--stream` over 2 processes: rows all-gathered per round, process 0 writes the
    single-process part layout, bit for bit; a run interrupted in one process resumes in two
    (process 1, given a folder it cannot read, learns where to go on from process 0)."""
    want = _stream_result(stream_one)
    assert want[0] == [f"part-{i:06d}.parquet" for i in range(3)]
    assert [t.num_rows for t in want[1]] == [16, 16, 5]
    for run in ("st0", "cut"):
        got = _stream_result(two_done / run)
        assert got[0] == want[0] and got[2] == want[2], run
        for a, b in zip(got[1], want[1], strict=True):
            assert a.equals(b), run  # every column, bit for bit
    assert stream.load_state(two_done / "cut_before")[1:3] == (16, 1)
    cut = json.loads((two_done / "cut" / "summary.json").read_text())["streamed"]
    assert cut["traces_this_call"] == 37 - 16 and cut["processes"] == 2


def test_four_host_devices_equal_one_to_the_last_ulp(single, compile_cache, tmp_path):
    """Sharding a chunk over 4 local devices changes the per-device batch shape, and XLA's CPU
    code rounds some sums differently for another shape: equal to float32 rounding, not bit
    for bit (the multi-process split keeps the shapes, and is bit for bit above)."""
    out = tmp_path / "four"
    p = _cli([*ARGS, "--out", str(out)], {"XLA_FLAGS": "--xla_force_host_platform_device_count=4",
                                          **_read_cache_env(compile_cache)})
    o, e = p.communicate(timeout=300)
    assert p.returncode == 0, e[-2000:]
    four, one = (np.genfromtxt(io.StringIO(t), delimiter=",", names=True)
                 for t in ((out / "results.csv").read_text(), single))
    for name in one.dtype.names:
        np.testing.assert_allclose(four[name], one[name], rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("flags, field", [
    (["--num-processes", "2", "--process-id", "2"], "--process-id"),
    (["--num-processes", "0", "--process-id", "0"], "--num-processes"),
    (["--num-processes", "2"], "--process-id"),
])
def test_bad_launch_is_one_line(flags, field, tmp_path, capsys):
    out = tmp_path / "bad"
    rc = main([*ARGS, "--out", str(out), "--coordinator", "127.0.0.1:1", *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and field in err
    assert not out.exists()


def test_unreachable_coordinator_fails_within_timeout(tmp_path):
    out = tmp_path / "none"
    p = _cli([*ARGS, "--out", str(out), "--coordinator", f"127.0.0.1:{_free_port()}",
              "--num-processes", "2", "--process-id", "1", "--distributed-timeout", "2"])
    o, e = p.communicate(timeout=60)
    assert p.returncode == 2, e[-2000:]
    lines = [x for x in e.splitlines() if x.strip()]
    assert len(lines) == 1 and "could not join" in lines[0], e[-2000:]
    assert not Path(out).exists()


@pytest.fixture(scope="module")
def tune_one(compile_cache, tmp_path_factory) -> Path:
    """A single-process tune run's folder (shared: its problem stays cached in-process)."""
    out = tmp_path_factory.mktemp("tune") / "one"
    assert main([*TUNE, "--out", str(out)]) == 0
    return out


def test_two_process_tune_averages_gradients_and_process_0_alone_writes(tune_one, two_done):
    """Data-parallel tune (moejax.tune.parallel): each process the gradient of its half of
    every batch, averaged by an all-gather; the run follows the single-process one (the mean
    of two half-batch means is the batch mean, to float rounding) and only process 0 writes
    checkpoints and summary.json."""
    from moejax.tune import restore

    _, one = restore(tune_one)
    _, two = restore(two_done / "tune0")
    assert two.step == one.step == 3
    np.testing.assert_allclose(two.history, one.history, rtol=1e-5)
    for k in one.raw:  # adam's first steps amplify float rounding of small gradients
        np.testing.assert_allclose(np.asarray(two.raw[k]), np.asarray(one.raw[k]), atol=1e-4)
        np.testing.assert_array_equal(np.asarray(two.hard[k]), np.asarray(one.hard[k]))
    s = [json.loads((d / "summary.json").read_text()) for d in (tune_one, two_done / "tune0")]
    assert s[1]["processes"] == 2 and s[1]["evaluation"] == s[0]["evaluation"]


def test_parallel_open_run_restores_what_the_local_one_does(tune_one):
    """The multi-process resume path (process 0 restores, broadcasts), in one process."""
    import jax

    from moejax.tune import TuneConfig, loop, parallel, restore

    cfg = restore(tune_one)[0].cfg
    prob = loop.build_problem(cfg)
    raw = loop.initial_raw(prob)
    a = loop.open_run(cfg, tune_one, True, raw, prob.optimizer.init(raw))
    b = parallel.open_run(cfg, tune_one, True, raw, prob.optimizer.init(raw))
    a[0].close()
    b[0].close()
    assert a[1:3] == b[1:3] == (3, a[2])
    for x, y in zip(jax.tree_util.tree_leaves(a[3:]), jax.tree_util.tree_leaves(b[3:]),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(Exception, match="already holds checkpoints"):
        parallel.open_run(cfg, tune_one, False, raw, prob.optimizer.init(raw))
    with pytest.raises(Exception, match="p99"):
        parallel.check(TuneConfig(loss="p99"))


@pytest.fixture(scope="module")
def sweep_one(compile_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "one"
    assert main([*SWEEP, "--out", str(out)]) == 0
    return out


def test_two_process_sweep_splits_points_and_equals_one_bit_for_bit(sweep_one, two_done):
    assert ((two_done / "sweep0" / "sweep.csv").read_text()
            == (sweep_one / "sweep.csv").read_text())
