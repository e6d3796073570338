"""An iterator made one item ahead, in a thread: polars and pyarrow parse without holding
the GIL, so the next chunk of a file is read and parsed while the caller works on this one.
At most one item waits, so memory holds two items, never more."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_END = object()


def ahead(items: Iterator[T], name: str = "lrm-read-ahead") -> Iterator[T]:
    """`items` in order; an error raised making one is raised here, in its place."""
    made: queue.Queue[tuple[object, BaseException | None]] = queue.Queue()
    turn = threading.Semaphore(1)  # the maker's turn: one item made ahead of the taker
    stop = threading.Event()

    def make() -> None:
        try:
            while True:
                turn.acquire()
                if stop.is_set():
                    return
                item = next(items, _END)
                made.put((item, None))
                if item is _END:
                    return
        except BaseException as e:  # noqa: BLE001 (raised again by the taker)
            made.put((_END, e))

    thread = threading.Thread(target=make, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, err = made.get()
            if err is not None:
                raise err
            if item is _END:
                return
            turn.release()  # the next one is made while this one is used
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        turn.release()  # (a maker waiting for its turn sees the stop)
        thread.join()
        close = getattr(items, "close", None)
        if close is not None:
            close()
