"""`python -m lrm.launch`: several ranks on one host meet without a network listener of
their own (torchrun's store listens on every interface), and a failing rank stops the
others with its exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

RANK = '''
import os, socket, sys, time
import torch, torch.distributed as dist
from lrm.dist import process_group

def listening():
    """(address, port) of every TCP socket of this process in LISTEN state (Linux /proc)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in mine:  # LISTEN
                addr, port = f[1].split(":")
                out.append((addr, int(port, 16)))
    return out

with process_group("cpu") as env:
    t = torch.tensor([env.rank + 1.0])
    dist.all_reduce(t)
    assert t.item() == 3.0
    wide = [a for a in listening() if a[0] not in ("0100007F", "00000000000000000000000001000000")]
    print(f"rank {env.rank}: listening on {listening()}", flush=True)
    if wide:
        sys.exit(f"rank {env.rank} listens beyond the loopback: {wide}")
    if env.rank == 1 and os.environ.get("FAIL"):
        os._exit(2)  # at once: rank 0 then waits in the barrier until the launch stops it
    dist.barrier()
'''


def _launch(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return subprocess.run([sys.executable, "-m", "lrm.launch", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net")
def test_ranks_meet_with_no_listener_beyond_the_loopback(tmp_path):
    r = _launch(tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("listening on") == 2


def test_a_failing_rank_stops_the_launch_with_its_status(tmp_path):
    r = _launch(tmp_path, FAIL="1")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
