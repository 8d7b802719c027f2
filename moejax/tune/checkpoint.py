"""Orbax checkpoints of a tuning run: raw parameters + optimizer state + run metadata.

One step directory per saved step (orbax `CheckpointManager`, written to a temporary
directory and renamed, so a failing run never leaves a half-written step). Each holds
`state` (the raw parameter arrays, the optimizer state's leaves, the step) and `meta` (JSON:
format version, the run specification, the loss history). Every failure to read one --
missing, corrupt, or written by a different run -- is a `CheckpointError` naming the
directory and what is wrong.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from moejax.errors import CheckpointError

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
        done = self.mgr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)
        self.mgr.wait_until_finished()
        return bool(done)

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
                                  f"({type(e).__name__}: {str(e)[:300]})") from e
        for path, (a, b) in _pairs(state, abstract):
            if np.shape(a) != b.shape or np.asarray(a).dtype != b.dtype:
                raise CheckpointError(f"{where}: array {path} has shape {np.shape(a)}, "
                                      f"this run needs {b.shape}")
        return state, meta, int(np.asarray(state["step"]))

    def read_meta(self, step: int | None = None) -> dict:
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
            raise CheckpointError(f"{where}: metadata cannot be read, the checkpoint is "
                                  f"corrupt ({type(e).__name__}: {str(e)[:200]})") from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointError(f"{where}: metadata format {_get(meta, 'format')!r}; "
                                  f"allowed: {FORMAT}")
        if not isinstance(meta.get("run"), dict):
            raise CheckpointError(f"{where}: metadata has no run specification")
        return meta

    def close(self) -> None:
        self.mgr.close()


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
