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
GROUP_RANK 0, and OMP_NUM_THREADS=1 with several processes unless set.

Several hosts: `python -m lrm.launch --nnodes 2 --nproc-per-node 8 --rdzv-endpoint
HOST0:29400 -m stages.train ...` on each host. This is torchrun (torch's elastic agent, c10d
rendezvous) with what a user would otherwise get wrong set for them:
  * the rendezvous store listens on the address given, not on every interface (torch's
    TCPStore has no bind address: the host's launcher binds the socket itself and hands it
    to the store, which the agent then shares), and so does the ranks' own store (rank 0
    makes it on its node's address, lrm.dist, where torch's agent would have opened one on
    every interface); gloo and NCCL use the interface that reaches that address
    (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, unless set), and the agent names itself by it;
  * a lost node fails the run in bounded time, with a message that names it: each launcher
    beats in the store every HEARTBEAT_S seconds; a node whose beats stop for
    --node-timeout seconds (killed, frozen, its network gone) is lost, and every other node
    stops its ranks and exits 1 with "error: lost node N (host H, pid P): ..."; a node whose
    ranks fail (a peer's connection closed) names the nodes whose beats stopped with it.
    The ranks' own collectives time out after the same bound (LRM_DIST_TIMEOUT_S, read by
    lrm.dist), and the rendezvous waits --join-timeout seconds for every node to join;
  * no restarts (a failed rank fails the run; `--resume` goes on from its checkpoints).
This is written here because torchrun's agent neither binds its store to an address nor
names a lost peer (its keep-alive only drops a node at the next rendezvous).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

STORE_ENV = "LRM_STORE"  # the FileStore the processes of one launch meet in (lrm.dist)
TIMEOUT_ENV = "LRM_DIST_TIMEOUT_S"  # the ranks' collective timeout (lrm.dist)
DEFAULT_PORT = 29400  # torchrun's rendezvous port
HEARTBEAT_S = 1.0  # a launcher's beat in the store (several hosts)


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


def _route(host: str) -> tuple[str, str]:
    """(this machine's address that reaches `host`, the name of its interface)."""
    import psutil

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent
        s.connect((socket.gethostbyname(host), 9))
        addr = s.getsockname()[0]
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == addr for a in addrs):
            return addr, name
    return addr, loopback()


def _host_socket(host: str, port: int) -> socket.socket | None:
    """A listening socket on host:port where `host` is an address of this machine and the
    port is free: this launcher then hosts the rendezvous store; None where another does."""
    addr = socket.gethostbyname(host)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((addr, port))
        s.listen(1024)
    except OSError:  # not this machine's address, or another launcher here hosts it
        s.close()
        return None
    return s


class _Peers:
    """Each launcher's beat in the rendezvous store, and the watch on the others' (above)."""

    def __init__(self, host: str, port: int, run_id: str, timeout_s: float,
                 join_timeout: float) -> None:
        self.host, self.port, self.join_timeout = host, port, join_timeout
        self.key, self.timeout_s, self.endpoint = f"lrm/{run_id}", timeout_s, f"{host}:{port}"
        self.store: Any = None  # connected by the thread (the host's store may come later)
        self.index = -1
        self.seen: dict[int, tuple[int, float]] = {}  # node -> (beats, when they last moved)
        self.lost: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="lrm-peers", daemon=True)
        self.thread.start()

    def _join(self) -> None:
        """Connect to the store (waiting up to the join timeout for its host) and say who
        this node is."""
        from datetime import timedelta

        import torch.distributed as dist

        store = dist.TCPStore(self.host, self.port, is_master=False, multi_tenant=True,
                              timeout=timedelta(seconds=self.join_timeout))
        store.set_timeout(timedelta(seconds=max(5.0, 3 * HEARTBEAT_S)))
        self.index = int(store.add(f"{self.key}/nodes", 1)) - 1
        store.set(f"{self.key}/node/{self.index}",
                  f"host {socket.gethostname()}, pid {os.getpid()}")
        self.store = store

    def _loop(self) -> None:
        import time

        try:
            self._join()
        except Exception:  # noqa: BLE001 (no store to beat in: the rendezvous fails alone)
            return
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self.store.add(f"{self.key}/beat/{self.index}", 1)
                lost = self.stalled(time.monotonic(), self.timeout_s)
            except Exception:  # noqa: BLE001 (the store's host gone: it is the lost node)
                lost = [f"the rendezvous host {self.endpoint} (it holds the store) does not "
                        f"answer"]
            if lost and not self.stop.is_set():
                self.lost = "; ".join(lost)
                _stop_ranks()
                return

    def stalled(self, now: float, after: float) -> list[str]:
        """The nodes (not done) whose beats have not moved for `after` seconds."""
        out = []
        for i in range(int(self.store.add(f"{self.key}/nodes", 0))):
            if i == self.index or self.store.check([f"{self.key}/done/{i}"]):
                continue
            beats = int(self.store.add(f"{self.key}/beat/{i}", 0))
            last = self.seen.get(i)
            if last is None or last[0] != beats:
                self.seen[i] = (beats, now)
            elif now - last[1] >= after:
                who = self.store.get(f"{self.key}/node/{i}").decode()
                out.append(f"lost node {i} ({who}): no heartbeat for {now - last[1]:.0f} s")
        return out

    def name_lost(self) -> str | None:
        """After this node's ranks failed: the nodes that stopped beating with them (watched
        for a few beats), or the loss already seen."""
        import time

        if self.lost:
            return self.lost
        self.stop.set()
        if self.store is None:
            return None
        try:
            for _ in range(4):
                lost = self.stalled(time.monotonic(), 2.5 * HEARTBEAT_S)
                if lost:
                    return "; ".join(lost)
                time.sleep(HEARTBEAT_S)
        except Exception:  # noqa: BLE001
            return f"the rendezvous host {self.endpoint} (it holds the store) does not answer"
        return None

    def close(self, done: bool) -> None:
        self.stop.set()
        if done and self.store is not None:
            try:
                self.store.set(f"{self.key}/done/{self.index}", "1")
            except Exception:  # noqa: BLE001 (the others are gone: nothing to tell)
                pass


def _stop_ranks() -> None:
    """SIGTERM this launcher's rank processes (the agent then sees them fail and returns)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass


def launch_nodes(nnodes: int, nproc: int, endpoint: str, argv: Sequence[str], *,
                 run_id: str = "lrm", node_timeout: float = 60.0,
                 join_timeout: float = 600.0) -> int:
    """Run `python ARGV...` as `nproc` ranks of this node, one of `nnodes` that meet at
    `endpoint` (HOST[:PORT]); the exit status. See the module."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    host, _, port_s = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    port = int(port_s) if port_s else DEFAULT_PORT
    addr, iface = _route(host)
    listener = _host_socket(host, port)
    server = None
    if listener is not None:  # the store on this socket only (the agent shares it)
        server = dist.TCPStore(host, port, is_master=True, multi_tenant=True,
                               master_listen_fd=listener.fileno(), wait_for_workers=False,
                               timeout=timedelta(seconds=join_timeout))
        listener.detach()  # the store owns the socket now (and closes it)
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        os.environ.setdefault(k, iface)
    # the agent of the node ranked 0 would start a second store for the ranks on a free
    # port of every interface: instead rank 0 makes it on MASTER_ADDR only (lrm.dist)
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    os.environ.setdefault(TIMEOUT_ENV, str(int(node_timeout)))
    if nproc > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp = tempfile.mkdtemp(prefix="lrm-launch-")
    config = LaunchConfig(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc, run_id=run_id,
        rdzv_endpoint=f"{host}:{port}", rdzv_backend="c10d", max_restarts=0,
        rdzv_configs={"is_host": server is not None, "join_timeout": join_timeout,
                      "read_timeout": int(max(60, node_timeout))},
        local_addr=addr, monitor_interval=0.5,
        logs_specs=DefaultLogsSpecs(log_dir=os.path.join(tmp, "logs")))
    peers = _Peers(host, port, run_id, node_timeout, join_timeout)
    ok = False
    try:
        elastic_launch(config, sys.executable)(*argv)
        ok = True
        return 0
    except ChildFailedError as e:
        lost = peers.name_lost()
        codes = [f.exitcode for f in e.failures.values()]
        if lost:
            print(f"error: {lost}; this node's ranks stopped with it (exit "
                  f"{max(codes)})", file=sys.stderr, flush=True)
            return 1
        return exit_status([(f.timestamp, f.exitcode) for f in e.failures.values()])
    finally:
        peers.close(done=ok)
        shutil.rmtree(tmp, ignore_errors=True)
        del server


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
    p.add_argument("--nnodes", type=int, default=1, help="hosts of the run (several: give "
                   "--rdzv-endpoint, the same on every host)")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default=None,
                   help=f"HOST[:PORT] (port {DEFAULT_PORT}) of the rendezvous: an address of "
                   "one of the hosts, on the network the hosts share; it listens there only")
    p.add_argument("--rdzv-id", "--rdzv_id", default="lrm", help="the run's id (the same on "
                   "every host; another for another run on the same endpoint)")
    p.add_argument("--node-timeout", type=float, default=60.0, help="seconds after which a "
                   "silent node is lost: the run stops, naming it")
    p.add_argument("--join-timeout", type=float, default=600.0, help="seconds to wait for "
                   "every host to join")
    cut = 0
    while cut < len(argv) and argv[cut] != "-m" and argv[cut].startswith("-"):
        cut += 1 if "=" in argv[cut] or argv[cut] in ("-h", "--help") else 2
    ns = p.parse_args(argv[:cut])
    if cut >= len(argv):
        p.error("nothing to run: give -m MODULE or a script")
    if ns.nnodes > 1 or ns.rdzv_endpoint:
        if not ns.rdzv_endpoint:
            p.error("--nnodes > 1 needs --rdzv-endpoint HOST[:PORT]")
        if ns.node_timeout <= 2 * HEARTBEAT_S:
            p.error(f"--node-timeout must be more than {2 * HEARTBEAT_S:g} s")
        raise SystemExit(launch_nodes(ns.nnodes, ns.nproc_per_node, ns.rdzv_endpoint,
                                      argv[cut:], run_id=ns.rdzv_id,
                                      node_timeout=ns.node_timeout,
                                      join_timeout=ns.join_timeout))
    raise SystemExit(launch(ns.nproc_per_node, argv[cut:]))


if __name__ == "__main__":
    main()
