"""fp8 training in the executor: torchao's float8 training on the bf16 recipe, where the device has fp8 tensor cores.

`precision: fp8` runs the bf16 recipe (bf16 parameters and gradients, fp32 masters in the optimizer:
planner.executor.precision) with every eligible nn.Linear swapped for torchao's Float8Linear
(torchao.float8.convert_to_float8_training, default Float8LinearConfig: dynamic tensorwise scaling, e4m3 in the
forward, e5m2 for gradients). Float8Linear casts its input and weight to fp8 in each GEMM and saves the
high-precision input and weight for backward (torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args:
`ctx.save_for_backward(input_hp, weight_hp_t)`), so it keeps no fp8 weight copy and saves bf16 activations.
Not converted (torchtitan's filter, torchtitan/components/quantization/float8.py, does the same): the LM head
(`output`) and layers whose dimensions are not multiples of 16 (fp8 GEMMs need them). MoE experts are grouped GEMMs,
not nn.Linear, and would stay bf16: the `planner` profile refuses fp8 on MoE models, and with tp > 1 (torchao's
float8 tensor-parallel styles are not wired in).

fp8 GEMMs need NVIDIA compute capability >= 8.9 (Ada L4/L40, Hopper H100/H200, Blackwell); a CPU has none.
torchao is optional (the `fp8` extra of pyproject.toml).
"""

from __future__ import annotations

import importlib.util

from planner.errors import BadInputError

FP8_MIN_CAPABILITY = (8, 9)
FP8_DIM_MULTIPLE = 16


def fp8_refusal(device_type: str, capability: tuple[int, int] | None, *, torchao_installed: bool) -> str | None:
    """Why precision='fp8' cannot run on this device (one line naming the reason and the fix), or None."""
    if device_type != "cuda":
        return (f"precision='fp8' needs fp8 tensor cores (NVIDIA compute capability >= 8.9: L4, L40, H100, H200, B200); "
                f"this run is on {device_type}, which has no fp8 matmul: use --precision bf16, or run on such a GPU")
    if capability is None or tuple(capability) < FP8_MIN_CAPABILITY:
        found = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
        return (f"precision='fp8' needs fp8 tensor cores (compute capability >= 8.9); this GPU has compute capability "
                f"{found}: use --precision bf16, or a GPU with fp8 (L4, L40, H100, H200, B200)")
    if not torchao_installed:
        return ("precision='fp8' runs torchao's float8 training, and torchao is not installed: "
                "pip install 'llm-planner[fp8]' (or torchao), or use --precision bf16")
    return None


def check_fp8(device) -> None:
    """BadInputError (one line) unless this rank's device runs fp8 training (see fp8_refusal)."""
    import torch

    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    reason = fp8_refusal(device.type, capability, torchao_installed=importlib.util.find_spec("torchao") is not None)
    if reason is not None:
        raise BadInputError(reason)


def convertible(module, fqn: str) -> bool:
    """torchtitan's rule: an nn.Linear outside the LM head, both dimensions multiples of 16."""
    from torch import nn

    if not isinstance(module, nn.Linear) or fqn.split(".")[-1] == "output":
        return False
    return module.in_features % FP8_DIM_MULTIPLE == 0 and module.out_features % FP8_DIM_MULTIPLE == 0


def apply_fp8(model) -> int:
    """Swap the eligible nn.Linear layers of `model` for torchao Float8Linear (before TP/FSDP wrap it); returns
    how many were converted."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    count = sum(convertible(m, name) for name, m in model.named_modules())
    convert_to_float8_training(model, config=Float8LinearConfig(), module_filter_fn=convertible)
    return count
