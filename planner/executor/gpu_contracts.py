"""The GPU's memory contracts that a trace on fake CPU tensors stands in (planner.executor.memtrace's docstring says
each with its source): FlashAttention-2's and fused RMSNorm's saved tensors, DistributedDataParallel's gradient
buckets, the executor's fused AdamW on CUDA. `counter` is the trace's LiveBytes: its pause() hides the reference
computations that give the stand-ins their exact values.
"""

from __future__ import annotations

import contextlib

import torch

class FlashContract(torch.autograd.Function):
    """Scaled-dot-product attention with FlashAttention-2's memory contract (module docstring): saves q, k, v, the
    output and the fp32 log-sum-exp; the backward makes dq, dk, dv, the fp32 dq accumulator and softmax_d. The values
    come from torch's reference attention, computed while `counter` is paused (its seq x seq scores are not counted)."""

    @staticmethod
    def forward(ctx, q, k, v, counter, is_causal):
        batch, heads, seq_len = q.shape[0], q.shape[1], q.shape[2]
        with counter.pause():
            reference = torch._C._nn.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=is_causal)
        out = torch.empty(batch, seq_len, heads, v.shape[-1], dtype=q.dtype, device=q.device).transpose(1, 2)
        out.copy_(reference)
        lse = torch.empty(batch, heads, seq_len, dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.counter, ctx.is_causal = counter, is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        with ctx.counter.pause(), torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            reference = torch.autograd.grad(
                torch._C._nn.scaled_dot_product_attention(*leaves, is_causal=ctx.is_causal), leaves, grad_out)
        dq_accum = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        softmax_d = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
        grads = [torch.empty_like(t) for t in (q, k, v)]
        for grad, value in zip(grads, reference):
            grad.copy_(value)
        del dq_accum, softmax_d
        return grads[0], grads[1], grads[2], None, None


class RmsNormContract(torch.autograd.Function):
    """RMSNorm as torch runs it on CUDA: the fused kernel (rms_norm -> _fused_rms_norm for CUDA inputs,
    aten/src/ATen/native/layer_norm.cpp; backward in tools/autograd/derivatives.yaml) saves the input, the weight and
    the fp32 rstd (one value per row) and makes grad_input and grad_weight; on CPU rms_norm is composite and saves the
    normalised input as well. Values from the reference, computed while `counter` is paused."""

    @staticmethod
    def forward(ctx, x, shape, weight, eps, counter):
        with counter.pause():
            reference = torch.rms_norm(x.detach(), shape, weight.detach() if weight is not None else None, eps)
        out = torch.empty(reference.shape, dtype=reference.dtype, device=x.device)
        out.copy_(reference)
        rstd = torch.empty((*x.shape[:x.dim() - len(shape)], *(1,) * len(shape)), dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, weight, rstd)
        ctx.counter, ctx.shape, ctx.eps = counter, shape, eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, _ = ctx.saved_tensors
        with ctx.counter.pause(), torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (x, weight) if t is not None]
            reference = torch.autograd.grad(torch.rms_norm(leaves[0], ctx.shape, leaves[1] if weight is not None else None, ctx.eps),
                                            leaves, grad_out)
        grads = [torch.empty_like(t) for t in leaves]
        for grad, value in zip(grads, reference):
            grad.copy_(value)
        return grads[0], None, grads[1] if weight is not None else None, None, None


@contextlib.contextmanager
def gpu_contracts(counter):
    """While the trace runs, F.scaled_dot_product_attention (planner.nn.model.AttentionCore calls it) is FlashContract
    and F.rms_norm (nn.RMSNorm's forward calls it) is RmsNormContract. The functions are swapped on
    torch.nn.functional itself, not through a TorchFunctionMode: activation checkpointing recomputes a block in the
    backward, where such a mode is not active, and the recomputed saved tensors must match the forward's."""
    import torch.nn.functional as F

    sdpa, rms_norm = F.scaled_dot_product_attention, F.rms_norm

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        from torch.distributed.tensor import DTensor

        if attn_mask is not None or dropout_p or kwargs or any(isinstance(t, DTensor) for t in (q, k, v)):
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)
        return FlashContract.apply(q, k, v, counter, is_causal)

    def norm(x, normalized_shape, weight=None, eps=None):
        from torch.distributed.tensor import DTensor

        if not torch.is_grad_enabled() or isinstance(x, DTensor) or isinstance(weight, DTensor):
            return rms_norm(x, normalized_shape, weight, eps)  # sequence-parallel norms: torch's own (CPU) contract
        eps = eps if eps is not None else torch.finfo(x.dtype).eps
        return RmsNormContract.apply(x, tuple(normalized_shape), weight, eps, counter)

    F.scaled_dot_product_attention, F.rms_norm = attention, norm
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.rms_norm = sdpa, rms_norm


DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel(bucket_cap_mb=25), torch/nn/parallel/distributed.py


class DdpContract(torch.nn.Module):
    """DistributedDataParallel's memory as torch's Reducer holds it (torch/csrc/distributed/c10d/reducer.cpp,
    initialize_buckets): one flat gradient buffer per bucket of ~25 MiB, in the parameters' dtype, allocated at
    construction and kept (gradient_as_bucket_view=False: the gradients are separate tensors, copied into the
    buckets, all-reduced in place and copied back, so the step allocates nothing more). The C++ reducer cannot run on
    fake tensors, so the trace stands this in for torch.nn.parallel.DistributedDataParallel (stand_in_ddp)."""

    def __init__(self, module: torch.nn.Module, process_group=None, **_kwargs):
        super().__init__()
        self.module = module
        self.process_group = process_group
        buckets, size = [], 0
        for param in reversed([p for p in module.parameters() if p.requires_grad]):
            if size and (size + param.numel()) * param.element_size() > DDP_BUCKET_BYTES:
                buckets.append(torch.empty(size, dtype=param.dtype, device=param.device))
                size = 0
            size += param.numel()
        if size:
            buckets.append(torch.empty(size, dtype=torch.float32, device=next(module.parameters()).device))
        self.buckets = buckets

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        yield

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, names) -> None:
        return None


@contextlib.contextmanager
def stand_in_ddp():
    """torch.nn.parallel.DistributedDataParallel is DdpContract while the job is built (apply_dp imports it then)."""
    import torch.nn.parallel as parallel

    real = parallel.DistributedDataParallel
    parallel.DistributedDataParallel = DdpContract
    try:
        yield
    finally:
        parallel.DistributedDataParallel = real


@contextlib.contextmanager
def meshes_outside_fake(counter):
    """DeviceMesh's own index tensors (which rank sits where: `(mesh == rank).nonzero()`, a data-dependent shape) are
    made on real CPU tensors, as the executor makes them, not under the trace's FakeTensorMode, and not counted (they
    live on the host). FSDP2 over a TP mesh builds such a mesh inside fully_shard (DeviceMesh._concatenate)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    real_init = DeviceMesh.__init__

    def init(self, *args, **kwargs):
        with unset_fake_temporarily(), counter.pause():
            real_init(self, *args, **kwargs)

    DeviceMesh.__init__ = init
    try:
        yield
    finally:
        DeviceMesh.__init__ = real_init


def cuda_optimizer_defaults(optimizers) -> None:
    """The optimizer the executor builds on CUDA, on the trace's CPU tensors: AdamW groups get
    parallelize.adamw_impl's answer for CUDA (fused=True, one kernel and no temporaries; the per-tensor loop where
    DTensors and plain tensors mix); other optimizers (SGD) what torch would choose on CUDA, foreach for plain tensors
    (torch.optim.optimizer _default_to_fused_or_foreach); on CPU torch would take the loop. MasterWeightOptimizer's
    inner AdamW is reached through `.optim` (inner_optimizers)."""
    from torch.distributed.tensor import DTensor

    from planner.executor.parallelize import adamw_impl

    for opt in optimizers:
        for inner in inner_optimizers(opt):
            for group in inner.param_groups:
                if isinstance(inner, torch.optim.Adam | torch.optim.AdamW) and "fused" in group:
                    group.update({"fused": False, "foreach": None} | adamw_impl(group["params"], on_cuda=True))
                elif "foreach" in group and group["foreach"] is None and not group.get("fused"):
                    group["foreach"] = not any(isinstance(p, DTensor) for p in group["params"])


def inner_optimizers(opt) -> list:
    """The torch optimizers inside the executor's wrappers (CombinedOptimizer.optimizers; ZeRO-1's and
    MasterWeightOptimizer's .optim, nested: ZeRO-1 over master weights wraps one in the other)."""
    if hasattr(opt, "optimizers"):
        return [o for each in opt.optimizers for o in inner_optimizers(each)]
    inner = getattr(opt, "optim", None)
    if isinstance(inner, torch.optim.Optimizer):
        return [inner]
    return inner_optimizers(inner) if inner is not None else [opt]


def master_weights(opt) -> list:
    """The fp32 master copies the executor's bf16 recipe keeps in its optimizer (MasterWeightOptimizer.masters),
    through the same wrappers: optimizer bytes (behaviour.memory.recipes bf16: optimizer 12 = master 4 + m, v 8)."""
    if hasattr(opt, "optimizers"):
        return [m for each in opt.optimizers for m in master_weights(each)]
    if hasattr(opt, "masters"):
        return list(opt.masters)
    inner = getattr(opt, "optim", None)
    return master_weights(inner) if inner is not None and not isinstance(inner, torch.optim.Optimizer) else []


@contextlib.contextmanager
def pipeline_metadata(sent: dict):
    """torch.distributed.pipelining on a fake process group: the schedule's warm-up vote reads a received tensor on
    the host (result.item()) and the stages exchange their shapes as pickled objects (send/recv_object_list), neither
    of which a fake backend carries. While the trace runs, the vote is skipped (every stage infers its shapes at run
    time, torch's DYNAMIC mode) and the metadata a stage sends is kept in `sent`, keyed (from stage, to stage), for the
    ranks traced after it (memtrace traces them in pipeline order). A stage whose sender is traced later gets the
    metadata its own shapes imply: a gradient like its output (backward), the hidden states another stage of this
    rank already sent (forward, interleaved stages). torch internals (2.13): a different torch fails the trace, which
    then says it was not verified."""
    from torch.distributed.pipelining import schedules, stage
    from torch.distributed.pipelining._utils import InferenceMode, _derive_grad_metas, _StageBackwardMeta

    def warmup(self, stages, has_backward, p2p_done):
        for each in stages:
            each._inference_mode = InferenceMode.DYNAMIC

    def send(self, meta, dst_stage):
        sent[(self.stage_index, dst_stage)] = meta

    def recv(self, src_stage):
        if (src_stage, self.stage_index) in sent:
            return sent[(src_stage, self.stage_index)]
        if src_stage > self.stage_index:  # a gradient of this stage's outputs
            return _StageBackwardMeta(backward_metas=_derive_grad_metas(self._stage_meta.outputs))
        forward = [meta for (src, dst), meta in sent.items() if dst > src]
        if not forward:
            raise RuntimeError(f"stage {self.stage_index}: no forward metadata from stage {src_stage} yet")
        return forward[-1]

    saved = (schedules._PipelineSchedule._warmup_p2p, stage.PipelineStage._send_meta, stage.PipelineStage._recv_meta)
    schedules._PipelineSchedule._warmup_p2p = warmup
    stage.PipelineStage._send_meta, stage.PipelineStage._recv_meta = send, recv
    try:
        yield
    finally:
        schedules._PipelineSchedule._warmup_p2p, stage.PipelineStage._send_meta, stage.PipelineStage._recv_meta = saved
