"""Layer 5: tune a system's discrete decisions by gradient descent through its relaxation.

`params` (parameter families and their relaxations, baseline heuristics), `traces` (train
and held-out traces sharing one popularity), `targets` (what each system exposes),
`loop` (`tune`: optax + orbax checkpoints + hard-mode evaluation), `checkpoint`, `export`
(tuned values -> policy TOML). See docs/tuning.md.
"""

from moejax.tune.loop import TuneConfig, TuneResult, evaluate, restore, tune

__all__ = ["TuneConfig", "TuneResult", "evaluate", "restore", "tune"]
