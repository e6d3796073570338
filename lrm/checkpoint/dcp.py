"""Full training checkpoints with torch.distributed.checkpoint (DCP).

Every save goes to a fresh `ROOT/step-N/`; DCP writes each rank's shards, then rank 0
writes `.metadata` last, so a folder without `.metadata` is incomplete (a crash mid-save)
and is ignored. The newest `keep` complete checkpoints are kept.

A checkpoint holds whatever state dict the caller passes (the loop passes the sharded
model, the combined optimizer and the train state); DCP reshards on load. Loading uses
weights_only semantics throughout: DCP loads tensors with `weights_only=True`, and the
few non-tensor values (optimizer hyper-parameters) are unpickled with it too.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from lrm.dist import Dist

log = logging.getLogger("lrm")
_STEP_DIR = re.compile(r"^step-(\d+)$")
METADATA = ".metadata"


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor values are unpickled with weights_only=True."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class Checkpointer:
    """`ROOT/step-N/` DCP checkpoints: save, find the latest complete one, load, prune."""

    def __init__(self, root: Path, env: Dist | None = None, keep: int = 2) -> None:
        """env: the process group (None: one process, e.g. to inspect a folder)."""
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.root, self.env, self.keep = Path(root), env, keep

    @property
    def _main(self) -> bool:
        return self.env is None or self.env.is_main

    def _barrier(self) -> None:
        if self.env is not None:
            self.env.barrier()

    def path(self, step: int) -> Path:
        return self.root / f"step-{step}"

    def _dirs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir()
                 if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
        return sorted(found)

    def complete(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first."""
        return [s for s, p in self._dirs() if (p / METADATA).is_file()]

    def latest(self) -> Path | None:
        steps = self.complete()
        return self.path(steps[-1]) if steps else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write `state` to a fresh step-N/ (collective), then prune old checkpoints."""
        path = self.path(step)
        if self._main:
            if path.exists():  # left by an earlier run or an interrupted save
                shutil.rmtree(path)
            path.mkdir(parents=True)
        self._barrier()
        dcp.save(state, checkpoint_id=path)
        self._barrier()
        if self._main:
            self._prune()
        self._barrier()
        return path

    def _prune(self) -> None:
        done = self.complete()
        keep = set(done[-self.keep:])
        newest = done[-1] if done else -1
        for s, p in self._dirs():
            # older than the newest complete one and not kept: superseded or never finished
            if s not in keep and s < newest:
                shutil.rmtree(p, ignore_errors=True)

    def load(self, state: dict[str, Any], path: Path) -> None:
        """Load `path` in place into `state` (whose tensors say what to read and where)."""
        if not (Path(path) / METADATA).is_file():
            raise FileNotFoundError(f"{path}: not a complete checkpoint (no {METADATA})")
        dcp.load(state, checkpoint_id=path, planner=WeightsOnlyLoadPlanner())

    def discard_incomplete(self) -> None:
        """Remove step-N/ folders without .metadata (saves that never finished)."""
        if self._main:
            for _, p in self._dirs():
                if not (p / METADATA).is_file():
                    shutil.rmtree(p, ignore_errors=True)
        self._barrier()

    def clear(self) -> None:
        """Remove every step-N/ (a fresh run owns its checkpoint folder)."""
        if self._main:
            for _, p in self._dirs():
                shutil.rmtree(p, ignore_errors=True)
        self._barrier()
