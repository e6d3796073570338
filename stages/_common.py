"""What every stage shares: its declaration, params loading, the CLI built from it, the runner.

A stage module declares one `Stage`: its typed `run(...)` function, which of run's
arguments are paths (inputs, outputs, state) or switches, and which params.yaml keys fill
its config arguments. From that one declaration come

* the CLI (`python -m stages.NAME`, `lrm NAME`): one option per run argument, plus one
  `--section.key` option per field of every config it reads (torchtitan's style), so an
  option the config lacks cannot exist and one it has cannot be dropped;
* the DVC stage (flows/dag.py renders dvc.yaml: deps, outs, dotted params);
* the Prefect task (flows/tasks.py calls `execute` with the same arguments).

`execute` is the one way a stage runs: it checks that no output overlaps an input and that
every output is lrm's to replace, locks the outputs for the run, opens the MLflow run
(rank 0 only), calls `run`, and writes the metrics file.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io as _stdio
import logging
import os
import sys
import tokenize
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import typer
import yaml
from rich.markup import escape

from lrm import io, lock, progress, tracking
from lrm.config import ParamsConfig, from_dict, section_type
from lrm.errors import ConfigError, LrmError

PARAMS = Path("params.yaml")
log = logging.getLogger("lrm")

Role = Literal["in", "out", "metrics", "summary", "plot", "state", "flag"]


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
            tp = _optional_inner(hints[k])
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


# ------------------------------------------------------------------------- params

def read_params_file(path: Path) -> dict[str, Any]:
    """One params YAML file as a mapping (exit-2 errors name the file)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: params file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the params file ({e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return data


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` laid over `base`, mappings merged key by key (a later params file wins)."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) \
            else v
    return out


def _set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for p in parents:
        nxt = d.get(p)
        if not isinstance(nxt, dict):
            nxt = d[p] = {}
        d = nxt
    d[last] = value


def load_params(files: Sequence[Path] | None = None,
                overrides: Mapping[str, Any] | None = None) -> ParamsConfig:
    """The validated params: `files` laid over each other, then dotted `overrides`.

    files None: ./params.yaml when present, else the built-in defaults (said in a log
    line). A named file that does not exist, an unknown section or key, or a bad value is
    a ConfigError naming the file and the key.
    """
    if files is None:
        files = [PARAMS] if PARAMS.exists() else []
        if not files:
            log.info("no %s here: using the built-in defaults", PARAMS)
    data: dict[str, Any] = {}
    for f in files:
        data = _merge(data, read_params_file(f))
    where = ", ".join(str(f) for f in files) or "params"
    known = [f.name for f in dataclasses.fields(ParamsConfig)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {unknown}; known sections: {known}")
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    try:
        return from_dict(ParamsConfig, data, "")
    except ConfigError as e:  # "params.yaml: train.batch_size: must be >= 1"
        raise ConfigError(f"{where}: {str(e).lstrip('.: ')}") from None


# ----------------------------------------------------------- options from configs

@dataclass(frozen=True)
class ConfigOption:
    """One `--section.key` option: a leaf field of a config the stage reads."""

    key: str  # dotted params key, e.g. "train.lr"
    type: Any
    help: str

    @property
    def param(self) -> str:  # a Python identifier for the CLI function's signature
        return "p__" + self.key.replace(".", "__")

    @property
    def short(self) -> str:
        return "--" + self.key.rsplit(".", 1)[-1].replace("_", "-")


@cache
def field_comments(cls: type) -> dict[str, str]:
    """The trailing `# comment` of each field in a config dataclass's source: its help."""
    cls = getattr(cls, "__lrm_base__", cls)  # an overrides class documents its base's keys
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    lines = src.splitlines()
    out: dict[str, str] = {}
    body = ast.parse(src).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            for line in lines[node.lineno - 1:node.end_lineno]:  # the first comment on it
                comment = _comment(line)
                if comment:
                    out[node.target.id] = comment
                    break
    return out


def _comment(line: str) -> str:
    """The `# comment` of one source line ("" if none); the line may be a statement's part."""
    toks = tokenize.generate_tokens(_stdio.StringIO(line).readline)
    try:
        for t in toks:
            if t.type == tokenize.COMMENT:
                return t.string.lstrip("#").strip()
    except tokenize.TokenError:  # an open bracket continued on the next line
        pass
    return ""


def _optional_inner(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def config_options(key: str) -> list[ConfigOption]:
    """Leaf options of the config at dotted `key` (nested configs recurse)."""
    cls = section_type(key)
    if not dataclasses.is_dataclass(cls):  # a single value, e.g. "teacher.registry_name"
        parent, _, name = key.rpartition(".")
        return [ConfigOption(key, _optional_inner(cls),
                             field_comments(section_type(parent)).get(name, ""))]
    hints = typing.get_type_hints(cls)
    helps = field_comments(cls)
    out: list[ConfigOption] = []
    for f in dataclasses.fields(cls):
        tp = _optional_inner(hints[f.name])
        sub = f"{key}.{f.name}"
        if dataclasses.is_dataclass(tp):
            out += config_options(sub)
        else:
            out.append(ConfigOption(sub, tp, helps.get(f.name, "")))
    return out


def parse_option(opt: ConfigOption, text: Any) -> Any:
    """A CLI value for `opt`: scalars as typed by click; lists as "1,2,3" or YAML; mappings
    as YAML. The result is validated by the config dataclass like a params.yaml value."""
    if not isinstance(text, str) or opt.type is str:
        return text
    origin = typing.get_origin(opt.type)
    if origin in (list, tuple) and not text.lstrip().startswith("["):
        return [yaml.safe_load(t) for t in text.split(",") if t.strip()]
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--{opt.key}: not valid YAML: {str(e).splitlines()[0]}") from None


def _click_type(tp: Any) -> Any:
    return tp if tp in (int, float, bool) else str


# --------------------------------------------------------------------- the runner

def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _flat_args(args: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ([str(x) for x in v] if isinstance(v, (list, tuple)) else
                str(v) if isinstance(v, Path) else v) for k, v in args.items()}


def execute(stage: Stage, args: Mapping[str, Any], params: ParamsConfig, *,
            force: bool = False, tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run `stage` once: check and lock its paths, log an MLflow run, write its metrics.

    Every check happens before anything is written: an output that is, contains or lies
    inside an input, and an existing output lrm did not write (unless `force`), are
    ConfigErrors; an output another run holds is a LockedError. Only rank 0 (torchrun)
    locks, logs and writes the metrics; other ranks just run.
    """
    args = stage.complete(args)
    configs = stage.configs(params, args)
    call = dict(args, **configs)
    if "force" in stage.signature().parameters:
        call["force"] = force
    title = stage.title(args)
    if _rank() != 0:
        with progress.context(stage=title):
            return stage.run(**call)
    inputs = stage.paths(args, "in")
    outputs = stage.paths(args, "out", "metrics", "summary", "plot", "state")
    io.check_paths(inputs, outputs)
    claimed: list[list[Path]] = []
    for k, a in stage.args.items():  # every output is lrm's to replace, before any work
        for p in stage.paths({k: args.get(k)}, "out", "metrics", "summary", "plot", "state"):
            if a.file or a.role in ("metrics", "summary", "plot"):
                io.check_file_replaceable(p, stage.name, force=force)
            elif a.role == "state" or a.persist:  # kept and added to, run after run
                if made := io.claim_dir(p, stage.name, force=force):
                    claimed.append(made)
            else:
                io.check_replaceable(p, stage.name, force=force)
    try:
        return _run_logged(stage, args, params, configs, call, title, outputs, tags, force)
    except BaseException:
        for made in claimed:  # a run that failed before writing leaves no empty folder
            io.release_claim(made)
        raise


def _run_logged(stage: Stage, args: Mapping[str, Any], params: ParamsConfig,
                configs: Mapping[str, Any], call: Mapping[str, Any], title: str,
                outputs: list[Path], tags: Mapping[str, str] | None, force: bool
                ) -> dict[str, Any]:
    run_params = {**_flat_args(args),
                  **{kw: dataclasses.asdict(c) if dataclasses.is_dataclass(c) else c
                     for kw, c in configs.items()}}
    with lock.exclusive_all(outputs, purpose=f"lrm {title}"), progress.context(stage=title), \
            tracking.run(title.replace(" ", "_"), params=run_params, cfg=params.tracking,
                         tags={"lrm.stage": stage.name, **(tags or {})}):
        metrics = stage.run(**call)
        tracking.log_metrics(metrics)
        for m in stage.paths(args, "metrics"):
            io.write_json(metrics, m, stage=stage.name, force=force)
    log.info("%s done: %s", title,
             {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))})
    return metrics


# ------------------------------------------------------------------------ the CLI

def setup_logging() -> None:
    """lrm's own INFO lines on stderr; libraries (fbgemm, torchrec, ...) only from WARNING."""
    progress.setup_logging()


def fail(err: BaseException) -> typer.Exit:
    """Report a user-facing error on stderr; the caller raises the returned Exit(2)."""
    print(f"error: {err}", file=sys.stderr)
    return typer.Exit(2)


def _options(stage: Stage) -> tuple[list[ConfigOption], dict[str, list[str]]]:
    """The stage's config options and each one's option names (short forms if unique)."""
    opts = [o for key in stage.all_keys() for o in config_options(key)]
    taken = {a.flag for a in stage.args.values()} | {x for a in stage.args.values()
                                                     for x in a.aliases}
    taken |= {"--params", "--force"}
    shorts = [o.short for o in opts if o.key.rsplit(".", 1)[0] in stage.short]
    names: dict[str, list[str]] = {}
    for o in opts:
        names[o.key] = [f"--{o.key}"]
        if o.key.rsplit(".", 1)[0] in stage.short and shorts.count(o.short) == 1 \
                and o.short not in taken:
            names[o.key].append(o.short)
        names[o.key] += list(stage.aliases.get(o.key, ()))
    return opts, names


def cli_params(stage: Stage) -> list[inspect.Parameter]:
    """The parameters of the stage's CLI function, for typer (see `command`)."""
    kw = inspect.Parameter.KEYWORD_ONLY
    hints = typing.get_type_hints(stage.run)
    sig = stage.signature()
    params: list[inspect.Parameter] = []
    for name, a in stage.args.items():
        tp = _optional_inner(hints[name])
        default = sig.parameters[name].default
        required = default is inspect.Parameter.empty
        if not a.flag:  # positional (e.g. ingest's FILE...)
            opt = typer.Argument(None if not required else ..., help=a.help, show_default=False)
        elif tp is bool:
            decl = a.flag if default is False else f"{a.flag}/--no-{a.flag[2:]}"
            opt = typer.Option(None, decl, *a.aliases, help=a.help, show_default=False)
        else:
            opt = typer.Option(None, a.flag, *a.aliases, help=a.help, show_default=False)
        shown = f" (default: {default})" if not required and default not in (None, False) else ""
        choices = f" ({' | '.join(a.choices)})" if a.choices else ""
        opt.help = escape((a.help + choices + shown).strip())  # rich would eat [brackets]
        params.append(inspect.Parameter(name, kw, default=opt, annotation=tp | None))
    params.append(inspect.Parameter(
        "params", kw, annotation=list[Path] | None,
        default=typer.Option(None, "--params", help="params YAML file(s), later ones win "
                                                    "(default: ./params.yaml)")))
    if stage.paths({k: "x" for k in stage.args}, "out", "state") or \
            "force" in stage.signature().parameters:
        params.append(inspect.Parameter(
            "force", kw, annotation=bool,
            default=typer.Option(False, "--force", help="replace outputs lrm did not write "
                                                        "(or that another stage wrote)")))
    opts, names = _options(stage)
    for o in opts:
        tp = _click_type(o.type)
        decls = names[o.key]
        if tp is bool:
            decls = [f"{decls[0]}/--no-{o.key}"] + [f"{s}/--no-{s[2:]}" for s in decls[1:]]
        params.append(inspect.Parameter(
            o.param, kw, annotation=tp | None,
            default=typer.Option(None, *decls, help=escape(f"{o.help} (params: {o.key})".strip()),
                                 show_default=False, rich_help_panel="Params")))
    return params


def command(stage: Stage) -> Callable[..., None]:
    """The stage's CLI as a typer-ready function (the signature is built, not written)."""
    opts = {o.param: o for o in _options(stage)[0]}

    def cli(**kw: Any) -> None:
        setup_logging()
        files = kw.pop("params", None) or None
        force = bool(kw.pop("force", False))
        try:
            overrides = {opts[k].key: parse_option(opts[k], v) for k, v in kw.items()
                         if k in opts and v is not None}
            args = {k: v for k, v in kw.items() if k not in opts}
            params = load_params(files, overrides)
            execute(stage, args, params, force=force)
        except LrmError as e:
            raise fail(e) from None

    cli.__signature__ = inspect.Signature(cli_params(stage))  # type: ignore[attr-defined]
    cli.__doc__ = (inspect.getdoc(stage.run) or stage.name).split("\n\n")[0]
    cli.__name__ = stage.name
    return cli


def app(stage: Stage) -> typer.Typer:
    """A typer app holding the stage's command (under its subcommand, if it has one)."""
    a = typer.Typer(add_completion=False, no_args_is_help=stage.group is not None,
                    pretty_exceptions_enable=False)
    if stage.group is None:
        a.command(stage.command_name)(command(stage))
    else:
        a.callback()(lambda: None)
        a.command(stage.group)(command(stage))
    return a


def main(stage: Stage) -> None:
    """`python -m stages.NAME`: the stage's CLI."""
    if stage.group is None:
        typer.run(command(stage))
    else:
        app(stage)()


__all__ = ["Arg", "ConfigOption", "PARAMS", "Stage", "app", "command", "config_options",
           "execute", "fail", "load_params", "main", "parse_option", "setup_logging"]
