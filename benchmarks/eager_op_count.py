"""Count the aten operators and bytes of HuggingFace Llama training under autocast, to check planner.cost.eager.

Runs LlamaForCausalLM (transformers, attn_implementation="sdpa", fp32 parameters) for a training step under
torch.autocast(bfloat16) with fused AdamW and zero_grad(set_to_none=True), on the CPU, under a TorchDispatchMode
that records every aten operator below autograd (forward, the autograd engine's backward, the optimizer).
Views are not counted (no kernel). Bytes are the sizes of each operator's tensor inputs and outputs. The
difference between a 2-layer and a 1-layer model is one decoder layer; two sequence lengths separate the bytes
that grow with tokens (reported per T*h element) from the per-parameter ones (weight casts, GEMM weights).

CPU autocast casts the same operators to bf16 as CUDA autocast here (linear/matmul and SDPA; every other
operator sees the fp32 residual stream), so the operator sequence is the one an H100 runs; CUDA launches a few
extra kernels inside some operators (slice_backward's zero fill, FlashAttention backward's preprocessing and
GQA reduction), counted here, as the host dispatches them, as one operator each.

    pip install transformers   # 5.17 measured the H100 rows
    python benchmarks/eager_op_count.py [--hidden 2048 --ffn 5632 --heads 32 --kv-heads 4]
"""

from __future__ import annotations

import argparse
import collections
import sys

VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "slice", "select", "unsqueeze", "squeeze", "as_strided",
         "alias", "detach", "permute", "split_with_sizes", "narrow", "unbind", "split", "lift_fresh", "_reshape_alias"}
GEMMS = {"mm", "addmm", "bmm"}


def recorder():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Record(TorchDispatchMode):
        """(phase, operator, bytes) of every non-view aten operator."""

        def __init__(self):
            super().__init__()
            self.phase, self.ops = "fwd", []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name not in VIEWS:
                tensors = [x for x in tree_flatten((args, kwargs, out))[0] if isinstance(x, torch.Tensor)]
                self.ops.append((self.phase, name, sum(x.numel() * x.element_size() for x in tensors)))
            return out

    return Record()


def step_record(layers: int, seq: int, args, *, checkpointing: bool):
    """Per phase: (operators, bytes of memory-bound operators) of the second of two training steps."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=layers,
                                   num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                                   max_position_embeddings=seq, use_cache=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, args.vocab, (1, seq))
    for _ in range(2):
        record = recorder()
        with record:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            record.phase = "bwd"
            loss.backward()
            record.phase = "opt"
            opt.step()
            opt.zero_grad(set_to_none=True)
    ops, nbytes = collections.Counter(), collections.Counter()
    for phase, name, size in record.ops:
        ops[phase] += 1
        if name not in GEMMS and not name.startswith("_scaled_dot_product"):
            nbytes[phase] += size
    return ops, nbytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--hidden", 2048), ("--ffn", 5632), ("--heads", 32), ("--kv-heads", 4), ("--vocab", 256)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args(argv)
    try:
        import transformers  # noqa: F401
    except ModuleNotFoundError:
        print("needs transformers: pip install transformers", file=sys.stderr)
        return 2
    from planner.cost import eager
    from planner.cost.compute import Shape
    from planner.schemas.model import ModelSpec

    short, long = 32, 64
    runs = {(n, s, c): step_record(n, s, args, checkpointing=c) for n in (1, 2) for s in (short, long) for c in (False, True)}
    spec = ModelSpec(name="llama", num_layers=1, hidden_size=args.hidden, ffn_hidden_size=args.ffn, num_attention_heads=args.heads,
                     num_kv_heads=args.kv_heads, vocab_size=args.vocab, seq_len=long, activation="swiglu", norm="rmsnorm")
    ours = eager.decoder_ops(spec, Shape(microbatch_size=1, seq_len=1))
    for phase, predicted_ops, predicted_bytes in (("fwd", ours.fwd_ops, ours.fwd_bytes), ("bwd", ours.bwd_ops, ours.bwd_bytes)):
        ops = runs[2, long, False][0][phase] - runs[1, long, False][0][phase]
        per_token = ((runs[2, long, False][1][phase] - runs[1, long, False][1][phase])
                     - (runs[2, short, False][1][phase] - runs[1, short, False][1][phase])) / (long - short)
        print(f"decoder layer {phase}: {ops} operators (planner.cost.eager {predicted_ops}), memory-bound bytes per T*h "
              f"{per_token / args.hidden:.1f} ({predicted_bytes / args.hidden:.1f}, weight casts aside)")
    recomputed = (runs[2, long, True][0]["bwd"] - runs[1, long, True][0]["bwd"]) - (runs[2, long, False][0]["bwd"] - runs[1, long, False][0]["bwd"])
    print(f"recomputed by checkpointing: {recomputed} operators (planner.cost.eager {ours.fwd_ops - eager.RECOMPUTE_SKIPPED_OPS})")
    for phase in ("fwd", "bwd", "opt"):
        outside = 2 * runs[1, long, False][0][phase] - runs[2, long, False][0][phase]
        print(f"outside the layers, {phase}: {outside} operators")
    return 0


if __name__ == "__main__":
    sys.exit(main())
