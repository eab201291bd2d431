"""What a relay's runs in flight keep on its Python heap: ``tracemalloc`` in a relay process.

``python -m bench.relay_heap DIR FRAMES relay [OPTIONS]`` runs ``outbox relay [OPTIONS]``
with ``tracemalloc`` tracing ``FRAMES`` frames of each allocation, and writes snapshots to
``DIR``: ``<n>.snap`` on each SIGUSR1 (``bench.inflight_wide --tracemalloc`` sends one at
the first lease, the idle heap), and ``peak.snap`` each time the traced heap is a new high
by ``PEAK_STEP`` (so the last one is the heap at about its peak). ``breakdown`` compares
two snapshots by traceback, per run in flight.

The figures of such a relay are not the relay's: tracing costs several times its CPU and
about doubles its memory. Only the breakdown is meant to be read.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import tracemalloc
from pathlib import Path
from types import FrameType

PEAK_STEP = 1.05  # a peak snapshot when the traced heap passed the last one by 5 %
PEAK_FLOOR = 4 * 2**20  # bytes above the start before peaks are snapshotted
PEAK_CHECK_S = 0.25  # how often the traced heap is read
SHOWN = 12  # tracebacks in a breakdown
SHOWN_FRAMES = 4  # frames shown of each, the innermost
REPO = Path(__file__).resolve().parent.parent


def snapshot(path: Path) -> None:
    """A snapshot of the traced heap in ``path``, written to a temporary name first (the
    bench may read it at any moment)."""
    taken = tracemalloc.take_snapshot()
    part = path.with_suffix(".part")
    taken.dump(str(part))
    del taken
    os.replace(part, path)


def watch_peak(directory: Path, stop: threading.Event) -> None:
    start = tracemalloc.get_traced_memory()[0]
    last = start + PEAK_FLOOR
    while not stop.wait(PEAK_CHECK_S):
        current = tracemalloc.get_traced_memory()[0]
        if current > last:
            snapshot(directory / "peak.snap")
            last = int(current * PEAK_STEP)


def run(directory: Path, frames: int, argv: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(frames)
    numbers = itertools.count(1)

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        snapshot(directory / f"{next(numbers)}.snap")

    signal.signal(signal.SIGUSR1, on_signal)
    stop = threading.Event()
    threading.Thread(target=watch_peak, args=(directory, stop), daemon=True).start()
    from outbox.commands.main import main

    sys.argv = ["outbox", *argv]
    try:
        main()
    finally:
        stop.set()


def breakdown(before: Path, after: Path, runs: int) -> str:
    """What the heap held more in ``after`` than in ``before``, by traceback, largest
    first, in bytes per run in flight (``runs``)."""
    old = tracemalloc.Snapshot.load(str(before))
    new = tracemalloc.Snapshot.load(str(after))
    ignored = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old, new = old.filter_traces(ignored), new.filter_traces(ignored)
    lines = []
    total = sum(s.size for s in new.statistics("filename")) - sum(
        s.size for s in old.statistics("filename")
    )
    lines.append(f"heap grew {total / 2**20:,.1f} MB: {total / runs:,.0f} bytes a run")
    for title, key in (("by line", "lineno"), ("by traceback", "traceback")):
        lines.append(f"-- {title}, bytes a run (count a run)")
        for stat in new.compare_to(old, key)[:SHOWN]:
            if stat.size_diff <= 0:
                break
            frames = list(stat.traceback)[-SHOWN_FRAMES:] if key == "traceback" else []
            where = stat.traceback[-1] if key == "traceback" else stat.traceback[0]
            lines.append(
                f"{stat.size_diff / runs:8,.0f} ({stat.count_diff / runs:5.2f})  "
                f"{_short(where.filename)}:{where.lineno}"
            )
            for frame in reversed(frames[:-1]):
                lines.append(f"{'':24}< {_short(frame.filename)}:{frame.lineno}")
    return "\n".join(lines)


def _short(filename: str) -> str:
    for marker in ("/site-packages/", f"{REPO}/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


if __name__ == "__main__":
    run(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
