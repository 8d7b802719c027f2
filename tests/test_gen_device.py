"""Generator version 3 on the device (moejax.trace.gen_device): the numba sampler's ids and
counts, bit for bit, from a JAX program (run here on the CPU; on an accelerator it is the
default for traces without gate weights)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.trace import gen, gen_device, gen_fast


def inputs(spec: str, key, num_traces: int, iterations: int, layers: int, e: int):
    """(popularity, alias tables, token seeds) as `gen_fast` makes them for these traces."""
    parsed = gen.parse_spec(spec)
    static, floats = gen.split_spec(parsed)
    key_data, impl = gen_fast.key_data_of(key, num_traces)
    w = (gen_fast.rank_weights(static, floats, e, key_data[:1], impl)
         if parsed.family in gen_fast.SHUFFLED else None)
    p = gen_fast.popularity_of(static, floats, key_data, impl, iterations, layers, e, w)
    return p, gen_fast.alias_tables(p), gen_fast.token_seeds(key_data)


CASES = [  # spec, experts, top-k, tokens, iterations, layers (E = 300: five 64-bit words)
    ("powerlaw:alpha=1.2", 128, 8, 64, 1, 2),
    ("normal", 300, 6, 37, 2, 1),
    ("uniform", 16, 1, 20, 2, 2),
]


@pytest.mark.parametrize("spec,e,k,n,i,l", CASES)
def test_device_ids_and_counts_are_the_numba_samplers(spec, e, k, n, i, l):
    tpi = np.array([[n, n - 7][:i]] * 5)
    kw = dict(num_traces=5, iterations=i, layers=l, tokens=n, num_experts=e, top_k=k,
              tokens_per_iteration=tpi, gate_weights=False)
    host = gen_fast.generate(spec, jax.random.key(2), device=False, **kw)
    dev = gen_fast.generate(spec, jax.random.key(2), device=True, **kw)
    assert isinstance(dev.expert_ids, jax.Array)
    for a, b in zip(jax.tree_util.tree_leaves(host), jax.tree_util.tree_leaves(dev),
                    strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_device_inverse_cdf_path_is_the_numba_samplers():
    # alpha 8 over 16 experts, top-8: tokens past MAX_TRIALS * k candidates take their last
    # choices by inverse CDF; with an unbounded candidate budget they would take others
    spec, e, k, n = "powerlaw:alpha=8", 16, 8, 64
    p, table, seeds = inputs(spec, jax.random.key(3), 4, 1, 1, e)
    tpi = np.full((4, 1), n, np.int32)
    host_ids, _, host_counts = gen_fast.sample_tokens(p, seeds, tpi, n, k, gate_weights=False)
    ids, counts = gen_device.sample(table, p, seeds, tpi, n, k, alias_bits=gen_fast.ALIAS_BITS,
                                    max_trials=gen_fast.MAX_TRIALS)
    assert np.array_equal(np.asarray(ids), host_ids)
    assert np.array_equal(np.asarray(counts), host_counts)
    unbounded, _ = gen_device.sample(table, p, seeds, tpi, n, k,
                                     alias_bits=gen_fast.ALIAS_BITS, max_trials=4096)
    assert (np.asarray(unbounded) != host_ids).any(-1).sum() > 10  # the path was taken


def test_device_sampler_refuses_gate_weights_and_is_off_on_cpu():
    kw = dict(num_traces=2, iterations=1, layers=1, tokens=8, num_experts=8, top_k=2)
    with pytest.raises(ConfigError, match="device"):
        gen_fast.generate_chunked("uniform", jax.random.key(0), device=True, **kw)
    if jax.default_backend() == "cpu":  # the numba sampler is the faster one on a CPU
        lazy = gen_fast.generate_chunked("uniform", jax.random.key(0), gate_weights=False, **kw)
        assert isinstance(lazy.chunk(0, 2).expert_ids, np.ndarray)
