"""`System`: a simulated system as pure `init` / `step` / `finish` functions (STYLE.md rule 1).

Systems build one from their static config; the runner (`moejax.runner.engine`) applies
`jit`, `vmap` and `lax.scan` to it. This module imports nothing of moejax, so every system
can import it without reaching the runner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

PyTree = Any

# The name of the batch axis (traces or request streams) when the runner vmaps `init` / `step`
# over a batch it runs until done: a step may reduce over it (`jax.lax.pmax(x, BATCH_AXIS)`)
# so that a loop predicate is the same for every member of the batch (the loop then runs as
# one loop under vmap instead of selecting every carried array per iteration).
BATCH_AXIS = "batch"


@dataclasses.dataclass(frozen=True)
class System:
    """A simulated system as pure functions of (params, state, trace).

    init(params, trace, key) -> state
    step(params, state, x) -> (state, out)           x: this step's input (see `inputs`)
    finish(params, state, outs) -> metrics           outs: `out` stacked over steps
    is_done(state) -> bool scalar, or None           steps after done leave the state as is
    num_steps: static scan length (an upper bound on the events or iterations to simulate);
      with `is_done`, the steps of one segment: the runner runs segments until every member
      of the batch is done (the count need not be known up front) and `finish` gets
      `outs = None`
    inputs(trace) -> xs, or None: a pytree whose leaves have a leading `[num_steps]` axis;
      the runner's scan hands step `t` the slice `xs[t]` (a trace system gets its step's
      routing this way instead of keeping the whole trace in its State). None: `x` is the
      int32 step index `t`.
    """

    name: str
    init: Callable[[PyTree, PyTree, jax.Array], PyTree]
    step: Callable[[PyTree, PyTree, jax.Array], tuple[PyTree, PyTree]]
    finish: Callable[[PyTree, PyTree, PyTree], PyTree]
    num_steps: int
    is_done: Callable[[PyTree], jax.Array] | None = None
    # Traces per compiled call on an accelerator where `DEFAULT_CHUNK_ACCELERATOR` does not
    # suit the system (None: the default); the user's `chunk_size` still wins.
    accelerator_chunk: int | None = None
    inputs: Callable[[PyTree], PyTree] | None = None
