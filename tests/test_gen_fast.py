"""Generator version 3 (moejax.trace.gen_fast): valid traces with the law of version 1
(Gumbel-top-k), deterministic whatever the chunks and threads; `--generator` on the CLI.

The law tests' thresholds were fixed before their first run: each two-sample test (chi-square
contingency on the rank each choice position picks, Kolmogorov-Smirnov on gate weights) must
not reject at p < 1e-3, at fixed seeds."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest
from scipy import stats

from moejax.trace import core, gen, gen_fast
from moejax.trace.chunked import key_data_of

KW = dict(iterations=1, layers=2, tokens=64, num_experts=32, top_k=4)
SPEC = "powerlaw:alpha=1.2"
ROOT = Path(__file__).resolve().parents[1]


def as_jax(t: core.Trace) -> core.Trace:
    return jax.tree_util.tree_map(jnp.asarray, t)


@pytest.fixture(scope="module")
def pair():
    a = gen.generate(SPEC, jax.random.key(5), num_traces=200, **KW)
    b = gen_fast.generate(SPEC, jax.random.key(5), num_traces=200, **KW)
    return a, b


def popularity(version: int, key, n: int, spec=SPEC, kw=KW) -> np.ndarray:
    """p float32 [T, I, L, E] of the traces `version` (1 or 3) makes with these arguments."""
    kd, impl = key_data_of(key, n)
    spec = gen.parse_spec(spec)
    static, floats = gen.split_spec(spec)
    shape = kw["iterations"], kw["layers"], kw["num_experts"]
    w = None
    if version == 3 and spec.family in gen_fast.SHUFFLED:
        w = gen_fast.rank_weights(static, floats, kw["num_experts"], kd[:1], impl)
    return gen_fast.popularity_of(static, floats, kd, impl, *shape, w)


def ranks_of_choices(t: core.Trace, version: int, key, n: int, spec=SPEC,
                     kw=KW) -> np.ndarray:
    """[T, I, L, N, K] popularity rank (0 = likeliest) of each chosen expert."""
    p = popularity(version, key, n, spec, kw)
    rank = np.argsort(np.argsort(-np.asarray(p), axis=-1, kind="stable"), axis=-1)
    ids = np.asarray(t.expert_ids)
    return np.take_along_axis(rank[:, :, :, None, :].repeat(ids.shape[3], 3),
                              ids, axis=-1)


def test_version_3_traces_are_valid(pair):
    _, b = pair
    core.validate(as_jax(b))
    ids = np.asarray(b.expert_ids).reshape(-1, KW["top_k"])
    assert all(len(set(r)) == KW["top_k"] for r in ids)  # without replacement
    np.testing.assert_allclose(np.asarray(b.gate_weights).sum(-1), 1.0, atol=1e-5)
    assert (np.diff(np.asarray(b.gate_weights), axis=-1) <= 1e-7).all()  # in score order
    np.testing.assert_array_equal(np.asarray(b.counts),
                                  np.asarray(core.counts_from_ids(b.expert_ids, 32)))


@pytest.mark.parametrize("spec", ["powerlaw:alpha=1.2", "lognormal", "drift"])
def test_version_3_popularity_is_version_1s(spec):
    key, kw = jax.random.key(2), dict(KW, iterations=3)
    p1, p3 = popularity(1, key, 64, spec, kw), popularity(3, key, 64, spec, kw)
    if gen.parse_spec(spec).family in gen_fast.SHUFFLED:  # the same weights, drawn order
        np.testing.assert_array_equal(np.sort(p3, -1), np.sort(p1, -1))
        assert (p3 != p1).any()
        assert (p3[:, 1:] == p3[:, :1]).all()  # fixed over iterations, as version 1
        first = np.argmax(p3[:, 0], -1).ravel()  # likeliest expert: uniform over E
        counts = np.bincount(first, minlength=kw["num_experts"])
        assert stats.chisquare(counts)[1] > 1e-3
    else:  # version 1's own popularity
        np.testing.assert_array_equal(p3, p1)


def test_version_3_draws_the_law_of_version_1(pair):
    a, b = pair
    ra = ranks_of_choices(a, 1, jax.random.key(5), 200).reshape(-1, KW["top_k"])
    rb = ranks_of_choices(b, 3, jax.random.key(5), 200).reshape(-1, KW["top_k"])
    bins = 12  # ranks 0..10 and 11+ (every cell expected well above 5)
    for j in range(KW["top_k"]):  # the law of the j-th choice, in score order
        table = np.stack([np.bincount(np.minimum(r[:, j], bins - 1), minlength=bins)
                          for r in (ra, rb)])
        assert stats.chi2_contingency(table)[1] > 1e-3, j
    wa = np.asarray(a.gate_weights).reshape(-1, KW["top_k"])
    wb = np.asarray(b.gate_weights).reshape(-1, KW["top_k"])
    for j in (0, KW["top_k"] - 1):
        assert stats.ks_2samp(wa[::7, j], wb[::7, j]).pvalue > 1e-3, j


def test_version_3_is_the_same_in_chunks_threads_and_without_weights():
    kw = dict(KW, iterations=2)
    key = jax.random.key(11)
    whole = gen_fast.generate("drift", key, num_traces=50, **kw)
    lazy = gen_fast.generate_chunked("drift", key, num_traces=50, **kw)  # prefetching
    parts = [lazy.chunk(s, min(s + 16, 50)) for s in range(0, 50, 16)]
    for name in ("expert_ids", "gate_weights", "counts", "token_mask"):
        joined = np.concatenate([np.asarray(getattr(p, name)) for p in parts])
        np.testing.assert_array_equal(joined, np.asarray(getattr(whole, name)), err_msg=name)
    threads = numba.get_num_threads()
    try:
        for n in sorted({1, max(threads, 2)} & set(range(1, numba.config.NUMBA_NUM_THREADS + 1))):
            numba.set_num_threads(n)
            par = gen_fast.generate("drift", key, num_traces=50, parallel=True, **kw)
            np.testing.assert_array_equal(par.expert_ids, whole.expert_ids)
            np.testing.assert_array_equal(par.gate_weights, whole.gate_weights)
    finally:
        numba.set_num_threads(threads)
    bare = gen_fast.generate("drift", key, num_traces=50, gate_weights=False, **kw)
    np.testing.assert_array_equal(bare.expert_ids, whole.expert_ids)
    np.testing.assert_array_equal(bare.counts, whole.counts)
    assert not np.asarray(bare.gate_weights).any()


def test_version_3_respects_the_token_mask():
    tpi = np.array([10, 64])
    b = gen_fast.generate("uniform", jax.random.key(1), num_traces=3, tokens_per_iteration=tpi,
                          **dict(KW, iterations=2))
    core.validate(as_jax(b))
    ids = np.asarray(b.expert_ids)
    assert (ids[:, 0, :, 10:] == -1).all() and (ids[:, 0, :, :10] >= 0).all()
    assert (ids[:, 1] >= 0).all()
    assert (np.asarray(b.counts)[:, 0].sum(-1) == 10 * KW["top_k"]).all()


def test_version_3_when_the_chosen_hold_nearly_all_the_mass():
    # alpha 8: after a few choices the free experts hold ~1e-6 of the mass, so draws past
    # MAX_TRIALS * k rejections go to the inverse CDF; its picks follow the free experts' law:
    # the number of tokens choosing each popularity rank, version 3 against version 1
    kw = dict(iterations=1, layers=1, tokens=256, num_experts=16, top_k=8)
    a, b = (g.generate("powerlaw:alpha=8", jax.random.key(3), num_traces=20, **kw)
            for g in (gen, gen_fast))
    core.validate(as_jax(b))
    ra, rb = (ranks_of_choices(t, v, jax.random.key(3), 20, "powerlaw:alpha=8", kw)[..., -1]
              for t, v in ((a, 1), (b, 3)))  # the last choice: ranks 7 and beyond
    table = np.stack([np.bincount(np.clip(r.ravel(), 7, 10) - 7, minlength=4)
                      for r in (ra, rb)])
    assert table[:, 1:].sum() > 100  # past rank 7: the inverse-CDF draws are tested
    assert stats.chi2_contingency(table)[1] > 1e-3


def test_no_simulation_reads_gate_weights():
    """`moejax simulate --generator fast` leaves gate weights undrawn because no system reads
    them; a system that starts to must make simulate draw them."""
    readers = [p for sub in ("systems", "physics", "runner", "placement")
               for p in (ROOT / "moejax" / sub).rglob("*.py")
               if re.search(r"\bgate_weights\b", p.read_text())]
    assert not readers, readers


def test_cli_generator_choice(tmp_path, capsys):
    # in process (`main` returns the exit code): one import of JAX and numba for the four runs
    from moejax.cli.main import main

    assert main(["simulate", "--traces", "4", "--generator", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--generator" in err and "fast" in err, err
    out = tmp_path / "t.npz"
    assert main(["trace", "gen", "uniform", "--experts", "8", "--top-k", "2", "--tokens", "8",
                 "--traces", "3", "--generator", "fast", "--out", str(out)]) == 0
    from moejax.trace import io as trace_io

    tr, meta = trace_io.load(out)
    core.validate(tr)
    assert meta["provenance"]["generator_version"] == 3
    capsys.readouterr()
    assert main(["simulate", "--trace", str(out), "--generator", "fast", "--quiet"]) == 2
    assert "--generator" in capsys.readouterr().err
    assert main(["sweep", "--vary", "link_Bps=50e9,100e9", "--traces", "4", "--tokens", "16",
                 "--generator", "fast", "--quiet", "--out", str(tmp_path / "sw")]) == 0
    summary = json.loads((tmp_path / "sw" / "summary.json").read_text())
    assert summary["provenance"]["data"]["generator_version"] == 3


def test_version_3_stream_is_pinned():
    """A trace file of version 3 names its seed, not its ids: the same key must give the same
    ids in every later release (a faster sampler may not change the stream). Hashes of the ids
    of two small batches (E = 128 and E = 300, padded tokens) as the stream made them when
    version 3 was introduced."""
    pinned = {("powerlaw:alpha=1.2", 128, 8): "4e7602d45fefac61", ("normal", 300, 6):
              "55e6696f1400b917"}
    for (spec, e, k), digest in pinned.items():
        tr = gen_fast.generate(spec, jax.random.key(7), num_traces=3, iterations=2, layers=2,
                               tokens=40, num_experts=e, top_k=k,
                               tokens_per_iteration=np.array([[40, 33]] * 3))
        ids = np.ascontiguousarray(tr.expert_ids, np.int32).tobytes()
        assert hashlib.sha256(ids).hexdigest()[:16] == digest, spec
