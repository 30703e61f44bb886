"""`planner profile`: measure every distinct layer type of a model with torch and return a Profile.

For each layer type x TP degree x micro-batch size (one layer built at a time, never the whole model):
1. a meta-device build counts parameters and bounds activation bytes, so that a shape which cannot fit
   in the device's free memory is recorded as "oom" without being run;
2. the layer is built on the device and timed (warm-up, median of repeats), with no recompute, with
   selective recompute (the attention core under `torch.utils.checkpoint`, Korthikanti et al. 2022,
   sec. 4.2) and with full recompute (the whole layer checkpointed); extra recompute time = backward
   with checkpointing minus backward without;
3. bytes saved for backward are logged unwrapped (see measure_timing); selective keeps everything saved
   outside the attention core plus the core's inputs; full keeps the layer's inputs only;
4. FLOPs are counted for the layer, and every operator is measured alone (measure_ops).
An out-of-memory error while measuring becomes a recorded status="oom" entry, never a crash.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint

from planner.errors import BadInputError
from planner.profiling.measure_layers import LayerCase, build_case, layer_types
from planner.profiling.measure_ops import measure_ops, params_bytes
from planner.profiling.measure_timing import (
    SavedTensorLog,
    autocast_context,
    constant_keys,
    count_flops,
    is_out_of_memory,
    region_of,
    storage_key,
    tensor_bytes,
    time_forward_backward,
)
from planner.profiling.options import ProfileOptions
from planner.schemas.model import ModelSpec
from planner.schemas.profile import LayerProfile, Profile
from planner.units import GiB

DTYPES = {"fp32": (torch.float32, None), "bf16": (torch.bfloat16, None), "fp16": (torch.float16, None),
          "amp-bf16": (torch.float32, torch.bfloat16)}
MEMORY_HEADROOM = 0.9  # fraction of free memory a shape may plan to use (allocator fragmentation, workspace)

EntryCallback = Callable[[Profile], None]
ProgressCallback = Callable[[int, int, str], None]
# build(spec, layer_type, *, tp, ep, microbatch_size, seq_len, device, param_dtype) -> LayerCase
Builder = Callable[..., LayerCase]


def resolve_device(name: str) -> torch.device:
    """'cpu' or 'cuda' (or 'cuda:N'); CUDA without a GPU is bad input."""
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BadInputError("CUDA requested but torch.cuda.is_available() is False: use --device cpu")
        return torch.device(name)
    if name != "cpu":
        raise BadInputError(f"device={name!r} is unknown: use --device cpu or --device cuda")
    return torch.device("cpu")


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            model = next((ln.split(":", 1)[1].strip() for ln in handle if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu: {model}, {torch.get_num_threads()} threads"


def software_versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()}
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    return versions


def free_memory_bytes(device: torch.device) -> int:
    """Free device memory (CUDA), or MemAvailable from /proc/meminfo (CPU)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def meta_bound_bytes(spec: ModelSpec, layer_type: str, *, tp: int, ep: int, microbatch_size: int, seq_len: int,
                     param_dtype: torch.dtype, build: Builder = build_case) -> int:
    """Upper bound of one shape's memory from a meta-device build: params, grads, and every saved
    activation counted without deduplication (meta tensors share no storage addresses)."""
    case = build(spec, layer_type, tp=tp, ep=ep, microbatch_size=microbatch_size, seq_len=seq_len,
                 device=torch.device("meta"), param_dtype=param_dtype)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outputs = case.apply(case.make_inputs())
    except NotImplementedError:  # data-dependent operators (MoE routing: bincount) have no meta kernel
        return 2 * params_bytes(case.module) + _routed_bound_bytes(spec, microbatch_size * seq_len, param_dtype)
    return 2 * params_bytes(case.module) + sum(saved) + 2 * sum(o.numel() * o.element_size() for o in outputs)


def _routed_bound_bytes(spec: ModelSpec, tokens: int, dtype: torch.dtype) -> int:
    """Rough activation bound of a MoE layer where meta tensors cannot run it: 40 hidden-wide tensors per token
    (attention, norms, residuals) plus top_k expert inputs and 4 expert-wide intermediates per assignment."""
    size = torch.finfo(dtype).bits // 8
    moe = spec.moe
    per_token = 40 * spec.hidden_size + moe.top_k * (spec.hidden_size + 4 * moe.expert_ffn_hidden_size) + 2 * moe.num_experts
    return int(tokens * per_token * size)


class _Checkpointed(torch.nn.Module):
    """Runs the wrapped module under non-reentrant activation checkpointing (recomputed in backward)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


@contextmanager
def _selective(case: LayerCase):
    """Temporarily wrap the selective-recompute submodule in a checkpoint."""
    parent_path, _, leaf = case.selective_module.rpartition(".")
    parent = case.module.get_submodule(parent_path)
    inner = getattr(parent, leaf)
    setattr(parent, leaf, _Checkpointed(inner))
    try:
        yield
    finally:
        setattr(parent, leaf, inner)


def _saved_bytes(case: LayerCase, amp_dtype, device) -> tuple[int, int, int]:
    """(no recompute, selective, full) bytes saved for backward, from one unwrapped forward."""
    log = SavedTensorLog(constant_keys([case.module], case.constants))
    core = case.module.get_submodule(case.selective_module) if case.selective_module else None
    core_inputs: list[torch.Tensor] = []
    handle = core.register_forward_pre_hook(lambda _m, args: core_inputs.extend(args)) if core is not None else None
    inputs = case.make_inputs()
    try:
        with log.recording(), region_of(log, core, "selective"), autocast_context(device, amp_dtype):
            case.apply(inputs)
    finally:
        if handle is not None:
            handle.remove()
    total = log.total_bytes()
    selective = total
    if core is not None:
        kept = log.total_bytes(outside="selective")
        outside_keys = {k for k, (_, region) in log.entries.items() if region != "selective"}
        extra = [t for t in core_inputs if isinstance(t, torch.Tensor) and storage_key(t) not in outside_keys]
        selective = kept + tensor_bytes(extra)
    return total, selective, tensor_bytes(inputs)


def _times(case: LayerCase, opts: ProfileOptions, device: torch.device):
    """(forward+backward timing, selective recompute extra, full recompute extra) of one layer."""
    _, amp_dtype = DTYPES[opts.dtype]

    def step():
        with autocast_context(device, amp_dtype):
            return case.apply(case.make_inputs())

    def full_step():
        inputs = case.make_inputs()
        with autocast_context(device, amp_dtype):
            return checkpoint(lambda *xs: tuple(case.apply(xs)), *inputs, use_reentrant=False)

    timing_args = {"device": device, "warmup": opts.warmup, "repeats": opts.repeats, "clock": opts.clock}
    plain = time_forward_backward(step, **timing_args)
    selective_extra = 0.0
    if case.selective_module is not None:
        with _selective(case):
            selective_extra = max(0.0, time_forward_backward(step, **timing_args).backward_s - plain.backward_s)
    full_extra = max(0.0, time_forward_backward(full_step, **timing_args).backward_s - plain.backward_s)
    return plain, selective_extra, full_extra


def measure_case(case: LayerCase, opts: ProfileOptions, *, device: torch.device, microbatch_size: int,
                 seq_len: int, tp: int, ep: int, timed: LayerCase | None = None) -> LayerProfile:
    """Everything the profile records about one layer at one shape; times from `timed` when given (the same
    layer as the executor runs it, planner.profiling.measure_dtensor), the rest from `case`."""
    _, amp_dtype = DTYPES[opts.dtype]

    def step():
        with autocast_context(device, amp_dtype):
            return case.apply(case.make_inputs())

    plain, selective_extra, full_extra = _times(timed or case, opts, device)
    saved, saved_selective, saved_full = _saved_bytes(case, amp_dtype, device)
    flops = count_flops(step)
    case.module.zero_grad(set_to_none=True)
    ops = measure_ops(case, amp_dtype=amp_dtype, warmup=opts.op_warmup, repeats=opts.op_repeats, clock=opts.clock,
                      layer_times=(plain.forward_s, plain.backward_s), layer_flops=flops) if opts.ops else ()
    return LayerProfile(
        layer_type=case.layer_type, tp=tp, ep=ep, microbatch_size=microbatch_size, seq_len=seq_len,
        forward_s=plain.forward_s, backward_s=plain.backward_s, recompute_selective_s=selective_extra,
        recompute_full_s=full_extra, params_bytes=params_bytes(case.module), saved_bytes=saved,
        saved_bytes_selective=saved_selective, saved_bytes_full=saved_full, ops=ops,
    )


def _not_fitting(layer_type: str, tp: int, ep: int, mbs: int, seq_len: int, message: str) -> LayerProfile:
    return LayerProfile(layer_type=layer_type, tp=tp, ep=ep, microbatch_size=mbs, seq_len=seq_len, status="oom", message=message)


def profile_shape(spec: ModelSpec, layer_type: str, opts: ProfileOptions, *, device: torch.device, tp: int, ep: int,
                  microbatch_size: int, build: Builder = build_case) -> LayerProfile:
    """One layer type at one shape, or a recorded "does not fit"."""
    param_dtype, _ = DTYPES[opts.dtype]
    shape = {"tp": tp, "ep": ep, "microbatch_size": microbatch_size, "seq_len": opts.seq_len}
    need = meta_bound_bytes(spec, layer_type, param_dtype=param_dtype, build=build, **shape)
    free = free_memory_bytes(device)
    if need > MEMORY_HEADROOM * free:
        return _not_fitting(layer_type, tp, ep, microbatch_size, opts.seq_len,
                            f"does not fit: needs up to {need / GiB:.2f} GiB, {free / GiB:.2f} GiB free on {device}")
    torch.manual_seed(0)
    try:
        case = build(spec, layer_type, device=device, param_dtype=param_dtype, **shape)
        timed = None
        if opts.tp_runtime == "dtensor" and tp > 1:
            from planner.profiling.measure_dtensor import dtensor_case

            timed = dtensor_case(spec, layer_type, device=device, param_dtype=param_dtype, **shape)
        entry = measure_case(case, opts, device=device, timed=timed, **shape)
        return entry.model_copy(update={"message": case.note}) if case.note else entry
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return _not_fitting(layer_type, tp, ep, microbatch_size, opts.seq_len, f"does not fit: {str(exc).splitlines()[0]}")


def shapes(spec: ModelSpec, opts: ProfileOptions) -> list[tuple[str, int, int, int]]:
    """(layer_type, tp, ep, microbatch_size) in measuring order; TP degrees that do not divide heads are skipped."""
    kinds = [k for k in layer_types(spec) if opts.layer_types is None or k in opts.layer_types]
    out = []
    for kind in kinds:
        for tp in opts.tp:
            if spec.num_attention_heads % tp or spec.kv_heads % tp or (kind == "decoder" and spec.ffn_hidden_size % tp):
                continue
            eps = opts.ep if kind == "moe_decoder" else (1,)
            for ep in eps:
                if kind == "moe_decoder" and spec.moe.num_experts % ep:
                    continue
                out += [(kind, tp, ep, mbs) for mbs in opts.microbatch_sizes]
    if not out:
        raise BadInputError(f"tp={list(opts.tp)}: no TP degree divides num_attention_heads={spec.num_attention_heads} "
                            f"and num_kv_heads={spec.kv_heads} of {spec.name!r}: choose divisors")
    return out


def profile_model(spec: ModelSpec, opts: ProfileOptions, *, command: str = "", on_entry: EntryCallback | None = None,
                  progress: ProgressCallback | None = None, build: Builder = build_case) -> Profile:
    """Measure every shape; `on_entry` gets the partial profile after each one (to save it as it grows)."""
    device = resolve_device(opts.device)
    if device.type == "cpu" and opts.threads is not None:
        torch.set_num_threads(opts.threads)
    todo = shapes(spec, opts)
    profile = Profile(kind="measured", model_name=spec.name, device=device_description(device), dtype=opts.dtype,
                      software=software_versions(), command=command or " ".join(sys.argv))
    for done, (kind, tp, ep, mbs) in enumerate(todo):
        if progress is not None:
            progress(done, len(todo), f"{kind} tp={tp} ep={ep} mbs={mbs}")
        entry = profile_shape(spec, kind, opts, device=device, tp=tp, ep=ep, microbatch_size=mbs, build=build)
        profile = profile.model_copy(update={"entries": (*profile.entries, entry)})
        if on_entry is not None:
            on_entry(profile)
    if progress is not None:
        progress(len(todo), len(todo), "done")
    return profile
