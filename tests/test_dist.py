"""The process group a run creates: on the way out it collects the run's reference cycles
(DMP's keep the gloo machinery alive), walking only the objects made during the run."""

from __future__ import annotations

import gc
import weakref

from lrm.dist import process_group


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_a_group_collects_its_runs_cycles_and_leaves_the_process_objects_alone():
    """Red when the objects before the run are not frozen out of the exit's collection
    (it walks the whole heap: 0.3-1.8 s a model on 2 cores), when they are not given back
    to the collector after it, and when the run's own cycles are not collected."""
    assert gc.get_freeze_count() == 0
    before = _Node()
    old = weakref.ref(before)
    with process_group("cpu"):
        assert gc.get_freeze_count() > 0  # what lived before the run: out of the collection
        del before  # garbage from before the run: not the exit's to walk
        run = _Node()
        new = weakref.ref(run)
        del run
    assert new() is None  # the run's cycle: collected on the way out
    assert old() is not None  # not walked there
    assert gc.get_freeze_count() == 0  # the process's objects are the collector's again
    gc.collect()
    assert old() is None
