"""A live one-line status for long commands whose length is not known up front (a
discrete-event simulation runs until its streams are done): "compiling", then what has been
simulated so far, with the time elapsed (an AEP simulate must not sit silent for minutes).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

# Off a terminal (a pipe, a CI log), print an update at most this often.
PLAIN_EVERY_S = 10.0


@contextlib.contextmanager
def live_status(title: str, show: bool = True) -> Iterator[Callable[[str], None]]:
    """Yield `say(text)`: shows `title: text` with a spinner and the time elapsed on a
    terminal; elsewhere prints `[title] text (N s)` on stderr, the first and then at most one
    every `PLAIN_EVERY_S`. Nothing when `show` is False."""
    if not show:
        yield lambda text: None
        return
    from rich.console import Console

    console = Console(stderr=True)
    t0 = time.perf_counter()
    if not console.is_terminal:
        last = [-PLAIN_EVERY_S]

        def say(text: str) -> None:
            now = time.perf_counter() - t0
            if now - last[0] >= PLAIN_EVERY_S:
                print(f"[{title}] {text} ({now:.0f} s)", file=sys.stderr, flush=True)
                last[0] = now

        yield say
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(f"{title}: starting", total=None)
        yield lambda text: bar.update(task, description=f"{title}: {text}")
