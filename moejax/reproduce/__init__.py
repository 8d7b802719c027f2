"""`moejax reproduce NAME`: each paper's headline studies as CSV + PNG + summary.json.

A study module `moejax.reproduce.<name>` defines `run(out_dir: Path, quick: bool) -> Report`.
It may define `steps(quick) -> int` and call `progress.step(label)` after each figure: `run`
then shows a progress bar over them (studies that show their own, fsedp and balancing, do not).
Register it in `STUDIES` (name -> module path); it is imported only when asked for.
Its figures are drawn from the columns it writes to CSV by a `plot_from_dir(src, out)`
registered in `replot.PLOTTERS` (`moejax reproduce NAME --replot DIR`, issue 13).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from pathlib import Path
from typing import Any

from moejax.errors import MoejaxError, UnknownNameError
from moejax.output.progress import study_progress
from moejax.output.results import atomic_write_json
from moejax.output.staging import staged_dir

STUDIES: dict[str, str] = {
    "fsedp": "moejax.reproduce.fsedp",
    "moentwine": "moejax.reproduce.moentwine",
    "amoe": "moejax.reproduce.amoe",
    "balancing": "moejax.reproduce.balancing",
    "dysharp": "moejax.reproduce.dysharp",
    "epsmoe": "moejax.reproduce.epsmoe",
}


@dataclasses.dataclass
class Claim:
    """One headline claim: what the paper says, what moejax measured, and whether it holds."""

    id: str
    paper: str  # the paper's statement and figure, e.g. "1.22-2.00x faster than EP (Fig. 9)"
    simulated: Any  # the measured number(s)
    holds: bool
    note: str = ""  # why it does not hold, or what differs


@dataclasses.dataclass
class Report:
    study: str
    claims: list[Claim]
    files: list[str]  # CSV / PNG written, relative to out_dir
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def write_summary(out_dir: Path, report: Report, quick: bool) -> Path:
    """summary.json with the `claims` list (id, paper, simulated, holds, note)."""
    path = Path(out_dir) / "summary.json"
    atomic_write_json(path, {
        "study": report.study,
        "quick": quick,
        "claims": [dataclasses.asdict(c) for c in report.claims],
        "files": report.files,
        **report.extra,
    })
    return path


def shipped_results(study: str) -> Path:
    """The committed outputs of `moejax reproduce STUDY` in a checkout: `docs/results/STUDY/`
    (summary.json, CSV, PNG), which the notebooks and docs read instead of re-running."""
    path = Path(__file__).resolve().parents[2] / "docs" / "results" / study
    if not (path / "summary.json").is_file():
        raise MoejaxError(f"shipped results of study {study!r}: no {path / 'summary.json'} "
                          f"(they ship with a checkout of the repository, not the wheel); "
                          f"run `moejax reproduce {study} --out DIR` instead")
    return path


def run(name: str, out_dir: Path, quick: bool) -> Report:
    """Run a registered study and write its summary.json (into a temporary sibling of
    `out_dir`, moved in when the study is done; see `moejax.output.staging.staged_dir`)."""
    if name not in STUDIES:
        raise UnknownNameError("study", name, STUDIES)
    module = importlib.import_module(STUDIES[name])
    steps = getattr(module, "steps", None)  # a study that counts its steps gets a progress
    shown = study_progress(name, steps(quick)) if steps else contextlib.nullcontext()
    with staged_dir(out_dir) as tmp, shown:  # out_dir gets the whole study or nothing
        report = module.run(tmp, quick)
        write_summary(tmp, report, quick)
    return report
