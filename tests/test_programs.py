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


# ---- quick compiles ---------------------------------------------------------------------

@pytest.fixture
def fresh_quick(monkeypatch):
    """Quick compiles undecided, as in a new process, and no program compiled quickly
    left behind for the next test."""
    monkeypatch.setattr(programs, "_QUICK", [None])
    yield
    programs.PROGRAMS.clear()


def test_quick_compiles_build_a_program_of_their_own(traces, fresh_quick):
    tr = _rows(traces, 8)
    programs.quick_compile(False)
    default = api.simulate("chiplet-2x2", "qwen3-30b-a3b", "ep", tr)
    lines = []
    programs.report_compiles(lines.append)
    try:
        programs.quick_compile(True)
        quick = api.simulate("chiplet-2x2", "qwen3-30b-a3b", "ep", tr)
        programs.quick_compile(False)
        with count_compiles() as compiles:  # the default program is still there
            again = api.simulate("chiplet-2x2", "qwen3-30b-a3b", "ep", tr)
    finally:
        programs.report_compiles(None)
    assert lines[0] == "compiling ep (quick compile) for 8 traces x 64 tokens ..."
    assert compiles == [] and len(lines) == 2, lines
    for k in default:
        np.testing.assert_array_equal(again[k], default[k], err_msg=k)
        # float32 sums may be summed in another order: the last bits may differ, no more
        np.testing.assert_allclose(quick[k], default[k], rtol=1e-6, atol=0, err_msg=k)


def test_quick_compile_options_reach_xla(traces, monkeypatch, fresh_quick):
    """The engine compiles with `QUICK_OPTIONS` (an option XLA does not know is refused
    there), and without them by default."""
    system, params = _build()
    monkeypatch.setattr(programs, "QUICK_OPTIONS", {"xla_no_such_option": True})
    monkeypatch.setattr(programs, "_QUICK", [True])
    with pytest.raises(Exception, match="xla_no_such_option"):
        engine.simulate(system, params, _rows(traces, 2), jax.random.key(5))
    monkeypatch.setattr(programs, "_QUICK", [False])
    engine.simulate(system, params, _rows(traces, 2), jax.random.key(5))


def test_quick_compiles_round_a_multiply_add_as_the_default_compile(fresh_quick):
    # moejax asked LLVM for SelectionDAG at -O0 when imported (before JAX's backend)
    assert "-fast-isel=false" in os.environ["XLA_FLAGS"]
    programs.quick_compile(True)  # its check compiles a*b+c both ways: no error
    assert programs.compiler_options() == programs.QUICK_OPTIONS
    programs.quick_compile(False)
    assert programs.compiler_options() is None


def test_quick_compiles_are_refused_where_fastisel_would_round_differently():
    # JAX's backend started before moejax was imported: XLA_FLAGS came too late
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(ROOT)
    code = ("import jax\njax.numpy.ones(1).block_until_ready()\n"
            "from moejax.runner import programs\n"
            "try:\n    programs.quick_compile(True)\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ConfigError quick compile: LLVM uses FastISel"), r.stdout


def test_the_quick_compile_setting_is_read_from_the_environment(monkeypatch, fresh_quick,
                                                                capsys, tmp_path):
    monkeypatch.setenv(programs.ENV_QUICK, "yes")
    assert programs.quick_compiling()
    monkeypatch.setattr(programs, "_QUICK", [None])
    monkeypatch.setenv(programs.ENV_QUICK, "0")
    assert not programs.quick_compiling()
    monkeypatch.setattr(programs, "_QUICK", [None])
    monkeypatch.setenv(programs.ENV_QUICK, "maybe")
    from moejax.cli.main import main

    out = tmp_path / "o"
    assert main(["simulate", "--traces", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["moejax: error: $MOEJAX_QUICK_COMPILE: 'maybe' is not one of 1, true, yes, "
                   "on, 0, false, no, off"]
    assert not out.exists()


def test_the_cli_compiles_quickly_when_asked_and_sweeps_do_too(monkeypatch, fresh_quick,
                                                               capsys, tmp_path):
    from moejax.cli.main import main

    monkeypatch.delenv(programs.ENV_QUICK, raising=False)
    assert main(["simulate", "--quick-compile", "--traces", "2", "--tokens", "16",
                 "--out", str(tmp_path / "o")]) == 0
    assert "compiling ep (quick compile) for 2 traces x 16 tokens" in capsys.readouterr().err
    # a sweep's program gets the options too (XLA refuses one it does not know)
    monkeypatch.setattr(programs, "QUICK_OPTIONS", {"xla_no_such_option": True})
    with pytest.raises(Exception, match="xla_no_such_option"):
        main(["sweep", "--vary", "link_Bps=50e9,100e9", "--traces", "2", "--tokens", "16",
              "--quiet", "--out", str(tmp_path / "sw")])


def test_the_cli_decides_quick_compiles_only_after_joining_a_multi_process_run(
        monkeypatch, fresh_quick, tmp_path):
    """Quick compiles' check computes with JAX; `jax.distributed.initialize` must come
    before any computation, so the CLI joins first."""
    from moejax.cli.main import main
    from moejax.runner import distributed

    seen = []
    monkeypatch.setattr(distributed, "initialize", lambda launch: seen.append(programs._QUICK[0]))
    assert main(["simulate", "--quick-compile", "--traces", "2", "--tokens", "16",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert seen == [None] and programs.quick_compiling()
