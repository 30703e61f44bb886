"""PipeDream-2BW (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training", sec. 3) on
torch.distributed send/recv: double-buffered weights, gradients coalesced over a step's micro-batches,
the one-step-delayed update and no pipeline flush between steps.

    W(t+1) = W(t) - lr * grad f(W(t-1))          (sec. 3.1; W(0) = W(1) = the initial weights)

Every micro-batch of step t (1-based) runs forward and backward on version W(t-1) on every stage. Each
pipeline rank holds its stage twice (`versions[0]`, `versions[1]`): step t computes on
`versions[(t-1) % 2]`; when that stage finishes the backward of step t's last micro-batch, the version it
used (W(t-1)) is no longer needed by any micro-batch, so it is overwritten with W(t) (the other version,
still in use by step t+1's micro-batches in flight) and the optimizer steps it with step t's coalesced
gradient: it now holds W(t+1), which step t+2 uses. Exactly two weight versions per stage; the two
optimizers share one state (Adam moments follow the logical weight, not the buffer).

The schedule is one 1F1B order over all the run's micro-batches (warm-up of pp - s - 1 forwards on stage
s, then one forward / one backward): step t+1's forwards enter the pipeline while step t's backwards
drain, so no flush. Two versions suffice when num_microbatches >= pp (sec. 3.1), checked before launch.
Activations go forward and gradients backward with isend/irecv on the pp group (FIFO per pair); the
first transfer each way carries a shape header.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

HEADER_LEN = 8
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64)


def one_f_one_b_order(stage: int, num_stages: int, total: int) -> list[tuple[str, int]]:
    """1F1B over `total` micro-batches with no flush: warm-up forwards, then alternate, then drain."""
    warmup = min(num_stages - stage - 1, total)
    order = [("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(total - warmup, total)]
    return order


def share_optimizer_state(first: torch.optim.Optimizer, second: torch.optim.Optimizer) -> None:
    """Make `second`'s per-parameter state the same dict objects as `first`'s (parameters paired in order):
    the optimizer's moments and step count belong to the logical weight, whichever buffer holds it. Called after
    `first` stepped (never on empty states: an entry created empty would stop torch's state-dict helpers from
    initialising the state before a checkpoint load)."""
    pairs = list(zip((p for g in first.param_groups for p in g["params"]), (p for g in second.param_groups for p in g["params"])))
    for a, b in pairs:
        if a.shape != b.shape:
            raise ValueError(f"2BW versions differ: parameter shapes {tuple(a.shape)} vs {tuple(b.shape)}")
        second.state[b] = first.state[a]


@torch.no_grad()
def copy_weights(dst: nn.Module, src: nn.Module) -> None:
    """dst <- src parameter by parameter (local shards of DTensors)."""
    for d, s in zip(dst.parameters(), src.parameters()):
        local = d.to_local() if hasattr(d, "to_local") else d
        local.copy_(s.to_local() if hasattr(s, "to_local") else s)


class Channel:
    """Point-to-point tensors between two neighbouring pipeline ranks; shapes learnt from the first header."""

    def __init__(self, peer: int, group, device: torch.device):
        self.peer, self.group, self.device = peer, group, device
        self.sent_header = False
        self.shape: tuple[int, ...] | None = None
        self.dtype: torch.dtype | None = None
        self.pending: list = []

    def send(self, tensor: torch.Tensor) -> None:
        tensor = tensor.detach().contiguous()
        if not self.sent_header:
            header = torch.zeros(HEADER_LEN, dtype=torch.int64)
            header[0], header[1] = DTYPES.index(tensor.dtype), tensor.dim()
            header[2:2 + tensor.dim()] = torch.tensor(tensor.shape)
            self.pending.append((dist.isend(header.to(self.device), self.peer, group=self.group), header))
            self.sent_header = True
        self.pending.append((dist.isend(tensor, self.peer, group=self.group), tensor))
        self._reap()

    def recv(self) -> torch.Tensor:
        if self.shape is None:
            header = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device)
            dist.recv(header, self.peer, group=self.group)
            header = header.cpu()
            self.dtype = DTYPES[int(header[0])]
            self.shape = tuple(int(d) for d in header[2:2 + int(header[1])])
        buffer = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        dist.recv(buffer, self.peer, group=self.group)
        return buffer

    def _reap(self) -> None:
        """Drop finished sends (keeps the tensors of unfinished ones alive)."""
        self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]

    def drain(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending = []


@dataclass
class TwoBWStage:
    """One pipeline rank's stage under 2BW: two versions of the module, their optimizers, the hooks a step
    ends with (`finish_grads`: DP and tied-embedding gradient reductions of the given version)."""

    versions: list[nn.Module]
    train_versions: list[nn.Module]
    optimizers: list
    stage: int
    num_stages: int
    pp_group: object
    device: torch.device
    num_microbatches: int
    loss_fn: Callable
    finish_grads: Callable[[nn.Module, nn.Module], None]
    autocast_dtype: torch.dtype | None = None
    prev: Channel | None = None
    next: Channel | None = None
    inflight: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        ranks = dist.get_process_group_ranks(self.pp_group)
        if self.stage > 0:
            self.prev = Channel(ranks[self.stage - 1], self.pp_group, self.device)
        if self.stage < self.num_stages - 1:
            self.next = Channel(ranks[self.stage + 1], self.pp_group, self.device)

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def forward(self, k: int, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> None:
        version = (k // self.num_microbatches) % 2
        x = inputs if self.stage == 0 else self.prev.recv().requires_grad_()
        with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            out = self.train_versions[version](x)
        if self.is_last:
            out = self.loss_fn(out, targets) / self.num_microbatches
        else:
            self.next.send(out)
        self.inflight[k] = (x, out)

    def backward(self, k: int) -> torch.Tensor | None:
        """Backward of micro-batch k; returns its (scaled) loss on the last stage."""
        x, out = self.inflight.pop(k)
        if self.is_last:
            out.backward()
        else:
            torch.autograd.backward(out, self.next.recv())
        if self.stage > 0:
            self.prev.send(x.grad)
        return out.detach() if self.is_last else None

    def update(self, step_index: int) -> None:
        """After step `step_index` (0-based)'s last backward: version v held W(t-1); make it W(t+1)."""
        v = step_index % 2
        used, other = self.versions[v], self.versions[1 - v]
        self.finish_grads(self.train_versions[v], used)
        copy_weights(used, other)
        self.optimizers[v].step()
        self.optimizers[v].zero_grad(set_to_none=True)
        share_optimizer_state(self.optimizers[v], self.optimizers[1 - v])

    def drain(self) -> None:
        for channel in (self.prev, self.next):
            if channel is not None:
                channel.drain()


def run_2bw(stage: TwoBWStage, first: int, last: int, batch_of: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
            on_step: Callable[[int, torch.Tensor | None, float], None]) -> None:
    """Train steps first..last-1 (0-based indices, passed to `batch_of`/`on_step`; the weight version of step t is
    t % 2) in one continuous 1F1B stream, drained at the end (the only flush: at checkpoints and the run's end).
    `on_step(t, loss or None, seconds)` runs after this rank's update of step t (loss: the step's mean
    micro-batch loss on the last stage)."""
    m = stage.num_microbatches
    chunks: dict[int, tuple[list, list]] = {}
    losses: list[torch.Tensor] = []
    start = time.perf_counter()
    for kind, local in one_f_one_b_order(stage.stage, stage.num_stages, (last - first) * m):
        k = first * m + local
        t = k // m
        if kind == "F":
            if t not in chunks:
                inputs, targets = batch_of(t)
                chunks[t] = (list(inputs.chunk(m)), list(targets.chunk(m)))
            xs, ys = chunks[t]
            stage.forward(k, xs[k % m] if stage.stage == 0 else None, ys[k % m] if stage.is_last else None)
            continue
        loss = stage.backward(k)
        if loss is not None:
            losses.append(loss)
        if k % m == m - 1:
            chunks.pop(t, None)
            stage.update(t)
            total = torch.stack(losses).sum() if losses else None
            losses = []
            now = time.perf_counter()
            on_step(t, total, now - start)
            start = now
    stage.drain()
