"""DCP checkpoints: fresh step-N/ folders, incomplete ones ignored, the newest kept, safe load."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from lrm.checkpoint.dcp import METADATA, Checkpointer
from lrm.dist import process_group


class Gadget:  # not a type weights_only unpickling allows
    def __init__(self) -> None:
        self.x = 1


def _state(v: float) -> dict:
    return {"w": torch.full((3, 2), v), "train": {"step": torch.tensor(int(v))},
            "hp": {"lr": 0.1, "betas": (0.9, 0.999)}}


def test_save_keeps_the_newest_complete_and_ignores_incomplete(tmp_path):
    with process_group("cpu") as env:
        ck = Checkpointer(tmp_path, env, keep=2)
        assert ck.latest() is None
        for step in (1, 2, 3):
            ck.save(step, _state(step))
        assert ck.complete() == [2, 3]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-3"]
        (tmp_path / "step-7").mkdir()  # a crash mid-save: no .metadata
        (tmp_path / "step-7" / "__0_0.distcp").write_bytes(b"partial")
        assert ck.latest() == tmp_path / "step-3"

        target = _state(0)
        ck.load(target, ck.latest())
        assert torch.equal(target["w"], torch.full((3, 2), 3.0))
        assert int(target["train"]["step"]) == 3 and target["hp"]["lr"] == 0.1
        with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
            ck.load(_state(0), tmp_path / "step-7")

        ck.save(7, _state(7))  # the stale partial folder is replaced, not mixed into
        assert ck.complete() == [3, 7] and (tmp_path / "step-7" / METADATA).is_file()
        ck.discard_incomplete()
        ck.clear()
        assert list(tmp_path.iterdir()) == []


def test_load_unpickles_with_weights_only(tmp_path):
    with process_group("cpu") as env:
        dcp.save({"w": torch.ones(2), "obj": Gadget()}, checkpoint_id=tmp_path / "step-1")
        ck = Checkpointer(tmp_path, env)
        with pytest.raises(CheckpointException) as err:  # DCP wraps the per-rank error
            ck.load({"w": torch.zeros(2), "obj": None}, tmp_path / "step-1")
        assert "Weights only load failed" in str(err.value) and "Gadget" in str(err.value)
