"""An iterator made one item ahead, in a thread: polars and pyarrow parse without holding
the GIL, so the next chunk of a file is read and parsed while the caller works on this one.
At most one item waits, so memory holds two items, never more."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

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
