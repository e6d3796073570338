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
from typing import Any, Literal, Protocol

from lrm.config import ParamsConfig, train_keys
from lrm.errors import ConfigError

Role = Literal["in", "out", "metrics", "summary", "plot", "state", "flag"]


def optional_inner(tp: Any) -> Any:
    """`X` of `X | None`; any other type as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _uncovered(keys: list[str]) -> list[str]:
    """`keys` once each, in order, without those inside another (teacher.train: teacher)."""
    keys = list(dict.fromkeys(keys))
    return [k for k in keys if not any(k.startswith(p + ".") for p in keys)]


def split_named(value: str | Path) -> tuple[str | None, Path]:
    """A `named` argument's value, NAME=PATH or PATH, as (NAME or None, PATH). A value that
    is a path as it stands (hive folders: `day=5/model`), or whose part before "=" holds a
    "/" (`/stream/day=5`), is a PATH."""
    key, sep, path = str(value).partition("=")
    if not sep or "/" in key or Path(value).exists():
        return None, Path(value)
    if not key or not path:  # `a=` was Path("") (the current folder), `=m` a folder "=m"
        raise ConfigError(f"{str(value)!r}: give NAME=PATH, both parts (the "
                          f"{'name' if not key else 'path'} is empty)")
    return key, Path(path)


class _Off:
    """The type of OFF: one instance, which copies and pickles as itself (`lrm serve` runs a
    flow from a cloudpickled copy of its functions, globals included)."""

    def __repr__(self) -> str:
        return "OFF"

    def __reduce__(self) -> str:
        return "OFF"  # pickled by reference: stagekit.declare.OFF


# An optional output a caller does not want written (a stream day's ExFM table and plots):
# None means "not given" (the CLI's unset options), which gets the stage's default path.
OFF: Any = _Off()


class Result(Protocol):
    """What a stage's `run` returns: fields its callers read (a flow reads `m.decision`,
    never `m["registry"]`: a renamed field fails where it is read, at once), and the JSON
    of its metrics file."""

    def metrics(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Metrics:
    """The result of a stage whose metrics are all its callers read (DVC, MLflow)."""

    values: dict[str, Any]

    def metrics(self) -> dict[str, Any]:
        return self.values


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
    """A DAG stage: `run(**args, **configs) -> Result` and how to call it."""

    name: str
    run: Callable[..., Result]
    args: Mapping[str, Arg]
    reads: Mapping[str, str]  # run keyword -> dotted params key; "{kind}" filled from args
    short: tuple[str, ...] = ()  # params keys whose fields also get a short option (--lr)
    label: tuple[str, ...] = ()  # args that tell two runs of the stage apart (task names)
    # output args holding a folder per value of the label (ARG/VALUE, e.g. a vertical
    # model's checkpoints): a run given the label holds (locks, claims) that folder alone,
    # so runs of other values go at once (the stream's vertical models in worker processes)
    per_label: tuple[str, ...] = ()
    group: str | None = None  # a CLI subcommand under the stage (`lrm ingest criteo`)
    cli_name: str | None = None  # the `lrm` command when not the name (`lrm fp8-probe`)
    derived: Mapping[str, str] = dataclasses.field(default_factory=dict)  # arg -> default
    # built from the other args, e.g. {"out": "models/{kind}"}
    aliases: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # params key -> older option names kept working, e.g. {"loader.recd": ("--dedup",)}
    headline: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # the part of its metrics that heads a pipeline run (NE, AUC per model): on the
    # pipeline's parent MLflow run
    trains: str | None = None  # the model whose training values fill run's `train`
    # (ParamsConfig.train_for: "teacher", "students", or "{kind}" filled from args)
    config_file: tuple[str, str] | None = None  # (flag, params key): the CLI takes a YAML
    # file of that config's keys, laid over the params and under the flags (`--map`)

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

    def complete(self, args: Mapping[str, Any], *, partial: bool = False) -> dict[str, Any]:
        """`args` with run's defaults filled in; unknown or missing arguments are errors
        (`partial`: missing ones are left out, and nothing is checked but the names)."""
        unknown = sorted(set(args) - set(self.args))
        if unknown:
            raise ConfigError(f"{self.name}: unknown arguments {unknown}; "
                              f"known: {sorted(self.args)}")
        out = {**self.signature_defaults(), **{k: v for k, v in args.items() if v is not None}}
        out = {k: None if v is OFF else v for k, v in out.items()}
        for k, fmt in self.derived.items():
            if out.get(k) is None:
                try:
                    out[k] = Path(fmt.format(**out))
                except KeyError as e:
                    # an argument not given is said below ("train: missing --model"); a
                    # name that is no argument is the stage's own template bug
                    if e.args[0] not in self.args:
                        raise
        if partial:
            return {k: Path(v) if isinstance(v, str) and self.args[k].role != "flag" else v
                    for k, v in out.items()}
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

    def beside_outputs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """`given` (a command line's arguments) with the run's own files placed beside its
        output: outside the DAG, a run whose --out (or state folder) is not the stage's
        default writes its metrics, plots, other files and state folder not given beside
        that output (OUT.NAME, e.g. /data/a.ingest.json, m.checkpoints), never into the
        folder it is started from, where two such runs would block each other (or take
        each other's checkpoints). The DAG passes every path itself."""
        given = dict(given)
        anchors = [k for k, a in self.args.items() if a.role in ("out", "state")
                   and given.get(k) is not None]
        if not anchors:
            return given
        defaults = self.complete({k: v for k, v in given.items() if k not in anchors},
                                 partial=True)
        moved = [k for k in anchors if defaults.get(k) is None
                 or Path(given[k]) != Path(defaults[k])]
        if not moved:
            return given
        at, file = Path(given[moved[0]]), self.args[moved[0]].file
        base = at.stem if file else at.name
        for k, a in self.args.items():
            default = defaults.get(k)
            if given.get(k) is not None or not isinstance(default, Path) or k in anchors \
                    or self.of_input(k):
                continue
            if a.role in ("metrics", "summary", "plot") or (a.role == "out" and a.file):
                given[k] = at.parent / f"{base}.{default.name}"
            elif a.role == "state":
                given[k] = at.parent / f"{base}.{k}"
        return given

    def of_input(self, key: str) -> bool:
        """A default built from an input's path (e.g. {data}.stats.json): it stays there."""
        fmt = self.derived.get(key, "")
        return any(f"{{{k}}}" in fmt for k, a in self.args.items() if a.role == "in")

    def paths(self, args: Mapping[str, Any], *roles: Role, held: bool = False) -> list[Path]:
        """The paths of `args` whose role is one of `roles` (lists flattened); `held`: the
        folders a run holds, a `per_label` arg's narrowed to its label's value."""
        found: list[Path] = []
        label = next((str(args[k]) for k in self.label if args.get(k) is not None), None)
        for k, a in self.args.items():
            v = args.get(k)
            if a.role in roles and v is not None:
                for p in (v if isinstance(v, (list, tuple)) else [v]):
                    path = split_named(p)[1] if a.named else Path(p)
                    found.append(path / label if held and label and k in self.per_label
                                 else path)
        return found

    # -- params --------------------------------------------------------------------
    def keys(self, args: Mapping[str, Any]) -> dict[str, str]:
        """run keyword -> the dotted params key it reads, for these args."""
        return {kw: key.format(**args) for kw, key in self.reads.items()}

    def configs(self, params: ParamsConfig, args: Mapping[str, Any]) -> dict[str, Any]:
        """run's config keywords: each params key's value, and the training values of the
        model it trains (`trains`) as `train`."""
        out = {kw: params.get(key) for kw, key in self.keys(args).items()}
        if self.trains is not None:
            out["train"] = params.train_for(self.trains.format(**args))
        return out

    def read_keys(self, args: Mapping[str, Any]) -> list[str]:
        """The dotted params keys a run with `args` reads."""
        trained = train_keys(self.trains.format(**args)) if self.trains is not None else ()
        return _uncovered([*trained, *self.keys(args).values()])

    def all_keys(self) -> list[str]:
        """Every params key the stage may read (each `{kind}` choice expanded)."""
        kinds = self._expanded(self.trains) if self.trains is not None else []
        out = [k for kind in kinds for k in train_keys(kind)]
        for key in self.reads.values():
            out += self._expanded(key)
        return _uncovered(out)

    def _expanded(self, key: str) -> list[str]:
        """`key`, or with a `{name}` in it, one key per choice of argument `name`."""
        if "{" not in key:
            return [key]
        name = key[key.index("{") + 1:key.index("}")]
        return [key.format(**{name: c}) for c in self.args[name].choices]

    def title(self, args: Mapping[str, Any]) -> str:
        """"train student": the stage and the arguments that tell its runs apart."""
        return " ".join([self.name, *(str(args[k]) for k in self.label if args.get(k))])


