"""The machines a plan is for: ranks, hosts, memory per rank, link and memory bandwidths.

Planning is pure computation: a topology of 512 GPU ranks can be planned on a laptop;
only training with the plan needs the devices. Which sharding types a rank can run
depends on its device (`sharding_types`), measured on torchrec 1.8 with 2 CPU ranks
(gloo) against the unsharded module:

* table-wise and column-wise pool correctly on CPU, also when every rank looks up a
  different number of rows (RecD's user-side tables: one row per unique session);
* row-wise and table-row-wise run on CPU only when every rank has the same batch: with
  different batches (the user-side tables, the last held-out batch, which may be short on
  some ranks) gloo's all-gather fails ("invalid tensor size"), so lrm never plans them
  for CPU ranks;
* data-parallel runs, but with the dense kernel: the table would be trained by AdamW
  (lrm's dense optimizer) instead of the fused row-wise Adagrad, and every step would
  all-reduce the whole table's gradient; lrm never plans it.

On GPUs (nccl) torchrec runs all four; that was not checkable here (no GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lrm.config import TopologyConfig
from lrm.errors import ConfigError

TABLE_WISE, COLUMN_WISE = "table_wise", "column_wise"
ROW_WISE, TABLE_ROW_WISE = "row_wise", "table_row_wise"
SHARDING_TYPES = (TABLE_WISE, COLUMN_WISE, ROW_WISE, TABLE_ROW_WISE)
DEVICE_TYPES = {"cpu": (TABLE_WISE, COLUMN_WISE), "cuda": SHARDING_TYPES}  # what runs where
GIB = 1 << 30


@dataclass(frozen=True)
class Topology:
    """`world_size` ranks, `ranks_per_host` to a host (rank r lives on host r // rph)."""

    world_size: int
    ranks_per_host: int
    device: str  # "cpu" | "cuda"
    memory_bytes: int  # per rank, for tables: HBM on cuda, host memory on cpu, less the reserve
    intra_host_bw: float  # bytes/s between two ranks of one host
    inter_host_bw: float  # bytes/s between hosts
    hbm_bw: float  # bytes/s of device memory (the analytic cost model of an uncalibrated GPU)

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.ranks_per_host < 1:
            raise ConfigError("sharding.topology: world_size and ranks_per_host must be >= 1")
        if self.world_size % self.ranks_per_host:
            raise ConfigError(f"sharding.topology.ranks_per_host: {self.ranks_per_host} does "
                              f"not divide world_size {self.world_size}")
        if self.device not in DEVICE_TYPES:
            raise ConfigError(f"sharding.topology.compute_device: {self.device!r} is not one "
                              f"of {sorted(DEVICE_TYPES)}")

    @classmethod
    def from_config(cls, cfg: TopologyConfig) -> Topology:
        mem = cfg.hbm_gb if cfg.compute_device == "cuda" else cfg.host_gb
        return cls(world_size=cfg.world_size,
                   ranks_per_host=cfg.ranks_per_host or cfg.world_size,
                   device=cfg.compute_device,
                   memory_bytes=int(mem * GIB * (1 - cfg.reserve)),
                   intra_host_bw=cfg.intra_host_gbps * 1e9,
                   inter_host_bw=cfg.inter_host_gbps * 1e9,
                   hbm_bw=cfg.hbm_gbps * 1e9)

    @property
    def hosts(self) -> int:
        return self.world_size // self.ranks_per_host

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def host_ranks(self, host: int) -> range:
        r = self.ranks_per_host
        return range(host * r, (host + 1) * r)

    def sharding_types(self) -> tuple[str, ...]:
        """The sharding types a table may use here (see the module docstring)."""
        if self.world_size == 1:  # one device: nothing to split a table for
            return (TABLE_WISE,)
        types = DEVICE_TYPES[self.device]
        if self.hosts == 1:  # table-row-wise over the one host is row-wise
            types = tuple(t for t in types if t != TABLE_ROW_WISE)
        return types

    def link_time(self, nbytes: Any, peers_in_host: float, peers_out: float) -> Any:
        """Seconds to move `nbytes` (a number or an array) spread evenly over
        `peers_in_host` + `peers_out` other ranks (all-to-all), each share over its link."""
        peers = peers_in_host + peers_out
        if peers <= 0:
            return nbytes * 0.0
        return nbytes / peers * (peers_in_host / self.intra_host_bw
                                 + peers_out / self.inter_host_bw)

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "ranks_per_host": self.ranks_per_host,
                "device": self.device, "memory_bytes": self.memory_bytes,
                "intra_host_bw": self.intra_host_bw, "inter_host_bw": self.inter_host_bw,
                "hbm_bw": self.hbm_bw}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Topology:
        return cls(**{k: d[k] for k in ("world_size", "ranks_per_host", "device",
                                        "memory_bytes", "intra_host_bw", "inter_host_bw",
                                        "hbm_bw")})

    def torchrec(self) -> Any:
        """The same machines as torchrec's planner Topology (for its planner and estimator)."""
        from torchrec.distributed.planner.types import (
            HardwareConfig,
            KernelConfig,
            TopologyFactory,
            TrainerConfig,
        )

        cap = self.memory_bytes  # torchrec's bandwidths are in bytes per millisecond
        hw = HardwareConfig(intra_host_bw=self.intra_host_bw / 1e3,
                            inter_host_bw=self.inter_host_bw / 1e3, hbm_mem_bw=self.hbm_bw / 1e3)
        trainer = TrainerConfig(world_size=self.world_size, local_world_size=self.ranks_per_host,
                                hbm_cap_bytes=cap if self.device == "cuda" else None,
                                ddr_cap_bytes=cap if self.device == "cpu" else None)
        return TopologyFactory.create_topology(
            trainer, hardware_config=hw, kernel_config=KernelConfig(compute_device=self.device))
