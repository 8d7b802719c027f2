"""Studies as data: a `Study` is a name, its `Figure`s, its two grids and its claim `Check`s;
one runner (`run_study`) writes every figure's CSV and PNG, the progress, and summary.json;
`replot` draws each figure again from its CSV alone.

A figure computes its rows from the grid (`Figure.compute(grid) -> Rows`), is written as
`NAME.csv` (plus any further tables it names in `Rows.more`), and draws `PNG.png` with its own
`plot(path, rows, grid)` from those CSV files read back, so a run's figures and a replot of its
CSVs are one code path. A claim check is a pure function of the rows of the figures it names
(`Check.needs`) returning `Claim`s; it runs when all those figures did (`--only` may skip it).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from moejax.errors import ConfigError, UnknownNameError
from moejax.output import plotting, provenance
from moejax.output.progress import study_progress
from moejax.output.results import atomic_write_csv, atomic_write_json, atomic_write_rows


@dataclasses.dataclass
class Claim:
    """One headline claim: what the paper says, what moejax measured, and whether it holds."""

    id: str
    paper: str  # the paper's statement and figure, e.g. "1.22-2.00x faster than EP (Fig. 9)"
    simulated: Any  # the measured number(s)
    holds: bool
    note: str = ""  # why it does not hold, or what differs
    # The model constant fitted to the very number this claim tests, and how it was fitted.
    # Non-empty: the claim is reported as "calibrated" and not counted as reproduced, whatever
    # `holds` says (a fit that hits its target shows the model can, not that it does).
    calibrated: str = ""
    # How the model changed after this claim had failed (what was added, and the reading
    # that motivated it). Non-empty keeps that history beside the verdict.
    changed_after_failure: str = ""

    @property
    def verdict(self) -> str:
        """"reproduced", "calibrated" or "fails"."""
        if self.calibrated:
            return "calibrated"
        return "reproduced" if self.holds else "fails"


def tally(claims: Iterable[Claim]) -> dict[str, int]:
    """How many claims are reproduced, calibrated and failing, and the total."""
    verdicts = [c.verdict for c in claims]
    return {v: verdicts.count(v) for v in ("reproduced", "calibrated", "fails")} | {
        "total": len(verdicts)}


@dataclasses.dataclass
class Report:
    study: str
    claims: list[Claim]
    files: list[str]  # CSV / PNG written, relative to out_dir
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def write_summary(out_dir: Path, report: Report, quick: bool) -> Path:
    """summary.json with the `claims` list (id, paper, simulated, holds, note, calibrated,
    changed_after_failure, verdict), their `tally` (reproduced / calibrated / fails) and the run's
    `provenance` (`moejax.output.provenance.record`: command line, version; a study's seeds
    and data are fixed in its module, so "data" names the study and its grid)."""
    path = Path(out_dir) / "summary.json"
    atomic_write_json(path, {
        "study": report.study,
        "quick": quick,
        "claims": [dataclasses.asdict(c) | {"verdict": c.verdict} for c in report.claims],
        "tally": tally(report.claims),
        "files": report.files,
        **report.extra,
        "provenance": provenance.record(None, {
            "kind": "study", "study": report.study, "grid": "quick" if quick else "full",
            "seeds": "fixed in the study's module (moejax.reproduce)"}),
    })
    return path


class Grid:
    """The sizes of one run of a study (traces, token counts, sweep axes ...), by name:
    `grid.traces`; `grid.quick` says which of the study's two grids it is. Hashable (values
    are numbers, strings or tuples), so figures sharing one computation can cache on it."""

    __slots__ = ("quick", "_values")

    def __init__(self, quick: bool, **values: Any):
        object.__setattr__(self, "quick", bool(quick))
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"grid has no {name!r}; it has {', '.join(self._values)}") \
                from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Grid is immutable")

    def asdict(self) -> dict[str, Any]:
        """The named sizes (without `quick`), in the order given."""
        return dict(self._values)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Grid) and self.quick == other.quick
                and self._values == other._values)

    def __hash__(self) -> int:
        return hash((self.quick, tuple(self._values.items())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"Grid(quick={self.quick}, {inner})"


Table = dict[str, Any] | list[dict]  # columns (name -> values) or row dicts
Plot = Callable[[Path, "Rows", Grid], None]


@dataclasses.dataclass
class Rows:
    """What a figure computed. `cols` is written to NAME.csv (columns name -> values, or a
    list of row dicts); `more` holds further files the figure writes (file name -> a table
    for `.csv`, any JSON-ready object for `.json`); `summary` holds entries the figure adds to
    summary.json (its plot may read them back); `extra` holds what its claim checks read
    beyond the files (never written)."""

    cols: Table
    more: dict[str, Any] = dataclasses.field(default_factory=dict)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Figure:
    """One figure or table of a paper: `name` is its CSV stem (what `--only` selects).

    compute(grid) -> Rows. plot(path, rows, grid) draws NAME.png from the rows read back from
    the files written (CSV columns as lists, `more` files by name, `rows.summary` as computed
    or as in summary.json); a figure drawing several PNGs gives `plot` as ((stem, plot), ...).
    `more` names the further files its plot reads, `summary` the summary.json keys."""

    name: str
    compute: Callable[[Grid], Rows]
    plot: Plot | tuple[tuple[str, Plot], ...] | None = None
    more: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()

    def drawings(self) -> tuple[tuple[str, Plot], ...]:
        """(PNG stem, plot) pairs."""
        if self.plot is None:
            return ()
        return self.plot if isinstance(self.plot, tuple) else ((self.name, self.plot),)


@dataclasses.dataclass(frozen=True)
class Check:
    """Claim checks on the rows of the figures `needs` names: fn(*rows) -> Claim or list
    (fn(*rows, grid) when `grid`)."""

    needs: tuple[str, ...]
    fn: Callable[..., Any]
    grid: bool = False

    def __call__(self, results: dict[str, Rows], grid: Grid) -> Any:
        return self.fn(*(results[n] for n in self.needs), *((grid,) if self.grid else ()))

    def claims(self, results: dict[str, Rows], grid: Grid) -> list[Claim]:
        out = self(results, grid)
        return [out] if isinstance(out, Claim) else list(out)


@dataclasses.dataclass(frozen=True)
class Study:
    """A paper's reproduction: figures run in order, claims checked in order.

    about(grid) -> summary.json entries of the whole study (the grid, readings ...);
    summaries: `Check`s whose fn returns summary.json entries read off several figures;
    timed: summary.json gets the run's `wall_s`."""

    name: str
    figures: tuple[Figure, ...]
    quick: Grid
    full: Grid
    checks: tuple[Check, ...] = ()
    about: Callable[[Grid], dict] | None = None
    summaries: tuple[Check, ...] = ()
    timed: bool = False

    def grid(self, quick: bool) -> Grid:
        return self.quick if quick else self.full

    def figure_names(self) -> list[str]:
        return [f.name for f in self.figures]

    def select(self, only: Iterable[str] | None) -> tuple[Figure, ...]:
        """The figures named in `only` (all when None), in the study's order; an unknown name
        raises UnknownNameError listing the known ones."""
        if only is None:
            return self.figures
        names = [n.strip() for n in only if n.strip()]
        for n in names:
            if n not in self.figure_names():
                raise UnknownNameError(f"{self.name} figure", n, self.figure_names())
        if not names:
            raise ConfigError(f"--only: no figure named; known: {', '.join(self.figure_names())}")
        return tuple(f for f in self.figures if f.name in names)


def parse_only(only: str | Iterable[str] | None) -> list[str] | None:
    """`--only A,B` as a list of names (None: every figure)."""
    if only is None:
        return None
    return [n for n in (only.split(",") if isinstance(only, str) else only)]


def write_table(path: Path, table: Table) -> None:
    """A figure's table as CSV (columns or row dicts), written atomically."""
    if isinstance(table, list):
        atomic_write_rows(path, table)
    else:
        atomic_write_csv(path, {k: np.asarray(v) for k, v in table.items()})


def read_table(path: Path) -> dict[str, list]:
    """A CSV written by `write_table` as columns of lists (numbers float, the rest str)."""
    return {k: list(v) for k, v in plotting.read_csv(path).items()}


def _write_file(path: Path, obj: Any) -> None:
    if path.suffix == ".json":
        atomic_write_json(path, obj)
    else:
        write_table(path, obj)


def _read_file(path: Path) -> Any:
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    return read_table(path)


def read_back(src: Path, fig: Figure, summary: dict) -> Rows:
    """The Rows a figure's plot draws, read from the files its computation wrote in `src`."""
    return Rows(read_table(src / f"{fig.name}.csv"),
                {f: _read_file(src / f) for f in fig.more if (src / f).is_file()},
                {k: summary[k] for k in fig.summary if k in summary})


def check_claims(study: Study, results: dict[str, Rows], grid: Grid) -> list[Claim]:
    """The claims of every check of `study` whose figures are all in `results`."""
    return [c for chk in study.checks if all(n in results for n in chk.needs)
            for c in chk.claims(results, grid)]


def run_study(study: Study, out: Path, quick: bool, only=None) -> Report:
    """Compute, write and draw the selected figures of `study` into `out`, then check the
    claims whose figures ran; returns the Report (the caller writes summary.json)."""
    t0 = time.perf_counter()
    grid = study.grid(quick)
    figures = study.select(parse_only(only))
    out = Path(out)
    results: dict[str, Rows] = {}
    files: list[str] = []
    extra: dict[str, Any] = dict(study.about(grid)) if study.about else {}
    with study_progress(study.name, len(figures)) as tick:
        for fig in figures:
            rows = fig.compute(grid)
            results[fig.name] = rows
            write_table(out / f"{fig.name}.csv", rows.cols)
            files.append(f"{fig.name}.csv")
            for name, obj in rows.more.items():
                _write_file(out / name, obj)
                files.append(name)
            extra.update(rows.summary)
            back = read_back(out, fig, rows.summary)
            for stem, plot in fig.drawings():
                plot(out / f"{stem}.png", back, grid)
                files.append(f"{stem}.png")
            tick(fig.name)
    claims = check_claims(study, results, grid)
    for s in study.summaries:
        if all(n in results for n in s.needs):
            extra.update(s(results, grid))
    if only is not None:
        extra["only"] = [f.name for f in figures]
    if study.timed:
        extra["wall_s"] = time.perf_counter() - t0
    return Report(study.name, claims, files, extra)


def replot_study(study: Study, src: Path, out: Path, summary: dict, only=None) -> list[str]:
    """Every selected figure of `study` whose CSV is in `src` drawn into `out` by its own
    plot (grid: the one summary.json's `quick` names); returns the PNG names written."""
    grid = study.grid(bool(summary.get("quick", False)))
    names = []
    for fig in study.select(parse_only(only)):
        if (src / f"{fig.name}.csv").is_file():
            back = read_back(src, fig, summary)
            for stem, plot in fig.drawings():
                plot(out / f"{stem}.png", back, grid)
                names.append(f"{stem}.png")
    return names
