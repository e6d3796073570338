"""A training process never runs more torch threads than it has free cores, and takes as many
loader threads as its device warrants (lrm.dist).

Behaviour, not formula: a real `train()` in a child process pinned to a set of cores records
the intra-op threads its steps run with and the loader threads alive. Spinning OpenMP threads
that outnumber the cores made a step ~90x slower on a shared 2-core host (see
lrm.dist.intra_op_threads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from lrm.config import LoaderConfig, from_dict
from lrm.dist import loader_workers
from lrm.errors import ConfigError
from tests.conftest import REPO

SCRIPT = r"""
import json, os, sys, threading
from pathlib import Path
os.sched_setaffinity(0, set(json.loads(sys.argv[2])))
import torch
import torch.nn.functional as F
from lrm.config import LoaderConfig, ModelConfig, StudentModelConfig, TrainConfig
from lrm.train import TrainJob, train
seen, loaders = [], []
def loss_fn(model, batch):
    seen.append(torch.get_num_threads())
    # a pool names its worker threads lrm-loader_0, _1, ...: the distinct names are the
    # threads of the largest pool alive (the train and validation loaders may both have one)
    loaders.append(len({t.name for t in threading.enumerate()
                        if t.name.startswith("lrm-loader_")}))
    loss = F.binary_cross_entropy_with_logits(model(batch), batch.labels)
    return loss, loss
prefetch, workers = int(sys.argv[3]), json.loads(sys.argv[5])
train(TrainJob(kind="student",
               train=TrainConfig(batch_size=512, steps=3, threads=int(sys.argv[4])),
               model=ModelConfig(student=StudentModelConfig(embedding_dim=4, bottom_mlp=[8],
                                                            top_mlp=[8])),
               data=Path(sys.argv[1]),
               loader=LoaderConfig(prefetch=prefetch, num_workers=workers), loss=loss_fn))
print(json.dumps({"threads": sorted(set(seen)), "loaders": max(loaders)}))
"""

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to pin a child to 1 and 2")
@pytest.mark.parametrize("cores, prefetch, threads, workers, env, want, loaders", [
    (1, 0, 0, 1, {}, [1], 0),  # one core: one thread
    (2, 0, 0, 1, {}, [2], 0),  # two free cores, no loader thread: both
    (2, 2, 0, 1, {}, [1], 1),  # a loader thread takes one of the two
    (2, 2, 0, "auto", {}, [1], 1),  # the default on a CPU: one loader thread
    (2, 2, 0, 2, {}, [1], 2),  # two asked for: two, and torch keeps a thread
    (2, 0, 0, 1, {"OMP_NUM_THREADS": "1"}, [1], 0),  # torchrun's per-process setting is kept
    (1, 0, 3, 1, {}, [3], 0),  # asked for explicitly: as asked
])
def test_threads_a_training_step_runs_with(datasets, tmp_path, cores, prefetch, threads,  # noqa: F811
                                           workers, env, want, loaders):
    run_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    run_env.update(env, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(datasets["sessions"]),
                        json.dumps(CORES[:cores]), str(prefetch), str(threads),
                        json.dumps(workers)],
                       env=run_env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen == {"threads": want, "loaders": loaders}


@pytest.mark.parametrize("device, cores, local_world, want", [
    ("cuda", 16, 1, 2),  # a GPU host with cores to spare: a second loader thread
    ("cuda", 4, 1, 2),
    ("cuda", 3, 1, 1),  # too few cores for two threads beside the loop
    ("cuda", 16, 8, 1),  # eight ranks share 16 cores: 2 each
    ("cpu", 64, 1, 1),  # a CPU step uses every free core
])
def test_auto_loader_threads_follow_the_device_and_cores(monkeypatch, device, cores,
                                                         local_world, want):
    # no GPU is needed: the rule reads the device's type and this process's cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    assert loader_workers("auto", torch.device(device)) == want
    assert loader_workers(3, torch.device(device)) == 3  # asked for: as asked


@pytest.mark.parametrize("value", ["many", -1, 1.5, True])
def test_loader_threads_must_be_auto_or_a_count(value):
    with pytest.raises(ConfigError, match="loader.num_workers"):
        from_dict(LoaderConfig, {"num_workers": value}, "loader")
    with pytest.raises(ConfigError, match="num_workers"):  # built in code, not from params
        LoaderConfig(num_workers=value)
