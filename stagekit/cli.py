"""A stage's command line, built from its declaration (`python -m stages.NAME`, `lrm NAME`).

One option per run argument, plus one `--section.key` option per field of every config the
stage reads (torchtitan's style; the help is the field's trailing comment in lrm/config.py),
so an option the config lacks cannot exist and one it has cannot be dropped.
"""

from __future__ import annotations

import ast
import dataclasses
import errno
import inspect
import os
import io as _stdio
import signal
import sys
import threading
import tokenize
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.markup import escape

from lrm import progress
from lrm.config import section_type
from lrm.errors import ConfigError, LrmError
from stagekit.declare import Stage, optional_inner
from stagekit.params import load_params, load_yaml, read_params_file
from stagekit.runner import execute

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
    found = _class_source(cls)
    if found is None:
        return {}
    body, lines = found
    out: dict[str, str] = {}
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            for line in lines[node.lineno - 1:node.end_lineno]:  # the first comment on it
                comment = _comment(line)
                if comment:
                    out[node.target.id] = comment
                    break
    return out


def _class_source(cls: type) -> tuple[ast.ClassDef, list[str]] | None:
    """The class's definition in its module's parsed source, and the module's lines.
    The module is parsed once (`_module_classes`): inspect.getsource parses the whole
    module again for each class, which was half of `lrm`'s start-up (0.4 s of 0.8)."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if path is None:
        return None
    classes, lines = _module_classes(path)
    body = classes.get(cls.__qualname__)
    return None if body is None else (body, lines)


@cache
def _module_classes(path: str) -> tuple[dict[str, ast.ClassDef], list[str]]:
    """Every class of a module's source by its qualified name, and the source's lines."""
    try:
        src = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(src)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}, []
    out: dict[str, ast.ClassDef] = {}

    def visit(nodes: list[ast.stmt], prefix: str) -> None:
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                out.setdefault(prefix + node.name, node)  # the first, as inspect finds it
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return out, src.splitlines()


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


def config_options(key: str) -> list[ConfigOption]:
    """Leaf options of the config at dotted `key` (nested configs recurse)."""
    cls = section_type(key)
    if not dataclasses.is_dataclass(cls):  # a single value, e.g. "teacher.registry_name"
        parent, _, name = key.rpartition(".")
        return [ConfigOption(key, optional_inner(cls),
                             field_comments(section_type(parent)).get(name, ""))]
    hints = typing.get_type_hints(cls)
    helps = field_comments(cls)
    out: list[ConfigOption] = []
    for f in dataclasses.fields(cls):
        tp = optional_inner(hints[f.name])
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
        return [load_yaml(t) for t in text.split(",") if t.strip()]
    try:
        return load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--{opt.key}: not valid YAML: {str(e).splitlines()[0]}") from None


def _click_type(tp: Any) -> Any:
    return tp if tp in (int, float, bool) else str


def setup_logging() -> None:
    """lrm's own INFO lines on stderr; libraries (fbgemm, torchrec, ...) only from WARNING."""
    progress.setup_logging()


def fail(err: BaseException | str) -> typer.Exit:
    """Report a user-facing error on stderr; the caller raises the returned Exit(2)."""
    print(f"error: {err}", file=sys.stderr)
    return typer.Exit(2)


# what a user fixes outside lrm (space, quota, a read-only or forbidden folder): one line,
# exit 2, like bad input (every output is written through a temporary: nothing replaced)
USER_OS_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                            errno.EPERM})


def os_failure(err: OSError) -> str | None:
    """The one line for an OSError a user fixes (USER_OS_ERRORS), else None."""
    if err.errno not in USER_OS_ERRORS:
        return None
    where = f"{err.filename}: " if err.filename else ""
    return (f"{where}{err.strerror or os.strerror(err.errno)} (nothing was replaced; "
            f"free the space or fix the folder's permissions, then run again)")


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
    # the output the other outputs go beside when it is given (`Stage.beside_outputs`)
    anchor = next((o.flag for o in stage.args.values() if o.role in ("out", "state")
                   and o.flag), None)
    for name, a in stage.args.items():
        tp = optional_inner(hints[name])
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
        if shown and anchor and anchor != a.flag and isinstance(default, Path) and \
                not stage.of_input(name) and (a.role in ("metrics", "summary", "plot")
                                              or (a.role == "out" and a.file)):
            # `Stage.beside_outputs`: a run with another output keeps its files beside it
            shown = f" (default: {default}; with another {anchor}: beside it, " \
                    f"OUT.{default.name})"
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
    if stage.config_file is not None:
        flag, key = stage.config_file
        params.append(inspect.Parameter(
            "config_file", kw, annotation=Path | None,
            default=typer.Option(None, flag, help=f"a YAML file with the keys of {key}, laid "
                                                  "over the params (the flags win)")))
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


@contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM (`kill`, a scheduler, torchrun's agent) exits as Ctrl-C does, through every
    `finally`: a stage's half-written output folder and its lock are removed, not left
    beside --out (Python's default for SIGTERM ends the process where it stands)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def read_config_file(path: Path, key: str) -> dict[str, Any]:
    """A YAML file of the keys of the config at `key` (an unknown key is an error)."""
    data = read_params_file(path, "mapping")
    known = {o.key.rsplit(".", 1)[1] for o in config_options(key)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown mapping keys {unknown}; known: {sorted(known)}")
    return data


def command(stage: Stage) -> Callable[..., None]:
    """The stage's CLI as a typer-ready function (the signature is built, not written)."""
    opts = {o.param: o for o in _options(stage)[0]}

    def cli(**kw: Any) -> None:
        setup_logging()
        files = kw.pop("params", None) or None
        force = bool(kw.pop("force", False))
        laid = kw.pop("config_file", None)
        origin: dict[str, str] = {}  # a value's source where it is not its flag
        try:
            if laid is not None and stage.config_file is not None:  # under the flags
                key = stage.config_file[1]
                for k, v in read_config_file(laid, key).items():
                    param = ConfigOption(f"{key}.{k}", None, "").param
                    if kw.get(param) is None:
                        kw[param] = v
                        origin[f"{key}.{k}"] = f"{laid}: {k}"
            overrides = {opts[k].key: parse_option(opts[k], v) for k, v in kw.items()
                         if k in opts and v is not None}
            args = stage.beside_outputs({k: v for k, v in kw.items() if k not in opts})
            params = load_params(files, overrides, origin)
            with terminated_as_exit():
                execute(stage, args, params, force=force)
        except LrmError as e:
            raise fail(e) from None
        except OSError as e:
            if (line := os_failure(e)) is None:
                raise
            raise fail(line) from None

    cli.__signature__ = inspect.Signature(cli_params(stage))  # type: ignore[attr-defined]
    # the docstring's first paragraph as one line: typer keeps its line breaks, which then
    # cut the command's summary in `lrm --help` mid-sentence
    cli.__doc__ = " ".join((inspect.getdoc(stage.run) or stage.name).split("\n\n")[0].split())
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


