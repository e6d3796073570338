"""Training benchmarks: `python bench/train.py [--quick | --smoke] [--device cuda]` prints one
JSON line per case.

train.vs_torchrec        lrm's student vs torchrec's own DLRM on the same batches (samples/s, NE)
train.profile            the same two steps under torch.profiler (CPU): ms per step by operator
                         category (embedding lookups, sparse dist, matmuls, ...), each side's
                         heaviest operators
train.dedup              student samples/s on RecD batches vs plain batches (session data)
train.vs_plain_pytorch   the project's student step vs the same student in plain PyTorch
train.scaling            lrm.train.train as 2 processes vs 1 (lrm.launch; CPU, gloo)
train.collections        the tables' lookup step in lrm's two collections vs one (ms, and the
                         pooled rows the output dist carries)
train.end_to_end         lrm.train.train's steady samples/s (loader and loop included) vs the
                         step alone on batches built beforehand
train.real               lrm's default student and teacher vs torchrec's DLRM on the real logs
                         in ../shared/data, held out in time: NE with paired intervals
                         (--seeds N; only with --only real, or in a full run); with
                         --log FILE... --map MAP (a mapping file of `lrm ingest logs`, or
                         `criteo`): that log alone
--quick: small sizes and a few steps (vs_torchrec: ~40k rows). --smoke: every case at tiny
sizes, batch 256 (unless --batch), a few steps: seconds each, that it runs.
--batch B: every case's batch size (defaults: vs_torchrec 1024, the peers' benchmark; the
others 2048, TrainConfig's); the days grow to hold enough batches of B. vs_torchrec's GPU
aims are at 2048 and 16384; RecD's saving of device work shows at large batches
(train.dedup: 65536), where the device's work, not the host's, sets the step.
--device cuda: every case's models on the GPU (train.scaling needs a GPU per process and
is skipped with one); every line says the device.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402
from bench.cases import train_collections, train_common, train_dedup, train_plain, \
    train_e2e, train_profile, train_real, train_scaling, train_vs_torchrec  # noqa: E402
from bench.cases.train_common import dataset  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    common.add_mode_flags(ap)
    ap.add_argument("--only", default=None,
                    choices=["vs_torchrec", "profile", "dedup", "plain", "scaling",
                             "collections", "end_to_end", "real"])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--batch", type=int, default=None,
                    help="every case's batch size (default: vs_torchrec 1024, the others "
                         "2048; the GPU aims: 2048 and 16384)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--seeds", type=int, default=1, help="train.real: seeds per model")
    ap.add_argument("--log", type=Path, nargs="+", default=None,
                    help="train.real on this log alone (files or folders; needs --map)")
    ap.add_argument("--map", default=None,
                    help="--log's mapping: a YAML file of `lrm ingest logs --map`, or criteo")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    quick = common.use_mode(args)
    if (args.log is None) != (args.map is None):
        ap.error("--log and --map go together")
    if args.log is not None and args.only != "real":
        ap.error("--log needs --only real")
    if args.batch is not None and args.batch < 1:
        ap.error(f"--batch must be at least 1, got {args.batch}")
    if args.worker is not None:  # one process of train.scaling (under lrm.launch or alone)
        train_scaling.worker(args.worker)
        return
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    train_common.use_device(args.device)
    common.DEVICE[0] = args.device
    if args.batch is None and common.smoke():
        args.batch = train_common.SMOKE_BATCH
    if args.batch is not None:
        train_common.use_batch(args.batch)
    if args.only in (None, "vs_torchrec"):  # its own ~200k-row dataset
        train_vs_torchrec.run(quick=quick, device=args.device,
                              batch=args.batch or train_vs_torchrec.BATCH)
    cases = {"dedup": train_dedup.run, "plain": train_plain.run, "scaling": train_scaling.run,
             "collections": train_collections.run}
    if args.only in (None, "profile") and args.device == "cpu":  # vs_torchrec's data
        train_profile.run(quick=quick, batch=args.batch or train_vs_torchrec.BATCH)
    if args.only in (None, "end_to_end"):  # its own days: one pass over them
        train_e2e.run(quick=quick)
    if args.only in (None, "real"):  # the real logs beside the repo
        train_real.run(quick=quick, seeds=args.seeds, only=None if args.log is None
                       else dict([train_real.mapped_log(args.log, args.map)]))
    if args.only in ("vs_torchrec", "profile", "end_to_end", "real"):
        return
    with dataset(quick) as data:  # one dataset for the other cases
        for name, fn in cases.items():
            if args.only in (None, name):
                fn(quick=quick, data=data)


if __name__ == "__main__":
    main()
