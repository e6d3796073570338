"""The checkpoint policy the training loop calls once a step.

Everything a run needs to go on is a `Stateful` (state_dict / load_state_dict): the sharded
model, the optimizers, the train state and the data position. The manager saves them every
`CheckpointConfig.every` steps and at the end, keeps the newest `keep`, and on resume loads
the newest complete one into them, after checking that the run asking is the run that
wrote it (the same model, tables, batch cut and data; `identity`), so a resume with other
settings is a one-line error saying what differs instead of a traceback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from lrm import io
from lrm.checkpoint.dcp import Checkpointer
from lrm.config import CheckpointConfig
from lrm.dist import Dist
from lrm.errors import ConfigError

log = logging.getLogger("lrm")
IDENTITY = "run.json"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


def _differences(then: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    out = []
    for k in sorted(set(then) | set(now)):
        if then.get(k) != now.get(k):
            a, b = json.dumps(then.get(k), sort_keys=True), json.dumps(now.get(k), sort_keys=True)
            out.append(f"{k}: {a[:120]} then, {b[:120]} now")
    return out


class CheckpointManager:
    """Periodic checkpoints of one run in `root` (see the module docstring).

    identity: what makes a checkpoint resumable by this run (JSON-able): written beside the
    checkpoints on the first save, compared on resume.
    """

    def __init__(self, root: Path, env: Dist, cfg: CheckpointConfig,
                 identity: Mapping[str, Any]) -> None:
        self.root, self.env, self.cfg = Path(root), env, cfg
        self.identity = json.loads(json.dumps(dict(identity), sort_keys=True, default=str))
        self.store = Checkpointer(self.root, env, cfg.keep)
        self.saved_at = -1  # step of the newest checkpoint of this run
        self.last: Path | None = None

    def _state(self, parts: Mapping[str, Stateful]) -> dict[str, Any]:
        return {k: v.state_dict() for k, v in parts.items()}

    def start(self, parts: Mapping[str, Stateful], resume: bool) -> int | None:
        """Fresh run: clear the folder. Resume: load the newest complete checkpoint into
        `parts` and return its step (None when there is none)."""
        if not resume:
            self.store.clear()
            if self.env.is_main:
                (self.root / IDENTITY).unlink(missing_ok=True)
            return None
        self.store.discard_incomplete()
        latest = self.store.latest()
        if latest is None:
            log.info("no checkpoint in %s: starting from scratch", self.root)
            return None
        then_file = self.root / IDENTITY
        if then_file.is_file():
            then = json.loads(then_file.read_text())
            diff = _differences(then, self.identity)
            if diff:
                raise ConfigError(f"cannot resume from {latest}: it was written by another run "
                                  f"({'; '.join(diff)}); start fresh without --resume, or "
                                  f"resume with that run's settings and data")
        state = self._state(parts)
        self.store.load(state, latest)
        for k, v in parts.items():
            v.load_state_dict(state[k])
        step = int(state["train"]["step"]) if "train" in state else None
        self.saved_at, self.last = step if step is not None else -1, latest
        log.info("resumed from %s (step %s)", latest, step)
        return step

    def step(self, step: int, parts: Mapping[str, Stateful]) -> bool:
        """Called after every optimizer step: save when the interval says so."""
        if self.cfg.every and step % self.cfg.every == 0:
            self.save(step, parts)
            return True
        return False

    def finish(self, step: int, parts: Mapping[str, Stateful]) -> None:
        """The end of the run: save unless this step is already saved."""
        if self.saved_at != step:
            self.save(step, parts)

    def save(self, step: int, parts: Mapping[str, Stateful]) -> Path:
        if self.env.is_main and not (self.root / IDENTITY).is_file():
            io.write_json(self.identity, self.root / IDENTITY)
        self.last = self.store.save(step, self._state(parts))
        self.saved_at = step
        return self.last
