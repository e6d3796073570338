"""Sharding: how the embedding tables are placed on ranks, and the DMP wrapping that does it.

    parallel.py   DistributedModelParallel with a plan (torchrec's planner by default), the
                  fused row-wise Adagrad + AdamW, plan-independent table init, unsharding
"""
