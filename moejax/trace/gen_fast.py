"""Generator version 3 (`--generator fast`, not the default): the law of
`moejax.trace.gen.generate` (version 1), drawn by a compiled CPU sampler in a few random words
per (token, choice) instead of a Gumbel score for every expert.

Version 1 draws E Gumbel scores per token and keeps the top k (Gumbel-top-k): for 256 tokens
of 128 experts that is 32,768 threefry words per trace and layer, most of its time. Version 3:

- the popularity p[I, L, E]: of a family whose experts' weights by rank are fixed and only
  their order is drawn (`SHUFFLED`: uniform, powerlaw, exponential, lognormal), version 1's
  weights in an order drawn by Fisher-Yates on version 3's stream (a uniformly random
  permutation per layer, as version 1's argsort of uniforms); of the others (normal, drift)
  version 1's own popularity of the trace (`families.log_popularity` on the same key);
- ids: each token draws experts with replacement from p (Walker's alias table, integer
  thresholds: one 64-bit word gives the column and the coin) and rejects repeats. Sampling
  successive experts with probability proportional to p among those not yet chosen is the law
  of Gumbel-top-k's ids in score order; drawing with replacement and rejecting repeats has
  exactly that law. Past `MAX_TRIALS` * k candidates (a token whose chosen experts hold
  nearly all the mass) its missing choices are drawn directly from the free experts by inverse
  CDF: given the choices so far, the next one's law does not depend on how many candidates
  were rejected, so the law is unchanged;
- gate weights: Gumbel-top-k's perturbed scores are z = -log X, X_e ~ Exp(rate p_e)
  (X_e = -log u / p_e). In score order X_(1) ~ Exp(rate 1) and, by memorylessness,
  X_(j+1) = X_(j) + Exp(rate left_j), left_j the mass not yet chosen; the weights are
  softmax(z) = (1 / X_j) / sum(1 / X). One more word and one log per choice.

On an accelerator (or with `device=True`) the ids and counts of traces without gate weights
are drawn by `moejax.trace.gen_device`, a JAX program with the same algorithm and words:
the same trace bit for bit, made where the engine runs.

Random stream: splitmix64 (Steele, Lea and Flood 2014) seeded per token by mixing a 64-bit
trace seed (the words of the trace's key, `jax.random.split(key, num_traces)[t]`) with the
token's index; a token's words therefore do not depend on the chunk, the thread count or the
order traces are made in. The stream differs from version 1's, so a trace of version 3 is
not version 1's trace with the same key (every committed study result uses version 1).
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numba as nb
import numpy as np

from moejax.errors import ConfigError
from moejax.trace import gen_device
from moejax.trace.chunked import ChunkedTraces, key_data_of
from moejax.trace.core import Trace
from moejax.trace.families import log_popularity
from moejax.trace.gen import chunked_args, split_spec

VERSION = 3
# Candidates (with replacement, from the alias table) a token draws at most, MAX_TRIALS * k,
# before its missing choices are drawn from the free experts by inverse CDF (O(E) each: a
# token whose chosen experts hold nearly all the mass).
MAX_TRIALS = 32
# Tokens per block, and the candidate words per token a block makes in one vectorized loop
# (`_block_words`): 16 cover ~95% of tokens at top-8 of 128 under power law 1.2 (11.5 on
# average); a token that needs more makes the rest one at a time.
BLOCK = 16
WORDS = 16
# An alias table entry packs the threshold (33 bits) above the alias (ALIAS_BITS bits).
ALIAS_BITS = 24
ALIAS_MASK = (1 << ALIAS_BITS) - 1
MAX_EXPERTS = 1 << ALIAS_BITS

_U = np.uint64
_GOLDEN = _U(0x9E3779B97F4A7C15)
_M1 = _U(0xBF58476D1CE4E5B9)
_M2 = _U(0x94D049BB133111EB)
_LOW32 = _U(0xFFFFFFFF)


@nb.njit(cache=True, inline="always")
def _mix64(z):
    """splitmix64's finalizer: a bijective 64-bit mixer."""
    z = (z ^ (z >> _U(30))) * _M1
    z = (z ^ (z >> _U(27))) * _M2
    return z ^ (z >> _U(31))


@nb.njit(cache=True, inline="always")
def _unit(w):
    """A uniform in (0, 1] from the top 53 bits of a word (float64)."""
    return (np.float64(w >> _U(11)) + 1.0) * (1.0 / 9007199254740992.0)


@nb.njit(cache=True)
def _alias(p, total, table, q, small, large):
    """Walker's alias table of p (float32 [E], sum `total`), built in float64 (Vose's method)
    into `table` (int64 [E]): column c holds (thr << ALIAS_BITS) | alias, and keeps c when a
    32-bit coin is below thr (an integer in [0, 2^32]), else takes alias. One array, so the
    candidates' lookups are one gather each."""
    e = p.shape[0]
    ns = 0
    nl = 0
    for c in range(e):
        q[c] = p[c] * e / total
        table[c] = (np.int64(4294967296) << ALIAS_BITS) | c
        if q[c] < 1.0:
            small[ns] = c
            ns += 1
        else:
            large[nl] = c
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        s = small[ns]
        g = large[nl - 1]
        table[s] = (np.int64(q[s] * 4294967296.0) << ALIAS_BITS) | g
        q[g] = (q[g] + q[s]) - 1.0
        if q[g] < 1.0:
            nl -= 1
            small[ns] = g
            ns += 1
    top = 0
    for c in range(e):
        if p[c] > p[top]:
            top = c
    for j in range(ns):  # what rounding leaves over keeps its own column if it has mass
        c = small[j]
        if not p[c] > 0:
            table[c] = top  # threshold 0: always the likeliest expert


@nb.njit(cache=True, inline="always")
def _row_alias(row, table, q, small, large):
    """`_alias` of row (float32 [E]) into `table`, with its total summed in float64 in expert
    order; returns the total. One function for the token sampler and `alias_tables`, so the
    device sampler draws from the very tables the numba one does."""
    total = 0.0
    for c in range(row.shape[0]):
        total += row[c]
    _alias(row, total, table, q, small, large)
    return total


@nb.njit(cache=True)
def _free_inverse_cdf(row, stamp, m, w):
    """An expert drawn from row (float32 [E]) restricted to those not stamped m, by inverse
    CDF of the word w; if float rounding runs past the end, the last free expert with mass
    (or the first free one when none has any)."""
    free = 0.0
    for c in range(row.shape[0]):
        if stamp[c] != m:
            free += row[c]
    target = _unit(w) * free
    acc = 0.0
    last = -1
    first = -1
    for c in range(row.shape[0]):
        if stamp[c] == m:
            continue
        if first < 0:
            first = c
        if row[c] > 0:
            last = c
            acc += row[c]
            if acc >= target:
                return c
    return last if last >= 0 else first


@nb.njit(cache=True, boundscheck=False)
def _block_words(s0, words):
    """words[c * B + b] = mix(s0[b] + (c + 1) G) for the B = len(s0) tokens of a block and
    their first WORDS candidates: one loop without branches or loads, which LLVM vectorizes
    (the 64-bit multiplies in SIMD lanes); the token loop that reads them has a serial
    chain per token and does not vectorize."""
    nb_ = s0.shape[0]
    for c in range(WORDS):
        step = _U(c + 1) * _GOLDEN
        for b in range(nb_):
            words[c * nb_ + b] = _mix64(s0[b] + step)


@nb.njit(cache=True)
def _trace(p, seed, tpi, ids, weights, counts, with_weights):
    """One trace: p float32 [I, L, E], seed uint64, tpi int32 [I]; writes ids int32
    [I * L * N, K] (-1 beyond tpi), weights float32 [I * L * N, K] when `with_weights` (the
    caller zeroes it: 0 beyond tpi, and everywhere when not `with_weights`), counts float32
    [I * L, E] (zeroed by the caller).

    A token's words: candidate c (c = 1, 2, ...) from mix(s + c G), gate weight j from
    mix(s + (2^32 + j) G), inverse-CDF draw j from mix(s + (2^33 + j) G), where
    s = mix(seed ^ m G) for token m of the trace and G the golden-ratio increment; so the
    ids do not depend on whether weights are drawn. Tokens go in blocks of BLOCK, whose
    first WORDS candidate words are made together (`_block_words`)."""
    n_i, n_l, e = p.shape
    k = ids.shape[1]
    n = ids.shape[0] // (n_i * n_l)
    table = np.empty(e, np.int64)
    q = np.empty(e, np.float64)
    small = np.empty(e, np.int64)
    large = np.empty(e, np.int64)
    stamp = np.full(e, -1, np.int64)  # token index that last chose each expert
    chosen = np.empty(k + 1, np.int64)
    xs = np.empty(k, np.float64)
    s0 = np.empty(BLOCK, np.uint64)
    words = np.empty(WORDS * BLOCK, np.uint64)
    for i in range(n_i):
        real = min(n, tpi[i])
        for l in range(n_l):
            row = p[i, l]
            total = _row_alias(row, table, q, small, large)
            il = i * n_l + l
            for t in range(real, n):
                for j in range(k):
                    ids[il * n + t, j] = -1
            for t0 in range(0, real, BLOCK):
                for b in range(BLOCK):
                    s0[b] = _mix64(seed ^ (_U(il * n + t0 + b) * _GOLDEN))
                _block_words(s0, words)
                for b in range(min(BLOCK, real - t0)):
                    m = il * n + t0 + b
                    _token_ids(row, table, words, b, s0[b], m, stamp, chosen, k)
                    for j in range(k):
                        c = chosen[j]
                        ids[m, j] = c
                        counts[il, c] += 1.0
                    if with_weights:
                        _gate_weights(row, total, chosen, k, s0[b], weights, m, xs)


@nb.njit(cache=True, inline="always", boundscheck=False)
def _token_ids(row, table, words, b, s0, m, stamp, chosen, k):
    """chosen[:k] = token m's k distinct experts in draw order: candidates with replacement
    from the alias table (the first WORDS from the block's `words`, column b), the first k
    distinct kept, without a branch on whether a candidate is new (a third of them are
    repeats under a skewed popularity: a branch on it mispredicts); past MAX_TRIALS * k
    candidates, the missing ones by inverse CDF over the free experts."""
    ew = _U(row.shape[0])
    nb_ = words.shape[0] // WORDS
    got = 0
    c = 0
    while got < k and c < MAX_TRIALS * k:
        w = words[c * nb_ + b] if c < WORDS else _mix64(s0 + _U(c + 1) * _GOLDEN)
        col = np.int64(((w >> _U(32)) * ew) >> _U(32))
        entry = table[col]
        other = entry & ALIAS_MASK
        keep = np.int64(np.int64(w & _LOW32) < (entry >> ALIAS_BITS))
        x = other + keep * (col - other)
        fresh = stamp[x] != m
        stamp[x] = m
        chosen[got] = x
        got += fresh
        c += 1
    for j in range(got, k):
        w = _mix64(s0 + (_U(2**33) + _U(j)) * _GOLDEN)
        x = _free_inverse_cdf(row, stamp, m, w)
        stamp[x] = m
        chosen[j] = x


@nb.njit(cache=True, inline="always")
def _gate_weights(row, total, chosen, k, s0, out, m, xs):
    """Softmax of Gumbel-top-k's scores of the chosen experts, drawn top down: exponential
    race times X_j = X_(j-1) + Exp(1) / left_(j-1) (the logs of 24-bit uniforms in float32,
    as version 1's float32 Gumbels; sums in float64); weights (1 / X_j) / sum(1 / X)."""
    left = 1.0  # float64: the mass left after the likeliest experts can be ~1e-6
    x = 0.0
    inv = 0.0
    for j in range(k):
        w = _mix64(s0 + (_U(2**32) + _U(j)) * _GOLDEN)
        u = np.float32((w >> _U(40)) + _U(1)) * np.float32(5.9604645e-08)  # (0, 1], 24 bits
        x += -np.log(u) / max(left, 1e-300)
        xs[j] = x
        inv += 1.0 / x
        left -= row[chosen[j]] / total
    for j in range(k):
        out[m, j] = (1.0 / xs[j]) / inv


@nb.njit(cache=True, nogil=True)
def _alias_tables(p, out):
    """out[t, i, l] = the token sampler's alias table of p[t, i, l] (float32 [T, I, L, E],
    `_row_alias`)."""
    n_t, n_i, n_l, e = p.shape
    q = np.empty(e, np.float64)
    small = np.empty(e, np.int64)
    large = np.empty(e, np.int64)
    for t in range(n_t):
        for i in range(n_i):
            for l in range(n_l):
                _row_alias(p[t, i, l], out[t, i, l], q, small, large)


def alias_tables(p) -> np.ndarray:
    """The alias tables (int64 [T, I, L, E], `_alias`'s packing) the token sampler draws from,
    of popularity p (float32 [T, I, L, E]): what `gen_device` samples on the device."""
    p = np.ascontiguousarray(p, np.float32)
    out = np.empty(p.shape, np.int64)
    _alias_tables(p, out)
    return out


@nb.njit(cache=True, nogil=True)
def _batch(p, seeds, tpi, ids, weights, counts, with_weights):
    """`_trace` over traces (one thread; `_batch_parallel` spreads traces over threads)."""
    for t in range(p.shape[0]):
        _trace(p[t], seeds[t], tpi[t], ids[t], weights[t], counts[t], with_weights)


@nb.njit(cache=True, nogil=True, parallel=True)
def _batch_parallel(p, seeds, tpi, ids, weights, counts, with_weights):
    for t in nb.prange(p.shape[0]):
        _trace(p[t], seeds[t], tpi[t], ids[t], weights[t], counts[t], with_weights)


_KERNEL_LOCK = threading.Lock()  # numba's workqueue layer runs one parallel kernel at a time


# Byte alignment of the sampler's outputs: XLA's CPU client takes a host array this aligned
# without a copy (a 4 MB chunk of ids: 0.07 ms against 0.81 ms to copy one allocated by
# NumPy, which aligns to 16 bytes).
ALIGN = 64


def _zeros_aligned(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros of `shape` whose data starts on an ALIGN-byte boundary (the allocation's pages
    are zeroed lazily by the system, as `np.zeros`'s are)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(size + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + size].view(dtype).reshape(shape)


def sample_tokens(p, seeds, tpi, tokens: int, top_k: int, *, gate_weights: bool = True,
                  parallel: bool = False):
    """(ids int32 [T, I, L, N, K], weights float32 [T, I, L, N, K], counts float32
    [T, I, L, E]) of popularities p (float32 [T, I, L, E]), token seeds (uint64 [T]) and
    real tokens per iteration tpi (int32 [T, I]). gate_weights=False: weights not drawn
    (zeros; the ids are the same). parallel: traces over numba's threads
    (`numba.set_num_threads`); the result does not depend on it."""
    p = np.ascontiguousarray(p, np.float32)
    t, i, l, e = p.shape
    ids = _zeros_aligned((t, i * l * tokens, top_k), np.int32)
    weights = _zeros_aligned((t, i * l * tokens, top_k), np.float32)
    counts = _zeros_aligned((t, i * l, e), np.float32)
    seeds = np.ascontiguousarray(seeds, np.uint64)
    tpi = np.ascontiguousarray(tpi, np.int32)
    if parallel and t > 1:
        with _KERNEL_LOCK:
            _batch_parallel(p, seeds, tpi, ids, weights, counts, gate_weights)
    else:
        _batch(p, seeds, tpi, ids, weights, counts, gate_weights)
    shape = (t, i, l, tokens, top_k)
    return ids.reshape(shape), weights.reshape(shape), counts.reshape(t, i, l, e)


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5, 6))
def _popularity(static, floats, key_data, iterations, layers, num_experts, impl):
    """p float32 [T, I, L, E] of traces with keys key_data: version 1's popularity (the same
    split of each trace key)."""
    keys = jax.random.wrap_key_data(key_data, impl=impl)

    def one(key):
        k_pop, _ = jax.random.split(key)
        return jnp.exp(log_popularity(static, floats, k_pop, iterations, layers, num_experts))

    return jax.vmap(one)(keys)


@nb.njit(cache=True, nogil=True)
def _shuffled(w, seeds, out):
    """out[t, i, l, c] = w[perm_tl[c]]: the weights by rank w (float32 [E]) in a uniformly
    random order per trace and layer (Fisher-Yates on the trace's stream, words
    mix(mix(seed ^ D) + (l E + c + 1) G)), the same in every iteration."""
    n_t, n_i, n_l, e = out.shape
    perm = np.empty(e, np.int64)
    for t in range(n_t):
        s0 = _mix64(seeds[t] ^ _SHUFFLE_DOMAIN)
        for l in range(n_l):
            for c in range(e):
                perm[c] = c
            for c in range(e - 1, 0, -1):
                w64 = _mix64(s0 + _U(l * e + c + 1) * _GOLDEN)
                j = np.int64(((w64 >> _U(32)) * _U(c + 1)) >> _U(32))
                perm[c], perm[j] = perm[j], perm[c]
            for i in range(n_i):
                for c in range(e):
                    out[t, i, l, c] = w[perm[c]]


# Families whose popularity is one weight vector by rank with the ranks shuffled per layer
# (`families._ranked`, fixed over iterations): version 3 shuffles them on its own stream
# (Fisher-Yates), the law of version 1's argsort of uniforms, without a compiled call.
SHUFFLED = ("uniform", "powerlaw", "exponential", "lognormal")
_SHUFFLE_DOMAIN = _U(0xD1B54A32D192ED03)


def token_seeds(key_words) -> np.ndarray:
    """uint64 [T] seeds from the traces' key data (uint32 [T, W]): the words mixed in."""
    words = np.asarray(key_words).astype(np.uint64).reshape(len(key_words), -1)
    s = np.full(len(words), 0x6A09E667F3BCC908, np.uint64)
    with np.errstate(over="ignore"):
        for w in words.T:
            s = _mix64_np(s ^ w)
    return s


def _mix64_np(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> _U(30))) * _M1
    z = (z ^ (z >> _U(27))) * _M2
    return z ^ (z >> _U(31))


# Traces per popularity call: every call has this shape (the last block padded), so a trace's
# popularity is computed by the same program, bit for bit, whatever chunk it is made in (XLA
# may round differently in programs of different batch sizes).
POPULARITY_BLOCK = 128


def rank_weights(static, floats, num_experts: int, key_data, impl) -> np.ndarray:
    """A `SHUFFLED` family's popularity by rank, float32 [E] (descending): version 1's values
    (its popularity of one layer of the trace with key data key_data [1, W], sorted)."""
    p = _popularity(static, floats, key_data, 1, 1, num_experts, impl)
    return np.sort(np.asarray(p).ravel())[::-1].copy()


def popularity_of(static, floats, key_data, impl, iterations, layers, num_experts,
                  weights=None):
    """p float32 [T, I, L, E] of traces with keys key_data: `_shuffled` of `weights` (a
    `SHUFFLED` family's `rank_weights`), or else version 1's popularity, in blocks of
    POPULARITY_BLOCK."""
    n = len(key_data)
    if weights is not None:
        out = np.empty((n, iterations, layers, num_experts), np.float32)
        _shuffled(weights, token_seeds(key_data), out)
        return out
    ps = []
    for s in range(0, n, POPULARITY_BLOCK):
        block = key_data[s:s + POPULARITY_BLOCK]
        m = len(block)
        if m < POPULARITY_BLOCK:
            block = np.concatenate([block, np.repeat(block[-1:], POPULARITY_BLOCK - m, 0)])
        ps.append(np.asarray(_popularity(static, floats, block, iterations, layers,
                                         num_experts, impl))[:m])
    return np.concatenate(ps)


def _make(static, floats, key_data, impl, tpi, shape, gate_weights, parallel, w, device):
    i, l, n, e, k = shape
    p = popularity_of(static, floats, key_data, impl, i, l, e, w)
    mask = np.arange(n)[None, None, :] < np.asarray(tpi)[:, :, None]  # [T, I, N]
    request = np.full(mask.shape, -1, np.int32)
    if device:  # ids and counts made on the default device; gate weights not drawn
        ids, counts = gen_device.sample(alias_tables(p), p, token_seeds(key_data), tpi, n, k,
                                        alias_bits=ALIAS_BITS, max_trials=MAX_TRIALS)
        return Trace(ids, jnp.zeros(ids.shape, jnp.float32), jnp.asarray(mask),
                     jnp.asarray(request), counts, num_experts=e, top_k=k)
    ids, weights, counts = sample_tokens(p, token_seeds(key_data), tpi, n, k,
                                         gate_weights=gate_weights, parallel=parallel)
    return Trace(ids, weights, mask, request, counts, num_experts=e, top_k=k)


def _on_device(device: bool | None, gate_weights: bool) -> bool:
    """Whether ids are drawn by `gen_device` (default: on an accelerator, when gate weights
    are not asked for); ConfigError if asked with gate weights, which it does not draw."""
    if device is None:
        return jax.default_backend() != "cpu" and not gate_weights
    if device and gate_weights:
        raise ConfigError("device: the device sampler draws no gate weights; allowed: "
                          "device=True with gate_weights=False, or device=False")
    return bool(device)


def _checked(spec, key, num_traces, iterations, layers, tokens, num_experts, top_k, tpi):
    """`gen.chunked_args`, and the expert count version 3's alias table can pack."""
    spec, key, num_traces, shape, tpi = chunked_args(
        spec, key, num_traces, iterations, layers, tokens, num_experts, top_k, tpi)
    if shape[3] > MAX_EXPERTS:
        raise ConfigError(f"num_experts: {shape[3]} is more than generator version 3 packs "
                          f"in its alias table; allowed: 1..{MAX_EXPERTS}")
    return spec, key, num_traces, shape, np.asarray(tpi, np.int32)


def generate(spec, key, *, num_traces: int, iterations: int, layers: int, tokens: int,
             num_experts: int, top_k: int, tokens_per_iteration=None,
             gate_weights: bool = True, parallel: bool = False,
             device: bool | None = None) -> Trace:
    """`moejax.trace.gen.generate`'s arguments and law, drawn by version 3 (module doc);
    trace t uses `jax.random.split(key, num_traces)[t]`. Leaves are NumPy arrays (jax arrays
    on the default device when `device`).
    gate_weights=False: gate weights not drawn (zeros), for consumers that read only ids and
    counts (no system's simulation reads them); the ids and counts are the same.
    parallel: traces spread over numba's threads; the result does not depend on it.
    device: ids and counts drawn by `moejax.trace.gen_device` on the default device, the same
    bit for bit (default: on an accelerator when gate_weights=False)."""
    lazy = generate_chunked(spec, key, num_traces=num_traces, iterations=iterations,
                            layers=layers, tokens=tokens, num_experts=num_experts, top_k=top_k,
                            tokens_per_iteration=tokens_per_iteration,
                            gate_weights=gate_weights, parallel=parallel, prefetch=False,
                            device=device)
    return lazy.materialize()


def generate_chunked(spec, key, *, num_traces: int, iterations: int, layers: int, tokens: int,
                     num_experts: int, top_k: int, tokens_per_iteration=None,
                     gate_weights: bool = True, parallel: bool = False,
                     prefetch: bool = True, device: bool | None = None) -> ChunkedTraces:
    """Version 3's batch made a chunk at a time (`ChunkedTraces`); the chunks, joined, equal
    `generate`. prefetch: when chunk [a, b) is asked for, chunk [b, 2b - a) is started on a
    thread (the sampler releases the GIL), so a consumer that simulates chunk i meanwhile
    waits for max(generation, simulation), not their sum. device: as in `generate`."""
    on_device = _on_device(device, gate_weights)
    spec, key, num_traces, shape, tpi = _checked(spec, key, num_traces, iterations, layers,
                                                 tokens, num_experts, top_k,
                                                 tokens_per_iteration)
    split = functools.cache(lambda: key_data_of(key, num_traces))
    static, floats = split_spec(spec)

    @functools.cache
    def weights_by_rank():
        key_data, impl = split()
        return rank_weights(static, floats, shape[3], key_data[:1], impl)

    def build(start: int, stop: int) -> Trace:
        key_data, impl = split()
        w = weights_by_rank() if spec.family in SHUFFLED else None
        return _make(static, floats, key_data[start:stop], impl, tpi[start:stop], shape,
                     gate_weights, parallel, w, on_device)

    make = _Prefetcher(build, num_traces) if prefetch else build
    i, l, n, e, k = shape
    return ChunkedTraces(num_traces, make, e, k, i, l, n,
                         scratch_bytes_per_trace=4 * i * l * e)


class _Prefetcher:
    """`build(start, stop)` with the next chunk of the same width made ahead on one thread."""

    def __init__(self, build, num_traces: int):
        self.build, self.num_traces = build, num_traces
        self.pool: ThreadPoolExecutor | None = None
        self.ahead: tuple[int, int, Future] | None = None

    def __call__(self, start: int, stop: int) -> Trace:
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead[:2] == (start, stop):
            out = ahead[2].result()
        else:
            if ahead is not None:
                ahead[2].cancel()
            out = self.build(start, stop)
        nxt = (stop, min(stop + (stop - start), self.num_traces))
        if nxt[0] < nxt[1]:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(1, thread_name_prefix="moejax-gen")
            self.ahead = (*nxt, self.pool.submit(self.build, *nxt))
        elif self.pool is not None:  # the last chunk: nothing left to make
            self.pool.shutdown(wait=False)
            self.pool = None
        return out
