"""`moejax reproduce NAME`: each paper's headline studies as CSV + PNG + summary.json.

A study module `moejax.reproduce.<name>` exports one `STUDY` (`moejax.reproduce.study.Study`:
its figures, grids and claim checks); `run` writes it through the one runner, `--only FIGURE`
selects figures, `--replot DIR` redraws each figure with its own plot from DIR's CSVs.
Register it in `STUDIES` (name -> module path); it is imported only when asked for.
A module without `STUDY` may instead define `run(out_dir, quick) -> Report` (and
`steps(quick) -> int`, counting its `progress.step(label)` calls); it has no `--only`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path

from moejax.errors import ConfigError, MoejaxError, UnknownNameError
from moejax.output.outpaths import check_dir
from moejax.output.progress import study_progress
from moejax.output.staging import staged_dir
from moejax.reproduce.study import (  # noqa: F401  (the public names of `moejax.reproduce`)
    Check,
    Claim,
    Figure,
    Grid,
    Report,
    Rows,
    Study,
    parse_only,
    replot_study,
    run_study,
    write_summary,
)

STUDIES: dict[str, str] = {
    "fsedp": "moejax.reproduce.fsedp",
    "moentwine": "moejax.reproduce.moentwine",
    "amoe": "moejax.reproduce.amoe",
    "balancing": "moejax.reproduce.balancing",
    "dysharp": "moejax.reproduce.dysharp",
    "epsmoe": "moejax.reproduce.epsmoe",
    "tuning": "moejax.reproduce.tuning",
}


def shipped_results(study: str) -> Path:
    """The committed outputs of `moejax reproduce STUDY` in a checkout: `docs/results/STUDY/`
    (summary.json, CSV, PNG), which the notebooks and docs read instead of re-running."""
    path = Path(__file__).resolve().parents[2] / "docs" / "results" / study
    if not (path / "summary.json").is_file():
        raise MoejaxError(f"shipped results of study {study!r}: no {path / 'summary.json'} "
                          f"(they ship with a checkout of the repository, not the wheel); "
                          f"run `moejax reproduce {study} --out DIR` instead")
    return path


def study_module(name: str):
    """The module registered for study `name` (UnknownNameError listing the known ones)."""
    if name not in STUDIES:
        raise UnknownNameError("study", name, STUDIES)
    return importlib.import_module(STUDIES[name])


def run(name: str, out_dir: Path, quick: bool, only=None) -> Report:
    """Run a registered study (only the figures `only` names, a list or "A,B"; default all)
    and write its summary.json (into a temporary sibling of `out_dir`, moved in when the study
    is done; see `moejax.output.staging.staged_dir`)."""
    module = study_module(name)
    study = getattr(module, "STUDY", None)
    if study is not None:
        study.select(parse_only(only))  # an unknown figure fails before any work
        with staged_dir(out_dir) as tmp:  # out_dir gets the whole study or nothing
            report = run_study(study, tmp, quick, only)
            write_summary(tmp, report, quick)
        return report
    if only is not None:
        raise ConfigError(f"--only: study {name!r} has no figure selection")
    steps = getattr(module, "steps", None)  # a study that counts its steps gets a progress
    shown = study_progress(name, steps(quick)) if steps else contextlib.nullcontext()
    with staged_dir(out_dir) as tmp, shown:
        report = module.run(tmp, quick)
        write_summary(tmp, report, quick)
    return report


def replot(name: str, src: Path | str, out: Path | str | None = None, only=None) -> list[str]:
    """`moejax reproduce NAME --replot SRC`: redraw the study's figures from the CSVs in `src`
    into `out` (default: `src`, the PNGs replaced one by one, atomically), simulating nothing;
    returns the PNG names written."""
    module = study_module(name)
    study = getattr(module, "STUDY", None)
    src = Path(src)
    if not (src / "summary.json").is_file():
        raise ConfigError(f"--replot {src}: no summary.json there; expected the folder a "
                          f"`moejax reproduce {name} --out DIR` run wrote")
    if study is None:
        raise ConfigError(f"--replot: study {name!r} has no figures to redraw")
    study.select(parse_only(only))
    summary = json.loads((src / "summary.json").read_text(encoding="utf-8"))

    def draw(src: Path, out: Path) -> list[str]:
        return replot_study(study, src, out, summary, only)

    if out is None or Path(out).resolve() == src.resolve():
        check_dir(src, "--replot")  # in place: DIR must be writable (one line, exit 2)
        return draw(src, src)
    with staged_dir(Path(out)) as tmp:  # a new --out gets every figure or nothing
        return draw(src, Path(tmp))
