"""The process group: lrm.launch's or torchrun's when launched by one, else a 1-rank group
of our own.

DistributedModelParallel needs a process group even in one process, so a plain
`python -m stages.train` gets a 1-rank group over a FileStore in a temporary folder (no
port to pick). Under `python -m lrm.launch` (one host) the ranks meet in the FileStore the
launcher names (LRM_STORE): no network listener; under torchrun, its env:// rendezvous (a
TCP store on every interface: several hosts). gloo on CPU, nccl on GPUs (one per process,
`LOCAL_RANK`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import platform
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from lrm.errors import ConfigError
from lrm.launch import STORE_ENV, TIMEOUT_ENV


@dataclass(frozen=True)
class Dist:
    """Where this process stands: its rank among `world_size`, and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any rank (a collective)."""
        if self.world_size == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `t` over every rank (a copy; a collective)."""
        out = t.detach().clone()
        if self.world_size > 1:
            out = out.to(self.device)
            dist.all_reduce(out)
        return out.cpu()

    def broadcast(self, obj: object) -> object:
        """Rank 0's `obj` on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def _device(pref: str, local_rank: int) -> torch.device:
    if pref == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda was asked for but no GPU is visible")
    if pref == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def local_device(pref: str) -> torch.device:
    """The device `pref` (auto | cpu | cuda) means for this process: its LOCAL_RANK's GPU,
    or the CPU (a model scored outside a training run's process group)."""
    return _device(pref, int(os.environ.get("LOCAL_RANK", "0")))


@contextlib.contextmanager
def process_group(device: str = "auto") -> Iterator[Dist]:
    """Yield this process's `Dist`; a group created here is destroyed on the way out.

    Under torchrun (RANK/WORLD_SIZE set) the env:// rendezvous is used; a group that
    already exists (a caller's) is used as it is and left alone.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = _device(device, local_rank)
    # what lives before the run (a worker's imports: torch, torchrec, mlflow, Prefect, ~0.5M
    # objects) is frozen out of the collection on the way out: that full collection took
    # 0.3-1.8 s a run (2 cores), paid by every model of a stream day
    froze = not dist.is_initialized() and gc.get_freeze_count() == 0
    if froze:
        gc.freeze()
    try:
        with _group(dev, local_rank) as env:
            yield env
    finally:
        if froze:
            gc.unfreeze()


@contextlib.contextmanager
def _group(dev: torch.device, local_rank: int) -> Iterator[Dist]:
    """process_group's group: created (and destroyed on the way out) unless one exists."""
    backend = "nccl" if dev.type == "cuda" else "gloo"
    owned, tmp = False, None
    if not dist.is_initialized():
        owned = True
        if os.environ.get(STORE_ENV) and "RANK" in os.environ:  # lrm.launch: one host
            world = int(os.environ["WORLD_SIZE"])
            store = dist.FileStore(os.environ[STORE_ENV], world)
            dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                                    world_size=world, timeout=timedelta(minutes=30))
        elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False":  # lrm.launch, hosts
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            dist.init_process_group(backend, store=_bound_store(rank, world), rank=rank,
                                    world_size=world, timeout=collective_timeout())
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun, several hosts
            dist.init_process_group(backend, timeout=collective_timeout())
        else:
            tmp = tempfile.mkdtemp(prefix="lrm-pg-")
            store = dist.FileStore(os.path.join(tmp, "store"), 1)
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
    try:
        yield Dist(rank=dist.get_rank(), world_size=dist.get_world_size(),
                   local_rank=local_rank, device=dev)
    finally:
        if owned:
            dist.destroy_process_group()
            # DMP/DDP leave reference cycles that keep the group's gloo machinery alive;
            # until they are collected, the next model in this process runs ~2x slower
            # (they are the run's own objects: what was frozen before it is not walked)
            gc.collect()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _bound_store(rank: int, world: int) -> dist.Store:
    """The ranks' store at MASTER_ADDR:MASTER_PORT, listening on that address only (rank 0
    binds the socket and hands it over: torch's TCPStore has no bind address)."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank != 0:
        return dist.TCPStore(host, port, world, is_master=False, timeout=collective_timeout())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((socket.gethostbyname(host), port))
    sock.listen(1024)
    store = dist.TCPStore(host, port, world, is_master=True, master_listen_fd=sock.fileno(),
                          wait_for_workers=False, timeout=collective_timeout())
    sock.detach()  # the store owns the socket now
    return store


def collective_timeout() -> timedelta:
    """How long a collective waits for the other ranks under torchrun: LRM_DIST_TIMEOUT_S
    (lrm.launch sets it to --node-timeout: a lost host fails the run in that time), else 30
    minutes."""
    return timedelta(seconds=float(os.environ.get(TIMEOUT_ENV) or 1800))


class _DropFbgemmInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or "fbgemm_gpu" not in record.pathname


def _process_cores() -> int:
    """This process's share of the cores it may run on (torchrun: LOCAL_WORLD_SIZE share them)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


# A GPU step leaves the host's cores idle, and one loader thread shares the interpreter with
# the loop: on an H100 (16 cores), the student at batch 2048 kept 0.80 of the step's speed
# with one loader thread and 0.90 with two (bench train.end_to_end). A CPU step uses every
# free core, so there a second loader thread takes one from torch.
GPU_LOADER_WORKERS = 2
GPU_LOADER_MIN_CORES = 4  # the two threads, the loop, and a core for torch and the driver


def loader_workers(requested: int | str, device: torch.device) -> int:
    """Loader threads for one training process: `requested`, or for "auto" GPU_LOADER_WORKERS
    on a GPU when the process has GPU_LOADER_MIN_CORES cores of its own, else one."""
    if requested != "auto":
        return int(requested)
    if device.type == "cuda" and _process_cores() >= GPU_LOADER_MIN_CORES:
        return GPU_LOADER_WORKERS
    return 1


def intra_op_threads(requested: int, loader_workers: int) -> int:
    """Torch intra-op threads for one training process: `requested`, else OMP_NUM_THREADS
    (torchrun sets 1 per process), else this process's share of the cores it may run on,
    less one per loader worker thread (at least 1).

    Never more threads than free cores: torch's OpenMP threads spin-wait at the end of
    every parallel region, so when one of them loses its core (to a loader thread,
    another rank or another process) each region waits out a scheduler slice (~ms). fbgemm's
    CPU TBE backward runs a few small regions per table: with 2 threads on a 2-core
    host next to a busy process, a 26-table backward took ~1 s instead of ~2 ms.
    """
    if requested:
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    return max(1, _process_cores() - loader_workers)


def quiet_libraries() -> None:
    """torchrec and fbgemm log every table at INFO and warn about their own deprecations."""
    for name in ("torchrec", "fbgemm_gpu", "MethodLogger-NullHandler",
                 "Cap01Logger-NullHandler"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    root = logging.getLogger()
    if not any(isinstance(f, _DropFbgemmInfo) for f in root.filters):
        root.addFilter(_DropFbgemmInfo())  # fbgemm logs through the root logger
    for msg in ("Please use DTensor instead", "`broadcast_buffers` is deprecated",
                "HeuristicalStorageReservation is known"):
        warnings.filterwarnings("ignore", message=f".*{msg}", category=FutureWarning)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo; platform's guess elsewhere)."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(x.split(":", 1)[1].strip() for x in f if x.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return name
