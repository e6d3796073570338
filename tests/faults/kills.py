"""SIGKILL a piece of work again and again at seeded moments, and check what is left after
every kill: the harness every kill test of the fault suite runs.

    stats = kill_loop(start, kills=12, seed=9, writes_in=ck, check=after_kill)

`start()` starts one attempt of the work as a process (it goes on from what the attempts
before it left: a resume); `writes_in` is a folder where a new entry marks a write starting
(a checkpoint's temporary folder, a day folder...). Even kills are aimed there: at the first
or second new entry after the start, plus a seeded 0-60 ms; odd kills fall anywhere in
0.05-0.6 s (imports, restore, training, a write, the final steps). After each kill the
process must have died by the signal (not ended by itself), and `check(i)` asserts what
must hold. The caller then runs the work to its end and compares it with a run never
killed.

A stream day is killed the same way (test_stream_kills.py): its `start` runs the stream's
next day, `writes_in` the day's student models folder (made once the teacher is judged),
`check` that no champion moved and the day's record is not written; the run that completes
the day closes the killed runs' MLflow runs as KILLED and moves the champions.

The targets start from one forkserver (`forkserver()`), which imports every target's
module once: a test session has a single forkserver, and the first test to start it sets
what it preloads.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from collections.abc import Callable
from pathlib import Path

# the kill targets' modules: training (torch, lrm) and the stream day (Prefect, MLflow too)
PRELOAD = ["tests.faults._killable", "tests.faults._stream_day"]


def forkserver() -> mp.context.ForkServerContext:
    """The forkserver context every kill target starts from, preloading all of them (set
    only by whichever test starts it first; a module it lacks is imported by each child)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _new_entry(folder: Path, seen: set[str], timeout: float,
               alive: Callable[[], bool]) -> bool:
    """Wait until an entry this loop has not seen appears in `folder`, for `timeout` s while
    the work is `alive` (a bounded wait: where no new entry comes, the kill falls after it,
    and a later aim of the caller's `before` takes over; a stream day's last attempt)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        for p in folder.iterdir() if folder.is_dir() else ():
            if not p.name.startswith(".old-") and p.name not in seen:
                seen.add(p.name)
                return True
        time.sleep(0.002)
    return False


def kill_loop(start: Callable[[], mp.process.BaseProcess], *, kills: int, seed: int,
              writes_in: Path | None, check: Callable[[int], None],
              before: Callable[[int], None] | None = None,
              aim_at: Callable[[int], bool] = lambda i: i % 2 == 0) -> dict[str, int]:
    """Start and SIGKILL the work `kills` times (see the module docstring). `before(i)`
    runs just before kill i (e.g. to note which writes are in flight); `aim_at(i)`: whether
    kill i waits for new entries in `writes_in` (the even ones). Returns counts."""
    rng = random.Random(seed)
    seen: set[str] = set()
    aimed = 0
    for i in range(kills):
        p = start()
        if aim_at(i) and writes_in is not None:
            for _ in range(1 + i // 2 % 2):
                if not _new_entry(writes_in, seen, timeout=30, alive=p.is_alive):
                    break
            else:
                aimed += 1
            time.sleep(rng.uniform(0, 0.06))
        else:
            time.sleep(rng.uniform(0.05, 0.6))
        if before is not None:
            before(i)
        p.kill()
        p.join()
        assert p.exitcode == -9, f"kill {i}: the work ended by itself ({p.exitcode})"
        check(i)
    return {"kills": kills, "aimed": aimed}
