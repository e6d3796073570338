"""Training benchmarks: `python bench/train.py [--quick]` prints one JSON line per case.

train.dedup              student samples/s on RecD batches vs plain batches (session data)
train.vs_plain_pytorch   the project's student step vs the same student in plain PyTorch
train.scaling            lrm.train.train under torchrun with 2 processes vs 1 (CPU, gloo)
--quick: 5k sessions a day and a few steps, under a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cases import train_dedup, train_plain, train_scaling  # noqa: E402
from bench.cases.train_common import dataset  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    ap.add_argument("--only", choices=["dedup", "plain", "scaling"], default=None)
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:  # one process of train.scaling (under torchrun or alone)
        train_scaling.worker(args.worker)
        return
    cases = {"dedup": train_dedup.run, "plain": train_plain.run, "scaling": train_scaling.run}
    with dataset(args.quick) as data:  # one dataset for every case
        for name, fn in cases.items():
            if args.only in (None, name):
                fn(quick=args.quick, data=data)


if __name__ == "__main__":
    main()
