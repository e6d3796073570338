"""The MLflow model registry: registered models, @challenger and @champion, promotion on NE.

MLflow 3: aliases replace the deprecated registry stages. lrm registers

    lrm-teacher          the ExFM teacher (`teacher.registry_name`)
    lrm-student-NAME     each student's serving model (`registry.student_prefix` + NAME)

Every version carries the content hash of its model folder (`HASH_TAG`): a consumer that
holds a folder (the augment stage holds the teacher's) can name its version, and a folder
registered once is never registered again (a re-run changes nothing). Each new version
gets @challenger. @champion moves to it only when its NE on the evaluation data is lower
than the champion's NE on the same data by at least `registry.margin` (`judge`); the
decision, its reason, what both were scored on and both NEs are tags of the version
(`Decision.tags`; a tag with no value is left out) and the version's description says it
in one line with NE to four digits (what the registry's pages show). A model's first
version has no champion to beat and becomes champion.
A manual promotion (`promote`) goes through the same check; a rollback points @champion
at an earlier version. Serving loads `models:/NAME@champion`.

The decision is written before @champion moves, so a run stopped in between leaves a
version tagged "promoted" whose champion has not moved yet; the next `challenge` of the
same folder finishes the move (when the champion is still the one it was compared with).
A decision read back from a version's tags is marked `earlier`: it was made by a previous
call (another run, another day: the stream's first teacher is often the very model the
pipeline registered), and nothing was decided now.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lrm.config import RegistryConfig, TrackingConfig
from lrm.errors import ConfigError, DataError
from lrm.io import MARKER, record_dir, scratch_dir
from lrm.tracking import connect

CHAMPION, CHALLENGER = "champion", "challenger"
HASH_TAG = "lrm.content_hash"
NE_TAG = "lrm.ne"  # the version's NE on the evaluation data of its decision
CHAMPION_NE_TAG = "lrm.champion_ne"  # the champion's NE on the same data (absent: none)
CHAMPION_VERSION_TAG = "lrm.champion_version"  # the champion it was compared with
DECISION_TAG = "lrm.decision"  # promoted | kept
REASON_TAG = "lrm.reason"
EVAL_TAG = "lrm.evaluated_on"  # what both were scored on, e.g. "day 5"
ROLLBACK_TAG = "lrm.rollback"  # set on a version @champion was rolled back to
VARIANT_TAG = "lrm.variant"  # a student's ExFM variant (the one its vertical model serves)
# the verticals a version is scored on (JSON ids): a surface's model that serves the
# foundation model's prediction is the FM's folder, whose card names no vertical
VERTICALS_TAG = "lrm.verticals"
SCORES = ("ne", "auc", "calibration", "rows")


def client(cfg: TrackingConfig | None = None) -> Any:
    """An MlflowClient on the tracking store (MLFLOW_TRACKING_URI wins over params)."""
    return connect(cfg)


def student_model(name: str, cfg: RegistryConfig) -> str:
    """The registered model of student `name`: lrm-student-NAME."""
    return f"{cfg.student_prefix}{name}"


# ---------------------------------------------------------------------------- the rule

def judge(challenger_ne: float, champion_ne: float | None, margin: float) -> tuple[bool, str]:
    """(promote?, why): the challenger replaces the champion only when its NE on the same
    evaluation data is lower, by at least `margin` (lower NE is better; a tie keeps the
    champion)."""
    if not math.isfinite(challenger_ne):
        return False, f"the challenger's NE is not finite ({challenger_ne})"
    if champion_ne is None:
        return True, "no champion yet: the first version becomes champion"
    if not math.isfinite(champion_ne):
        return True, f"the champion's NE is not finite ({champion_ne}) on this data"
    gain = champion_ne - challenger_ne
    if gain > 0 and gain >= margin:
        return True, (f"NE {challenger_ne:.5f} beats the champion's {champion_ne:.5f} by "
                      f"{gain:.5f} >= margin {margin:g}")
    return False, (f"NE {challenger_ne:.5f} vs the champion's {champion_ne:.5f}: gain "
                   f"{gain:.5f} < margin {margin:g}")


@dataclass(frozen=True)
class Decision:
    """Whether a version became champion, why, and the scores both models got."""

    name: str
    version: str
    promoted: bool
    reason: str
    challenger: dict[str, float]  # ne, auc, calibration, rows on the evaluation data
    champion: dict[str, float] | None  # the same for the champion (None: there was none)
    champion_version: str | None
    evaluated_on: str
    margin: float
    earlier: bool = False  # read back from the version: decided by an earlier call, not now

    def tags(self) -> dict[str, str]:
        """The version's tags (full precision, for reading back); none without a value."""
        tags = {NE_TAG: repr(float(self.challenger["ne"])),
                CHAMPION_NE_TAG: repr(float(self.champion["ne"])) if self.champion else "",
                CHAMPION_VERSION_TAG: self.champion_version or "",
                DECISION_TAG: "promoted" if self.promoted else "kept",
                REASON_TAG: self.reason, EVAL_TAG: self.evaluated_on}
        return {k: v for k, v in tags.items() if v}

    def description(self) -> str:
        """One line for the version's page and the registry's list of versions."""
        ne = f"NE {float(self.challenger['ne']):.4f} on {self.evaluated_on}"
        if self.champion:
            ne += f" (champion v{self.champion_version}: {float(self.champion['ne']):.4f})"
        verb = "promoted to @champion" if self.promoted else "kept as @challenger"
        return f"{ne}: {verb}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _decision_from_tags(name: str, version: str, tags: Mapping[str, str],
                        margin: float) -> Decision | None:
    if DECISION_TAG not in tags:
        return None
    champ = tags.get(CHAMPION_NE_TAG) or ""
    return Decision(
        name=name, version=version, promoted=tags[DECISION_TAG] == "promoted",
        reason=tags.get(REASON_TAG, ""), challenger={"ne": float(tags[NE_TAG])},
        champion={"ne": float(champ)} if champ else None,
        champion_version=tags.get(CHAMPION_VERSION_TAG) or None,
        evaluated_on=tags.get(EVAL_TAG, ""), margin=margin, earlier=True)


# ------------------------------------------------------------------------ versions

def _quoted(value: str) -> str:
    """`value` as a string in an MLflow search filter (a name with a ' in double quotes:
    in single ones it ended the string, MlflowException's traceback)."""
    return f'"{value}"' if "'" in value else f"'{value}'"


def find_model_version(name: str, tag: str, value: str,
                       cfg: TrackingConfig | None = None) -> str | None:
    """The newest version of registered model `name` whose tag `tag` is `value`, or None."""
    versions = client(cfg).search_model_versions(
        f"name = {_quoted(name)} and tags.`{tag}` = {_quoted(value)}")
    hits = [int(v.version) for v in versions]
    return str(max(hits)) if hits else None


def alias_version(name: str, alias: str, cfg: TrackingConfig | None = None) -> str | None:
    """The version `alias` points at, or None (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client(cfg).get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def _version(name: str, version: str, cfg: TrackingConfig | None) -> Any:
    from mlflow.exceptions import MlflowException

    c = client(cfg)
    try:
        return c.get_model_version(name, str(version))
    except MlflowException:
        pass
    try:
        c.get_registered_model(name)
    except MlflowException:  # (it said "nope has no version '1'")
        raise ConfigError(f"registry: no registered model {name!r} (`lrm models list` "
                          f"lists them)") from None
    raise ConfigError(f"registry: {name} has no version {version!r}") from None


def register(model_dir: Path, name: str, *, example_data: Path, example_day: int,
             cfg: TrackingConfig | None = None) -> tuple[str, bool]:
    """(version, new?): the model folder as a version of `name`, pointed at by @challenger.

    A folder whose content hash a version already carries is not registered again (that
    version is returned). Otherwise the folder is logged as a pyfunc to the active MLflow
    run (its input example from `example_data`, day `example_day`) and registered.
    """
    import mlflow

    from lrm.models.saved import model_hash  # the content hash of a saved model folder
    from lrm.serving import pyfunc

    content = model_hash(model_dir)
    found = find_model_version(name, HASH_TAG, content, cfg)
    if found is not None:
        return found, False
    if mlflow.active_run() is None:
        raise ConfigError(f"registry: registering {model_dir} as {name} needs an active "
                          "MLflow run (lrm.tracking.run)")
    info = pyfunc.log_model(model_dir, example_data, example_day)
    mv = mlflow.register_model(info.model_uri, name, tags={HASH_TAG: content})
    client(cfg).set_registered_model_alias(name, CHALLENGER, mv.version)
    return str(mv.version), True


def model_folder(name: str, version: str, dst: Path, cfg: TrackingConfig | None = None
                 ) -> Path:
    """Download version `version` of `name` under `dst`; the lrm model folder inside it.

    The logged pyfunc keeps the model folder as its "model" artifact (lrm.serving.pyfunc);
    the path comes from the MLmodel file, read as YAML (nothing is unpickled).
    """
    import mlflow
    import yaml

    mv = _version(name, version, cfg)  # (its client set the tracking URI)
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/{version}",
                                                     dst_path=str(dst)))
    if not (local / "MLmodel").is_file():  # MLflow copies nothing and says nothing
        raise DataError(_artifacts(mv, cfg), None, None, f"{name} v{version}'s files are "
                        f"not there (removed or moved from its artifact store)")
    meta = yaml.safe_load((local / "MLmodel").read_text())
    try:
        rel = meta["flavors"]["python_function"]["artifacts"]["model"]["path"]
    except (KeyError, TypeError):
        raise DataError(local / "MLmodel", None, "artifacts.model",
                        f"{name} v{version} is not an lrm model (no model folder artifact)"
                        ) from None
    folder = local / rel
    if not (folder / MARKER).is_file():  # logged before models carried their own record:
        _check_content(name, version, folder, cfg)  # the registry's hash vouches for it
        record_dir(folder)
    return folder


def _artifacts(mv: Any, cfg: TrackingConfig | None) -> str:
    """Where a version's files are kept: its logged model's artifact location (MLflow 3),
    else its source URI."""
    src = str(mv.source)
    model_id = mv.model_id or (src.split("/")[1] if src.startswith("models:/m-") else None)
    try:
        return str(client(cfg).get_logged_model(model_id).artifact_location)
    except Exception:  # an older store or version: no logged model, the source says where
        return src


def _check_content(name: str, version: str, folder: Path, cfg: TrackingConfig | None) -> None:
    """A DataError unless `folder` holds the content registered as `name` v`version`."""
    from lrm.models.saved import model_hash

    want = _version(name, version, cfg).tags.get(HASH_TAG)
    if want is None or model_hash(folder) != want:
        raise DataError(folder, None, None, f"{name} v{version}'s files are not the model "
                                            f"registered (content hash {want})")


def scores(model_dir: Path, data: Path, day: int, batch_size: int = 8192,
           verticals: Sequence[int] | None = None) -> dict[str, float]:
    """NE, AUC, calibration and rows of a model folder on one day of `data`: the rows of
    `verticals`, else of the verticals it was trained on (a vertical model's card says
    which), else every row."""
    from lrm.train.evaluate import evaluate
    from lrm.models.saved import read_card

    verticals = verticals or read_card(model_dir).info.get("verticals") or None
    m = evaluate(model_dir, data, day=day, batch_size=batch_size, verticals=verticals)
    return {k: m[k] for k in SCORES}


# ------------------------------------------------------------------------ decisions

def decide(name: str, version: str, challenger: Mapping[str, float],
           champion: Mapping[str, float] | None, champion_version: str | None, *,
           margin: float, evaluated_on: str, cfg: TrackingConfig | None = None,
           promote: bool = True) -> Decision:
    """Apply the rule to scores on the same data; tag the version, then move @champion
    (promote=False: leave that to `complete`, e.g. once a stream day is over)."""
    promoted, reason = judge(float(challenger["ne"]),
                             float(champion["ne"]) if champion else None, margin)
    d = Decision(name=name, version=str(version), promoted=promoted, reason=reason,
                 challenger=dict(challenger), champion=dict(champion) if champion else None,
                 champion_version=champion_version, evaluated_on=evaluated_on, margin=margin)
    c = client(cfg)
    for k, v in d.tags().items():
        c.set_model_version_tag(name, str(version), k, v)
    c.update_model_version(name, str(version), description=d.description())
    return complete(d, cfg) if promote else d


def complete(d: Decision, cfg: TrackingConfig | None = None) -> Decision:
    """Carry out a decision: @champion moves to a promoted version, unless the champion has
    moved on since the decision compared with it (idempotent: a version already champion
    stays). A run that stopped between tagging and moving the alias completes it so."""
    if d.promoted:
        now = alias_version(d.name, CHAMPION, cfg)
        if now != d.version and now == d.champion_version:
            client(cfg).set_registered_model_alias(d.name, CHAMPION, d.version)
    return d


def challenge(model_dir: Path, name: str, *, eval_data: Path, eval_day: int, margin: float,
              evaluated_on: str, cfg: TrackingConfig | None = None,
              batch_size: int = 8192, version_tags: Mapping[str, str] | None = None,
              promote: bool = True, verticals: Sequence[int] | None = None) -> Decision:
    """The whole promotion path of a freshly trained model folder.

    Register it (once) as @challenger, score it and the current @champion on the same day
    of `eval_data`, and move @champion only when the rule says so (promote=False: the
    decision is made and tagged, the caller moves @champion later with `complete`).
    `verticals`: both are scored on these verticals' rows (a surface's model; tagged on the
    version, VERTICALS_TAG), else on those the folder's card names. Run again on the same
    folder (or on a folder with the same content), it changes nothing:
    the version's decision is read back from its tags, marked `earlier`.
    """
    version, _ = register(model_dir, name, example_data=eval_data, example_day=eval_day,
                          cfg=cfg)
    extra = {VERTICALS_TAG: json.dumps(sorted(verticals))} if verticals else {}
    for k, v in {**(version_tags or {}), **extra}.items():  # what the caller knows
        client(cfg).set_model_version_tag(name, version, k, v)
    tags = _version(name, version, cfg).tags
    found = _decision_from_tags(name, version, tags, margin)
    if found is not None:
        return complete(found, cfg) if promote else found
    champ_version = alias_version(name, CHAMPION, cfg)
    mine = scores(model_dir, eval_data, eval_day, batch_size, verticals)
    theirs = None
    if champ_version is not None and champ_version != version:
        with scratch_dir("lrm-champion-") as tmp:
            theirs = scores(model_folder(name, champ_version, Path(tmp), cfg), eval_data,
                            eval_day, batch_size, verticals)
    elif champ_version == version:  # an earlier attempt promoted it but left no tags
        champ_version = None
    return decide(name, version, mine, theirs, champ_version, margin=margin,
                  evaluated_on=evaluated_on, cfg=cfg, promote=promote)


def _verticals(name: str, version: str, tags: Mapping[str, str]) -> list[int] | None:
    """The verticals a version is scored on (its VERTICALS_TAG: JSON ids), or None."""
    if VERTICALS_TAG not in tags:
        return None
    try:
        got = json.loads(tags[VERTICALS_TAG])
    except json.JSONDecodeError:
        got = None
    if not isinstance(got, list) or not all(isinstance(v, int) for v in got):
        raise ConfigError(f"registry: {name} v{version}'s tag {VERTICALS_TAG} is "
                          f"{tags[VERTICALS_TAG]!r}, not a JSON list of vertical ids (edited "
                          f"by hand?)")
    return got


def seen(model_dir: Path, day: int, held_out: bool = False) -> str | None:
    """How a model folder's training saw day `day` (its card's train_days; a model carried
    from an earlier one, init_from, saw the days before its own too), else None: scored on
    that day it would be judged on rows it fit. held_out: the rows are the held-out slice of
    the day (the stream's), unseen by a model that fit the rest of that day and was scored
    on the slice (its eval_day is its train day)."""
    from lrm.models.saved import read_card

    info = read_card(model_dir).info
    days = sorted(int(d) for d in info.get("train_days") or [])
    if not days:
        return None
    if held_out and day == days[-1] and info.get("eval_day") == day:
        return None
    if day in days:
        return f"trained on day {day} (train_days {days})"
    if info.get("init_from") and day < days[-1]:
        return f"went on from a model of the days before day {days[-1]} ({info['init_from']})"
    return None


def promote(name: str, version: str, *, eval_data: Path, eval_day: int, margin: float,
            cfg: TrackingConfig | None = None, batch_size: int = 8192,
            held_out: bool = False, evaluated_on: str | None = None) -> Decision:
    """A manual promotion through the same check: `version` and the champion scored on the
    same day of `eval_data`; @champion moves only when the rule says so. A day either model
    trained on is refused, naming the overlap (its NE there says how well it fit, not how it
    does on new rows: the stream's champion scored 0.872 on its own training day, 0.991 on
    its held-out slice); held_out: `eval_data` is the stream's held-out slice of the day."""
    mv = _version(name, version, cfg)
    version = str(mv.version)  # MLflow's number: "01" is v1 (it was judged against itself)
    tags = mv.tags or {}
    verticals = _verticals(name, version, tags)
    champ_version = alias_version(name, CHAMPION, cfg)
    if champ_version == str(version):
        raise ConfigError(f"registry: {name} v{version} is already @{CHAMPION}")
    with scratch_dir("lrm-promote-") as tmp:
        folders = {version: model_folder(name, version, Path(tmp) / "challenger", cfg)}
        if champ_version is not None:
            folders[champ_version] = model_folder(name, champ_version, Path(tmp) / "champion",
                                                  cfg)
        for v, folder in folders.items():
            if why := seen(folder, eval_day, held_out):
                raise ConfigError(f"registry: {name} v{v} {why}: scored on day {eval_day} of "
                                  f"{eval_data} it would be judged on rows it trained on; "
                                  f"score both on a day neither saw (--data, --day), or leave "
                                  f"--data out (the rows the stream judged its newest day on)")
        mine = scores(folders[version], eval_data, eval_day, batch_size, verticals)
        theirs = None if champ_version is None else scores(
            folders[champ_version], eval_data, eval_day, batch_size, verticals)
    return decide(name, str(version), mine, theirs, champ_version, margin=margin,
                  evaluated_on=f"{evaluated_on or f'day {eval_day} of {eval_data}'} "
                               f"(manual promotion)", cfg=cfg)


def rollback(name: str, version: str, cfg: TrackingConfig | None = None, *,
             force: bool = False) -> tuple[str, str | None]:
    """Point @champion back at an earlier champion (no NE check: the operator's call);
    returns (the version that was champion, what `force` overrode or None).

    Only a version that was @champion before (promoted by the NE rule, or rolled back to)
    is an earlier champion; any other earlier version, one the rule kept out, needs
    `force`, and the returned line (also its tag) says which decision it overrides."""
    mv = _version(name, version, cfg)
    version = str(mv.version)  # MLflow's number ("01" is v1)
    now = alias_version(name, CHAMPION, cfg)
    if now is None:
        raise ConfigError(f"registry: {name} has no @{CHAMPION} to roll back")
    if int(version) >= int(now):
        raise ConfigError(f"registry: rollback goes to an earlier version than the champion "
                          f"v{now}; got v{version} (use `lrm models promote` to go forward)")
    tags = dict(mv.tags or {})
    overrides = None
    if tags.get(DECISION_TAG) != "promoted" and ROLLBACK_TAG not in tags:
        why = (f"the NE rule kept it ({tags.get(REASON_TAG) or tags[DECISION_TAG]})"
               if DECISION_TAG in tags else "it was never judged")
        overrides = f"v{version} was never @{CHAMPION}: {why}"
        if not force:
            raise ConfigError(f"registry: rollback goes to an earlier @{CHAMPION}, and "
                              f"{overrides}; pass --force to make it @{CHAMPION} anyway")
    c = client(cfg)
    note = f"champion again, replacing v{now}" if overrides is None else \
        f"made champion by force, replacing v{now} ({overrides})"
    c.set_model_version_tag(name, str(version), ROLLBACK_TAG, note)
    c.set_registered_model_alias(name, CHAMPION, str(version))
    return now, overrides


# ------------------------------------------------------------------------- reading

def _pages(search: Any, filter_string: str | None = None) -> Iterator[Any]:
    """Every result of an MLflow search, page after page."""
    token = None
    while True:
        page = search(filter_string, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def list_models(prefixes: Sequence[str] = ("lrm-",), cfg: TrackingConfig | None = None
                ) -> list[dict[str, Any]]:
    """Every version of the registered models whose names start with one of `prefixes`:
    aliases, NE and decision."""
    c = client(cfg)
    rows: list[dict[str, Any]] = []
    # every page, matched here: a LIKE filter took a prefix's ' for its end (a traceback)
    # and its _ and % for wildcards, and one page of 100 models was all there was
    wanted = tuple(p for p in prefixes if p)
    found = {rm.name: rm for rm in _pages(c.search_registered_models)
             if rm.name.startswith(wanted)}
    for rm in sorted(found.values(), key=lambda m: m.name):
        aliases: dict[str, list[str]] = {}
        for alias, v in (rm.aliases or {}).items():
            aliases.setdefault(str(v), []).append(alias)
        for mv in sorted(_pages(c.search_model_versions, f"name = {_quoted(rm.name)}"),
                         key=lambda v: int(v.version)):
            t = mv.tags or {}
            rows.append({"name": rm.name, "version": str(mv.version),
                         "aliases": sorted(aliases.get(str(mv.version), [])),
                         "ne": t.get(NE_TAG), "champion_ne": t.get(CHAMPION_NE_TAG) or None,
                         "champion_version": t.get(CHAMPION_VERSION_TAG) or None,
                         "decision": t.get(DECISION_TAG), "reason": t.get(REASON_TAG),
                         "evaluated_on": t.get(EVAL_TAG), "rollback": t.get(ROLLBACK_TAG)})
    return rows


def load(name: str, alias: str = CHAMPION, cfg: TrackingConfig | None = None) -> Any:
    """The pyfunc of `models:/NAME@ALIAS` (predict(DataFrame of impressions) -> probability)."""
    import mlflow

    connect(cfg)
    return mlflow.pyfunc.load_model(f"models:/{name}@{alias}")
