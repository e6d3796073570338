"""The flows' task runner for the units of ingest and dedup: threads here, or a Dask cluster.

`--cluster` (python -m flows.pipeline, lrm's flows) picks where the units (lrm.fanout: each
input file and each day of ingest, each day of dedup) run:

    (none)              threads of the flow's process (Prefect's ThreadPoolTaskRunner)
    local:N             a Dask cluster of N worker processes on this host, started and
                        stopped with the flow (distributed.LocalCluster; 127.0.0.1 only)
    tcp://HOST:8786     a running Dask scheduler (`dask scheduler` + `dask worker` on the
                        machines: the workers need lrm installed, at the same version)

Dask rather than Ray (both measured with bench/scale.py --cluster; docs/cluster.md has the
figures): Dask started 2-8x faster and installs a tenth the size, and its Nanny restarts a
killed worker while its tasks rerun on the live ones. Ray did the units as fast or faster on
a loaded 2-core machine. The units are engine-neutral: the benchmark runs prefect-ray's
RayTaskRunner through the same flows.

Every worker must see the flow's folders at the same paths (a shared file system: NFS,
Lustre, EFS, or one host): a unit runs in the flow's working folder (flows.tasks.unit_task),
and a worker that does not have it fails the unit with a message that says so. The workers
record their task runs in the flow's Prefect API: PREFECT_API_URL (a real server) for a
remote cluster; with a local cluster and Prefect's temporary server, its address is passed
on (flows.tasks.task_units).
"""

from __future__ import annotations

from typing import Any

from lrm.errors import ConfigError

EXTRA = "pip install -e '.[cluster]'"  # prefect-dask, dask.distributed (pyproject.toml)


def available() -> bool:
    """Whether the cluster extra is installed."""
    try:
        import distributed  # noqa: F401
        import prefect_dask  # noqa: F401
    except ImportError:
        return False
    return True


def task_runner(spec: str | None) -> Any:
    """The task runner `spec` names (see the module); None: the flow's own default."""
    if not spec:
        return None
    local = spec.startswith("local:")
    if not (local or spec.startswith("tcp://")):
        raise ConfigError(f"--cluster {spec!r}: give local:N (N worker processes here) or "
                          "tcp://HOST:PORT (a running Dask scheduler)")
    if not available():
        raise ConfigError(f"--cluster {spec}: the cluster extra is not installed ({EXTRA})")
    from prefect_dask import DaskTaskRunner

    if not local:
        return DaskTaskRunner(address=spec)
    try:
        workers = int(spec.removeprefix("local:"))
    except ValueError:
        workers = 0
    if workers < 1:
        raise ConfigError(f"--cluster {spec!r}: N in local:N is a number of worker "
                          "processes, at least 1")
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs=local_cluster(workers))


def local_cluster(workers: int) -> dict[str, Any]:
    """distributed.LocalCluster's arguments for `workers` one-thread worker processes that
    listen on 127.0.0.1 only, with no dashboard (a web server nobody asked for)."""
    return {"n_workers": workers, "threads_per_worker": 1, "processes": True,
            "host": "127.0.0.1", "dashboard_address": None}
