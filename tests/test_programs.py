"""Compile once per distinct program: value fingerprints, the program cache, batch buckets,
compile reports and the persistent compilation cache (moejax.runner.programs)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from jax import monitoring

from moejax import api
from moejax.runner import engine, programs
from moejax.systems import SYSTEMS, resolve
from moejax.trace import gen

ROOT = Path(__file__).resolve().parents[1]
# the simulation program's persistent-cache entries (the hard-only program at tau = 0)
SIM = ("jit_one_params-", "jit_one_params_hard-")


@contextlib.contextmanager
def count_compiles():
    """The number of XLA compiles while the block runs (JAX's backend-compile event)."""
    seen = []

    def listener(event, duration_s, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(duration_s)

    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        monitoring.unregister_event_duration_listener(listener)


@pytest.fixture(scope="module")
def traces():
    return gen.generate("powerlaw:alpha=1.5", jax.random.key(0), num_traces=128, iterations=1,
                        layers=1, tokens=64, num_experts=128, top_k=8)


def _rows(tr, n):
    return jax.tree_util.tree_map(lambda x: x[:n], tr)


def _build(policy="ep", **options):
    s = resolve("chiplet-2x2", "qwen3-30b-a3b", policy)
    table = s.policy.options_table()
    return SYSTEMS[s.policy.system].from_policy(s.platform, s.model, table, 1)


def test_equal_builds_share_a_fingerprint_and_different_ones_do_not():
    (a, _), (b, _) = _build(), _build()
    assert a is not b
    assert programs.fingerprint(a) == programs.fingerprint(b)
    (c, _) = _build("fsedp")
    assert programs.fingerprint(c) != programs.fingerprint(a)
    assert engine.compiled_program(a, False, "threefry2x32") is engine.compiled_program(
        b, False, "threefry2x32")


def test_fingerprint_reads_array_bytes_dtypes_and_closures():
    fp = programs.fingerprint

    @dataclasses.dataclass(frozen=True, eq=False)
    class Cfg:
        table: np.ndarray
        n: int

    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert fp(Cfg(x, 1)) == fp(Cfg(x.copy(), 1))
    assert fp(Cfg(x, 1)) != fp(Cfg(x, 2))
    assert fp(Cfg(x, 1)) != fp(Cfg(x.astype(np.int64), 1))
    assert fp(Cfg(x, 1)) != fp(Cfg(x.reshape(3, 2), 1))
    y = x.copy()
    y[0, 0] = 7
    assert fp(Cfg(x, 1)) != fp(Cfg(y, 1))

    def make(k):
        return lambda v: v * k

    assert fp(make(2)) == fp(make(2)) and fp(make(2)) != fp(make(3))
    with pytest.raises(programs.Unfingerprintable):
        jax.jit(lambda t: fp(t) and t)(1.0)


def test_a_second_identical_api_call_does_not_compile_and_gives_the_same_numbers(traces):
    tr = _rows(traces, 16)
    first = api.simulate("chiplet-2x2", "qwen3-30b-a3b", "ep", tr)
    with count_compiles() as compiles:
        t0 = time.perf_counter()
        second = api.simulate("chiplet-2x2", "qwen3-30b-a3b", "ep", tr)
        elapsed = time.perf_counter() - t0
    assert compiles == []
    assert elapsed < 1.0  # ~10-50 ms on 2 cores; generous for a loaded machine
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])


def test_batches_in_one_bucket_share_one_program_and_match_bit_for_bit(traces):
    full = api.simulate("chiplet-2x2", "qwen3-30b-a3b", "ep", traces)  # 128: the bucket
    for n in (100, 120):
        rows = _rows(traces, n)
        with count_compiles() as compiles:
            part = api.simulate("chiplet-2x2", "qwen3-30b-a3b", "ep", rows)
        assert compiles == [], n
        for k in full:
            np.testing.assert_array_equal(part[k], full[k][:n], err_msg=k)


def test_a_padded_last_chunk_matches_an_unpadded_run(traces):
    system, params = _build()
    whole = engine.simulate(system, params, _rows(traces, 100), jax.random.key(3),
                            chunk_size=100)
    chunked = engine.simulate(system, params, _rows(traces, 100), jax.random.key(3),
                              chunk_size=32)  # 4 calls of 32, the last padded from 4
    for k in whole:
        assert np.shape(chunked[k]) == np.shape(whole[k])
        np.testing.assert_array_equal(np.asarray(chunked[k]), np.asarray(whole[k]), err_msg=k)


def test_keys_of_a_batch_are_a_prefix_of_a_bucket_split():
    key = jax.random.key(11)
    for n in (1, 5, 100, 129):
        data, impl = engine.split_keys(key, n)
        want = jax.random.key_data(jax.random.split(key, n))
        np.testing.assert_array_equal(data, np.asarray(want))
        assert impl == "threefry2x32"


def test_bucket_sizes():
    assert [programs.bucket(n, 512) for n in (1, 2, 3, 100, 128, 129, 512, 513, 10_000)] == [
        1, 2, 4, 128, 128, 256, 512, 512, 512]
    assert programs.bucket(100, 64) == 64


def test_compiles_are_reported_only_when_asked(traces):
    lines = []
    system, params = _build()
    programs.report_compiles(lines.append)
    try:
        engine.simulate(system, params, _rows(traces, 3), jax.random.key(5))
        engine.simulate(system, params, _rows(traces, 3), jax.random.key(5))
    finally:
        programs.report_compiles(None)
    assert lines[0] == "compiling ep for 4 traces x 64 tokens ..."
    assert lines[1].startswith("compiled ep for 4 traces x 64 tokens in ")
    assert len(lines) == 2


def test_cache_setting_reads_the_flag_then_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(programs.ENV_CACHE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert programs.cache_setting() == str(tmp_path / "moejax" / "jax")
    monkeypatch.setenv(programs.ENV_CACHE, "off")
    assert programs.cache_setting() is None
    monkeypatch.setenv(programs.ENV_CACHE, str(tmp_path / "c"))
    assert programs.cache_setting() == str(tmp_path / "c")
    assert programs.cache_setting("off") is None
    assert programs.cache_setting(str(tmp_path / "d")) == str(tmp_path / "d")


def _cli(args, env):
    return subprocess.run([sys.executable, "-m", "moejax.cli.main", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_a_second_process_reads_the_persistent_cache(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MOEJAX_COMPILATION_CACHE=str(tmp_path / "jc"))
    args = ["simulate", "--traces", "8", "--out", str(tmp_path / "o1")]
    first = _cli(args, env)
    assert first.returncode == 0, first.stderr
    assert "compiling ep for 8 traces" in first.stderr
    entries = sorted(p.name for p in (tmp_path / "jc").iterdir() if p.name.endswith("-cache"))
    assert entries, "nothing written to the persistent cache"
    sim = [e for e in entries if e.startswith(SIM)]  # the simulation program
    assert len(sim) == 1, entries
    # the second process counts JAX's persistent-cache hits while the CLI runs
    hits = ("import sys; from jax import monitoring; from moejax.cli.main import main; n = [];"
            "monitoring.register_event_listener(lambda e, **k: n.append(e) if e =="
            " '/jax/compilation_cache/cache_hits' else None);"
            "rc = main(sys.argv[1:]); print('HITS', len(n)); sys.exit(rc)")
    second = subprocess.run([sys.executable, "-c", hits, "simulate", "--traces", "8", "--out",
                             str(tmp_path / "o2")], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    assert int(second.stdout.split("HITS")[1].split()[0]) >= len(entries), second.stdout[-500:]
    after = sorted(p.name for p in (tmp_path / "jc").iterdir() if p.name.endswith("-cache"))
    assert [e for e in after if e.startswith(SIM)] == sim
    a = (tmp_path / "o1" / "results.csv").read_text()
    assert a == (tmp_path / "o2" / "results.csv").read_text()
