"""Progress of a study, one step per figure or table, shown in quick and full mode alike.

On a terminal: a rich bar with a spinner, the step in progress and the time elapsed (so a
long first step, which includes compiling, does not look stuck). Elsewhere (a pipe, a CI
log, a notebook cell's captured stderr): a first line saying how many steps there are, then
one line per finished step with its time.

Code deep inside a study can report a finished step with `step(label)`, which reaches the
innermost active `study_progress` (and does nothing when there is none).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

_active: list[Callable[[str], None]] = []


def step(label: str) -> None:
    """Report the step `label` done to the innermost active `study_progress`, if any."""
    if _active:
        _active[-1](label)


@contextlib.contextmanager
def study_progress(study: str, total: int, show: bool = True) -> Iterator[Callable[[str], None]]:
    """Yield `tick(label)`: call it when the step named `label` is done (`total` steps)."""
    if not show:
        yield lambda label: None
        return
    with _shown(study, total) as tick:
        _active.append(tick)
        try:
            yield tick
        finally:
            _active.remove(tick)


@contextlib.contextmanager
def _shown(study: str, total: int) -> Iterator[Callable[[str], None]]:
    from rich.console import Console

    console = Console(stderr=True)
    t0 = last = time.perf_counter()
    done = 0
    if not console.is_terminal:
        print(f"[{study}] {total} steps; the first includes compiling", file=sys.stderr,
              flush=True)

        def tick(label: str) -> None:
            nonlocal done, last
            done += 1
            now = time.perf_counter()
            print(f"[{study}] {done}/{total} {label} ({now - last:.1f} s, {now - t0:.0f} s in all)",
                  file=sys.stderr, flush=True)
            last = now

        yield tick
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=False) as bar:
        task = bar.add_task(f"{study}: step 1 of {total} (compiling, then running)",
                            total=total)

        def tick(label: str) -> None:
            bar.update(task, advance=1, description=f"{study}: {label} done")

        yield tick
