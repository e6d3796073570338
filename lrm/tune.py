"""Searching the training params that matter on the user's own days (`lrm tune`).

Optuna's TPE sampler searches `TuneSpace` (rates, epochs, the embedding dim, a factor on
every hidden width) for one model kind. Each trial is an ordinary training run (the job of
`lrm.train.build_job`, run by `lrm.train.train`) on the train days before the validation
days, scored on those days (pooled when there are several): the validation days are the
`tune.valid_days` days just before `split.eval_day`, so the held-out day on which the
tuned params are judged stays unseen by the search. The first trial is the params as they
are (where the space holds their values), so the best trial is never worse than them on
the validation days.

The budget: `tune.trials` trials and `tune.minutes` of wall time (no trial starts after
it; the one running finishes). A trial whose loss went non-finite (a rate too high) is
failed and the search goes on; bad data or params stop it. Each trial is an MLflow run
nested under the tuning run (its params, its training series, its validation NE) where
one is active.

The result is a params file (`params_overlay`): the best trial's keys, laid over the
params it was searched with by `--params FILE`. A student's training keys are `train`'s
(the student's own, which the ExFM students inherit too), so the file also holds the
teacher's values of those keys in `teacher.train`, as it resolved them: the teacher does
not move with a file tuned for the student. A teacher's keys are `teacher.train`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lrm import tracking
from lrm.config import (
    LoaderConfig,
    ModelConfig,
    SplitConfig,
    TrainConfig,
    TuneConfig,
    TuneSpace,
)
from lrm.data.schema import day_files, pick_day
from lrm.errors import ConfigError
from lrm.progress import Reporter

log = logging.getLogger("lrm")

TRAIN_KEYS = ("lr", "embedding_lr", "epochs")  # the space's keys that are TrainConfig's
# the hidden widths a `width` factor scales, per model kind
WIDTHS = {"student": ("bottom_mlp", "top_mlp"), "teacher": ("dense_mlp", "fm_mlp", "top_mlp")}


@dataclass(frozen=True)
class Trial:
    number: int
    params: dict[str, Any]  # the searched values (the space's keys)
    ne: float | None  # pooled NE on the validation days (None: failed)
    seconds: float
    state: str  # complete | failed


@dataclass
class TuneResult:
    kind: str
    train_days: list[int]
    valid_days: list[int]
    eval_day: int  # the held-out day the search never saw
    best: Trial
    trials: list[Trial] = field(default_factory=list)
    stopped: str = ""  # why the search stopped: trials | minutes

    @property
    def baseline(self) -> Trial | None:
        """The first trial: the params as they were (where the space held their values)."""
        return self.trials[0] if self.trials else None

    def summary(self) -> dict[str, Any]:
        done = [t for t in self.trials if t.state == "complete"]
        base = self.baseline
        return {"kind": self.kind, "train_days": self.train_days,
                "valid_days": self.valid_days, "eval_day": self.eval_day,
                "trials": len(self.trials), "completed": len(done), "stopped": self.stopped,
                "best_trial": self.best.number, "best_ne": self.best.ne,
                "best_params": self.best.params,
                "start_ne": base.ne if base is not None else None,
                "seconds": sum(t.seconds for t in self.trials),
                "per_trial": [dataclasses.asdict(t) for t in self.trials]}


def search_days(data: Path, split: SplitConfig, valid_days: int) -> tuple[list[int],
                                                                          list[int], int]:
    """(train days, validation days, held-out day) of a search: the `valid_days` days just
    before `split.eval_day` validate, the days before them (of `split.days`, when given)
    train."""
    days = sorted(day_files(data))
    held = pick_day(days, split.eval_day, "split.eval_day")
    before = [d for d in days if d < held]
    if len(before) < valid_days + 1:
        raise ConfigError(
            f"tune: {data} has {len(before)} day(s) before the held-out day {held}; the "
            f"search needs {valid_days + 1}: at least one to train on and tune.valid_days "
            f"({valid_days}) to validate on, all before the held-out day")
    valid = before[-valid_days:]
    train = [d for d in (split.days or before) if d < valid[0]]
    if not train:
        raise ConfigError(f"tune: split.days {split.days} hold no day before the "
                          f"validation days {valid}")
    return train, valid, held


def _scaled(widths: list[int], factor: float) -> list[int]:
    return [max(1, round(w * factor)) for w in widths]


def apply(values: Mapping[str, Any], kind: str, train: TrainConfig, model: ModelConfig
          ) -> tuple[TrainConfig, ModelConfig]:
    """`train` and `model` with a trial's values (the space's keys) in place."""
    train = dataclasses.replace(train, **{k: values[k] for k in TRAIN_KEYS if k in values})
    shape = getattr(model, kind)
    changes: dict[str, Any] = {}
    if "embedding_dim" in values:
        changes["embedding_dim"] = int(values["embedding_dim"])
    if "width" in values:
        changes.update({k: _scaled(getattr(shape, k), float(values["width"]))
                        for k in WIDTHS[kind]})
    return train, dataclasses.replace(model, **{kind: dataclasses.replace(shape, **changes)})


def _suggest(trial: Any, space: TuneSpace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("lr", "embedding_lr"):
        if rng := getattr(space, k):
            out[k] = trial.suggest_float(k, rng[0], rng[1], log=True)
    if space.epochs:
        out["epochs"] = trial.suggest_int("epochs", int(space.epochs[0]), int(space.epochs[1]))
    for k in ("embedding_dim", "width"):
        if choices := getattr(space, k):
            out[k] = trial.suggest_categorical(k, list(choices))
    return out


def current(space: TuneSpace, kind: str, train: TrainConfig, model: ModelConfig
            ) -> dict[str, Any]:
    """The params' own values of the searched keys that the space holds (the first trial)."""
    shape = getattr(model, kind)
    now = {"lr": train.lr, "embedding_lr": train.embedding_lr, "epochs": train.epochs,
           "embedding_dim": shape.embedding_dim, "width": 1.0}
    out: dict[str, Any] = {}
    for k, v in now.items():
        allowed = getattr(space, k)
        if k in ("embedding_dim", "width"):
            if v in allowed:
                out[k] = v
        elif allowed and allowed[0] <= v <= allowed[1]:
            out[k] = v
    return out


def _best(trials: list[Trial]) -> Trial | None:
    """The finished trial of lowest NE (None: none finished)."""
    done = [t for t in trials if t.ne is not None]
    return min(done, key=lambda t: t.ne if t.ne is not None else math.inf) if done else None


def tune(kind: str, *, train: TrainConfig, model: ModelConfig, data: Path,
         split: SplitConfig, loader: LoaderConfig, cfg: TuneConfig,
         plan: Path | None = None) -> TuneResult:
    """Search `cfg.space` for `kind` (module docstring); the trials and the best."""
    import optuna

    from lrm.dist import local_device
    from lrm.train import NonFiniteLossError, build_job
    from lrm.train import train as run_job
    from lrm.train.evaluate import evaluate_days

    train_days, valid, held = search_days(Path(data), split, cfg.valid_days)
    if plan is not None:  # a plan that cannot be read: said now, not as trial 0's failure
        from lrm.sharding.plan import read_file

        read_file(plan)
    trials: list[Trial] = []
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial is ours
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=cfg.seed))
    if start := current(cfg.space, kind, train, model):
        study.enqueue_trial(start)
    t0 = time.monotonic()
    log.info("tune %s: trials on days %s, scored on day(s) %s (day %d held out)", kind,
             train_days, valid, held)

    with tempfile.TemporaryDirectory(prefix="lrm-tune-") as tmp, \
            Reporter(f"tune {kind}", total=cfg.trials or None, unit="trials") as rep:
        def objective(trial: Any) -> float:
            values = _suggest(trial, cfg.space)
            tcfg, mcfg = apply(values, kind, train, model)
            out = Path(tmp) / f"trial-{trial.number}"
            started = time.monotonic()
            ne: float | None = None
            with tracking.child_run(f"trial_{trial.number}", params=values):
                try:
                    job = build_job(kind, train=tcfg, model=mcfg, data=data, plan=plan,
                                    split=dataclasses.replace(split, days=train_days,
                                                              eval_day=valid[-1]),
                                    loader=loader, out=out)
                    result = run_job(job, log_fn=tracking.log_metrics
                                     if tracking.active() else None)
                    ne = float(result.eval["ne"]) if len(valid) == 1 else float(
                        evaluate_days(out, data, valid, device=str(local_device(tcfg.device)),
                                      resamples=0)["ne"])
                    tracking.log_metrics({"valid_ne": ne})
                except NonFiniteLossError as e:
                    log.info("tune %s: trial %d failed (%s)", kind, trial.number, e)
                finally:
                    secs = time.monotonic() - started
                    trials.append(Trial(trial.number, values, ne, secs,
                                        "complete" if ne is not None else "failed"))
            best = _best(trials)
            rep.update(1, ne=ne if ne is not None else math.nan,
                       best=best.ne if best is not None else math.nan)
            log.info("tune %s: trial %d %s in %.0f s %s; best %s", kind, trial.number,
                     f"NE {ne:.5f}" if ne is not None else "failed", secs, values,
                     f"{best.ne:.5f} (trial {best.number})" if best else "none yet")
            if ne is None:
                raise optuna.TrialPruned()  # no value to learn from; the search goes on
            return ne

        study.optimize(objective, n_trials=cfg.trials or None,
                       timeout=cfg.minutes * 60 if cfg.minutes else None)
    best = _best(trials)
    if best is None or best.ne is None:
        raise ConfigError(f"tune: no trial of {len(trials)} finished (every loss went "
                          f"non-finite): narrow tune.space's rates")
    stopped = "trials" if cfg.trials and len(trials) >= cfg.trials else "minutes"
    log.info("tune %s: best NE %.5f (trial %d of %d, %.0f s)", kind, best.ne, best.number,
             len(trials), time.monotonic() - t0)
    return TuneResult(kind=kind, train_days=train_days, valid_days=valid, eval_day=held,
                      best=best, trials=trials, stopped=stopped)


def params_overlay(result: TuneResult, *, train: TrainConfig, model: ModelConfig,
                   teacher_train: TrainConfig | None = None) -> dict[str, Any]:
    """The params file of the best trial (module docstring): a mapping of sections.

    train, model: what the search started from (the kind's resolved train config);
    teacher_train: for a student, the teacher's resolved train config, whose values of
    the student's tuned training keys the file pins in teacher.train."""
    kind, values = result.kind, result.best.params
    tuned_train, tuned_model = apply(values, kind, train, model)
    keys = [k for k in TRAIN_KEYS if k in values]
    train_part = {k: getattr(tuned_train, k) for k in keys}
    shape = getattr(tuned_model, kind)
    model_part: dict[str, Any] = {}
    if "embedding_dim" in values:
        model_part["embedding_dim"] = shape.embedding_dim
    if "width" in values:
        model_part.update({k: list(getattr(shape, k)) for k in WIDTHS[kind]})
    doc: dict[str, Any] = {}
    if kind == "teacher":
        if train_part:
            doc["teacher"] = {"train": train_part}
    else:
        if train_part:
            doc["train"] = train_part
            if teacher_train is not None:
                doc["teacher"] = {"train": {k: getattr(teacher_train, k) for k in keys}}
    if model_part:
        doc["model"] = {kind: model_part}
    return doc


__all__ = ["TRAIN_KEYS", "Trial", "TuneResult", "apply", "current", "params_overlay",
           "search_days", "tune"]
