"""moejax.ops.bincount: the flat batched histogram equals a plain per-row loop."""

import jax
import numpy as np
import pytest

from moejax.ops import bincount


def _loop(keys, weights, length):
    out = np.zeros(keys.shape[:-1] + (length,))
    for idx in np.ndindex(keys.shape[:-1]):
        for k, w in zip(keys[idx], weights[idx], strict=True):
            if 0 <= k < length:
                out[idx + (k,)] += w
    return out


@pytest.fixture(scope="module")
def data():
    keys = np.asarray(jax.random.randint(jax.random.key(0), (3, 4, 50), -3, 20))
    weights = np.asarray(jax.random.uniform(jax.random.key(1), (3, 4, 50)))
    return keys, weights, _loop(keys, weights, 17)


def test_unbatched_drops_out_of_range_keys(data):
    keys, weights, ref = data
    np.testing.assert_allclose(bincount(keys[0, 0], weights[0, 0], 17), ref[0, 0], rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_nested_vmap_equals_loop(data, jit):
    keys, weights, ref = data
    f = jax.vmap(jax.vmap(lambda k, w: bincount(k, w, 17)))
    f = jax.jit(f) if jit else f
    np.testing.assert_allclose(f(keys, weights), ref, rtol=1e-6)


def test_vmap_with_unbatched_weights(data):
    keys, weights, _ = data
    got = jax.vmap(lambda k: bincount(k, weights[0, 0], 17))(keys[:, 0])
    np.testing.assert_allclose(got, _loop(keys[:, 0], np.broadcast_to(weights[0, 0], (3, 50)),
                                          17), rtol=1e-6)


def test_mask_weights_give_exact_integer_counts(data):
    keys, weights, _ = data
    mask = weights > 0.5
    ref = _loop(keys, mask.astype(float), 17)
    got = jax.jit(jax.vmap(jax.vmap(lambda k, w: bincount(k, w, 17))))(keys, mask)
    # 50 keys per row: no bin can pass 2**15 (int16 on CPU; int32 on an accelerator)
    assert got.dtype == (np.int16 if jax.default_backend() == "cpu" else np.int32)
    np.testing.assert_array_equal(got, ref)
    big = np.zeros(2**15, np.int32)  # a row this long could overflow int16: int32 counts
    out = bincount(big, np.ones(2**15, bool), 3)
    assert out.dtype == np.int32 and out[0] == 2**15
    assert bincount(keys[0, 0], (keys[0, 0] > 5).astype(np.int8), 17).dtype == np.int32


def test_mask_counts_are_int32_off_cpu(data, monkeypatch):
    """A GPU has no 16-bit atomic add: int16 counts made EP 9.6x slower on an H100."""
    keys, weights, _ = data
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    got = bincount(keys[0, 0], weights[0, 0] > 0.5, 17)  # traced here: dtype only
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _loop(keys[0, 0], (weights[0, 0] > 0.5) * 1.0, 17))
