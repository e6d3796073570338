"""Work beside the caller's, in a thread (polars, numpy and pyarrow work without holding
the GIL): an iterator made one item ahead (`ahead`: the next chunk of a file is read and
parsed while the caller works on this one), and calls run one behind (`Behind`: a chunk is
spilled, a cell written, while the caller makes the next). At most one item waits, so
memory holds two items, never more."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()


def ahead(items: Iterator[T], name: str = "lrm-read-ahead") -> Iterator[T]:
    """`items` in order; an error raised making one is raised here, in its place."""
    with ThreadPoolExecutor(1, thread_name_prefix=name) as pool:
        made = pool.submit(next, items, _END)
        try:
            while (item := made.result()) is not _END:
                made = pool.submit(next, items, _END)  # the next one, while this one is used
                yield item  # type: ignore[misc]
        finally:
            if not made.cancel():  # an item in flight: let it finish before closing `items`
                made.exception()
            close = getattr(items, "close", None)
            if close is not None:
                close()


class Behind:
    """Calls run in order on a thread of their own, one at a time: `submit` hands over the
    next once the one before has finished, and gives back that one's result (its error,
    raised there)."""

    def __init__(self, name: str) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.pending: Future[Any] | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The call before's result (None for the first), once `fn(*args)` is handed over."""
        done = self.wait()
        self.pending = self.pool.submit(fn, *args)
        return done

    def wait(self) -> Any:
        """The last call's result, once it has finished (None when none is pending)."""
        if self.pending is None:
            return None
        f, self.pending = self.pending, None
        return f.result()

    def close(self, quiet: bool = False) -> Any:
        """The last call's result (quiet: its error dropped); the thread ends (also after
        an error)."""
        try:
            return self.wait()
        except Exception:
            if not quiet:
                raise
            return None
        finally:
            self.pool.shutdown(wait=True)
