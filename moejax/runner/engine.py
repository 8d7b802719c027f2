"""The runner: jit + vmap over traces (and params) + a fixed-length `lax.scan` over time.

Systems are pure `init` / `step` / `finish` functions built from a static config
(STYLE.md rule 1); only this module applies `jit`, `vmap` and `scan` to them. A system with
`is_done` (an event simulation over request streams, 002 AMoE) runs in segments of
`num_steps` steps until every member of its batch is done (`run_until_done`): its input is
any batched pytree (a `RequestStream` batch), its step count need not be known up front.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax.errors import MoejaxError
from moejax.runner import distributed, programs
from moejax.system import BATCH_AXIS, PyTree, System
from moejax.trace.chunked import ChunkedTraces

# Traces per compiled call. On CPU, batches much larger than 512 fall out of cache (a 4096
# batch ran 2-4x slower per trace than 512 batches in benchmarks/bench_ep.py); an
# accelerator wants large batches to fill its cores, up to a point: on an H200 (jax 0.11.2,
# 2026-11-26, benchmarks/gpu_section.sh) FSE-DP ran as fast at 8192 traces per call as at
# 16384. A system whose best size differs says so in `System.accelerator_chunk` (EP 65,536:
# little work per trace; the wafer layer 4,096: XLA's compile time; docs/performance.md,
# "Running on an accelerator").
DEFAULT_CHUNK = {"cpu": 512}
DEFAULT_CHUNK_ACCELERATOR = 8192
# ... and at most about this many bytes of trace per call on CPU: a call's scratch grows with
# its traces, and past ~32 MB glibc hands every call fresh pages (EP at 2048 tokens per
# trace, 142 kB: 512 traces per call ran 28 k traces/s with 17 k page faults per run,
# 128 per call 79 k/s).
CPU_CHUNK_BYTES = 16 * 2**20


def default_chunk(traces: PyTree | None = None, system: System | None = None) -> int:
    """Traces per compiled call for the default backend (see `DEFAULT_CHUNK`, or the system's
    own `accelerator_chunk` on an accelerator); on CPU, given the traces, no more than the
    power of two nearest `CPU_CHUNK_BYTES` of them."""
    backend = jax.default_backend()
    chunk = DEFAULT_CHUNK.get(backend, DEFAULT_CHUNK_ACCELERATOR)
    if backend != "cpu" and system is not None and system.accelerator_chunk:
        chunk = system.accelerator_chunk
    if traces is None or backend != "cpu":
        return chunk
    if isinstance(traces, ChunkedTraces):  # generation scratch is freed before the call runs
        per_trace = traces.bytes_per_trace
    else:
        leaves = [x for x in jax.tree_util.tree_leaves(traces) if np.ndim(x) > 0]
        per_trace = sum(np.size(x) * np.dtype(x.dtype).itemsize for x in leaves) / batch_size(
            traces)
    if per_trace <= 0:
        return chunk
    fit = 2 ** int(np.round(np.log2(max(CPU_CHUNK_BYTES / per_trace, 1.0))))
    return int(min(chunk, fit))


def run_one(system: System, params: PyTree, trace: PyTree, key: jax.Array) -> PyTree:
    """Simulate one trace (no jit, no vmap): init, scan `num_steps` steps, finish."""
    state = system.init(params, trace, key)

    def body(state, x):
        new_state, out = system.step(params, state, x)
        if system.is_done is not None:
            done = system.is_done(state)
            new_state = jax.tree_util.tree_map(
                lambda n, o: jnp.where(done, o, n), new_state, state
            )
        return new_state, out

    xs = (jnp.arange(system.num_steps, dtype=jnp.int32) if system.inputs is None
          else system.inputs(trace))
    state, outs = jax.lax.scan(body, state, xs, length=system.num_steps)
    return system.finish(params, state, outs)


def batch_size(tree: PyTree) -> int:
    """Length of the leading axis shared by every leaf of `tree` (a `ChunkedTraces`' count)."""
    if isinstance(tree, ChunkedTraces):
        return tree.num_traces
    sizes = {np.shape(x)[0] for x in jax.tree_util.tree_leaves(tree) if np.ndim(x) > 0}
    if len(sizes) != 1:
        raise MoejaxError(f"batch: leaves disagree on the leading (trace) axis: {sorted(sizes)}")
    return sizes.pop()


def compiled_program(system: System, sweep: bool, key_impl: str, hard: bool = False) -> Program:
    """jit(vmap(run_one)) over traces (and params); keys come in as raw key data, wrapped
    inside the call (no per-chunk dispatch to rebuild typed keys on the host). Cached by
    value (`programs.fingerprint` of the system): an equal system built again reuses the
    compiled program.

    hard: a program for params whose temperatures are all 0 (`program_for` decides), traced
    in `relax.hard_program`: each cond on a temperature compiles its hard branch, unchanged,
    and a NaN fill for the smooth one, so its results are the two-branch program's bit for
    bit at less XLA time (docs/performance.md, "A cold first call"). It is cached apart from
    the two-branch program and refuses params with a temperature that is not 0."""
    def build():
        def one_params(params, traces, key_data):
            keys = jax.random.wrap_key_data(key_data, impl=key_impl)
            return jax.vmap(lambda tr, k: run_one(system, params, tr, k))(traces, keys)

        def one_params_hard(params, traces, key_data):
            with relax.hard_program():
                return one_params(params, traces, key_data)

        options = programs.compiler_options(quick)
        name = system.name + (" (quick compile)" if quick else "")
        if hard:
            return Program(jax.jit(one_params_hard, compiler_options=options), name, hard=True)
        fn = jax.vmap(one_params, in_axes=(0, None, None)) if sweep else one_params
        return Program(jax.jit(fn, compiler_options=options), name)

    if hard and sweep:
        raise ValueError("compiled_program: a sweep has no hard-only program")
    quick = programs.quick_compiling()
    return programs.PROGRAMS.get("trace", (system, sweep, key_impl, bool(hard), quick), build)


def program_for(system: System, params: PyTree, sweep: bool, key_impl: str) -> Program:
    """The compiled program `simulate` runs `params` with: the hard-only program when the
    params' temperatures are all concretely 0 (`relax.tau_is_zero`; not for a sweep, whose
    stacked temperatures would turn each cond into a select of both branches), else the
    two-branch one (tuning: traced or positive temperatures)."""
    hard = not sweep and relax.tau_is_zero(params)
    return compiled_program(system, sweep, key_impl, hard)


class Program:
    """A compiled call (a `jax.jit` function) that tells `programs.report_compiles`'s sink
    when a call compiles: "compiling EP for 128 traces x 256 tokens ... 4.1 s"."""

    def __init__(self, fn, name: str, hard: bool = False):
        self.fn, self.name, self.signatures = fn, name, programs.Signatures()
        self.hard = hard
        self.checked = None  # the params last found hard (one check per run, not per chunk)

    def __call__(self, params, traces, key_data):
        if self.hard and params is not self.checked:
            if not relax.tau_is_zero(params):
                raise MoejaxError(f"{self.name}: a hard-only program was given params with a "
                                  "temperature that is not 0 (use program_for)")
            self.checked = params
        return programs.call_reporting(self.fn, self.signatures,
                                       lambda: _describe(self.name, traces),
                                       params, traces, key_data)


def _describe(name: str, traces) -> str:
    """"EP for 128 traces x 256 tokens" (the tokens of a trace batch only)."""
    text = f"{name} for {batch_size(traces)} traces"
    ids = getattr(traces, "expert_ids", None)
    if ids is not None and np.ndim(ids) >= 2 and np.shape(ids)[-2] > 0:
        text += f" x {np.shape(ids)[-2]} tokens"
    return text


def simulate(
    system: System,
    params: PyTree,
    traces: PyTree,
    key: jax.Array | None = None,
    *,
    sweep: bool = False,
    chunk_size: int | None = None,
    progress=None,
    **until_done,
) -> PyTree:
    """Simulate a batch of traces; returns the metrics pytree with a leading `[T]` axis.

    A system with `is_done` runs until done (`run_until_done`, which takes the keyword
    arguments `until_done`, and `progress` as a callable); the rest of this text is about
    fixed-length trace systems.

    sweep: `params` carries a leading `[P]` axis; metrics get `[P, T]` (one vmapped call).
    chunk_size: traces per compiled call (default `default_chunk(traces)`); a progress bar is shown
      when there are more than 8 chunks (or `progress=True`).
    traces: a pytree with a leading `[T]` axis, or a `ChunkedTraces` whose chunks are made
      inside the chunk loop (a generated batch never exists whole).
    Traces are sharded over all local devices (`jax.sharding`) when there are several and
    the chunk divides evenly; results equal the single-device run bit for bit for the
    systems docs/scaling.md lists (tests/test_sharded_bits.py), to float32 rounding else. In a
    multi-process run (`moejax.runner.distributed`) each process simulates its block of the global
    trace indices and the results are all-gathered: identical to the single-process run.
    """
    if system.is_done is not None:
        if sweep or chunk_size:
            raise MoejaxError(f"{system.name}: runs until done on its whole batch; give "
                              "per-member params (params_batched) instead of sweep / chunk_size")
        return run_until_done(system, params, traces, key, progress=progress, **until_done)
    if until_done:
        raise TypeError(f"simulate: unexpected arguments {sorted(until_done)} for a "
                        "fixed-length system")
    n = batch_size(traces)
    key_data, key_impl = split_keys(_typed_key(key), n)
    chunk = programs.bucket(n, chunk_size or default_chunk(traces, system))
    part = distributed.partition(n, chunk)  # several processes: this one's whole chunks
    if part is not None:
        traces, key_data, n = part.take(traces), part.take(key_data), part.rows
    fn = program_for(system, params, sweep, key_impl)
    starts = range(0, n, chunk)
    read = chunk_reader(traces, key_data, several=len(starts) > 1, width=chunk)
    show = progress if progress is not None else len(starts) > 8
    results = []
    with progress_bar(show, len(starts), system.name) as advance:
        for s in starts:
            results.append(fn(params, *read(s, min(s + chunk, n))))
            advance()
    axis = 1 if sweep else 0
    out = _join(results, axis, n)
    return out if part is None else part.gather(out, axis)


def split_keys(key: jax.Array, n: int) -> tuple[np.ndarray, str]:
    """(raw data of `jax.random.split(key, n)` on the host, the key impl's name). With
    threefry keys split partitionably (JAX's default), the first n of a split into more keys
    are the same keys, so the split is made for the power of two at or above n and cut: one
    compiled split per power of two instead of one per batch size (each ~0.6 s on CPU)."""
    impl = str(jax.random.key_impl(key))
    m = n
    if impl == "threefry2x32" and jax.config.jax_threefry_partitionable:
        m = 1 << max(0, int(n - 1).bit_length())
    data = jax.random.key_data(jax.random.split(key, m))
    if isinstance(data, jax.core.Tracer):  # simulate inside a caller's jit / grad: in graph
        return data[:n], impl
    return np.asarray(data)[:n], impl


def _typed_key(key) -> jax.Array:
    """A typed PRNG key (default `key(0)`; a legacy uint32 PRNGKey is wrapped)."""
    if key is None:  # the default key is a constant, also inside a caller's jit
        with jax.ensure_compile_time_eval():
            return jax.random.key(0)
    if not jnp.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return key


def run_until_done(system: System, params: PyTree, inputs: PyTree, key=None, *, keys=None,
                   params_batched=False, max_steps: int = 50_000_000,
                   return_state: bool = False, progress=None) -> PyTree:
    """Metrics with a leading `[T]` axis of a system with `is_done`, run until every member
    of the batch `inputs` (any pytree with a leading `[T]` axis, e.g. a `RequestStream`
    batch) is done.

    One compiled call runs a segment: a loop of at most `system.num_steps` steps, vmapped
    over the batch with axis name `BATCH_AXIS`, which stops once every member is done (a
    done member's state is frozen; a `while_loop`, not a fixed `scan`: these event
    simulations are not differentiated, and a segment ends as soon as its batch is done);
    the host calls segments until all are done, so the number of steps need not be known
    up front. Step t gets the int32 index t within its segment (`System.inputs` is for
    fixed-length systems). Member t uses `jax.random.split(key, T)[t]`
    (or `keys[t]`). params_batched: True if every params leaf carries the leading `[T]` axis
    (member t runs with params[t]), or a pytree prefix of params with 0 (batched) / None
    (shared) per part, as `jax.vmap`'s in_axes. Raises MoejaxError if some member is not
    done after `max_steps` steps. return_state: also return the final state. progress(text):
    told "compiling", then after each segment how many members are done.
    """
    if system.inputs is not None:
        raise MoejaxError(f"{system.name}: a system run until done takes no per-step inputs")
    n = batch_size(inputs)
    if keys is None:
        keys = jax.random.split(_typed_key(key), n)
    key_data = jax.random.key_data(keys)
    init, segment, finish = until_done_program(system, params_batched,
                                               str(jax.random.key_impl(keys)))
    say = progress if callable(progress) else (lambda text: None)
    say("compiling")
    state = init(params, inputs, key_data)
    steps = 0
    while True:
        state, done = segment(params, state)
        steps += system.num_steps
        done = np.asarray(done)
        say(f"{steps} steps simulated, {int(done.sum())} of {done.size} done")
        if bool(np.all(done)):
            break
        if steps >= max_steps:
            raise MoejaxError(f"{system.name}: {int((~done).sum())} of {done.size} not done "
                              f"after max_steps = {max_steps} steps; raise max_steps or lower "
                              "the load")
    out = finish(params, state)
    return (out, state) if return_state else out


def until_done_program(system: System, params_batched=False, key_impl: str = "threefry2x32"):
    """(init, segment, finish) of `run_until_done`, each jit(vmap) over the batch, for
    callers that drive the segments themselves (benchmarks): init(params, inputs, key_data)
    -> state; segment(params, state) -> (state, done [T]), at most `system.num_steps` steps,
    its state argument donated; finish(params, state) -> metrics. params_batched: as
    `run_until_done`."""
    axes = 0 if params_batched is True else (None if params_batched is False else params_batched)
    quick = programs.quick_compiling()
    return programs.PROGRAMS.get("until_done", (system, axes, key_impl, quick),
                                 lambda: _until_done_compiled(system, axes, key_impl, quick))


def _until_done_compiled(system: System, params_axes, key_impl: str, quick: bool):
    def init_one(params, x, key_data):
        return system.init(params, x, jax.random.wrap_key_data(key_data, impl=key_impl))

    def segment_one(params, state):
        def running(c):  # the same predicate for every member: one loop under vmap
            return (c[0] < system.num_steps) & jax.lax.pmax(~system.is_done(c[1]), BATCH_AXIS)

        def body(c):
            t, st = c
            new, _ = system.step(params, st, t)
            done = system.is_done(st)
            return t + 1, jax.tree_util.tree_map(lambda a, b: jnp.where(done, b, a), new, st)

        _, state = jax.lax.while_loop(running, body, (jnp.int32(0), state))
        return state, system.is_done(state)

    options = programs.compiler_options(quick)
    init = jax.jit(jax.vmap(init_one, in_axes=(params_axes, 0, 0)), compiler_options=options)
    segment = jax.jit(jax.vmap(segment_one, in_axes=(params_axes, 0), axis_name=BATCH_AXIS),
                      donate_argnums=1, compiler_options=options)
    finish = jax.jit(jax.vmap(lambda p, s: system.finish(p, s, None), in_axes=(params_axes, 0)),
                     compiler_options=options)
    return init, segment, finish


def chunk_reader(traces: PyTree, key_data, *, several: bool = True, width: int | None = None):
    """A function (s, e) -> the compiled call's (traces, key data) of traces [s, e), sharded
    over the local devices (`_shard`); `engine.simulate` and `moejax.runner.stream` read chunks
    through it. A `ChunkedTraces` is made chunk by chunk (and dropped after the call); a batch
    on an accelerator is sliced there (`_take`: one compiled slice for every offset); any
    other batch is sliced on the host (`x[s:e]` on a jax array compiles per offset).
    several=False: one chunk, the whole batch, passed unsliced (a slice is a dispatch per
    leaf). width: rows per call; a shorter chunk is padded to it with copies of its last
    trace and key (`programs.bucket`: fewer distinct shapes, so fewer compiles), whose
    results the caller drops."""
    devices = jax.local_devices()
    lazy = isinstance(traces, ChunkedTraces)
    if not several and not lazy:
        return lambda s, e: _shard(*_pad(traces, key_data, width), devices)
    resident = not lazy and _on_accelerator(traces)
    if not lazy and not resident:
        traces = jax.tree_util.tree_map(np.asarray, traces)
    key_data = np.asarray(key_data)

    def read(s: int, e: int):
        if lazy:
            tr = traces.chunk(s, e)
        elif resident:
            tr = jax.tree_util.tree_map(lambda x: _take(x, s, e - s), traces)
        else:
            tr = jax.tree_util.tree_map(lambda x: x[s:e], traces)
        return _shard(*_pad(tr, key_data[s:e], width), devices)

    return read


def _pad(traces: PyTree, key_data, width: int | None):
    """(traces, key data) with rows appended, copies of the last, up to `width` rows.
    Every trace runs alone under vmap, so the real rows' results do not depend on them.
    Padded on the host (no compile per shape), or in one compiled call where the batch
    lives on an accelerator."""
    m = batch_size(traces)
    if width is None or m >= width:
        return traces, key_data
    if _on_accelerator(traces):
        return _pad_rows((traces, jnp.asarray(key_data)), width)

    def pad(x):
        if np.ndim(x) == 0:
            return x
        x = np.asarray(x)
        return np.concatenate([x, np.repeat(x[-1:], width - m, axis=0)])

    return jax.tree_util.tree_map(pad, traces), pad(key_data)


@functools.partial(jax.jit, static_argnums=1)
def _pad_rows(tree: PyTree, width: int) -> PyTree:
    """Every leaf with copies of its last row appended up to `width` rows."""
    return jax.tree_util.tree_map(lambda x: x if x.ndim == 0 else jnp.concatenate(
        [x, jnp.repeat(x[-1:], width - x.shape[0], axis=0)]), tree)


def _on_accelerator(traces: PyTree) -> bool:
    """Every leaf is a jax.Array on a non-CPU device. Such a batch is sliced where it lives:
    copying it to the host and each chunk back made EP on an H200 3.9x slower at 64k traces
    (0.69 vs 2.67 M traces/s, docs/performance.md "GPU")."""
    leaves = jax.tree_util.tree_leaves(traces)
    return bool(leaves) and all(
        isinstance(x, jax.Array) and all(d.platform != "cpu" for d in x.devices())
        for x in leaves)


@functools.partial(jax.jit, static_argnums=2)
def _take(x: jax.Array, start, size: int) -> jax.Array:
    """Rows [start, start + size) of x, compiled once per size (start is traced)."""
    return jax.lax.dynamic_slice_in_dim(x, start, size)


def _join(results: list, axis: int, n: int) -> PyTree:
    """Chunk results joined along `axis` and cut to the first `n` rows (the last chunk's
    padding dropped): on the host by NumPy (no compile per chunk count and n), on an
    accelerator or inside a trace in one compiled call (not one dispatch per leaf)."""
    first = results[0]
    if len(results) == 1 and np.shape(jax.tree_util.tree_leaves(first)[0])[axis] == n:
        return first
    if _on_host(first):  # the compiled join took ~1 s to compile at 256 chunks on CPU
        cut = (slice(None),) * axis + (slice(n),)
        return jax.tree_util.tree_map(lambda *xs: jax.device_put(
            np.concatenate([np.asarray(x) for x in xs], axis=axis)[cut]), *results)
    return _joiner(axis, n)(*results)


def _on_host(tree: PyTree) -> bool:
    """Every leaf is a concrete array on the CPU (not a tracer, not on an accelerator)."""
    leaves = jax.tree_util.tree_leaves(tree)
    return all(not isinstance(x, jax.core.Tracer) and not _on_accelerator(x) for x in leaves)


@functools.lru_cache(maxsize=64)
def _joiner(axis: int, n: int):
    def join(*parts):
        return jax.tree_util.tree_map(lambda *xs: jax.lax.slice_in_dim(
            jnp.concatenate(xs, axis=axis) if len(xs) > 1 else xs[0], 0, n, axis=axis),
            *parts)

    return jax.jit(join)


def _shard(traces, keys, devices):
    m = batch_size(traces)
    if len(devices) < 2 or m % len(devices):
        return traces, keys
    mesh = jax.sharding.Mesh(np.array(devices), ("traces",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("traces"))
    return jax.device_put(traces, spec), jax.device_put(keys, spec)


class progress_bar:
    """A rich progress bar over chunks, or nothing. Until the first chunk's call returns it
    reads "compiling" (XLA compiles on that call; the bar would otherwise sit at 0%)."""

    def __init__(self, show: bool, total: int, name: str):
        self.show, self.total, self.name = show, total, name

    def __enter__(self):
        if not self.show:
            return lambda: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("chunks"), TimeElapsedColumn(),
                            TimeRemainingColumn(), transient=True)
        self.bar.__enter__()
        task = self.bar.add_task(f"compiling {self.name} (first chunk)", total=self.total)
        return lambda: self.bar.update(task, advance=1, description=f"simulating {self.name}")

    def __exit__(self, *exc):
        if self.show:
            self.bar.__exit__(*exc)
        return False


def stack_params(params_list: list[PyTree]) -> PyTree:
    """Stack params pytrees into one with a leading `[P]` axis, for `simulate(sweep=True)`."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]),
                                  *params_list)


def percentile_summary(x) -> dict[str, float]:
    """mean / p50 / p99 / min / max of a 1-D array, as Python floats."""
    x = np.asarray(x, np.float64).ravel()
    return {
        "mean": float(x.mean()),
        "p50": float(np.percentile(x, 50)),
        "p99": float(np.percentile(x, 99)),
        "min": float(x.min()),
        "max": float(x.max()),
    }
