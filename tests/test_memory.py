"""Memory-safe batches: counts by bincount, generation a chunk at a time, an
up-front size estimate that shrinks the chunk or refuses in one line."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import make_model, make_platform

from moejax.cli.main import main
from moejax.errors import ConfigError
from moejax.runner import budget, engine
from moejax.systems import ep
from moejax.trace import counts_from_ids, gen

FIELDS = ("expert_ids", "gate_weights", "token_mask", "token_request", "counts")
SHAPE = dict(iterations=2, layers=3, tokens=24, num_experts=16, top_k=2)


def test_counts_by_bincount_equal_onehot_counts():
    ids = np.random.default_rng(0).integers(-1, 12, (2, 3, 7, 4))  # -1 and >= E dropped
    onehot = jax.nn.one_hot(ids, 10, dtype=np.float32).sum(axis=(-3, -2))
    got = counts_from_ids(ids, 10)
    assert got.dtype == np.float32 and got.shape == onehot.shape == (2, 3, 10)
    np.testing.assert_array_equal(got, onehot)
    vm = jax.vmap(lambda x: counts_from_ids(x, 10))(ids[:, None])
    np.testing.assert_array_equal(vm[:, 0], onehot)
    assert counts_from_ids(np.zeros((2, 0, 4), int), 10).shape == (2, 10)


@pytest.fixture(scope="module")
def batches():
    """The same 8 traces, generated whole and as a ChunkedTraces."""
    key = jax.random.key(7)
    return (gen.generate("powerlaw:alpha=1.2", key, num_traces=8, **SHAPE),
            gen.generate_chunked("powerlaw:alpha=1.2", key, num_traces=8, **SHAPE))


def test_chunked_generation_equals_whole_batch_bit_for_bit(batches):
    whole, lazy = batches
    parts = [lazy.chunk(s, s + 4) for s in (0, 4)]
    for f in FIELDS:
        np.testing.assert_array_equal(np.concatenate([getattr(p, f) for p in parts]),
                                      getattr(whole, f), err_msg=f)
    assert lazy.bytes_per_trace == sum(getattr(whole, f)[0].nbytes for f in FIELDS)
    with pytest.raises(ConfigError, match="chunk"):
        lazy.chunk(4, 9)


def test_engine_on_chunked_traces_equals_whole_batch(batches):
    whole, lazy = batches
    cfg = ep.make_config(make_platform("mesh2d"), make_model())
    system, params = ep.build(cfg, SHAPE["iterations"]), ep.default_params(cfg)
    key = jax.random.key(2)
    a = engine.simulate(system, params, lazy, key, chunk_size=4)
    b = engine.simulate(system, params, whole, key, chunk_size=4)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
    assert engine.batch_size(lazy) == 8


def test_plan_chunk_shrinks_a_default_chunk_and_refuses_a_given_one():
    kw = dict(trace_bytes=1000, scratch_bytes=6000, metric_bytes=40, metric_scalars=10,
              available=8 * 2**20)  # a chunk may hold 1 MiB: 128 traces at 8000 B each
    assert budget.plan_chunk(1000, 64, chunk_given=True, **kw) == 64
    assert budget.plan_chunk(1000, 512, chunk_given=False, **kw) == 128
    with pytest.raises(ConfigError, match=r"^chunk: 512 .* use --chunk 128 or less$"):
        budget.plan_chunk(1000, 512, chunk_given=True, **kw)
    with pytest.raises(ConfigError, match=r"^traces: 100000 traces need about"):
        budget.plan_chunk(100_000, 64, chunk_given=False, **kw)


def test_cli_refuses_a_run_too_large_for_memory_in_one_line(tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(["simulate", "--traces", str(10**12), "--tokens", "8", "--out", str(out),
               "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("moejax: error: traces: 1000000000000 traces need about"), err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_trace_gen_refuses_a_batch_too_large_to_write_in_one_line(tmp_path, capsys):
    out = tmp_path / "t.npz"
    rc = main(["trace", "gen", "uniform", "--experts", "128", "--top-k", "8", "--traces",
               str(10**10), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "10000000000 traces of" in err and "--traces" in err
    assert list(tmp_path.iterdir()) == []


def test_generate_in_chunks_equals_one_call(monkeypatch):
    """A batch whose sampling scratch is over GENERATE_SCRATCH_BYTES is made a few traces at
    a time (the full FSE-DP grid peaked at 14.8 GB in one generate call), with the
    same traces bit for bit."""
    args = dict(num_traces=5, iterations=2, layers=1, tokens=8, num_experts=16, top_k=2,
                tokens_per_iteration=np.array([[8, 3]] * 5, np.int32))
    whole = gen.generate("powerlaw:alpha=1.2", jax.random.key(4), **args)
    monkeypatch.setattr(gen, "GENERATE_SCRATCH_BYTES", 2 * gen._scratch_bytes((2, 1, 8, 16, 2)))
    parts = gen.generate("powerlaw:alpha=1.2", jax.random.key(4), **args)
    for a, b in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(parts),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
