"""Layer 5: tune a system's discrete decisions by gradient descent through its relaxation.

`targets` (what each registered system exposes, `moejax.system.Tuning`), `loop` (the
problem, the relaxed objective, optax updates, orbax checkpoints, hard-mode evaluation),
`parallel` (the loop over processes), `smoothed` (Gaussian smoothing for discrete-event
systems; `rebalancing` smooths EPLB's re-plan interval and window the same way), `run`
(`tune` / `restore`, which pick among them), `zeroth` (hard-mode grids), `checkpoint`,
`export` (tuned values -> policy TOML), `search` (`--search tpe | cmaes | random | grid`:
black-box search of the same problem, and the budget accounting of every method). The
families themselves are in `moejax.tunable`. See docs/tuning.md.
"""

from moejax.tune.loop import TuneConfig, TuneResult, evaluate
from moejax.tune.run import restore, tune

__all__ = ["TuneConfig", "TuneResult", "evaluate", "restore", "tune"]
