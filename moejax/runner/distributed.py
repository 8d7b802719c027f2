"""Runs past one process on JAX's own distributed runtime (`jax.distributed`).

N processes (one per host or per GPU) each run the same command. Traces are split by their
global index into N contiguous blocks of whole chunks (the chunks of a single-process run, so
every compiled call has the same shapes); each process simulates its block with the trace keys
of a single-process run, and the per-trace results are all-gathered (`process_allgather`, the CPU
collectives JAX ships: gloo) and trimmed back to [T]. The result is therefore independent of
the process count: a trace's metrics depend only on its trace and its key. Process 0 writes
the outputs; the others write nothing.

Launch: `--coordinator HOST:PORT --num-processes N --process-id I`, or the environment
variables `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`, or, with none of
them, a cluster JAX detects by itself (SLURM, Open MPI, ...) when `--distributed` is given.
See docs/scaling.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.trace.chunked import ChunkedTraces

PyTree = object

# Seconds a process waits for the coordinator and every peer before giving up (one line,
# exit 2). jax's own timeout (longer) would abort the process with a multi-line stack dump.
DEFAULT_TIMEOUT_S = 60

_state = {"initialized": False}


@dataclasses.dataclass(frozen=True)
class Launch:
    """Where this process sits in a run: coordinator address, process count, own rank."""

    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    timeout_s: int = DEFAULT_TIMEOUT_S
    auto: bool = False  # let jax detect a cluster (SLURM, Open MPI, ...) by itself


def launch_from_args(args) -> Launch | None:
    """The launch the flags (`moejax.cli.args.add_distributed_arguments`) or environment
    variables ask for; None for one process."""
    env = os.environ
    coord = getattr(args, "coordinator", None) or env.get("JAX_COORDINATOR_ADDRESS")
    nproc = getattr(args, "num_processes", None)
    rank = getattr(args, "process_id", None)
    nproc = nproc if nproc is not None else _env_int("JAX_NUM_PROCESSES")
    rank = rank if rank is not None else _env_int("JAX_PROCESS_ID")
    auto = bool(getattr(args, "distributed", False))
    timeout = getattr(args, "distributed_timeout", DEFAULT_TIMEOUT_S)
    if coord is None and nproc is None and rank is None and not auto:
        return None
    return Launch(coord, nproc, rank, int(timeout), auto)


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"${name}={v!r}: must be an integer") from None


def check_launch(launch: Launch) -> None:
    """Reject a launch that cannot work, naming the field (ConfigError)."""
    if launch.timeout_s < 1:
        raise ConfigError(f"--distributed-timeout {launch.timeout_s}: must be >= 1 second")
    if launch.auto and launch.coordinator is None:
        return  # jax reads the layout from the cluster environment
    if launch.coordinator is None:
        raise ConfigError("--coordinator (or $JAX_COORDINATOR_ADDRESS) is required with "
                          "--num-processes / --process-id: HOST:PORT of process 0")
    host, _, port = launch.coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--coordinator {launch.coordinator!r}: must be HOST:PORT with a "
                          "port in 1..65535")
    if launch.num_processes is None or launch.num_processes < 1:
        raise ConfigError(f"--num-processes {launch.num_processes}: must be an integer >= 1")
    if launch.process_id is None or not 0 <= launch.process_id < launch.num_processes:
        raise ConfigError(f"--process-id {launch.process_id}: must be in 0..."
                          f"{launch.num_processes - 1} for --num-processes "
                          f"{launch.num_processes}")


def initialize(launch: Launch | None) -> None:
    """Join the run (`jax.distributed.initialize`), or do nothing for one process.

    Must run before any JAX computation. On CPU the cross-process collectives are gloo's.
    A coordinator that cannot be reached, or peers that do not all join, within
    `launch.timeout_s`: one line on stderr and exit code 2 (a watchdog thread; jax itself would
    abort with a stack dump, later)."""
    if launch is None or _state["initialized"]:
        return
    check_launch(launch)
    if launch.num_processes == 1 and not launch.auto:
        return  # one process: nothing to join
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    done = threading.Event()

    def watchdog():
        if not done.wait(launch.timeout_s):
            where = launch.coordinator or "the cluster's coordinator"
            print(f"moejax: error: distributed: process {launch.process_id} could not join "
                  f"{where} with {launch.num_processes} processes within "
                  f"{launch.timeout_s} s (coordinator unreachable or a peer missing)",
                  file=sys.stderr, flush=True)
            os._exit(2)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        jax.distributed.initialize(
            launch.coordinator, launch.num_processes, launch.process_id,
            initialization_timeout=launch.timeout_s + 30,
        )
        # the first collective completes the rendezvous of every peer (gloo connects lazily)
        sync("moejax-join")
    finally:
        done.set()
    _state["initialized"] = True


def sync(name: str) -> None:
    """A barrier over every process (no-op for one)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def is_writer() -> bool:
    """True on the process that writes outputs (process 0; the only one without a run)."""
    return jax.process_index() == 0


def process_count() -> int:
    return jax.process_count()


@dataclasses.dataclass(frozen=True)
class Partition:
    """This process's block of a [T] batch cut into chunks of `chunk` traces: whole chunks
    [lo, hi) of the global trace indices, the same chunk boundaries as a single-process run,
    so that every compiled call sees the shapes it would see there (XLA's CPU code may round
    differently for another batch shape: last-ulp differences). `bounds`: every process's
    (lo, hi). A process without a chunk simulates the first one and discards it."""

    total: int
    chunk: int
    rank: int
    bounds: tuple[tuple[int, int], ...]

    @property
    def lo(self) -> int:
        return self.bounds[self.rank][0]

    @property
    def hi(self) -> int:
        return self.bounds[self.rank][1]

    @property
    def rows(self) -> int:
        """Traces this process simulates (its block, or one dummy chunk)."""
        return self.hi - self.lo if self.hi > self.lo else min(self.chunk, self.total)

    def take(self, tree: PyTree) -> PyTree:
        """This process's rows of every leaf's leading axis."""
        lo, hi = (self.lo, self.hi) if self.hi > self.lo else (0, self.rows)
        if isinstance(tree, ChunkedTraces):  # generated per chunk: this block, still lazy
            return tree.rows(lo, hi)
        return jax.tree_util.tree_map(lambda x: np.asarray(x)[lo:hi], tree)

    def gather(self, tree: PyTree, axis: int = 0) -> PyTree:
        """Every process's block of the result along `axis`, in global order ([T] again)."""
        width = max(max(h - lo for lo, h in self.bounds), self.rows)
        valid = self.hi - self.lo

        def pad(x):
            x = np.moveaxis(np.asarray(x), axis, 0)[:valid]
            return np.concatenate([x, np.zeros((width - valid, *x.shape[1:]), x.dtype)])

        full = allgather_rows(jax.tree_util.tree_map(pad, tree))

        def unpad(x):  # [P, width, ...] -> [T, ...]
            x = np.concatenate([np.asarray(x)[r, : h - lo]
                                for r, (lo, h) in enumerate(self.bounds)])
            return np.moveaxis(x, 0, axis)

        return jax.tree_util.tree_map(unpad, full)


def allgather_rows(tree: PyTree) -> PyTree:
    """Every process's `tree` (NumPy leaves with the same leading axis, the same shapes on
    every process), stacked: leaves [P, ...]. All leaves travel as ONE byte buffer [rows,
    bytes a row] in one `process_allgather`: one collective a call, not one per metric
    (EP's ~15 metrics were ~15 gloo round trips a call, the fixed cost that made 2
    processes slower than 1 at 2,048 traces)."""
    from jax.experimental import multihost_utils

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [np.ascontiguousarray(x) for x in leaves]
    rows = leaves[0].shape[0]
    cols = [x.reshape(rows, -1).view(np.uint8) for x in leaves]
    buf = np.concatenate(cols, axis=1) if len(cols) > 1 else cols[0]
    full = np.asarray(multihost_utils.process_allgather(buf, tiled=False))  # [P, rows, B]
    out, at = [], 0
    for x, c in zip(leaves, cols, strict=True):
        w = c.shape[1]
        part = np.ascontiguousarray(full[:, :, at:at + w])
        out.append(part.view(x.dtype).reshape(full.shape[0], *x.shape))
        at += w
    return jax.tree_util.tree_unflatten(treedef, out)


def partition(total: int, chunk: int, rank: int | None = None,
              count: int | None = None) -> Partition | None:
    """This process's whole chunks of `total` traces (contiguous, about equal counts of
    chunks per process); None in a single-process run."""
    count = jax.process_count() if count is None else count
    if count < 2:
        return None
    rank = jax.process_index() if rank is None else rank
    chunks = -(-total // chunk)
    per = -(-chunks // count)
    bounds = tuple((min(total, r * per * chunk), min(total, (r + 1) * per * chunk))
                   for r in range(count))
    return Partition(total, chunk, rank, bounds)


def mean_across_processes(tree: PyTree) -> PyTree:
    """The mean of `tree` over processes (an all-gather, then a mean; identity for one):
    data-parallel gradients, each process's from its block of traces."""
    if jax.process_count() < 2:
        return tree
    from jax.experimental import multihost_utils

    full = multihost_utils.process_allgather(tree, tiled=False)
    return jax.tree_util.tree_map(lambda x: np.mean(np.asarray(x), axis=0), full)
