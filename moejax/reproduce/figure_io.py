"""What every study's `plot_from_dir` shares (`moejax reproduce STUDY --replot DIR`): the run's
folder read back (CSV columns, rows, summary.json) and the list of PNG names a replot wrote.

A study's figure module reads only what `moejax reproduce STUDY --out src` wrote, draws with the
study's own figure functions into `out`, and returns `FigureDir.names`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moejax.output import plotting


class FigureDir:
    """A run's folder `src` (CSV files, summary.json) and the folder `out` a replot draws into.

    `png(stem)` returns `out / stem.png` and records the name, so a figure module lists what
    it drew as it draws it (`names`)."""

    def __init__(self, src: Path | str, out: Path | str):
        self.src, self.out = Path(src), Path(out)
        self.names: list[str] = []

    def has(self, stem: str) -> bool:
        """Whether the run wrote `stem.csv`."""
        return (self.src / f"{stem}.csv").is_file()

    def cols(self, stem: str) -> dict[str, np.ndarray]:
        """`stem.csv` as columns (`plotting.read_csv`: numbers float64, the rest str)."""
        return plotting.read_csv(self.src / f"{stem}.csv")

    def lists(self, stem: str) -> dict[str, list]:
        """`stem.csv` as columns of Python lists (what the studies' own row dicts hold)."""
        return {k: list(v) for k, v in self.cols(stem).items()}

    def rows(self, stem: str, **kw) -> list[dict]:
        """`stem.csv` as row dicts (`plotting.read_rows`; `ints`, `bools` as there)."""
        return plotting.read_rows(self.src / f"{stem}.csv", **kw)

    def summary(self) -> dict:
        """The run's summary.json ({} where there is none)."""
        p = self.src / "summary.json"
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}

    def png(self, stem: str) -> Path:
        """The path to draw `stem.png` at; the name joins `names`."""
        self.names.append(f"{stem}.png")
        return self.out / f"{stem}.png"

    def each(self, table: tuple[tuple[str, str, Callable], ...]) -> None:
        """For each `(csv stem, png stem, draw)` whose CSV the run wrote:
        `draw(png path, columns)`."""
        for csv_stem, png_stem, draw in table:
            if self.has(csv_stem):
                draw(self.png(png_stem), self.cols(csv_stem))
