"""`moejax simulate --stream`: millions of traces in bounded memory (the command itself,
which prints and writes the summary, is `moejax.cli.simulate.simulate_streamed`).

Traces are made (or sliced from a recording) a chunk at a time, exactly as in
`engine.simulate` (same keys, same chunk shapes, so a streamed run's rows equal the in-memory
run's bit for bit); each chunk's per-trace rows go to the results folder and its metrics into
streaming summaries (`moejax.runner.sketch`: exact mean / min / max, percentiles within a stated
relative error). Nothing grows with --traces except the split keys (48 bytes a trace).

Folder layout (`--out DIR`):
- `DIR/results/part-NNNNNN.parquet`: the per-trace rows, `PART_ROWS` traces a part, in
  trace order (read the folder whole with `pyarrow.parquet.read_table(DIR / "results")`);
- `DIR/stream_state.npz`: what is done (traces, parts), the run's settings and the summaries'
  state, rewritten after each part;
- `DIR/summary.json`: written when the last trace is done.

Each part and the state are written atomically (temp file + rename), and Ctrl-C is held off
while one part and its state are renamed in, so an interrupted run leaves whole parts and a
state that counts exactly them (or nothing). `--resume` reads the state, checks the settings
match, drops any part past the state's count and goes on from the next trace.

Several processes (`moejax.runner.distributed`): the run goes in rounds of whole chunks of the
single-process run (the same chunk boundaries, so the same compiled shapes and the same
rows bit for bit); in a round each process simulates `ROUND_CHUNKS` consecutive chunks, the
rows are all-gathered (`process_allgather`, one collective a round) and process 0 alone
keeps the summaries and writes the parts, chunk by chunk in trace order exactly as a single
process does, so the folder is the same whatever the process count and `--resume` works
with any count (process 0 reads the state and broadcasts where to go on).
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import threading
from pathlib import Path

import jax
import numpy as np

from moejax.errors import ConfigError, OutputError
from moejax.output.results import atomic_write_bytes, made_folders, refused, remove_empty
from moejax.runner import distributed, engine
from moejax.runner.sketch import ALPHA, LogHistogram, RunningMean
from moejax.trace.chunked import key_data_of

STATE = "stream_state.npz"
PARTS = "results"
# Traces per Parquet part: 64 k rows of ~10 float32 metrics is ~3 MB held before a write,
# and 153 parts for 10^7 traces.
PART_ROWS = 65536
# Metrics whose percentiles the summary reports (the others: mean only); the held-out ones
# are a re-planning policy's per-trace means after its plan's window (`run`'s `derive`).
PERCENTILE_METRICS = ("latency_s", "forward_s", "held_out_latency_s", "held_out_forward_s")
# Settings a resumed run may differ in (the chunk is taken from the state).
_NOT_COMPARED = ("chunk", "chunk_given", "columns")
# Several processes: traces each process simulates between two all-gathers of rows (whole
# chunks). One collective per round is a fixed cost (ms); 8 k traces of EP at 256 tokens is
# ~10 ms of simulation plus ~15 s of trace generation per process, so it is amortized.
ROUND_TRACES = 8192


def _prepare(system, params, traces, key, chunk: int):
    """What both iterators share: the batch size, the compiled call, and the chunk reader
    of `engine.simulate` (its per-trace keys, its slicing and sharding; a last, shorter
    chunk padded to `chunk` rows, so that it runs the same compiled program)."""
    n = engine.batch_size(traces)
    key = jax.random.key(0) if key is None else key
    key_data, impl = key_data_of(key, n)
    return (n, engine.program_for(system, params, False, impl),
            engine.chunk_reader(traces, key_data, width=chunk))


def iter_chunks(system, params, traces, key, chunk: int, start: int = 0, derive=None):
    """Yield (lo, hi, metrics) for each chunk of `chunk` traces from trace `start` (a chunk
    boundary), with `engine.simulate`'s keys and chunk shapes. One chunk is dispatched
    ahead of the one yielded, so the host work on a chunk's results overlaps the next call.
    derive: metrics -> further per-trace metrics added to each chunk's (see `run`)."""
    n, fn, read = _prepare(system, params, traces, key, chunk)

    def call(s):
        e = min(s + chunk, n)
        out = fn(params, *read(s, e))
        if e - s < chunk:  # the padded last chunk: its real rows
            out = jax.tree_util.tree_map(lambda x: np.asarray(x)[: e - s], out)
        return s, e, ({**out, **derive(out)} if derive else out)

    pending = None
    for s in range(start, n, chunk):
        nxt = call(s)
        if pending is not None:
            yield pending
        pending = nxt
    if pending is not None:
        yield pending


def iter_rounds(system, params, traces, key, chunk: int, start: int = 0,
                round_traces: int | None = None, derive=None):
    """`iter_chunks` over several processes: every process yields the same (lo, hi,
    metrics) for each chunk from `start`, in trace order. A round is `P * G` consecutive
    chunks of the single-process run (G = round_traces // chunk, at least 1); process p
    simulates the p-th run of G of them, pads its rows to G * chunk and the rows are
    all-gathered (one `process_allgather` a round). A process with no chunk in the last
    round simulates the run's first chunk from `start` and sends padding only."""
    n, fn, read = _prepare(system, params, traces, key, chunk)
    count, rank = jax.process_count(), jax.process_index()
    per = max(1, int(round_traces or ROUND_TRACES) // chunk)  # chunks per process per round
    span = per * chunk

    def call(s, e):
        out = fn(params, *read(s, e))
        return {**out, **derive(out)} if derive else out

    def own(r0):  # this process's rows of the round starting at trace r0, padded to span
        lo = min(n, r0 + rank * span)
        hi = min(n, lo + span)
        starts = range(lo, hi, chunk) if hi > lo else [start]
        outs = [call(s, min(s + chunk, n)) for s in starts]
        out = {k: np.concatenate([np.asarray(o[k]) for o in outs])[: hi - lo]
               for k in outs[0] if np.ndim(outs[0][k]) == 1}
        return {k: np.concatenate([v, np.zeros(span - len(v), v.dtype)])
                for k, v in out.items()}

    for r0 in range(start, n, count * span):
        full = distributed.allgather_rows(own(r0))  # [P, span] each, one collective
        full = {k: np.asarray(v).reshape(-1) for k, v in full.items()}  # trace order
        for s in range(r0, min(n, r0 + count * span), chunk):
            e = min(s + chunk, n)
            yield s, e, {k: v[s - r0: e - r0] for k, v in full.items()}


class Summaries:
    """Per-metric streaming summaries: a `LogHistogram` for `PERCENTILE_METRICS`, a running
    mean for every other 1-D metric."""

    def __init__(self, columns: list[str]):
        self.hists = {c: LogHistogram(ALPHA) for c in columns if c in PERCENTILE_METRICS}
        self.means = {c: RunningMean() for c in columns if c not in PERCENTILE_METRICS}

    def add(self, cols: dict[str, np.ndarray]) -> None:
        for c, h in self.hists.items():
            h.add(cols[c])
        for c, m in self.means.items():
            m.add(cols[c])

    def mean(self, c: str) -> float:
        return self.hists[c].mean() if c in self.hists else self.means[c].mean()

    def state(self) -> dict[str, np.ndarray]:
        st = {}
        for c, h in self.hists.items():
            st.update({f"h:{c}:{k}": v for k, v in h.state().items()})
        for c, m in self.means.items():
            st[f"m:{c}"] = np.array([m.total, m.n], np.float64)
        return st

    @classmethod
    def from_state(cls, columns: list[str], st) -> Summaries:
        s = cls(columns)
        for c in s.hists:
            s.hists[c] = LogHistogram.from_state(
                {k: st[f"h:{c}:{k}"] for k in ("params", "counts", "scalars_i", "scalars_f")})
        for c, m in s.means.items():
            m.total, n = (float(v) for v in st[f"m:{c}"])
            m.n = int(n)
        return s


@contextlib.contextmanager
def _hold_sigint():
    """Ctrl-C during the block is delivered when it ends (main thread only; elsewhere the
    block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    old = signal.signal(signal.SIGINT, lambda *a: got.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if got:
            raise KeyboardInterrupt


def _columns(out) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in out.items() if np.ndim(v) == 1}


def _parquet_bytes(cols: dict[str, np.ndarray]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf)
    return buf.getvalue()


def _part_path(out_dir: Path, i: int) -> Path:
    return out_dir / PARTS / f"part-{i:06d}.parquet"


def _save_state(out_dir: Path, meta: dict, done: int, parts: int, sums: Summaries) -> None:
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(meta, sort_keys=True)), done=np.int64(done),
             parts=np.int64(parts), **sums.state())
    atomic_write_bytes(out_dir / STATE, buf.getvalue())


def _refused(err: OutputError, out_dir: Path, made: list[Path], n: int) -> OutputError:
    """`err` (a part or the state refused by the file system), saying what the folder
    holds now: the traces its state counts, resumable, or nothing (the folders made for
    the run, if left empty, removed)."""
    if not (out_dir / STATE).exists():
        remove_empty(made)
        return refused(err.path, err.reason, "nothing was written")
    done = load_state(out_dir)[1]
    return refused(err.path, err.reason,
                   f"{out_dir} keeps the first {done} of {n} traces and can be resumed: free "
                   "space, then rerun the same command with --resume")


def load_state(out_dir: Path) -> tuple[dict, int, int, dict]:
    """(settings, traces done, parts written, raw summary state) of a streamed run."""
    with np.load(Path(out_dir) / STATE) as z:
        return (json.loads(str(z["meta"])), int(z["done"]), int(z["parts"]),
                {k: z[k] for k in z.files})


def _open(out_dir: Path | None, resume: bool, meta: dict):
    """(first trace, parts written, summaries or None, meta) of a new or resumed run in
    `out_dir`; ConfigError if the folder does not fit (see `run`)."""
    if out_dir is not None and resume:
        if not (out_dir / STATE).exists():
            raise ConfigError(f"--resume: {out_dir} holds no streamed run ({STATE} missing); "
                              "start one with --stream")
        old, start, parts, st = load_state(out_dir)
        diff = [k for k in sorted(set(old) | set(meta))
                if k not in _NOT_COMPARED and old.get(k) != meta.get(k)]
        if diff:
            k = diff[0]
            raise ConfigError(f"--resume: {k} is {meta.get(k)!r} but the run in {out_dir} "
                              f"has {old.get(k)!r}; resume with the same settings")
        if meta.get("chunk_given") and meta["chunk"] != old["chunk"]:
            raise ConfigError(f"--resume: --chunk {meta['chunk']} but the run in {out_dir} "
                              f"used {old['chunk']}; leave --chunk out")
        meta = dict(meta, chunk=old["chunk"], columns=old["columns"])
        sums = Summaries.from_state(old["columns"], st)
        for p in sorted((out_dir / PARTS).glob("part-*.parquet")):  # past the state: redo
            if int(p.stem.split("-")[1]) >= parts:
                p.unlink()
        return start, parts, sums, meta
    if out_dir is not None and (out_dir / STATE).exists():
        raise ConfigError(f"--out {out_dir}: holds a streamed run already ({STATE}); add "
                          "--resume to continue it, or choose another --out")
    return 0, 0, None, meta


def _open_everywhere(out_dir, resume: bool, meta: dict):
    """`_open` on process 0 (the only one that reads the folder); the others learn the first
    trace and the chunk by broadcast. A refusal on process 0 reaches every process (a status
    broadcast first, so none waits on a collective that never comes)."""
    if distributed.process_count() < 2:
        return _open(out_dir, resume, meta)
    from jax.experimental import multihost_utils

    err, start, parts, sums = None, 0, 0, None
    if distributed.is_writer():
        try:
            start, parts, sums, meta = _open(out_dir, resume, meta)
        except ConfigError as e:
            err = e
    status = np.asarray(multihost_utils.broadcast_one_to_all(
        np.array([err is not None, start, meta["chunk"]], np.int64)))
    if status[0]:
        raise err or ConfigError(f"{out_dir}: process 0 could not open the streamed run "
                                 "(its message says why)")
    return int(status[1]), parts, sums, dict(meta, chunk=int(status[2]))


def run(system, params, traces, key, *, chunk: int, meta: dict, out_dir: Path | None,
        resume: bool = False, progress: bool = False,
        round_traces: int | None = None, derive=None) -> tuple[Summaries | None, int, dict]:
    """Stream `traces` through `system`; returns (summaries, traces simulated now, meta).

    meta: the run's settings (JSON-able); a resumed run must have the same ones (its chunk
    comes from the state, so a resumed run makes the same calls as an uninterrupted one).
    out_dir None: summaries only, no rows written (and no resume). Several processes: each
    runs this with the same arguments; process 0 keeps the summaries and writes, the others
    get None summaries (`round_traces`: see `iter_rounds`). derive: a chunk's metrics ->
    further 1-D per-trace metrics (e.g. a re-planning policy's held-out means of its
    per-iteration ones), summarized and written like the others."""
    n = engine.batch_size(traces)
    made = made_folders(out_dir / PARTS) if out_dir is not None else []
    start, parts, sums, meta = _open_everywhere(out_dir, resume, meta)
    chunk = int(meta["chunk"])
    writer = distributed.is_writer()
    if not writer:
        out_dir = None
    buffered: list[dict[str, np.ndarray]] = []
    rows = 0

    def flush(lo_done: int):
        nonlocal buffered, rows, parts, sums
        cols = {k: np.concatenate([b[k] for b in buffered]) for k in buffered[0]}
        buffered, rows = [], 0
        if sums is None:
            sums = Summaries([k for k in cols if k != "trace"])
            meta["columns"] = [k for k in cols if k != "trace"]
        sums.add(cols)
        if out_dir is None:
            return
        data = _parquet_bytes(cols)
        part = _part_path(out_dir, parts)
        with _hold_sigint():  # the part and the state that counts it, or neither
            try:
                atomic_write_bytes(part, data)
                _save_state(out_dir, meta, lo_done, parts + 1, sums)
            except OutputError as e:  # a full disk: the folder stays as the last state says
                part.unlink(missing_ok=True)
                raise _refused(e, out_dir, made, n) from None
            parts += 1

    done_now = 0
    starts = range(start, n, chunk)
    chunks = (iter_chunks(system, params, traces, key, chunk, start, derive)
              if distributed.process_count() < 2 else
              iter_rounds(system, params, traces, key, chunk, start, round_traces, derive))
    with engine.progress_bar(progress and writer, len(starts), system.name) as advance:
        for lo, hi, out in chunks:
            done_now += hi - lo
            if writer:
                buffered.append({"trace": np.arange(lo, hi, dtype=np.int64),
                                 **_columns(out)})
                rows += hi - lo
                if rows >= PART_ROWS or hi == n:
                    flush(hi)
            advance()
    return (sums if writer else None), done_now, meta
