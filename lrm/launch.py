"""Several training processes on one host, listening on no network interface:
`python -m lrm.launch --nproc-per-node 2 -m stages.train --model student ...`.

Why not torchrun here: its rendezvous store (torch's TCPStore) listens on every interface
of the host, whatever `--master-addr` or `--rdzv-endpoint` says (measured with torch 2.13:
`--rdzv-endpoint 127.0.0.1:29517` listens on `*:29517`; the store has no bind address),
so anyone who can reach the host can join or disturb a run. On one host nothing needs the
network: the processes meet in a FileStore in a private temporary folder (lrm.dist reads
LRM_STORE), and gloo and NCCL keep their own sockets on the loopback interface
(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, unless already set). Starting, watching and
stopping the processes is torch's own (torch.distributed.elastic.multiprocessing, what
torchrun runs them with): when one fails the others are stopped, and the launcher exits
with the first failure's status (2 for bad input, as a single process would).

Each process gets what torchrun gives it: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK 0, and OMP_NUM_THREADS=1 with several processes unless set. Several hosts need
torchrun (README: on a private network only).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence

STORE_ENV = "LRM_STORE"  # the FileStore the processes of one launch meet in (lrm.dist)


def loopback() -> str:
    """The loopback interface's name (lo on Linux, lo0 on macOS)."""
    names = [n for _, n in socket.if_nameindex()]
    return next((n for n in names if n.startswith("lo")), "lo")


def environments(nproc: int, store: str) -> dict[int, dict[str, str]]:
    """Each local rank's environment (added to this process's)."""
    lo = loopback()
    common = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
              STORE_ENV: store, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", lo),
              "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", lo)}
    if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:  # as torchrun: the cores are shared
        common["OMP_NUM_THREADS"] = "1"
    return {r: {**common, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(nproc)}


def launch(nproc: int, argv: Sequence[str]) -> int:
    """Run `python ARGV...` as `nproc` ranks; the exit status (0, or the first failure's)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    if nproc < 1:
        raise SystemExit("error: --nproc-per-node must be >= 1")
    tmp = tempfile.mkdtemp(prefix="lrm-launch-")  # 0700: this user's processes only
    try:
        ctx = start_processes(
            name="lrm", entrypoint=sys.executable,
            args={r: tuple(argv) for r in range(nproc)},
            envs=environments(nproc, os.path.join(tmp, "store")),
            logs_specs=DefaultLogsSpecs(log_dir=os.path.join(tmp, "logs")))
        result = ctx.wait()  # no timeout: until every rank ended, or one failed
        assert result is not None
        if not result.is_failed():
            return 0
        return exit_status([(f.timestamp, f.exitcode) for f in result.failures.values()])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def exit_status(failures: Sequence[tuple[float, int]]) -> int:
    """The launch's status from its ranks' (time, exit code) failures: a rank that fails
    takes the others down (gloo: connection closed, status 1; or torch stops them), so the
    most telling status wins: the highest exit code (2, bad input, over 1), else a signal's
    128 + its number."""
    codes = [c for _, c in failures]
    code = max(codes) if any(c > 0 for c in codes) else min(codes)
    return code if code > 0 else 128 - code


def main(args: Sequence[str] | None = None) -> None:
    """`python -m lrm.launch --nproc-per-node N (-m MODULE | SCRIPT) ARGS...`: the options
    come first; everything from -m (or the script) on is the command, passed as it is."""
    argv = list(sys.argv[1:] if args is None else args)
    p = argparse.ArgumentParser(
        prog="python -m lrm.launch", usage="%(prog)s --nproc-per-node N (-m MODULE | SCRIPT) "
        "ARGS...", description="Run a training command as several processes of this host "
        "(no network listener; see lrm/launch.py).")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, required=True,
                   help="processes to start (one per GPU on a GPU host)")
    cut = 0
    while cut < len(argv) and argv[cut] != "-m" and argv[cut].startswith("-"):
        cut += 1 if "=" in argv[cut] or argv[cut] in ("-h", "--help") else 2
    ns = p.parse_args(argv[:cut])
    if cut >= len(argv):
        p.error("nothing to run: give -m MODULE or a script")
    raise SystemExit(launch(ns.nproc_per_node, argv[cut:]))


if __name__ == "__main__":
    main()
