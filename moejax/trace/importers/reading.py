"""What every importer of recorded routing shares: lines read as UTF-8 with the bad byte
named, a progress bar over the bytes read, checks of experts / top-k / ids / weights that
name the file, line and field, and the token-level `Trace` they assemble."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError, TraceError
from moejax.trace.core import Trace, validate


def error(path, line: int | None, field: str, msg: str) -> TraceError:
    """A TraceError "path:line: field: msg" (no line when `line` is None)."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    return TraceError(f"{where}: {field}: {msg}")


@contextlib.contextmanager
def byte_progress(total_bytes: int, label: str, enabled: bool):
    """Yield `advance(nbytes)`; a rich progress bar over bytes when `enabled`."""
    if not enabled:
        yield lambda n: None
        return
    # rich.progress takes ~60 ms to import: only a run that shows a bar pays for it
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=max(total_bytes, 1))
        pending = [0]

        def advance(n: int) -> None:
            pending[0] += n
            if pending[0] >= 1 << 20:
                bar.advance(task, pending[0])
                pending[0] = 0

        yield advance
        bar.advance(task, pending[0])


def read_lines(f, path, field_at=None) -> Iterator[tuple[int, str, bool]]:
    """(1-based line number, text without newline, whether it ended with a newline) of a
    file opened in binary mode; a line that is not UTF-8 is a TraceError naming the file,
    the line and the field (`field_at(text before the bad byte)`, else "encoding"), never a
    UnicodeDecodeError traceback."""
    for n, raw in enumerate(f, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            before = raw[: err.start].decode("utf-8", "replace")
            field = (field_at(before) if field_at else None) or "encoding"
            raise error(path, n, field, f"byte 0x{raw[err.start]:02x} at column "
                        f"{err.start + 1} is not UTF-8 (save the file as UTF-8)") from None
        if n == 1 and text.startswith("\ufeff"):  # a UTF-8 byte-order mark
            text = text[1:]
        ended = text.endswith("\n")
        yield n, text.rstrip("\r\n"), ended


def check_experts_top_k(num_experts, top_k, what: str) -> None:
    """ConfigError unless each of num_experts / top_k is None or an integer >= 1."""
    for name, v in (("num_experts", num_experts), ("top_k", top_k)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{name}: expected an integer >= 1 for {what}, got {v!r}")


class Grow:
    """A growable NumPy buffer (amortized doubling) so streaming never builds Python lists
    of every value."""

    def __init__(self, dtype, width: int = 0):
        self.width, self.n = width, 0
        self.buf = np.empty((1024, width) if width else (1024,), dtype)

    def extend(self, rows) -> None:
        rows = np.asarray(rows)
        m = len(rows)
        while self.n + m > len(self.buf):
            self.buf = np.concatenate([self.buf, np.empty_like(self.buf)])
        self.buf[self.n : self.n + m] = rows
        self.n += m

    def array(self) -> np.ndarray:
        return self.buf[: self.n]


def check_ids(path, line, field, ids: np.ndarray, num_experts: int) -> None:
    """ids [T, K]: in range and no expert twice in one token."""
    bad = (ids < 0) | (ids >= num_experts)
    if bad.any():
        t, k = np.argwhere(bad)[0]
        raise error(path, line, field, f"token {t} choice {k}: expert id {ids[t, k]} out of "
                    f"range [0, {num_experts})")
    s = np.sort(ids, axis=-1)
    dup = np.diff(s, axis=-1) == 0
    if dup.any():
        t = int(np.argwhere(dup)[0][0])
        raise error(path, line, field, f"token {t} chose the same expert twice: "
                    f"{ids[t].tolist()}")


def check_weights(path, line, field, w: np.ndarray) -> None:
    """Every gate weight finite."""
    bad = ~np.isfinite(w)
    if bad.any():
        idx = tuple(int(x) for x in np.argwhere(bad)[0])
        raise error(path, line, field, f"non-finite weight {w[idx]} at {idx}")


def token_trace(ids, w, mask, num_experts: int, request) -> Trace:
    """A validated token-level Trace from NumPy [I, L, N, K] ids / weights and [I, N] mask.

    Counts come from a bincount (O(ids) memory), not from a one-hot [I, L, N, K, E], so a
    large recording imports in bounded memory.
    """
    ids = np.where(mask[:, None, :, None], ids, -1).astype(np.int32)
    i, l = ids.shape[:2]
    flat = (np.arange(i * l).reshape(i, l, 1, 1) * num_experts + ids)[ids >= 0]
    counts = np.bincount(flat, minlength=i * l * num_experts).reshape(i, l, num_experts)
    t = Trace(
        expert_ids=jnp.asarray(ids),
        gate_weights=jnp.asarray(w, jnp.float32),
        token_mask=jnp.asarray(mask, bool),
        token_request=jnp.asarray(request, jnp.int32),
        counts=jnp.asarray(counts, jnp.float32),
        num_experts=num_experts,
        top_k=ids.shape[-1],
    )
    validate(t, raw=(ids, np.asarray(w, np.float32), mask))
    return t


LAST_ITERATION = ("keep", "drop")


def short_last(trace: Trace, meta: dict, tokens_per_iteration: int, last_iteration,
               warnings: list, report: dict) -> tuple[Trace, dict]:
    """A trace cut into iterations of `tokens_per_iteration` tokens whose last iteration is
    shorter: kept with a warning (`last_iteration` None), kept ("keep") or dropped ("drop",
    unless it is the only one). Other traces pass unchanged."""
    tokens = np.asarray(trace.token_mask).sum(-1)
    last = int(tokens[-1])
    if last >= tokens_per_iteration:
        return trace, meta
    what = (f"the last iteration holds {last} of {tokens_per_iteration} tokens "
            f"({trace.num_iterations} iterations)")
    if last_iteration is None:
        warnings.append(f"{what}; kept: --last-iteration drop drops it, --last-iteration "
                        "keep keeps it without this warning")
    if last_iteration == "drop":
        if trace.num_iterations == 1:
            raise TraceError(f"--last-iteration drop: {what}, the only one")
        trace = jax.tree_util.tree_map(lambda x: x[:-1], trace)
        meta = {**meta, "tokens": int(meta.get("tokens", last) - last)}
        report["dropped"].append(f"the short last iteration ({last} tokens)")
    else:
        report["assumed"].append(f"the short last iteration ({last} tokens) kept")
    return trace, meta
