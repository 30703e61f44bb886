"""ZeRO-3 parameter gathers as DeepSpeed ran them before its coalesced all-gather (deepspeedai/DeepSpeed #1188,
2021-10-31, first released in v0.5.6): one synchronous collective per parameter tensor, copied out rank by rank.

What the code did (deepspeed/runtime/zero/partition_parameters.py at v0.4.0, `_allgather_param`): for each
parameter tensor, `torch.cuda.synchronize()`, a Python loop building `world_size` narrow views of a flat buffer,
then `torch.distributed.all_gather(partitions, ...)` with that list of `world_size` outputs, which
ProcessGroupNCCL runs as one ncclAllGather into a flattened buffer followed by one `copy_` per output tensor
(torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp `allgather`: "Copy the flattened output tensors to the
outputs"). So a gather is not hidden behind compute (the synchronize), and it costs, besides the collective,
`world_size` small copies per parameter tensor.

Priced here: per micro-batch, each gather pass (2, or 3 with the recompute forward where the stack re-gathers)
over the rank's parameter tensors costs the collective (comm.all_gather_s of the weights), the fixed latency of
one ring all-gather per further tensor (each tensor is its own ncclAllGather; comm.half_ring_latency_s), plus
tensors * dp copies of `copy_s` each. `copy_s` is the measured per-kernel device time of eager kernels
(calibration.yaml `eager_kernel_s`, benchmarks/gpu_kernels.py: launch gap, ramp-up and tail), the nearest
measurement of one small copy kernel; no GPU run of the 2021 code path exists here.
"""

from __future__ import annotations

from planner.schemas.model import ModelSpec

LINEARS_PER_LAYER = 4  # Megatron's fused QKV, attention output, fc1 (gate and up fused), fc2
NORMS_PER_LAYER = 2


def tensors_per_layer(spec: ModelSpec) -> int:
    """Parameter tensors of one decoder layer as ZeRO-3 partitions them: the four linear weights and two norm
    weights, plus a bias per linear where the model has linear biases and per LayerNorm (RMSNorm has none)."""
    linear_biases = LINEARS_PER_LAYER if spec.linear_bias else 0
    norm_biases = NORMS_PER_LAYER if spec.norm == "layernorm" else 0
    return LINEARS_PER_LAYER + NORMS_PER_LAYER + linear_biases + norm_biases


def params_per_tensor(spec: ModelSpec, layer_params: float) -> float:
    """The mean parameter count of a layer's tensors (what turns a rank's parameters into a tensor count)."""
    return layer_params / tensors_per_layer(spec)


def exposed_s(*, params: float, per_tensor: float, dp: int, gathers: int, num_microbatches: int,
              gather_s: float, copy_s: float, collective_latency_s: float = 0.0) -> float:
    """Exposed seconds of a step's synchronous per-tensor gathers: per micro-batch and gather pass, the collective
    of the rank's weights (`gather_s`, which holds one collective's fixed latency), the fixed latency of each
    further collective (one per tensor: `collective_latency_s`, comm.half_ring_latency_s) and one copy per tensor
    and rank (params / per_tensor tensors, dp ranks)."""
    if dp <= 1 or params <= 0:
        return 0.0
    tensors = params / per_tensor
    copies = tensors * dp * copy_s
    return num_microbatches * gathers * (gather_s + max(tensors - 1, 0.0) * collective_latency_s + copies)
