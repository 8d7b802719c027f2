"""`moejax reproduce STUDY --replot DIR`: redraw a study's PNG figures from the CSV files (and
summary.json) a run wrote into DIR, without simulating anything (issue 13, item 11).

Each study names a `plot_from_dir(src: Path, out: Path) -> list[str]` in `PLOTTERS` (module
path, function); it reads only what `moejax reproduce STUDY --out src` wrote and draws through
`moejax.output.plotting`, the same figure functions the study itself calls, so a replot of a run's
CSVs gives that run's figures. Used to regenerate the shipped `docs/results/<study>/` PNGs after
a change to a figure.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from moejax.errors import ConfigError, UnknownNameError
from moejax.output.outpaths import check_dir
from moejax.output.staging import staged_dir

PLOTTERS: dict[str, str] = {
    "fsedp": "moejax.reproduce.fsedp_figures",
    "moentwine": "moejax.reproduce.moentwine_figures",
    "amoe": "moejax.reproduce.amoe_figures",
    "balancing": "moejax.reproduce.balancing_figures",
    "dysharp": "moejax.reproduce.dysharp_figures",
    "epsmoe": "moejax.reproduce.epsmoe_figures",
}


def replot(study: str, src: Path | str, out: Path | str | None = None) -> list[str]:
    """Redraw `study`'s figures from the CSVs in `src` into `out` (default: `src`, the PNGs
    replaced one by one, atomically); returns the PNG names written."""
    if study not in PLOTTERS:
        raise UnknownNameError("study with a replot", study, PLOTTERS)
    src = Path(src)
    if not (src / "summary.json").is_file():
        raise ConfigError(f"--replot {src}: no summary.json there; expected the folder a "
                          f"`moejax reproduce {study} --out DIR` run wrote")
    module = importlib.import_module(PLOTTERS[study])
    if out is None or Path(out).resolve() == src.resolve():
        check_dir(src, "--replot")  # in place: DIR must be writable (one line, exit 2)
        return module.plot_from_dir(src, src)
    with staged_dir(Path(out)) as tmp:  # a new --out gets every figure or nothing
        return module.plot_from_dir(src, Path(tmp))

