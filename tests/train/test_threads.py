"""A training process never runs more torch threads than it has free cores (lrm.dist).

Behaviour, not formula: a real `train()` in a child process pinned to a set of cores records
the intra-op threads its steps run with. Spinning OpenMP threads that outnumber the cores
made a step ~90x slower on a shared 2-core host (see lrm.dist.intra_op_threads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.train.conftest import datasets  # noqa: F401  (session fixture)

SCRIPT = r"""
import json, os, sys
from pathlib import Path
os.sched_setaffinity(0, set(json.loads(sys.argv[2])))
import torch
import torch.nn.functional as F
from lrm.config import LoaderConfig, ModelConfig, StudentModelConfig, TrainConfig
from lrm.train import train
seen = []
def loss_fn(model, batch):
    seen.append(torch.get_num_threads())
    loss = F.binary_cross_entropy_with_logits(model(batch), batch.labels)
    return loss, loss
prefetch = int(sys.argv[3])
train("student", TrainConfig(batch_size=512, steps=2, threads=int(sys.argv[4])),
      ModelConfig(student=StudentModelConfig(embedding_dim=4, bottom_mlp=[8], top_mlp=[8])),
      Path(sys.argv[1]), loader_cfg=LoaderConfig(prefetch=prefetch, num_workers=1),
      loss_fn=loss_fn)
print(json.dumps(sorted(set(seen))))
"""

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to pin a child to 1 and 2")
@pytest.mark.parametrize("cores, prefetch, threads, env, want", [
    (1, 0, 0, {}, [1]),  # one core: one thread
    (2, 0, 0, {}, [2]),  # two free cores, no loader thread: both
    (2, 2, 0, {}, [1]),  # a loader thread takes one of the two
    (2, 0, 0, {"OMP_NUM_THREADS": "1"}, [1]),  # torchrun's per-process setting is kept
    (1, 0, 3, {}, [3]),  # asked for explicitly: as asked
])
def test_threads_a_training_step_runs_with(datasets, tmp_path, cores, prefetch, threads,  # noqa: F811
                                           env, want):
    run_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    run_env.update(env, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(datasets["sessions"]),
                        json.dumps(CORES[:cores]), str(prefetch), str(threads)],
                       env=run_env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == want
