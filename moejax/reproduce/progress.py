"""Progress of a study, one step per figure or table, shown in quick and full mode alike.

On a terminal: a rich bar with the step in progress and the time elapsed. Elsewhere (a pipe,
a CI log, a notebook cell's captured stderr): one line per finished step with its time.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def study_progress(study: str, total: int, show: bool = True) -> Iterator[Callable[[str], None]]:
    """Yield `tick(label)`: call it when the step named `label` is done (`total` steps)."""
    if not show:
        yield lambda label: None
        return
    from rich.console import Console

    console = Console(stderr=True)
    t0 = last = time.perf_counter()
    done = 0
    if not console.is_terminal:
        def tick(label: str) -> None:
            nonlocal done, last
            done += 1
            now = time.perf_counter()
            print(f"[{study}] {done}/{total} {label} ({now - last:.1f} s, {now - t0:.0f} s in all)",
                  file=sys.stderr, flush=True)
            last = now

        yield tick
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        task = bar.add_task(f"{study}: running", total=total)

        def tick(label: str) -> None:
            bar.update(task, advance=1, description=f"{study}: {label} done")

        yield tick
