"""Units, decided once.

Memory is counted in binary units (GiB = 2**30 bytes), as GPU vendors quote HBM capacity and as
torch.cuda reports it. Bandwidth is counted in decimal units (GB/s = 1e9 bytes/s), as NVIDIA and
network vendors quote links and as nccl-tests reports bus bandwidth. FLOP rates are decimal (1 TFLOP/s = 1e12).
"""

KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 10**9
TFLOPS = 1e12
US = 1e-6  # one microsecond in seconds

BYTES_PER_DTYPE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def gib(num_bytes: float) -> float:
    """Bytes -> GiB, for display."""
    return num_bytes / GiB


def gbps_to_bytes_per_s(bandwidth_GBps: float) -> float:
    """GB/s (decimal) -> bytes per second."""
    return bandwidth_GBps * GB
