"""Run an event-step System over many request streams until every stream is done.

`jit(vmap(scan))` over fixed-length chunks of `chunk_steps` events with a done-mask (a
finished stream's state is frozen); the host only checks between chunks whether every
stream is done, so the number of events need not be known in advance.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import MoejaxError
from moejax.system import System


@functools.lru_cache(maxsize=32)
def _compiled(system: System, chunk_steps: int, params_batched: bool = False):
    p_ax = 0 if params_batched else None

    def chunk_one(params, state):
        def body(st, t):
            new, _ = system.step(params, st, t)
            done = system.is_done(st)
            return jax.tree_util.tree_map(lambda n, o: jnp.where(done, o, n), new, st), None

        state, _ = jax.lax.scan(body, state, jnp.arange(chunk_steps, dtype=jnp.int32))
        return state, system.is_done(state)

    init = jax.jit(jax.vmap(system.init, in_axes=(p_ax, 0, 0)))
    chunk = jax.jit(jax.vmap(chunk_one, in_axes=(p_ax, 0)), donate_argnums=1)
    finish = jax.jit(jax.vmap(lambda p, s: system.finish(p, s, None), in_axes=(p_ax, 0)))
    return init, chunk, finish


def run_streams(system: System, params, streams, key=None, *, chunk_steps: int = 2048,
                max_steps: int = 50_000_000, return_state: bool = False, keys=None,
                params_batched: bool = False, progress=None, backend: str = "rounds"):
    """Metrics with a leading `[T]` axis for `streams` (a RequestStream batch, leaves [T, R]).

    Stream t uses `jax.random.split(key, T)[t]` (or `keys[t]` if given). params_batched:
    params leaves carry the same leading [T] axis (stream t runs with params[t], e.g. a
    sweep over a scheduler knob). Raises MoejaxError if some stream is not done after
    `max_steps` events. progress(text): told "compiling" first, then after each chunk of
    events how many were simulated and how many streams are done. backend: "rounds" runs
    an AEP system (`aep.build`) in rounds (`rounds.py`: exact, the same metrics, faster; a
    `return_state` state then holds the fields `aep.metrics` reads); "scan" runs one event
    per scan step (every other system always does).
    """
    key = jax.random.key(0) if key is None else key
    n = int(np.shape(streams.arrival_s)[0])
    keys = jax.random.split(key, n) if keys is None else keys
    if backend == "rounds":  # an AEP system: the exact simulation in rounds (rounds.py)
        from moejax.systems.amoe import aep, rounds

        cfg = aep.CONFIGS.get(system)
        if cfg is not None:
            return rounds.run_streams(cfg, params, streams, keys, params_batched=params_batched,
                                      max_steps=max_steps, return_state=return_state,
                                      progress=progress)
    elif backend != "scan":
        raise MoejaxError(f"backend = {backend!r}; allowed: rounds, scan")
    init, chunk, finish = _compiled(system, int(chunk_steps), bool(params_batched))
    say = progress or (lambda text: None)
    say("compiling")
    state = init(params, streams, keys)
    steps = 0
    while True:
        state, done = chunk(params, state)
        steps += chunk_steps
        done = np.asarray(done)
        say(f"{steps} events simulated, {int(done.sum())} of {done.size} streams done")
        if bool(np.all(done)):
            break
        if steps >= max_steps:
            raise MoejaxError(f"{system.name}: streams not done after max_steps = {max_steps} "
                              "events; raise max_steps or lower the load")
    out = finish(params, state)
    return (out, state) if return_state else out
