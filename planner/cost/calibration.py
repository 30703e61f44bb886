"""Per-device-family calibration of the analytic cost model, read from calibration.yaml (data, not code).

Every constant is global per device type and carries its source in the YAML file: the measured H100 GEMM
ceiling and copy bandwidth (validation/h100_hf_tinyllama.jsonl), published A100 end-to-end rates (Narayanan
et al. 2021 Table 1), FlashAttention-2 rates (Dao 2023). Nothing here is fitted per run.
"""

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import yaml

from planner.resources import package_path
from planner.schemas.topology import DeviceSpec

CALIBRATION_FILE = package_path("cost", "calibration.yaml")
FLASH_ATTENTION_2 = "flash-attention-2"


@dataclass(frozen=True, kw_only=True)
class DeviceCalibration:
    """Achieved fractions of a device family's datasheet rates."""

    family: str
    matmul_ceiling_fraction: float  # large-GEMM achieved / datasheet peak
    gemm_fixed_s: float  # fixed cost per GEMM call (launch, ramp, tail wave)
    hbm_efficiency: float  # achieved / datasheet HBM bandwidth for streaming kernels
    attention_fraction: float  # fused (flash) attention achieved / datasheet peak (long sequences)
    source: str
    eager_kernel_s: float = 0.0  # eager recipe: device time per kernel beyond bytes / bandwidth (planner.cost.eager)
    eager_host_op_s: float = 0.0  # eager recipe: host (CPU) time per aten operator (planner.cost.eager)
    error_band: float | None = None  # 90th percentile |step-time error| of the leave-one-source-out predictions
    ranking_band: float | None = None  # median error moving between configurations of one source (calibration.yaml)
    stack: str | None = None  # the software stack whose GEMM ceiling this is (None: the family's)
    attention_seq_half: float = 0.0  # fused attention reaches half its rate at this sequence length (0: flat)
    # measured fused-attention rates per kernel: ((kernel, ((head_dim, fraction of peak, seq_half), ...)), ...)
    attention_kernels: tuple[tuple[str, tuple[tuple[int, float, float], ...]], ...] = ()
    fp8_matmul_relative: float = 1.0  # fp8 GEMM ceiling / bf16 GEMM ceiling, each against its own peak (measured)


@dataclass(frozen=True, kw_only=True)
class MemoryCalibration:
    """Allocator allowance of one caching-allocator setting: fixed bytes plus a fraction of the allocated bytes
    (calibration.yaml `memory`; `source` says what measured it, or "not measured: ..." where nothing has)."""

    fragmentation_fixed_bytes: int
    fragmentation_fraction: float
    allocator: str = "default"
    source: str = ""

    @property
    def measured(self) -> bool:
        """Whether a run measured this setting's allowance (else it is the default allocator's, carried over)."""
        return not self.source.startswith("not measured")


def _entry(raw: dict) -> DeviceCalibration:
    fields = {key: raw[key] for key in DeviceCalibration.__dataclass_fields__ if key in raw}
    kernels = dict(raw.get("attention_kernels") or {})
    # a family without a measured FlashAttention-2 rate runs it at its attention_fraction: the table always has it,
    # so resolving a stack's kernel (attention_rate_for) never reads a fraction resolved before
    kernels.setdefault(FLASH_ATTENTION_2, {128: {"fraction": raw["attention_fraction"],
                                                 "seq_half": raw.get("attention_seq_half", 0.0)}})
    fields["attention_kernels"] = tuple(
        (name, tuple(sorted((int(dim), float(value["fraction"]), float(value["seq_half"])) for dim, value in rates.items())))
        for name, rates in kernels.items())
    return DeviceCalibration(**fields)


def _stacks(raw: dict, key: str = "stack_ceilings") -> tuple[tuple[str, DeviceCalibration], ...]:
    """Per software stack of a family: the family's entry with the stack's GEMM ceiling under `key` (derived from
    published runs, `stack_ceilings`, or measured, `measured_stack_ceilings`), error band and ranking band (the
    family's where the stack has none)."""
    base = _entry(raw)
    bands, ranking = raw.get("stack_error_bands") or {}, raw.get("stack_ranking_bands") or {}
    return tuple((name, replace(base, matmul_ceiling_fraction=float(value), stack=name,
                                error_band=float(bands[name]) if name in bands else base.error_band,
                                ranking_band=float(ranking[name]) if name in ranking else base.ranking_band))
                 for name, value in (raw.get(key) or {}).items())


def _measured(raw: dict) -> dict[str, DeviceCalibration]:
    """The eager recipe's calibration per stack of a family: its measured GEMM ceiling (`measured_stack_ceilings`) and,
    where its own runs measured them (`stack_eager`, written by benchmarks/gpu_executor.py --derive), its eager
    per-kernel and per-operator constants."""
    measured = dict(_stacks(raw, "measured_stack_ceilings"))
    for name, values in (raw.get("stack_eager") or {}).items():
        if name in measured:
            measured[name] = replace(measured[name], **{key: float(value) for key, value in values.items()})
    return measured


@lru_cache(maxsize=1)
def _raw() -> dict:
    """calibration.yaml, parsed once (reload() reads it again)."""
    return yaml.safe_load(CALIBRATION_FILE.read_text(encoding="utf-8"))


def reload() -> None:
    """Forget the parsed calibration.yaml (benchmarks/accuracy.py --derive rewrites it and reads it again)."""
    _raw.cache_clear()
    _load.cache_clear()


def with_prior(item: dict, families: dict[str, dict]) -> dict:
    """A family entry with `prior: <family>` takes every constant it does not state from that family's entry (its
    own family name, match patterns and source kept): the rule for a family nothing has measured yet."""
    prior = item.get("prior")
    if prior is None:
        return item
    if prior not in families or families[prior].get("prior"):
        raise ValueError(f"calibration.yaml family {item['family']!r}: prior={prior!r} must name a measured family")
    return {**{k: v for k, v in families[prior].items() if k not in ("family", "match", "source")}, **item}


@lru_cache(maxsize=1)
def _load() -> tuple[tuple, DeviceCalibration, tuple[tuple[str, MemoryCalibration], ...]]:
    raw = _raw()
    families = {item["family"]: item for item in raw["devices"]}
    items = [with_prior(item, families) for item in raw["devices"]]
    devices = tuple((tuple(m.lower() for m in item["match"]), _entry(item), dict(_stacks(item)), _measured(item))
                    for item in items)
    memory = tuple((name, MemoryCalibration(allocator=name, fragmentation_fixed_bytes=int(entry["fragmentation_fixed_bytes"]),
                                            fragmentation_fraction=float(entry["fragmentation_fraction"]),
                                            source=str(entry.get("source", ""))))
                   for name, entry in raw["memory"].items())
    return devices, _entry(raw["default"]), memory


def device_calibration(device: DeviceSpec, framework: str | None = None, *, eager: bool = False) -> DeviceCalibration:
    """The calibration of the first family whose `match` substring occurs in the device name, else the default;
    with `framework`, that stack's GEMM ceiling on the family where calibration.yaml has one: for the eager recipe
    (`eager`: planner.cost.eager itemises every kernel's overhead) a measured large-GEMM ceiling
    (`measured_stack_ceilings`) first, else the in-step ceiling derived from published runs (`stack_ceilings`),
    else the family's own (the median over all its runs)."""
    devices, default, _ = _load()
    name = device.name.lower()
    for patterns, calibration, stacks, measured in devices:
        if any(pattern in name for pattern in patterns):
            if eager and framework in measured:
                return measured[framework]
            return stacks.get(framework, calibration)
    return default


def flash_attention_1_relative_rate() -> float:
    """FlashAttention v1's forward + backward rate relative to FlashAttention-2's (calibration.yaml kernels)."""
    return float(_raw()["kernels"]["flash_attention_1_relative_rate"])


def attention_rate_for(cal: DeviceCalibration, kernel: str, head_dim: int) -> tuple[float, float]:
    """(fraction of peak on long sequences, seq_half) of the stack's fused-attention kernel at a head dim, forward +
    backward; the rate on blocks of s tokens is fraction * s / (s + seq_half) (compute.attention_seq_factor).

    The family's measured rates (`attention_kernels`, benchmarks/gpu_kernels.py) are interpolated linearly in
    the head dim between measured ones and held flat outside them (the rate grows with the head dim: the
    tensor-core tiles of q @ k^T and p @ v get longer). Rules for what was not measured: a kernel the family has
    no rate for runs at FlashAttention-2's (e.g. cuDNN on Ampere, where Transformer Engine selects flash-attn
    anyway); FlashAttention-2 unmeasured is the family's `attention_fraction` and `attention_seq_half` (_entry
    puts them in the table); FlashAttention v1 is FlashAttention-2 x kernels.flash_attention_1_relative_rate (Dao 2023: about 2x)."""
    if kernel == "flash-attention-1":
        fraction, seq_half = attention_rate_for(cal, FLASH_ATTENTION_2, head_dim)
        return fraction * flash_attention_1_relative_rate(), seq_half
    table = dict(cal.attention_kernels)
    rates = table.get(kernel) or table.get(FLASH_ATTENTION_2)
    if not rates:  # a calibration built by hand without a table
        return cal.attention_fraction, cal.attention_seq_half
    dims = [dim for dim, _, _ in rates]
    return (float(np.interp(head_dim, dims, [fraction for _, fraction, _ in rates])),
            float(np.interp(head_dim, dims, [seq_half for _, _, seq_half in rates])))


def step_overhead_s(framework: str | None) -> float:
    """Per-step loop overhead of a software stack (calibration.yaml `loop`): measured where the stack's loop was
    measured, else the value derived from every published run."""
    loop = _raw()["loop"]
    measured = loop.get("measured_stack_step_overhead_s") or {}
    return float(measured[framework]) if framework in measured else float(loop["step_overhead_s"])


def memory_calibration(allocator: str = "default") -> MemoryCalibration:
    """The allocator allowance of a caching-allocator setting (frameworks/*.yaml behaviour.memory.allocator):
    calibration.yaml's `memory` entry of that name; "default" is derived from the tinyllama H100 measurements."""
    entries = dict(_load()[2])
    if allocator not in entries:
        raise ValueError(f"allocator={allocator!r}: calibration.yaml memory has no entry for it; one of {sorted(entries)}")
    return entries[allocator]
