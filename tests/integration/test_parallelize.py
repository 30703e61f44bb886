"""Each parallelism, applied to the reference model, trains like a single process (gloo, CPU, fp32).

One launch of 2 processes runs many layouts back to back (start-up dominates on this box); one launch of
4 processes runs the 2-D layouts. Every layout trains the same seeded model on the same global batches for
3 steps and must give the single-process per-step losses within 1e-4 relative.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from planner.schemas.model import ModelSpec, MoESpec  # noqa: E402

STEPS, GLOBAL_BATCH, SEQ, LR, SEED = 3, 4, 16, 1e-2, 0
REL_TOL = 1e-4

LLAMA = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                  num_kv_heads=2, vocab_size=64, seq_len=SEQ, activation="swiglu", norm="rmsnorm", qk_norm=True)
GPT = ModelSpec(name="tiny-gpt", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                vocab_size=64, seq_len=SEQ, activation="gelu", norm="layernorm", position="learned",
                linear_bias=True, tied_embeddings=True)
MOE = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                vocab_size=64, seq_len=SEQ, activation="swiglu", norm="rmsnorm",
                moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, num_shared_experts=1,
                            capacity_factor=1.0, first_k_dense=1))


def _model(spec):
    from planner.nn import Transformer

    model = Transformer(spec)
    model.init_weights(SEED)
    return model


def _batches(spec):
    from planner.executor.train import synthetic_batches

    return synthetic_batches(vocab_size=spec.vocab_size, batch_size=GLOBAL_BATCH, seq_len=SEQ, steps=STEPS, seed=SEED + 1)


def reference(spec, *, num_microbatches=1):
    """Single process, no process group: losses and MoE drop counts."""
    from planner.executor.parallelize import build_optimizer, dropped_tokens
    from planner.executor.train import train_steps

    model = _model(spec)
    opt = build_optimizer(model, zero_stage=0, lr=LR)
    losses = train_steps(model, opt, _batches(spec), num_microbatches=num_microbatches)
    return losses, dropped_tokens(model)


def run_layout(spec, *, dp_mesh=None, tp_mesh=None, sp=False, zero_stage=0, ep_group=None, domino=False,
               ac=None, loss_parallel=False):
    """Apply a layout in the documented order and train; returns (losses averaged over dp, dropped, routed)."""
    from torch.distributed.tensor.parallel import loss_parallel as lp_context

    from planner.executor.domino import apply_domino_tp
    from planner.executor.parallelize import apply_ac, apply_dp, apply_ep, apply_tp, build_optimizer, dropped_tokens
    from planner.executor.train import shard_batch, train_steps

    model = _model(spec)
    if ep_group is not None:
        apply_ep(model, ep_group)
    if domino:
        apply_domino_tp(model, tp_mesh.get_group())
    elif tp_mesh is not None:
        apply_tp(model, tp_mesh, sp=sp, loss_parallel=loss_parallel)
    if ac is not None:
        apply_ac(model, *ac)
    batches, dp_group = _batches(spec), None
    if dp_mesh is not None:
        dp_group = dp_mesh.get_group()
        rank, size = dist.get_rank(dp_group), dist.get_world_size(dp_group)
        batches = [shard_batch(b, rank=rank, size=size) for b in batches]
        model = apply_dp(model, dp_mesh, zero_stage=zero_stage)
    opt = build_optimizer(model, zero_stage=zero_stage, dp_group=dp_group, lr=LR)
    local_numel = sum(_local_numel(p) for p in {id(p): p for p in model.parameters()}.values())
    losses = train_steps(model, opt, batches, loss_group=dp_group, loss_context=lp_context if loss_parallel else None)
    dropped, routed = dropped_tokens(model)
    if dp_group is not None:
        counts = torch.tensor([dropped, routed])
        dist.all_reduce(counts, group=dp_group)
        dropped, routed = counts.tolist()
    return losses, (dropped, routed), local_numel


def _local_numel(p) -> int:
    return p.to_local().numel() if hasattr(p, "to_local") else p.numel()


def _layouts_2(mesh):
    """name -> (spec, reference microbatches, layout kwargs) on 2 ranks."""
    group = mesh.get_group()
    return {
        "dp2_ddp": (LLAMA, 1, dict(dp_mesh=mesh, zero_stage=0)),
        "dp2_zero1": (LLAMA, 1, dict(dp_mesh=mesh, zero_stage=1)),
        "dp2_zero2_fsdp": (LLAMA, 1, dict(dp_mesh=mesh, zero_stage=2)),
        "dp2_zero3_fsdp": (LLAMA, 1, dict(dp_mesh=mesh, zero_stage=3)),
        "dp2_zero3_full_ac": (LLAMA, 1, dict(dp_mesh=mesh, zero_stage=3, ac=("full", 0))),
        "tp2": (LLAMA, 1, dict(tp_mesh=mesh)),
        "tp2_sp": (LLAMA, 1, dict(tp_mesh=mesh, sp=True)),
        "tp2_sp_gpt_loss_parallel": (GPT, 1, dict(tp_mesh=mesh, sp=True, loss_parallel=True)),
        "tp2_sp_selective_ac": (GPT, 1, dict(tp_mesh=mesh, sp=True, ac=("selective", 1))),
        "domino_tp2": (LLAMA, 1, dict(tp_mesh=mesh, domino=True)),
        "domino_tp2_gpt": (GPT, 1, dict(tp_mesh=mesh, domino=True)),
        "ep2_ddp": (MOE, 2, dict(dp_mesh=mesh, ep_group=group, zero_stage=0)),
        "ep2_zero3_fsdp": (MOE, 2, dict(dp_mesh=mesh, ep_group=group, zero_stage=3)),
        "ep2_zero1": (MOE, 2, dict(dp_mesh=mesh, ep_group=group, zero_stage=1)),
    }


def _layouts_4(mesh):
    """dp x tp = 2 x 2 layouts on 4 ranks."""
    dp, tp = mesh["dp"], mesh["tp"]
    return {
        "dp2xtp2_sp_zero3": (LLAMA, 1, dict(dp_mesh=dp, tp_mesh=tp, sp=True, zero_stage=3)),
        "dp2xtp2_zero0": (GPT, 1, dict(dp_mesh=dp, tp_mesh=tp, zero_stage=0)),
        "dp2xdomino_tp2": (LLAMA, 1, dict(dp_mesh=dp, tp_mesh=tp, domino=True, zero_stage=0)),
        "ep2xtp2_sp_zero2": (MOE, 2, dict(dp_mesh=dp, tp_mesh=tp, sp=True, ep_group=dp.get_group(), zero_stage=2)),
    }


def _worker(rank, world, port, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        if world == 2:
            layouts = _layouts_2(init_device_mesh("cpu", (2,), mesh_dim_names=("x",)))
        else:
            layouts = _layouts_4(init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")))
        results = {}
        for name, (spec, ref_mb, kwargs) in layouts.items():
            ref_losses, ref_drops = reference(spec, num_microbatches=ref_mb)
            losses, drops, local_numel = run_layout(spec, **kwargs)
            full_numel = sum(p.numel() for p in _model(spec).parameters())
            results[name] = {"ref": ref_losses, "got": losses, "ref_drops": list(ref_drops), "drops": list(drops),
                             "sharded": local_numel < full_numel}
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(world, tmp_path):
    out = tmp_path / f"results_{world}.json"
    mp.spawn(_worker, args=(world, _free_port(), str(out)), nprocs=world, join=True)
    return json.loads(out.read_text())


def _check(results):
    bad = []
    for name, r in results.items():
        assert len(r["got"]) == STEPS, name
        for step, (ref, got) in enumerate(zip(r["ref"], r["got"])):
            if abs(got - ref) > REL_TOL * abs(ref):
                bad.append(f"{name} step {step}: got {got:.8f}, single process {ref:.8f}")
        if not name.startswith("dp2_zero1") and not name.startswith("dp2_ddp"):  # these replicate parameters
            assert r["sharded"], f"{name}: rank 0 holds every parameter: the layout was not applied"
        assert r["drops"] == r["ref_drops"], f"{name}: dropped/routed {r['drops']} != single process {r['ref_drops']}"
    assert not bad, "\n".join(bad)


def test_two_process_layouts_match_single_process(tmp_path):
    results = _launch(2, tmp_path)
    _check(results)
    # the losses must move (the check is not vacuous) and the capacity factor must drop some tokens
    assert results["dp2_ddp"]["ref"][0] != results["dp2_ddp"]["ref"][-1]
    assert results["ep2_ddp"]["drops"][0] > 0 and results["ep2_ddp"]["drops"][1] > 0


def test_four_process_2d_layouts_match_single_process(tmp_path):
    _check(_launch(4, tmp_path))
