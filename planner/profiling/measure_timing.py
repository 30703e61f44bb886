"""Measuring one callable on any nn.Module: forward/backward time, FLOPs, bytes saved for backward, output bytes.

Generic machinery (no knowledge of transformer layers): `planner.profiling.measure_layers` builds the layers
and says which submodules form which operator.

- Time: warm-up iterations, then `repeats` timed iterations. CUDA: `torch.cuda.Event` pairs read after one
  synchronize per iteration, summarised by the median; CPU: `time.perf_counter` (monotonic, sub-microsecond),
  summarised by the minimum, because on a shared CPU interference only ever adds time and the least
  disturbed run is the best estimate of the cost (the convention of Python's timeit). `clock="process"`
  reads `time.process_time` instead (CPU seconds of this process): on a box shared with other jobs it
  excludes the time the profiler is descheduled; with one intra-op thread it equals the compute time.
  Gradients accumulate across iterations (the steady state of gradient accumulation).
- FLOPs: `torch.utils.flop_counter.FlopCounterMode`, forward and backward counted in separate modes so
  that neither borrows from the other. SDPA runs under the MATH backend while counting (FlopCounterMode
  misses CPU fused SDPA otherwise), which counts the full s x s score matrix (no causal halving).
- Saved bytes: `torch.autograd.graph.saved_tensors_hooks` during the forward, deduplicated by storage
  (a view saved twice costs its storage once) and excluding parameters, buffers and other constants
  (counted as parameters elsewhere). Measured unwrapped: under checkpointing the hooks only see the
  checkpoint's inputs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

# A "step" is one forward: it takes fresh inputs and returns the tensors to backpropagate from.
Forward = Callable[[], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class Timing:
    """Forward and backward seconds over the timed repeats (after warm-up): median on CUDA, minimum on CPU."""

    forward_s: float
    backward_s: float


class _Clock:
    """Marks points in time: CUDA events on a GPU (read after synchronize), perf_counter on CPU."""

    def __init__(self, device: torch.device, clock: str = "wall"):
        self.cuda = device.type == "cuda"
        self.read = time.process_time if clock == "process" else time.perf_counter
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(self.read())

    def intervals_s(self) -> list[float]:
        """Seconds between consecutive marks."""
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def backward_of(outputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
    """Backpropagate from every output that needs a gradient (scalars with grad 1, others with `grads`)."""
    pairs = [(out, g) for out, g in zip(outputs, grads) if out.requires_grad]
    if pairs:
        torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])


def output_grads(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """Fixed random upstream gradients, one per output (None for scalars: autograd uses 1)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    grads: list[torch.Tensor | None] = []
    for out in outputs:
        if out.dim() == 0 or not out.is_floating_point():
            grads.append(None)
        else:
            grads.append(torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.device, out.dtype))
    return grads


def time_forward_backward(step: Forward, *, device: torch.device, warmup: int, repeats: int, clock: str = "wall") -> Timing:
    """Forward and backward time of `step` (a fresh forward each iteration); see the module docstring."""
    grads = None
    forward_s, backward_s = [], []
    for i in range(warmup + repeats):
        marks = _Clock(device, clock)
        if marks.cuda:
            torch.cuda.synchronize()
        marks.mark()
        outputs = step()
        marks.mark()
        if grads is None:
            grads = output_grads(outputs)
        backward_of(outputs, grads)
        marks.mark()
        fwd, bwd = marks.intervals_s()
        if i >= warmup:
            forward_s.append(fwd)
            backward_s.append(bwd)
        del outputs
    summary = statistics.median if device.type == "cuda" else min
    return Timing(forward_s=summary(forward_s), backward_s=summary(backward_s))


def count_flops(step: Forward) -> tuple[float, float]:
    """(forward FLOPs, backward FLOPs) of one step, counted under the MATH SDPA backend."""
    with sdpa_kernel(SDPBackend.MATH):
        forward_mode = FlopCounterMode(display=False)
        with forward_mode:
            outputs = step()
        grads = output_grads(outputs)
        backward_mode = FlopCounterMode(display=False)
        with backward_mode:
            backward_of(outputs, grads)
    return float(forward_mode.get_total_flops()), float(backward_mode.get_total_flops())


def storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    """Identity of the memory a tensor lives in (its storage), so that views count once."""
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr())


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors`."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        seen[storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def constant_keys(modules: Iterable[nn.Module], extra: Iterable[torch.Tensor] = ()) -> set[tuple[str, int]]:
    """Storages of parameters, buffers and extra constants (e.g. a RoPE table): not activations."""
    keys = {storage_key(t) for m in modules for t in (*m.parameters(), *m.buffers())}
    keys.update(storage_key(t) for t in extra)
    return keys


class SavedTensorLog:
    """Records every tensor autograd saves for backward, tagged with the region (operator) active then."""

    def __init__(self, exclude: set[tuple[str, int]]):
        self.exclude = exclude
        self.region: str | None = None
        self.entries: dict[tuple[str, int], tuple[int, str | None]] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        if key not in self.exclude and key not in self.entries:
            self.entries[key] = (tensor.untyped_storage().nbytes(), self.region)
        return tensor

    @contextmanager
    def recording(self):
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            yield self

    def total_bytes(self, *, outside: str | None = None) -> int:
        """All saved bytes, or only those saved outside region `outside`."""
        return sum(n for n, region in self.entries.values() if outside is None or region != outside)

    def keys(self) -> set[tuple[str, int]]:
        return set(self.entries)


@contextmanager
def region_of(log: SavedTensorLog, module: nn.Module | None, name: str):
    """Tag saves made inside `module.forward` with `name` (forward pre/post hooks); no-op without a module."""
    if module is None:
        yield
        return

    def enter(_mod, _args):
        log.region = name

    def leave(_mod, _args, _out):
        log.region = None

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def autocast_context(device: torch.device, amp_dtype: torch.dtype | None):
    """torch.autocast for mixed precision (fp32 parameters, bf16 math), or nothing."""
    if amp_dtype is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA OOM, or the CPU allocator failing ("can't allocate memory")."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "can't allocate memory" in text)
