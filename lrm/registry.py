"""The MLflow model registry: registered models, versions, aliases.

MLflow 3: aliases (e.g. `champion`) replace the deprecated registry stages. Every version
lrm registers carries the content hash of its model folder as a tag (`HASH_TAG`), so a
consumer that holds a folder (the augment stage holds the teacher's) can name the
registered version it came from.
"""

from __future__ import annotations

from collections.abc import Mapping

from lrm.config import TrackingConfig
from lrm.tracking import tracking_uri

HASH_TAG = "lrm.content_hash"


def register_model(model_uri: str, name: str, *, aliases: list[str] | tuple[str, ...] = (),
                   tags: Mapping[str, str] | None = None) -> str:
    """Register a logged model as a new version of `name`, tag it and point `aliases` at it.

    Returns the new version (a string, as the registry spells it).
    """
    import mlflow

    mv = mlflow.register_model(model_uri, name, tags=dict(tags or {}))
    client = mlflow.MlflowClient()
    for alias in aliases:
        client.set_registered_model_alias(name, alias, mv.version)
    return str(mv.version)


def register_last_logged(name: str, content_hash: str, *, aliases: list[str] | tuple[str, ...] = ()
                         ) -> str:
    """Register the model logged last in this process (the active run's) under `name`."""
    import mlflow

    from lrm.errors import LrmError

    logged = mlflow.last_logged_model()
    if logged is None:
        raise LrmError(f"registry: no model was logged to MLflow to register as {name}")
    return register_model(logged.model_uri, name, aliases=aliases,
                          tags={HASH_TAG: content_hash})


def find_model_version(name: str, tag: str, value: str,
                       cfg: TrackingConfig | None = None) -> str | None:
    """The newest version of registered model `name` whose tag `tag` is `value`, or None."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(cfg))
    client = mlflow.MlflowClient()
    versions = client.search_model_versions(f"name = '{name}' and tags.`{tag}` = '{value}'")
    hits = [int(v.version) for v in versions]
    return str(max(hits)) if hits else None
