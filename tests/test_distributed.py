"""Multi-process runs (moejax.distributed): 2 CPU processes over loopback (gloo collectives)
and 4 host devices in one process give the single-process results bit for bit; process 0
alone writes; bad launches fail in one line with exit code 2."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moejax import distributed
from moejax.cli import main

# a small EP run: 37 traces (not a multiple of 2 or 4: the last block is padded), 2 chunks
ARGS = ["simulate", "--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b", "--tokens", "16",
        "--traces", "37", "--chunk", "24", "--quiet"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(extra, env_extra=None, timeout=120):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "moejax.cli", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> str:
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


def test_two_processes_equal_one_bit_for_bit(single, tmp_path):
    port = _free_port()
    out = tmp_path / "two"
    procs = [_cli([*ARGS, "--out", str(out), "--coordinator", f"127.0.0.1:{port}",
                   "--num-processes", "2", "--process-id", str(r), "--distributed-timeout",
                   "60"]) for r in range(2)]
    res = [p.communicate(timeout=120) for p in procs]
    for p, (_, e) in zip(procs, res, strict=True):
        assert p.returncode == 0, e[-2000:]
    assert "wrote" in res[0][0] and "wrote" not in res[1][0]  # process 0 alone writes
    assert sorted(x.name for x in out.iterdir()) == ["results.csv", "summary.json"]
    assert (out / "results.csv").read_text() == single  # %.9g of float32: bit for bit


def test_four_host_devices_equal_one_to_the_last_ulp(single, tmp_path):
    """Sharding a chunk over 4 local devices changes the per-device batch shape, and XLA's CPU
    code rounds some sums differently for another shape: equal to float32 rounding, not bit
    for bit (the multi-process split keeps the shapes, and is bit for bit above)."""
    out = tmp_path / "four"
    p = _cli([*ARGS, "--out", str(out)], {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    o, e = p.communicate(timeout=120)
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


TUNE = ["tune", "--steps", "3", "--traces", "8", "--batch", "4", "--eval-traces", "8",
        "--tokens", "16", "--iterations", "1", "--every", "2", "--quiet"]


@pytest.fixture(scope="module")
def tune_one(tmp_path_factory) -> Path:
    """A single-process tune run's folder (shared: its problem stays cached in-process)."""
    out = tmp_path_factory.mktemp("tune") / "one"
    assert main([*TUNE, "--out", str(out)]) == 0
    return out


def test_two_process_tune_averages_gradients_and_process_0_alone_writes(tune_one, tmp_path):
    """Data-parallel tune (moejax.tune.parallel): each process the gradient of its half of
    every batch, averaged by an all-gather; the run follows the single-process one (the mean
    of two half-batch means is the batch mean, to float rounding) and only process 0 writes
    checkpoints and summary.json."""
    from moejax.tune import loop

    port = _free_port()
    procs = [_cli([*TUNE, "--out", str(tmp_path / f"two{r}"), "--coordinator",
                   f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(r),
                   "--distributed-timeout", "60"]) for r in range(2)]
    for p in procs:
        _, e = p.communicate(timeout=600)  # a loaded machine: minutes
        assert p.returncode == 0, e[-2000:]
    assert not (tmp_path / "two1").exists()  # process 1 wrote nothing
    _, one = loop.restore(tune_one)
    _, two = loop.restore(tmp_path / "two0")
    assert two.step == one.step == 3
    np.testing.assert_allclose(two.history, one.history, rtol=1e-5)
    for k in one.raw:  # adam's first steps amplify float rounding of small gradients
        np.testing.assert_allclose(np.asarray(two.raw[k]), np.asarray(one.raw[k]), atol=1e-4)
        np.testing.assert_array_equal(np.asarray(two.hard[k]), np.asarray(one.hard[k]))
    s = [__import__("json").loads((d / "summary.json").read_text())
         for d in (tune_one, tmp_path / "two0")]
    assert s[1]["processes"] == 2 and s[1]["evaluation"] == s[0]["evaluation"]


def test_parallel_open_run_restores_what_the_local_one_does(tune_one):
    """The multi-process resume path (process 0 restores, broadcasts), in one process."""
    from moejax.tune import TuneConfig, loop, parallel

    cfg = loop.restore(tune_one)[0].cfg
    tmp_path = tune_one
    prob = loop.build_problem(cfg)
    raw = loop.initial_raw(prob)
    a = loop.open_run(cfg, tmp_path, True, raw, prob.optimizer.init(raw))
    b = parallel.open_run(cfg, tmp_path, True, raw, prob.optimizer.init(raw))
    a[0].close()
    b[0].close()
    assert a[1:3] == b[1:3] == (3, a[2])
    for x, y in zip(jax_leaves(a[3:]), jax_leaves(b[3:]), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(Exception, match="already holds checkpoints"):
        parallel.open_run(cfg, tmp_path, False, raw, prob.optimizer.init(raw))
    with pytest.raises(Exception, match="p99"):
        parallel.check(TuneConfig(loss="p99"))


def jax_leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


SWEEP = ["sweep", "--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b", "--policy", "ep",
         "--tokens", "16", "--traces", "4", "--quiet", "--vary", "link_Bps=20e9:300e9:5",
         "--points-per-call", "2"]  # 3 blocks of points: process 0 gets 2, process 1 one


def test_two_process_sweep_splits_points_and_equals_one_bit_for_bit(tmp_path):
    assert main([*SWEEP, "--out", str(tmp_path / "one")]) == 0
    port = _free_port()
    procs = [_cli([*SWEEP, "--out", str(tmp_path / f"two{r}"), "--coordinator",
                   f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(r),
                   "--distributed-timeout", "60"]) for r in range(2)]
    for p in procs:
        _, e = p.communicate(timeout=600)
        assert p.returncode == 0, e[-2000:]
    assert not (tmp_path / "two1").exists()  # process 0 alone writes
    assert ((tmp_path / "two0" / "sweep.csv").read_text()
            == (tmp_path / "one" / "sweep.csv").read_text())
