"""Synchronous-EP serving in a closed loop of N requests (002 §5), on `sync.py`'s step.

The iteration cost is `sync.build(cfg).step` itself (DP attention, barrier all-to-all,
experts, overheads): this module only sets up a steady population instead of a stream.
N requests run from the start, spread over ranks round-robin (what the most-free balancer
gives for equal lengths) and, with `spread`, at random progress; every iteration each
running request emits one token, and a request that finishes is replaced at once by a
fresh one (new uniform lengths) on the same rank, so N stays constant. Measured over the
iterations after `warmup`: output tokens per second, ITL (one iteration), stall share.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.systems.amoe import sync
from moejax.systems.amoe.config import TICK_S
from moejax.trace.core import RequestStream


@functools.lru_cache(maxsize=64)
def _loop(cfg: sync.SyncConfig, iters: int):
    """(system, run): one compilation per configuration and N, shared by every workload
    (the replacement lengths' bounds are runtime arguments)."""
    system = sync.build(cfg)
    n = cfg.num_requests

    def body(carry, key):
        s, (ilo, ihi, olo, ohi) = carry
        new, _ = system.step(sync.SyncParams(), s, jnp.int32(0))
        fin = new.phase == 2
        ki, ko = jax.random.split(key)
        inp = jax.random.randint(ki, (n,), ilo, ihi, jnp.int32)
        out = jax.random.randint(ko, (n,), olo, ohi, jnp.int32)
        new = new.replace(phase=jnp.where(fin, 0, new.phase),
                          tokens_done=jnp.where(fin, 0, new.tokens_done),
                          input_len=jnp.where(fin, inp, new.input_len),
                          output_len=jnp.where(fin, out, new.output_len),
                          complete=jnp.where(fin, sync.BIG_TICK, new.complete))
        obs = (new.clock - s.clock, fin.sum(), new.busy_s.sum(), new.stall_s.sum())
        return (new, (ilo, ihi, olo, ohi)), obs

    @jax.jit
    def run(s, key, bounds):
        (s, _), out = jax.lax.scan(body, (s, bounds), jax.random.split(key, iters))
        return s, out

    return system, run


def run_closed(cfg: sync.SyncConfig, iterations: int = 40, warmup: int = 10, seed: int = 0,
               *, workload=((50, 150), (50, 250)), spread: bool = True) -> dict:
    """Steady closed-loop metrics of `cfg.num_requests` concurrent requests."""
    n, d = cfg.num_requests, cfg.num_devices
    if iterations <= warmup:
        raise ConfigError(f"iterations = {iterations}; allowed: > warmup = {warmup}")
    per_rank = -(-n // d)
    if per_rank > cfg.max_running:
        raise ConfigError(f"concurrency = {n}: more than max_running = {cfg.max_running} "
                          f"per rank on {d} ranks")
    rng = np.random.default_rng(seed)
    (ilo, ihi), (olo, ohi) = workload
    inp = rng.integers(ilo, ihi + 1, n)
    outl = rng.integers(olo, ohi + 1, n)
    need = (inp + outl).reshape(-1)
    rank = np.arange(n) % d
    if np.bincount(rank, need, d).max() > cfg.kv_capacity_tokens:
        raise ConfigError(f"concurrency = {n}: exceeds the KV-cache capacity of "
                          f"{cfg.kv_capacity_tokens} tokens per rank")
    done = (rng.random(n) * outl).astype(np.int64) if spread else np.zeros(n, np.int64)
    system, run = _loop(cfg, int(iterations))
    st = RequestStream(arrival_s=jnp.zeros(n), input_len=jnp.asarray(inp, jnp.int32),
                       output_len=jnp.asarray(outl, jnp.int32), mask=jnp.ones(n, bool))
    s = system.init(sync.SyncParams(), st, jax.random.key(seed))
    s = s.replace(rank=jnp.asarray(rank, jnp.int32), phase=jnp.zeros(n, jnp.int32),
                  tokens_done=jnp.asarray(done, jnp.int32), next_req=jnp.int32(n))
    bounds = tuple(jnp.int32(x) for x in (ilo, ihi + 1, olo, ohi + 1))
    _, (dur, fin, busy, stall) = run(s, jax.random.key(seed + 1), bounds)
    dur, busy, stall = (np.asarray(x, np.float64) for x in (dur, busy, stall))
    w = slice(warmup, None)
    d_busy = busy[-1] - busy[warmup - 1] if warmup else busy[-1]
    d_stall = stall[-1] - stall[warmup - 1] if warmup else stall[-1]
    secs = dur[w] * TICK_S
    return {
        "throughput_tok_s": n * len(secs) / secs.sum(),
        "itl_mean_s": float(secs.mean()),
        "itl_p99_s": float(np.quantile(secs, 0.99)),
        "concurrency": float(n),
        "stall_fraction": float(d_stall / max(d_busy + d_stall, 1e-30)),
        "mean_batch": float(n),
        "completions": int(np.asarray(fin)[w].sum()),
    }
