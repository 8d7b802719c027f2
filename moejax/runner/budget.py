"""Up-front memory estimate of a batch simulation: pick a chunk that fits, or refuse in one
line before any work (a 200 000-trace run must not end in an out-of-memory traceback).

What a run holds, from shapes alone (no compile):
- for the whole run, per trace: its two split keys (generator and engine, raw and typed) and
  its metrics, held about four times over (chunk results, their concatenation, the NumPy
  copy, the CSV text);
- per chunk: the chunk's traces twice (host and device copies) plus the generator's scratch
  (`ChunkedTraces.scratch_bytes_per_trace`).
"""

from __future__ import annotations

import os

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.runner import programs
from moejax.runner.engine import batch_size, default_chunk, program_for
from moejax.trace.chunked import ChunkedTraces
from moejax.trace.core import Trace

# Per trace and run: 2 x 8 bytes of raw key data and 8 of typed keys, for each of the
# generator and the engine (jax.random.split of the default threefry impl: 2 x uint32).
KEY_BYTES_PER_TRACE = 48
# Copies of the metrics a run holds at its end (see the module docstring), plus the CSV text
# of one float metric ("%.9g" and a comma: at most 16 characters), held three times by
# `results.atomic_write_csv` (the StringIO buffer, its str, the encoded bytes).
METRIC_COPIES = 4
CSV_BYTES_PER_VALUE = 16 * 3
# Keep the whole run under this share of the memory available when it starts (the rest is
# for the Python process, XLA's compiled code, and whatever else runs on the machine).
RUN_SHARE = 0.5
# ... and one chunk under this share, so the chunk is never what runs out.
CHUNK_SHARE = 0.125
# What simulating traces holds at its peak, per trace, as a multiple of what `plan_chunk`
# counts for it (its leaves twice plus the generator's scratch): the engine's own arrays
# come on top. Measured (peak RSS of `moejax simulate --traces 1`, ep on chiplet-2x2,
# qwen3-30b-a3b): 2.1 kB more per token (and per layer) from 1 M to 2 M tokens and from 1 to
# 4 layers, where the count is 1.16 kB.
PEAK_FACTOR = 2


def available_bytes() -> int:
    """Memory available to this process now: the kernel's MemAvailable, or the cgroup's
    limit minus its use when that is smaller (a container)."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 1 << 62  # unknown: do not refuse
    try:
        limit = int(open("/sys/fs/cgroup/memory.max").read().split()[0])
        used = int(open("/sys/fs/cgroup/memory.current").read().split()[0])
        avail = min(avail, limit - used)
    except (OSError, ValueError, IndexError):
        pass
    return int(avail)


def metric_bytes_per_trace(system, params, traces, chunk: int) -> tuple[int, int]:
    """(bytes of one trace's metrics, number of scalar metrics) by `jax.eval_shape`.

    chunk: the rows of the compiled call `engine.simulate` will make; the shapes come from
    that program's own `eval_shape` with the call's argument shapes, so its tracing is the one
    the call reuses (tracing a system costs 0.2-1 s on CPU, also with a warm persistent cache).
    """
    impl = str(jax.config.jax_default_prng_impl)
    keys = jax.eval_shape(lambda: jax.random.key_data(jax.random.split(jax.random.key(0),
                                                                       chunk)))
    prog = program_for(system, params, False, impl)
    out = getattr(prog, "fn", prog).eval_shape(params, _chunk_shapes(traces, chunk), keys)
    leaves = jax.tree_util.tree_leaves(out)
    nbytes = sum(int(np.prod(x.shape[1:])) * np.dtype(x.dtype).itemsize for x in leaves)
    return nbytes, sum(1 for x in leaves if x.shape[1:] == ())


def _chunk_shapes(traces, chunk: int):
    """ShapeDtypeStructs of a compiled call's traces: `chunk` rows of the batch."""
    if isinstance(traces, ChunkedTraces):
        return jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct((chunk, *x.shape), x.dtype), _one_trace_shapes(traces))
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct((chunk, *np.shape(x)[1:]) if np.ndim(x) else (),
                                       x.dtype), traces)


def _one_trace_shapes(traces):
    """ShapeDtypeStructs of one trace of a batch (or of a `ChunkedTraces`, made from its
    shape attributes: no chunk is generated)."""
    if isinstance(traces, ChunkedTraces):
        i, l, n, k, e = (traces.num_iterations, traces.num_layers, traces.num_tokens,
                         traces.top_k, traces.num_experts)
        s = jax.ShapeDtypeStruct
        return Trace(s((i, l, n, k), np.int32), s((i, l, n, k), np.float32),
                     s((i, n), np.bool_), s((i, n), np.int32), s((i, l, e), np.float32),
                     num_experts=e, top_k=k)
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype),
                                  traces)


def trace_bytes_per_trace(traces) -> tuple[int, int]:
    """(bytes of one trace's leaves, generator scratch per trace)."""

    if isinstance(traces, ChunkedTraces):
        return traces.bytes_per_trace, traces.scratch_bytes_per_trace
    leaves = [x for x in jax.tree_util.tree_leaves(traces) if np.ndim(x) > 0]
    total = sum(np.size(x) * np.dtype(x.dtype).itemsize for x in leaves)
    return int(total // max(batch_size(traces), 1)), 0


def trace_shape(traces) -> tuple[int, int, int]:
    """(iterations, layers, tokens) of one trace of a batch (or a `ChunkedTraces`)."""
    return int(traces.num_iterations), int(traces.num_layers), int(traces.num_tokens)


def check_traces_fit(*, held: int, working: int, trace_bytes: int, scratch_bytes: int,
                     shape: tuple[int, int, int] | None, extra_bytes: int = 0,
                     available: int | None = None) -> None:
    """ConfigError (one line, naming --tokens) when `held` whole traces plus `working`
    traces simulated at once (each `PEAK_FACTOR` x its leaves twice and its scratch) plus
    `extra_bytes` need more than `RUN_SHARE` of the available memory: no chunk size makes
    such a run fit, and it would end killed by the kernel. shape: one trace's (iterations,
    layers, tokens)."""
    available = available_bytes() if available is None else available
    need = (held * trace_bytes + working * PEAK_FACTOR * (2 * trace_bytes + scratch_bytes)
            + extra_bytes)
    limit = RUN_SHARE * available
    if need <= limit:
        return
    what = f"{held} traces held and {working} simulated at once" if held else "one trace"
    verb = "need" if held else "needs"
    if shape is None:
        raise ConfigError(f"tokens: {what} {verb} about {_gb(need)}; {_gb(available)} is "
                          "available and a run may use half; use fewer --tokens, --layers "
                          "or --iterations" + (" (or fewer --traces)" if held else ""))
    i, layers, n = shape
    most = int(n * limit // need)  # the bytes grow in proportion to the tokens
    raise ConfigError(
        f"tokens: {what} of {i} iteration{'s' * (i != 1)} x {layers} layer"
        f"{'s' * (layers != 1)} x {n} tokens {verb} about {_gb(need)}; {_gb(available)} is "
        f"available and a run may use half; use at most {most} --tokens at these --layers "
        f"and --iterations" + (" (or fewer --traces)" if held else ""))


def plan_chunk(num_traces: int, chunk: int, *, trace_bytes: int, scratch_bytes: int,
               metric_bytes: int, metric_scalars: int, chunk_given: bool,
               available: int | None = None, shape: tuple[int, int, int] | None = None) -> int:
    """The chunk to run with: `chunk`, halved until a chunk fits `CHUNK_SHARE` of the
    available memory. ConfigError (one line) when one trace does not fit (see
    `check_traces_fit`; shape: its iterations, layers, tokens, for the message), when the
    whole run does not fit `RUN_SHARE`, or when a `chunk_given` by the user does not fit."""
    available = available_bytes() if available is None else available
    check_traces_fit(held=0, working=1, trace_bytes=trace_bytes, scratch_bytes=scratch_bytes,
                     shape=shape, available=available)
    run = num_traces * (KEY_BYTES_PER_TRACE + METRIC_COPIES * metric_bytes
                        + CSV_BYTES_PER_VALUE * metric_scalars)
    if run > RUN_SHARE * available:
        raise ConfigError(
            f"traces: {num_traces} traces need about {_gb(run)} for their keys and results "
            f"(~{run // max(num_traces, 1)} bytes a trace); {_gb(available)} is available "
            f"and a run may use half; use at most "
            f"{int(RUN_SHARE * available) // max(run // max(num_traces, 1), 1)} --traces, or "
            f"simulate --stream (rows to disk a part at a time)")
    per_chunk_trace = 2 * trace_bytes + scratch_bytes
    fit = max(int(CHUNK_SHARE * available) // max(per_chunk_trace, 1), 1)
    if chunk <= fit:
        return chunk
    if chunk_given:
        raise ConfigError(
            f"chunk: {chunk} traces per call need about {_gb(chunk * per_chunk_trace)}; "
            f"{_gb(available)} is available; use --chunk {2 ** int(np.log2(fit))} or less")
    return 2 ** int(np.log2(fit))


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"


def check(system, params, traces, chunk_size: int | None) -> int:
    """The chunk `engine.simulate` should use for `traces` (see `plan_chunk`); call it before
    any work. chunk_size: the user's, or None for `engine.default_chunk`.

    A batch of one chunk skips the whole-run estimate (its `jax.eval_shape` of the system
    costs about a second on CPU, and one chunk's keys and metrics are small beside its
    traces).
    """

    n = batch_size(traces)
    chunk = programs.bucket(n, chunk_size or default_chunk(traces, system))
    trace_bytes, scratch_bytes = trace_bytes_per_trace(traces)
    # first: tracing the system for the metrics' shapes builds its per-token constants
    check_traces_fit(held=0, working=1, trace_bytes=trace_bytes, scratch_bytes=scratch_bytes,
                     shape=trace_shape(traces))
    metric_bytes, metric_scalars = (metric_bytes_per_trace(system, params, traces, chunk)
                                    if n > chunk else (0, 0))
    return plan_chunk(n, chunk, trace_bytes=trace_bytes, scratch_bytes=scratch_bytes,
                      metric_bytes=metric_bytes, metric_scalars=metric_scalars,
                      chunk_given=chunk_size is not None, shape=trace_shape(traces))


def check_whole_batch(traces, copies: int = 3, available: int | None = None) -> None:
    """ConfigError (one line) when a batch that must exist whole (`moejax trace gen` writes
    one .npz) needs more than `RUN_SHARE` of the available memory: its leaves `copies` times
    (the arrays, their NumPy copies, the compressed file) plus one chunk's scratch."""
    available = available_bytes() if available is None else available
    trace_bytes, scratch = trace_bytes_per_trace(traces)

    n = batch_size(traces)
    need = n * trace_bytes * copies + min(n, 512) * scratch
    if need > RUN_SHARE * available:
        most = int(RUN_SHARE * available) // max(trace_bytes * copies, 1)
        raise ConfigError(f"traces: {n} traces of {trace_bytes} bytes need about {_gb(need)} "
                          f"to write at once; {_gb(available)} is available and a run may "
                          f"use half; use at most {most} --traces")
