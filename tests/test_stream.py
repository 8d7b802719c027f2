"""Streaming runs: `moejax simulate --stream` writes rows a part at a time, keeps
summaries with a stated error, leaves whole parts on Ctrl-C, and `--resume` continues."""

from __future__ import annotations

import json
import os
import signal

import jax
import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import interrupt_at_second_part, make_model, make_platform

from moejax.cli.main import main
from moejax.errors import ConfigError
from moejax.runner import engine, stream
from moejax.runner.sketch import ALPHA, LogHistogram
from moejax.systems import ep
from moejax.trace import gen

SHAPE = dict(iterations=1, layers=2, tokens=16, num_experts=16, top_k=2)
N, CHUNK = 40, 8


@pytest.mark.parametrize("dist", ["lognormal", "uniform", "bimodal"])
def test_streamed_percentiles_within_stated_error_of_exact(dist):
    rng = np.random.default_rng(3)
    x = {"lognormal": rng.lognormal(-7, 1.5, 20_001),
         "uniform": rng.uniform(1e-4, 2e-3, 20_001),
         "bimodal": np.concatenate([rng.normal(1e-3, 1e-5, 15_000),
                                    rng.normal(5e-2, 1e-3, 5_001)])}[dist]
    x = np.concatenate([x, [0.0]]).astype(np.float32)  # one zero: the below-LOW counter
    a, b = LogHistogram(), LogHistogram()
    for i, part in enumerate(np.array_split(x, 37)):  # in chunks, over two merged sketches
        (a if i % 2 else b).add(part)
    a.merge(b)
    h = LogHistogram.from_state(a.state())  # what --resume reads back
    exact = x.astype(np.float64)
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
        want = np.percentile(exact, q)
        got = h.percentile(q)
        assert abs(got - want) <= ALPHA * abs(want) + 1e-300, (q, got, want)
    s = h.summary()
    assert s["min"] == exact.min() and s["max"] == exact.max()
    np.testing.assert_allclose(s["mean"], exact.mean(), rtol=1e-12)
    h.add([np.nan])
    assert np.isnan(h.percentile(50)) and np.isnan(h.mean())  # as np.percentile with a NaN


@pytest.fixture(scope="module")
def setup():
    """A small EP system, a lazily generated batch, and the in-memory engine's results."""
    cfg = ep.make_config(make_platform("mesh2d"), make_model())
    system, params = ep.build(cfg, SHAPE["iterations"]), ep.default_params(cfg)
    traces = gen.generate_chunked("powerlaw:alpha=1.2", jax.random.key(5), num_traces=N,
                                  **SHAPE)
    key = jax.random.key(9)
    want = engine.simulate(system, params, traces, key, chunk_size=CHUNK)
    return system, params, traces, key, {k: np.asarray(v) for k, v in want.items()}


def _run(setup, out, resume=False):
    system, params, traces, key, _ = setup
    meta = {"run": "test", "traces": N, "chunk": CHUNK}
    return stream.run(system, params, traces, key, chunk=CHUNK, meta=meta, out_dir=out,
                      resume=resume)


def _table(out):
    return pq.read_table(out / stream.PARTS).to_pydict()


def test_streamed_rows_equal_in_memory_run_bit_for_bit(setup, tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "PART_ROWS", 16)  # 40 traces: parts of 16, 16, 8
    sums, done, _ = _run(setup, tmp_path)
    want = setup[4]
    assert done == N and len(list((tmp_path / stream.PARTS).iterdir())) == 3
    t = _table(tmp_path)
    assert t["trace"] == list(range(N))
    for k, v in want.items():
        if v.ndim == 1:
            np.testing.assert_array_equal(np.asarray(t[k], v.dtype), v, err_msg=k)
    lat = want["latency_s"].astype(np.float64)
    for q in (50, 99):
        assert abs(sums.hists["latency_s"].percentile(q) - np.percentile(lat, q)) <= \
            ALPHA * np.percentile(lat, q)
    np.testing.assert_allclose(sums.mean("comm_s"), want["comm_s"].astype(np.float64).mean(),
                               rtol=1e-12)


def test_chunks_of_a_resident_or_host_batch_equal_the_in_memory_run(setup, monkeypatch):
    """`iter_chunks` reads chunks through the engine's reader: a materialized batch sliced on
    the host, or on the accelerator it lives on (CPU stands in for it), gives the rows of
    the in-memory run."""
    system, params, traces, key, want = setup
    batch = traces.chunk(0, N)
    for on_device in (False, True):
        monkeypatch.setattr(engine, "_on_accelerator", lambda tr, v=on_device: v)
        got = list(stream.iter_chunks(system, params, batch, key, CHUNK))
        assert [(lo, hi) for lo, hi, _ in got] == [(s, min(s + CHUNK, N))
                                                   for s in range(0, N, CHUNK)]
        np.testing.assert_array_equal(
            np.concatenate([np.asarray(out["latency_s"]) for *_, out in got]),
            want["latency_s"])


def test_interrupted_run_keeps_whole_parts_and_resume_equals_uninterrupted(
        setup, tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "PART_ROWS", 16)
    full, cut = tmp_path / "full", tmp_path / "cut"
    sums_full, _, _ = _run(setup, full)
    real = interrupt_at_second_part(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _run(setup, cut)
    files = sorted(p.name for p in cut.rglob("*"))
    assert files == ["part-000000.parquet", "results", "stream_state.npz"], files  # no temp
    assert stream.load_state(cut)[1:3] == (16, 1)
    with pytest.raises(ConfigError, match="--resume to continue"):  # not overwritten
        _run(setup, cut)
    monkeypatch.setattr(stream, "_parquet_bytes", real)
    sums, done, _ = _run(setup, cut, resume=True)
    assert done == N - 16
    assert _table(cut) == _table(full)
    a, b = sums.state(), sums_full.state()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_ctrl_c_is_held_while_a_part_and_its_state_are_renamed():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with stream._hold_sigint():
            os.kill(os.getpid(), signal.SIGINT)
            done.append(1)  # the block finishes first
    assert done == [1]


def test_cli_stream_writes_parts_and_summary_and_refuses_bad_resume(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["simulate", "--traces", "12", "--tokens", "8", "--chunk", "4", "--quiet",
            "--out", str(out)]
    assert main(args + ["--stream"]) == 0
    summ = json.loads((out / "summary.json").read_text())
    assert summ["traces"] == 12 and summ["streamed"]["chunk"] == 4
    assert _table(out)["trace"] == list(range(12))
    assert main(args + ["--resume"]) == 0  # same settings: accepted, nothing left to do
    again = json.loads((out / "summary.json").read_text())
    assert again["streamed"]["traces_this_call"] == 0
    assert again["latency_s"] == summ["latency_s"]
    capsys.readouterr()
    for extra, msg in [(["--stream"], "holds a streamed run already"),
                       (["--resume", "--seed", "3"], "--resume: seed is 3 but the run"),
                       (["--resume", "--out", str(tmp_path / "none")], "holds no streamed run")]:
        before = sorted(tmp_path.rglob("*"))
        rc = main(args + extra)
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and msg in err, err
        assert sorted(tmp_path.rglob("*")) == before  # nothing written
