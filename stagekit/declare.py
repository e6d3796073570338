"""A stage's declaration: its typed `run(...)`, which arguments are paths or switches, and
which params keys fill its config arguments.

A stage module (`stages/NAME.py`) declares one `Stage`. From that one declaration come the
CLI (stagekit.cli), the DVC stage (flows/dag.py renders dvc.yaml: deps, outs, dotted params)
and the Prefect task (flows/tasks.py), all calling `run` through stagekit.runner.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lrm.config import ParamsConfig
from lrm.errors import ConfigError

Role = Literal["in", "out", "metrics", "summary", "plot", "state", "flag"]


def optional_inner(tp: Any) -> Any:
    """`X` of `X | None`; any other type as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def split_named(value: str | Path) -> tuple[str | None, Path]:
    """A `named` argument's value, NAME=PATH or PATH, as (NAME or None, PATH)."""
    key, sep, path = str(value).partition("=")
    return (key, Path(path)) if sep and key else (None, Path(value))


@dataclass(frozen=True)
class Arg:
    """A `run` argument that is not a params value: a path DVC tracks, or a switch.

    role: "in" (a dependency), "out" (an output folder, or a file with file=True),
    "metrics" (the stage's metrics JSON that `execute` writes from run's return value),
    "summary" (a small headline metrics file the stage writes: what `dvc metrics show`
    lists), "plot" (a CSV for `dvc plots`, a PNG beside it), "state" (a folder the stage
    keeps between runs, e.g. checkpoints: locked, not tracked by DVC), "flag" (anything
    else). Type and default come from run's signature.
    """

    flag: str  # the CLI option ("--data"), or "" for a positional argument
    help: str
    role: Role = "flag"
    aliases: tuple[str, ...] = ()  # more option names (kept for compatibility)
    persist: bool = False  # DVC: keep the output across runs (the stage skips what is done)
    file: bool = False  # an "out" that is one file, not a folder
    cache: bool = True  # DVC: store the output in its cache (False: a small file, left alone)
    choices: tuple[str, ...] = ()  # allowed values of a str argument
    named: bool = False  # values may be NAME=PATH (the path is what DVC tracks)


@dataclass(frozen=True)
class Stage:
    """A DAG stage: `run(**args, **configs) -> metrics` and how to call it."""

    name: str
    run: Callable[..., dict[str, Any]]
    args: Mapping[str, Arg]
    reads: Mapping[str, str]  # run keyword -> dotted params key; "{kind}" filled from args
    short: tuple[str, ...] = ()  # params keys whose fields also get a short option (--lr)
    label: tuple[str, ...] = ()  # args that tell two runs of the stage apart (task names)
    group: str | None = None  # a CLI subcommand under the stage (`lrm ingest criteo`)
    cli_name: str | None = None  # the `lrm` command when not the name (`lrm fp8-probe`)
    derived: Mapping[str, str] = dataclasses.field(default_factory=dict)  # arg -> default
    # built from the other args, e.g. {"out": "models/{kind}"}
    aliases: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # params key -> older option names kept working, e.g. {"loader.recd": ("--dedup",)}
    headline: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # the part of its metrics that heads a pipeline run (NE, AUC per model): on the
    # pipeline's parent MLflow run

    @property
    def command_name(self) -> str:
        """The CLI command (`lrm NAME`): `cli_name`, else the stage's name."""
        return self.cli_name or self.name

    # -- arguments -----------------------------------------------------------------
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.run)

    def signature_defaults(self) -> dict[str, Any]:
        return {k: p.default for k, p in self.signature().parameters.items()
                if k in self.args and p.default is not inspect.Parameter.empty}

    def complete(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """`args` with run's defaults filled in; unknown or missing arguments are errors."""
        unknown = sorted(set(args) - set(self.args))
        if unknown:
            raise ConfigError(f"{self.name}: unknown arguments {unknown}; "
                              f"known: {sorted(self.args)}")
        out = {**self.signature_defaults(), **{k: v for k, v in args.items() if v is not None}}
        for k, fmt in self.derived.items():
            if out.get(k) is None:
                out[k] = Path(fmt.format(**out))
        missing = sorted(set(self.args) - set(out))
        if missing:
            flags = [self.args[k].flag or k.upper() for k in missing]
            raise ConfigError(f"{self.name}: missing {', '.join(flags)}")
        hints = typing.get_type_hints(self.run)
        for k, a in self.args.items():
            tp = optional_inner(hints[k])
            if tp is Path and out[k] is not None:
                out[k] = Path(out[k])
            elif typing.get_origin(tp) is list and typing.get_args(tp) == (Path,) and out[k]:
                out[k] = [Path(x) for x in out[k]]
            if a.choices and out[k] not in a.choices:
                raise ConfigError(f"{a.flag or k}: {out[k]!r} is not one of {list(a.choices)}")
        return out

    def paths(self, args: Mapping[str, Any], *roles: Role) -> list[Path]:
        """The paths of `args` whose role is one of `roles` (lists flattened)."""
        found: list[Path] = []
        for k, a in self.args.items():
            v = args.get(k)
            if a.role in roles and v is not None:
                for p in (v if isinstance(v, (list, tuple)) else [v]):
                    found.append(split_named(p)[1] if a.named else Path(p))
        return found

    # -- params --------------------------------------------------------------------
    def keys(self, args: Mapping[str, Any]) -> dict[str, str]:
        """run keyword -> the dotted params key it reads, for these args."""
        return {kw: key.format(**args) for kw, key in self.reads.items()}

    def configs(self, params: ParamsConfig, args: Mapping[str, Any]) -> dict[str, Any]:
        return {kw: params.get(key) for kw, key in self.keys(args).items()}

    def all_keys(self) -> list[str]:
        """Every params key the stage may read (each `{kind}` choice expanded)."""
        out: list[str] = []
        for key in self.reads.values():
            if "{" not in key:
                out.append(key)
                continue
            name = key[key.index("{") + 1:key.index("}")]
            out += [key.format(**{name: c}) for c in self.args[name].choices]
        return list(dict.fromkeys(out))

    def title(self, args: Mapping[str, Any]) -> str:
        """"train student": the stage and the arguments that tell its runs apart."""
        return " ".join([self.name, *(str(args[k]) for k in self.label if args.get(k))])


