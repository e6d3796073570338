"""What every stage shares: params loading, error reporting, metrics and the MLflow run."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import typer
import yaml

from lrm import io, tracking
from lrm.config import TrackingConfig, from_dict
from lrm.errors import ConfigError, LrmError

C = TypeVar("C")
PARAMS = Path("params.yaml")
log = logging.getLogger("lrm")

ParamsOption = typer.Option(PARAMS, "--params", help="params.yaml to read defaults from")


def load_params(path: Path = PARAMS) -> dict[str, Any]:
    """The whole params file; an absent file means every default."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def section(params: Mapping[str, Any], name: str, cls: type[C],
            overrides: Mapping[str, Any] | None = None) -> C:
    """Config `cls` from params[name] with non-None CLI `overrides` applied on top."""
    data = dict(params.get(name) or {})
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return from_dict(cls, data, name)


def load_config(params_path: Path, name: str, cls: type[C],
                overrides: Mapping[str, Any] | None = None) -> tuple[C, dict[str, Any]]:
    """(config, whole params) for a CLI command; a bad value exits 2 with the key named."""
    try:
        params = load_params(params_path)
        return section(params, name, cls, overrides), params
    except LrmError as e:
        raise fail(e) from None


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def fail(err: BaseException) -> typer.Exit:
    """Report a user-facing error on stderr; the caller raises the returned Exit(2)."""
    print(f"error: {err}", file=sys.stderr)
    return typer.Exit(2)


@contextlib.contextmanager
def stage(name: str, cfg: Any, params: Mapping[str, Any] | None = None,
          metrics_file: Path | None = None, extra_params: Mapping[str, Any] | None = None,
          ) -> Iterator[dict[str, Any]]:
    """Run a stage body: yields a dict the body fills with metrics.

    On success the metrics go to `metrics_file` (atomically) and to an MLflow run that
    also holds the stage's config as params. An LrmError becomes a one-line message on
    stderr and exit status 2, with nothing logged or written.
    """
    setup_logging()
    metrics: dict[str, Any] = {}
    run_params = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg or {})
    run_params.update(extra_params or {})
    tcfg = section(params or {}, "tracking", TrackingConfig)
    try:
        with tracking.run(name, params=run_params, cfg=tcfg, tags={"lrm.stage": name}):
            yield metrics
            tracking.log_metrics(metrics)
    except LrmError as e:
        raise fail(e) from None
    if metrics_file is not None:
        io.write_json(metrics, metrics_file)
    log.info("%s done: %s", name, {k: v for k, v in metrics.items() if not isinstance(v, dict)})
