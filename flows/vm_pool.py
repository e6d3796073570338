"""The stream day's worker processes for its vertical models, as the student tasks see them.

A module of its own: `lrm serve` runs the streaming flow from a cloudpickled copy, which
carries the globals its functions use by value, and a ContextVar cannot be pickled (a
scheduled run crashed before it started); a module is pickled by its name.
"""

from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from contextvars import ContextVar

# None: the VMs train in the flow's process. Prefect runs a submitted task in a copy of the
# flow's context, so the tasks see what the day set
_WORKERS: ContextVar[Executor | None] = ContextVar("lrm_stream_workers", default=None)


def current() -> Executor | None:
    """The day's worker processes, or None."""
    return _WORKERS.get()


@contextmanager
def using(pool: Executor) -> Iterator[None]:
    """`pool` as the day's worker processes while the block runs."""
    token = _WORKERS.set(pool)
    try:
        yield
    finally:
        _WORKERS.reset(token)
