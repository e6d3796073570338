"""Sharding: how the embedding tables are placed on ranks, and the DMP wrapping that does it.

    stats.py      table statistics from the data (rows, pooling, skew, unique ids, RecD's
                  sessions per batch) and each table's work per training step
    topology.py   the ranks, hosts, memory and links a plan is for; which sharding types run
    cost.py       the cost model of a shard (compute, memory traffic, communication) and
                  its calibration (calibration/DEVICE.json, written by calibrate.py)
    planner.py    the greedy baseline and lrm's planner (greedy + splits + local moves)
    towers.py     DMT: tables grouped into one tower per host
    plan.py       a plan as JSON (plans/sharding.json) and as torchrec's ShardingPlan
    compare.py    torchrec's planner and estimator on the same tables, for comparison
    calibrate.py  times fbgemm's fused TBE here and fits the cost model's kernel terms
    parallel.py   DistributedModelParallel with a plan, the fused row-wise Adagrad +
                  AdamW, plan-independent table init, unsharding
"""
