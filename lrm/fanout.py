"""Independent units of work (a file to read, a day to write) and who runs them.

lrm's steps that split into independent units (lrm.data.logs reads each input file and
writes each day on its own; lrm.data.dedup dedups each day on its own) hand them to
`map_units`. By default they run in this process, one after the other (or a few at a time
on threads, where the caller says its units' work releases the GIL). An orchestrator sets
another mapper for the duration of a call (`using`): the Prefect flows run each unit as a
task of the flow's task runner (flows/tasks.py), so the same flow, pointed at a distributed
task runner (prefect-dask, prefect-ray) or a work pool, spreads the days over machines
without a change to lrm. A unit's function and arguments are plain picklable values
(paths, configs, frames); its outputs go to the path it is given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Mapper(Protocol):
    def __call__(self, kind: str, fn: Callable[[Any], Any], items: Sequence[Any],
                 names: Sequence[str]) -> list[Any]: ...


def sequential(kind: str, fn: Callable[[Any], Any], items: Sequence[Any],
               names: Sequence[str]) -> list[Any]:
    """Every unit in turn, in this process."""
    return [fn(x) for x in items]


_MAPPER: ContextVar[Mapper] = ContextVar("lrm_fanout_mapper", default=sequential)


def in_process() -> bool:
    """Whether the units run one after the other in this process (they may then share
    objects that do not travel, such as a progress reporter)."""
    return _MAPPER.get() is sequential


def map_units(kind: str, fn: Callable[[T], R], items: Sequence[T],
              names: Sequence[str] | None = None, *, threads: int = 1) -> list[R]:
    """fn(item) for every item, in item order, by the current mapper. `kind` says what a
    unit is ("ingest day", "dedup day"); `names` name each unit ("3", "a.csv"): "dedup day 3".

    threads: by the default mapper, up to this many units at a time on threads of this
    process (units whose work is mostly polars, numpy and pyarrow, which release the GIL,
    and that share nothing they change; memory then holds that many units' working sets).
    The first error is raised once the units started have finished; no other starts."""
    names = list(names) if names is not None else [str(i) for i in range(len(items))]
    mapper = _MAPPER.get()
    if mapper is sequential and threads > 1 and len(items) > 1:
        with ThreadPoolExecutor(min(threads, len(items)),
                                thread_name_prefix=f"lrm-{kind.replace(' ', '-')}") as pool:
            made = [pool.submit(fn, x) for x in items]
            try:
                return [m.result() for m in made]
            finally:
                for m in made:  # after an error, none that has not started
                    m.cancel()
    return mapper(kind, fn, list(items), names)


@contextlib.contextmanager
def using(mapper: Mapper) -> Iterator[None]:
    """Run the units mapped inside the block with `mapper`."""
    token = _MAPPER.set(mapper)
    try:
        yield
    finally:
        _MAPPER.reset(token)
