"""Generator version 2 (moejax.trace.gen_fast): valid traces with the law of version 1
(Gumbel-top-k), from a different random stream."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from moejax.trace import core, gen, gen_fast

KW = dict(iterations=2, layers=2, tokens=64, num_experts=32, top_k=4)


@pytest.fixture(scope="module")
def pair():
    a = gen.generate("powerlaw:alpha=1.2", jax.random.key(5), num_traces=256, **KW)
    b = gen_fast.generate("powerlaw:alpha=1.2", jax.random.key(5), num_traces=256, **KW)
    return a, b


def test_version_2_traces_are_valid(pair):
    _, b = pair
    core.validate(b)
    ids = np.asarray(b.expert_ids).reshape(-1, KW["top_k"])
    assert all(len(set(r)) == KW["top_k"] for r in ids)  # without replacement
    np.testing.assert_allclose(np.asarray(b.gate_weights).sum(-1), 1.0, atol=1e-5)
    w = np.asarray(b.gate_weights)
    assert (np.diff(w, axis=-1) <= 1e-7).all()  # in score order, as lax.top_k gives


def test_version_2_draws_the_law_of_version_1(pair):
    a, b = pair  # popularity ranks are random per trace: compare rank-sorted loads
    ca = np.sort(np.asarray(a.counts), axis=-1)[..., ::-1].mean(axis=(0, 1, 2))
    cb = np.sort(np.asarray(b.counts), axis=-1)[..., ::-1].mean(axis=(0, 1, 2))
    np.testing.assert_allclose(cb, ca, rtol=0.05, atol=0.3)
    wa = np.asarray(a.gate_weights).mean(axis=(0, 1, 2, 3))
    wb = np.asarray(b.gate_weights).mean(axis=(0, 1, 2, 3))
    np.testing.assert_allclose(wb, wa, rtol=0.03)


def test_version_2_respects_the_token_mask():
    tpi = np.array([10, 64])
    b = gen_fast.generate("uniform", jax.random.key(1), num_traces=3, tokens_per_iteration=tpi,
                          **KW)
    core.validate(b)
    ids = np.asarray(b.expert_ids)
    assert (ids[:, 0, :, 10:] == -1).all() and (ids[:, 0, :, :10] >= 0).all()
    assert (ids[:, 1] >= 0).all()
