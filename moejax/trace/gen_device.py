"""Generator version 3's ids and counts drawn by a JAX program, for accelerators: the same
algorithm and the same random words as the numba sampler in `moejax.trace.gen_fast`, so the
same ids and counts bit for bit (`tests/test_gen_device.py`), made where the engine runs.

What stays on the host: each trace's popularity and its alias tables (O(E) per trace and
layer, `gen_fast.alias_tables`), a few KB per trace against ~8 KB of ids per trace and layer
at 256 tokens of top-8. On the device, every token of the chunk at once (vectorized across
tokens; 64-bit words under `jax.enable_x64` for this program only):

- token m's seed s = mix(seed ^ m G), candidate c's word mix(s + c G) (c = 1, 2, ...), the
  column from its high 32 bits, the alias coin from its low 32 (`gen_fast._token_ids`);
- a candidate is kept when the token has not chosen it yet (a bitset of E bits per token)
  and the token has fewer than k; a `lax.while_loop` draws candidates until every real token
  of the chunk has k, or MAX_TRIALS * k were drawn;
- a token still short of k then takes its missing choices by inverse CDF over its free
  experts (`gen_fast._free_inverse_cdf`: float64 sums in expert order, here a `lax.scan`
  over experts so that the sums are added in the same order), in a `lax.cond` that runs only
  when some token needs it.

Every token pays the while loop of the chunk's slowest token (~40-60 candidates at 131,072
tokens a chunk of top-8 of 128 at power law 1.2, against 11.5 on average): on an accelerator
the width is free; on a CPU the numba sampler, which stops each token at its k-th expert, is
several times faster (docs/performance.md, Generated traces). Gate weights are not drawn
(`simulate` does not read them): the caller asks for them from the numba sampler.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# the numba sampler's constants (moejax.trace.gen_fast, which imports this module)
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_LOW32 = 0xFFFFFFFF
_INVERSE_CDF = 1 << 33  # word offset of the inverse-CDF draws


def _u(x: int) -> jax.Array:
    return jnp.uint64(x)


def _mix64(z: jax.Array) -> jax.Array:
    """splitmix64's finalizer (uint64 arrays; multiplication wraps mod 2^64)."""
    z = (z ^ (z >> _u(30))) * _u(_M1)
    z = (z ^ (z >> _u(27))) * _u(_M2)
    return z ^ (z >> _u(31))


def sample(table: np.ndarray, p: np.ndarray, seeds: np.ndarray, tpi: np.ndarray, tokens: int,
           top_k: int, *, alias_bits: int, max_trials: int) -> tuple[jax.Array, jax.Array]:
    """(ids int32 [T, I, L, N, K] (-1 beyond tpi), counts float32 [T, I, L, E]) on the default
    device, of alias tables `table` (int64 [T, I, L, E], `gen_fast.alias_tables`), popularity
    p (float32 [T, I, L, E]), token seeds (uint64 [T]) and real tokens per iteration tpi
    (int32 [T, I])."""
    with jax.enable_x64(True):
        ids, counts = _sample(jnp.asarray(table, jnp.int64), jnp.asarray(p, jnp.float32),
                              jnp.asarray(seeds, jnp.uint64), jnp.asarray(tpi, jnp.int32),
                              tokens, top_k, alias_bits, max_trials)
    return ids, counts


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7))
def _sample(table, p, seeds, tpi, n, k, alias_bits, max_trials):
    t_, i_, l_, e = table.shape
    words = -(-e // 64)
    # token m = (i L + l) N + t of its trace, as the numba sampler numbers them
    m = jnp.arange(i_ * l_ * n, dtype=jnp.uint64).reshape(i_, l_, n)
    s0 = _mix64(seeds[:, None, None, None] ^ (m[None] * _u(_GOLDEN)))  # [T, I, L, N]
    real = jnp.arange(n)[None, None, None, :] < tpi[:, :, None, None]  # [T, I, 1, N]
    real = jnp.broadcast_to(real, s0.shape)
    entries = table[:, :, :, None, :]  # [T, I, L, 1, E]
    word_ids = jnp.arange(words, dtype=jnp.int64)
    slots = jnp.arange(k, dtype=jnp.int32)

    def candidate(c, s):
        """Candidate c (uint64) of every token: expert ids int64 [T, I, L, N]."""
        w = _mix64(s0 + c * _u(_GOLDEN))
        col = (((w >> _u(32)) * _u(e)) >> _u(32)).astype(jnp.int64)
        entry = jnp.take_along_axis(entries, col[..., None], axis=-1)[..., 0]
        keep = (w & _u(_LOW32)).astype(jnp.int64) < (entry >> alias_bits)
        return jnp.where(keep, col, entry & ((1 << alias_bits) - 1))

    def draw(state):
        c, got, chosen, seen = state
        x = candidate(c, s0)
        onehot = word_ids == (x >> 6)[..., None]  # [..., W]
        bit = _u(1) << (x & 63).astype(jnp.uint64)
        old = jnp.sum(jnp.where(onehot, seen, _u(0)), axis=-1) & bit
        fresh = (old == _u(0)) & (got < k) & real
        seen = seen | jnp.where(onehot & fresh[..., None], bit[..., None], _u(0))
        chosen = jnp.where((slots == got[..., None]) & fresh[..., None],
                           x[..., None].astype(jnp.int32), chosen)
        return c + _u(1), got + fresh.astype(jnp.int32), chosen, seen

    def short(state):
        c, got, _, _ = state
        return (c <= _u(max_trials * k)) & jnp.any((got < k) & real)

    got = jnp.zeros(s0.shape, jnp.int32)
    chosen = jnp.full(s0.shape + (k,), -1, jnp.int32)
    seen = jnp.zeros(s0.shape + (words,), jnp.uint64)
    _, got, chosen, seen = jax.lax.while_loop(short, draw, (_u(1), got, chosen, seen))
    need = (got < k) & real
    chosen = jax.lax.cond(jnp.any(need), functools.partial(_inverse_cdf, k=k),
                          lambda *a: a[3], p, s0, need, chosen, got, seen)
    ids = jnp.where(real[..., None], chosen, -1)
    flat = ids.reshape(t_ * i_ * l_, -1)
    rows = jnp.repeat(jnp.arange(t_ * i_ * l_), flat.shape[1])
    counts = jnp.zeros((t_ * i_ * l_, e), jnp.float32).at[rows, flat.ravel()].add(
        (flat.ravel() >= 0).astype(jnp.float32), mode="drop")
    return ids, counts.reshape(t_, i_, l_, e)


def _inverse_cdf(p, s0, need, chosen, got, seen, k):
    """The missing choices j = got..k-1 of the tokens that `need` them, each by inverse CDF
    over the token's free experts (`gen_fast._free_inverse_cdf`, the same float64 sums in
    expert order), the others' chosen unchanged."""
    e = p.shape[-1]

    def mass(c):  # expert c's popularity for every token, float64 [T, I, L, 1]
        return p[:, :, :, c, None].astype(jnp.float64)

    def is_free(seen_bits, c):
        return ((seen_bits[..., c // 64] >> (c % 64).astype(jnp.uint64)) & _u(1)) == _u(0)

    for j in range(k):
        todo = need & (got <= j)
        w = _mix64(s0 + (_u(_INVERSE_CDF) + _u(j)) * _u(_GOLDEN))
        unit = ((w >> _u(11)).astype(jnp.float64) + 1.0) * (1.0 / 9007199254740992.0)

        def total(acc, c, seen=seen):
            return acc + jnp.where(is_free(seen, c), mass(c), 0.0), None

        free, _ = jax.lax.scan(total, jnp.zeros(s0.shape, jnp.float64), jnp.arange(e))
        target = unit * free

        def walk(carry, c, seen=seen, target=target):
            acc, pick, last, first = carry
            ok = is_free(seen, c)
            first = jnp.where(ok & (first < 0), c, first)
            has = ok & (mass(c) > 0)
            acc = jnp.where(has, acc + mass(c), acc)
            last = jnp.where(has, c, last)
            pick = jnp.where(has & (pick < 0) & (acc >= target), c, pick)
            return (acc, pick, last, first), None

        minus = jnp.full(s0.shape, -1, jnp.int64)
        (_, pick, last, first), _ = jax.lax.scan(
            walk, (jnp.zeros(s0.shape, jnp.float64), minus, minus, minus), jnp.arange(e))
        x = jnp.where(pick >= 0, pick, jnp.where(last >= 0, last, first))
        chosen = chosen.at[..., j].set(jnp.where(todo, x.astype(jnp.int32), chosen[..., j]))
        word = jnp.arange(seen.shape[-1]) == (x >> 6)[..., None]
        seen = seen | jnp.where(word & todo[..., None],
                                (_u(1) << (x & 63).astype(jnp.uint64))[..., None], _u(0))
    return chosen
