"""FP8 probing and dispatch (LoKA): where low precision is safe and fast, and FP8 only there.

    formats   quantize -> dequantize in bf16, e4m3 (per tensor / per row), e5m2, MXFP8, MXFP4
    stats     online means with t intervals (the stopping rule), tensor statistics
    probe     hooks on every Linear and BatchedMatmul: statistics and error per format
    speed     a layer's (or a model step's) time in training precision vs FP8, real kernels
    report    probe a model on real batches, judge each layer, the plan, the readable table
    linear    FP8 linears that train: torchao's Float8Linear, or torch._scaled_mm
    dispatch  swap the planned layers to FP8; `transform(report, kind)`: the training job's
    norm      LayerNorms for the mods: the e4m3 cast fused in (static scale), a bf16 stream
    mods      fp8.fuse_norm (LayerNorm -> e4m3 for an FP8 Linear), fp8.bf16_residual
"""
