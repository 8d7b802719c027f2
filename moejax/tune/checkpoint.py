"""Orbax checkpoints of a tuning run: raw parameters + optimizer state + run metadata.

One step directory per saved step (orbax `CheckpointManager`, written to a temporary
directory and renamed, so a failing run never leaves a half-written step). Each holds
`state` (the raw parameter arrays, the optimizer state's leaves, the step) and `meta` (JSON:
format version, the run specification, the loss history). Every failure to read one --
missing, corrupt, or written by a different run -- is a `CheckpointError` naming the
directory and what is wrong; a corrupt step's error names the latest earlier step that
reads back whole, and how to resume from it. A save the file system refuses (a full disk)
is an `OutputError` line that leaves no partial step behind, and names the last saved one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

from moejax.errors import CheckpointError, OutputError
from moejax.output.results import write_error_reason

FORMAT = 1


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


def flatten_state(raw: dict, opt_state) -> dict:
    """The saved pytree: raw arrays by name and the optimizer state's leaves by index."""
    leaves = jax.tree_util.tree_leaves(opt_state)
    return {
        "raw": {k: np.asarray(v) for k, v in raw.items()},
        "opt": {f"{i:04d}": np.asarray(x) for i, x in enumerate(leaves)},
    }


def unflatten_state(saved: dict, opt_like) -> tuple[dict, object]:
    """(raw, opt_state) from a restored pytree, the optimizer state rebuilt on `opt_like`."""
    treedef = jax.tree_util.tree_structure(opt_like)
    leaves = [saved["opt"][k] for k in sorted(saved["opt"])]
    if len(leaves) != treedef.num_leaves:
        raise CheckpointError(f"optimizer state has {len(leaves)} arrays, this run's optimizer "
                              f"needs {treedef.num_leaves}: the checkpoint is from another run")
    opt = jax.tree_util.tree_unflatten(treedef, [jax.numpy.asarray(x) for x in leaves])
    return {k: jax.numpy.asarray(v) for k, v in saved["raw"].items()}, opt


class Checkpoints:
    """A run's checkpoint folder: save every `every` steps (and on demand), keep the last
    `keep`, restore the latest with a clear error when it cannot be read."""

    def __init__(self, directory: str | Path, every: int = 50, keep: int = 3,
                 read_only: bool = False, primary_only: bool = False):
        ocp = _ocp()
        self.dir = Path(directory).absolute()
        if read_only and not self.dir.is_dir():
            raise CheckpointError(f"{directory}: no such checkpoint folder")
        opts = ocp.CheckpointManagerOptions(
            save_interval_steps=every,
            preservation_policy=ocp.checkpoint_managers.LatestN(keep),
            enable_async_checkpointing=False,
            create=not read_only,
            read_only=read_only,
        )
        if primary_only and jax.process_count() > 1:  # process 0 alone writes, no barriers
            self.dir.mkdir(parents=True, exist_ok=True)  # orbax: no create= with a subset
            opts.create = False
            opts.multiprocessing_options = ocp.options.MultiprocessingOptions(
                primary_host=0, active_processes={0})
        try:
            self.mgr = ocp.CheckpointManager(self.dir, options=opts)
        except Exception as e:  # noqa: BLE001 - any orbax failure is a bad folder
            raise CheckpointError(f"{directory}: not a readable checkpoint folder "
                                  f"({type(e).__name__}: {e})") from e

    def latest_step(self) -> int | None:
        return self.mgr.latest_step()

    def save(self, step: int, state: dict, meta: dict, force: bool = False) -> bool:
        """Save `state` (numpy pytree) and `meta` (JSON) at `step`; True if written."""
        ocp = _ocp()
        state = {**state, "step": np.asarray(step, np.int64)}
        meta = {"format": FORMAT, **meta}
        try:
            with _stderr_kept_on_success():  # orbax's threads print their own tracebacks
                try:
                    done = self.mgr.save(step, args=ocp.args.Composite(
                        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                        force=force)
                    self.mgr.wait_until_finished()
                except Exception:
                    # join orbax's worker threads while their output is still held: left
                    # running, they print late tracebacks ("Event loop is closed") after
                    # the one-line error
                    with contextlib.suppress(Exception):
                        self.mgr.close()
                    raise
        except Exception as e:
            reason = write_error_reason(e)
            if reason is None:
                raise
            for tmp in self.dir.glob(f"{step}.orbax-checkpoint-tmp*"):  # the partial step
                shutil.rmtree(tmp, ignore_errors=True)
            saved = [s for s in self.steps() if s < step]
            left = (f"step {saved[-1]} is the last saved: free space, then rerun with "
                    "--resume to continue from it" if saved else "no step was saved")
            raise OutputError(f"cannot write checkpoint step {step} in {self.dir}: {reason}; "
                              f"nothing of step {step} is left, {left}") from None
        return bool(done)

    def steps(self) -> list[int]:
        """The saved steps (their folders), in order."""
        if not self.dir.is_dir():
            return []
        return sorted(int(p.name) for p in self.dir.iterdir()
                      if p.is_dir() and p.name.isdigit())

    def _intact_before(self, step: int, abstract=None) -> str:
        """What to say after step `step` was found corrupt: the latest earlier step whose
        metadata (and, given `abstract`, arrays) read back, and how to resume from it."""
        ocp = _ocp()
        for s in reversed([s for s in self.steps() if s < step]):
            try:
                self.read_meta(s, _hint=False)
                if abstract is not None:
                    self.mgr.restore(s, args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(abstract)))
            except Exception:  # noqa: BLE001 - that one is not intact either
                continue
            return (f"; step {s} is intact: remove {self.dir / str(step)} (and any later "
                    f"step) and rerun with --resume to continue from step {s}")
        return "; no earlier step is intact: start again in another --out"

    def restore(self, like: dict, step: int | None = None) -> tuple[dict, dict, int]:
        """(state, meta, step) of `step` (default: latest); `like` gives shapes and dtypes."""
        ocp = _ocp()
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{self.dir}: holds no checkpoint")
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
            {**like, "step": np.asarray(0, np.int64)})
        where = f"{self.dir} step {step}"
        meta = self.read_meta(step)
        try:
            state = self.mgr.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract))).state
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{where}: arrays cannot be restored: the checkpoint is "
                                  f"corrupt or its shapes do not match this run "
                                  f"({type(e).__name__}: {_line(e, 300)})"
                                  f"{self._intact_before(step, abstract)}") from e
        for path, (a, b) in _pairs(state, abstract):
            if np.shape(a) != b.shape or np.asarray(a).dtype != b.dtype:
                raise CheckpointError(f"{where}: array {path} has shape {np.shape(a)}, "
                                      f"this run needs {b.shape}")
        return state, meta, int(np.asarray(state["step"]))

    def read_meta(self, step: int | None = None, _hint: bool = True) -> dict:
        """The JSON metadata of `step` (default: latest), checked for format."""
        ocp = _ocp()
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{self.dir}: holds no checkpoint")
        where = f"{self.dir} step {step}"
        try:
            meta = self.mgr.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore())).meta
        except Exception as e:  # noqa: BLE001
            hint = self._intact_before(step) if _hint else ""
            raise CheckpointError(f"{where}: metadata cannot be read, the checkpoint is "
                                  f"corrupt ({type(e).__name__}: {_line(e, 200)}){hint}") from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointError(f"{where}: metadata format {_get(meta, 'format')!r}; "
                                  f"allowed: {FORMAT}")
        if not isinstance(meta.get("run"), dict):
            raise CheckpointError(f"{where}: metadata has no run specification")
        return meta

    def close(self) -> None:
        self.mgr.close()


def _line(err: BaseException, n: int) -> str:
    """The first `n` characters of `err`'s message on one line."""
    return " ".join(str(err).split())[:n]


@contextlib.contextmanager
def _stderr_kept_on_success():
    """Hold what is written to file descriptor 2 in the block (orbax's worker threads print
    tracebacks and absl ERROR lines there before the save's exception reaches us); write it
    out when the block succeeds, drop it when it raises (the error is then one line)."""
    try:
        sys.stderr.flush()
        held = tempfile.TemporaryFile()
    except (OSError, ValueError):  # no stderr to flush, or nowhere to hold it: as it is
        yield
        return
    with held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        with os.fdopen(os.dup(2), "wb") as err:
            err.write(held.read())


def _get(d, k):
    return d.get(k) if isinstance(d, dict) else None


def _pairs(a, b):
    la = jax.tree_util.tree_leaves_with_path(a)
    lb = jax.tree_util.tree_leaves(b)
    if len(la) != len(lb):
        raise CheckpointError(f"checkpoint holds {len(la)} arrays, this run needs {len(lb)}")
    return [(jax.tree_util.keystr(p), (x, y)) for (p, x), y in zip(la, lb, strict=True)]


def check_same_run(meta: dict, spec: dict, where: str) -> None:
    """CheckpointError naming each field where the saved run spec differs from `spec`."""
    saved = meta.get("run", {})
    keys = sorted(set(saved) | set(spec))
    diff = [k for k in keys if saved.get(k) != spec.get(k)]
    if diff:
        detail = "; ".join(f"{k}: checkpoint {saved.get(k)!r}, now {spec.get(k)!r}"
                           for k in diff[:6])
        raise CheckpointError(f"{where}: checkpoint was written by a different run ({detail}); "
                              "use the same options to resume, or another --out")
