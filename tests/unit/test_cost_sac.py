"""torchtitan's op-level selective activation checkpointing (planner/cost/sac.py) against its source: which mms the
policy recomputes and what it keeps, from the call order of torchtitan's modules; and, where torchtitan is
installed, against torchtitan's own SelectiveAC run on a Llama-shaped block on CPU (mm calls counted)."""

import pytest

from planner.cost import sac
from planner.cost.compute import Shape
from planner.frameworks import load_framework
from planner.schemas.model import MLASpec, MoESpec, ModelSpec

LLAMA3_8B = ModelSpec(name="llama3-8b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, vocab_size=128256, seq_len=8192, activation="swiglu", norm="rmsnorm",
                      position="rope")


def test_llama_block_recomputes_wo_and_w3():
    """wqkv (1) saved, wo (2) recomputed, w1 (3) saved, w3 (4) recomputed, w2 (5) saved."""
    shares = sac.recompute_shares(sac.block_mms(LLAMA3_8B, Shape(microbatch_size=1, seq_len=8192), moe_layer=False))
    assert shares == {"attn_out": 1.0, "mlp": pytest.approx(1 / 3)}


def test_moe_block_recomputes_router_and_grouped_experts():
    """The router gate is force-recomputed and not counted; torch._grouped_mm is not in the save list."""
    spec = LLAMA3_8B.model_copy(update={"moe": MoESpec(num_experts=64, top_k=6, expert_ffn_hidden_size=1408,
                                                       num_shared_experts=2)})
    shares = sac.recompute_shares(sac.block_mms(spec, Shape(microbatch_size=1, seq_len=4096), moe_layer=True))
    assert shares == {"attn_out": 1.0, "router": 1.0, "experts": 1.0, "shared_experts": pytest.approx(1 / 3)}


def test_mla_block_order():
    """wq_a (1) wq_b (2) wkv_a (3) wkv_b (4) wo (5) w1 (6) w3 (7) w2 (8): q_up, kv_up and 2 of 3 FFN mms rerun."""
    spec = LLAMA3_8B.model_copy(update={"mla": MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                                                       qk_rope_head_dim=64, v_head_dim=128)})
    shares = sac.recompute_shares(sac.block_mms(spec, Shape(microbatch_size=1, seq_len=4096), moe_layer=False))
    assert shares == {"q_up": 1.0, "kv_up": 1.0, "mlp": pytest.approx(2 / 3)}


def test_saved_bytes_of_a_llama_block():
    """Input h + wqkv (a+2kv)d + w1 f + w2 h + SDPA output a*d + fp32 log-sum-exp, 16-bit, per token."""
    h, f, a, d, kv = 4096, 14336, 32, 128, 8
    per_token = h + (a + 2 * kv) * d + f + h + a * d + 2 * a
    got = sac.saved_bytes(LLAMA3_8B, Shape(microbatch_size=2, seq_len=8192), moe_layer=False)
    assert got == pytest.approx(2 * per_token * 2 * 8192)
    tp = Shape(microbatch_size=1, seq_len=8192, tp=2, sp=True)  # SP: input /t, two reduce-scatter outputs h/t
    per_token_tp = h / 2 + (a + 2 * kv) * d / 2 + f / 2 + h + a * d / 2 + a + 2 * h / 2
    assert sac.saved_bytes(LLAMA3_8B, tp, moe_layer=False) == pytest.approx(2 * per_token_tp * 8192)


def test_recompute_time_takes_the_shares_and_half_the_sp_collectives():
    shape = Shape(microbatch_size=1, seq_len=8192, tp=2, sp=True)
    got = sac.recompute_s(LLAMA3_8B, shape, moe_layer=False, gemm_fwd_s={"qkv": 1.0, "attn_out": 2.0, "mlp": 3.0},
                          elementwise_s=0.5, tp_fwd_s=0.4, cp_fwd_s=0.1)
    assert got == pytest.approx(2.0 + 1.0 + 0.5 + 0.2 + 0.1)


def test_torchtitan_profile_runs_op_sac():
    assert load_framework("torchtitan").behaviour.memory.selective_recompute == "op_sac"


def test_torchtitans_own_selective_ac_recomputes_the_mms_sac_names():
    """Judge: torchtitan's SelectiveAC wrapped around a block calling its mms in torchtitan's order (fused wqkv,
    SDPA, wo, w1, w3, w2); the mms rerun in backward are those sac.recompute_shares names (2 of 5)."""
    torch = pytest.importorskip("torch")
    ac = pytest.importorskip("torchtitan.distributed.activation_checkpoint")
    from torch.utils._python_dispatch import TorchDispatchMode

    h, f, heads = 64, 128, 4

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wqkv, self.wo = torch.nn.Linear(h, 3 * h, bias=False), torch.nn.Linear(h, h, bias=False)
            self.w1, self.w3 = torch.nn.Linear(h, f, bias=False), torch.nn.Linear(h, f, bias=False)
            self.w2 = torch.nn.Linear(f, h, bias=False)

        def forward(self, x):
            q, k, v = (t.view(2, 16, heads, -1).transpose(1, 2) for t in self.wqkv(x).chunk(3, dim=-1))
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(o.transpose(1, 2).reshape(2, 16, h))
            return x + self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))

    class CountMm(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.mm += func in (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
            return func(*args, **(kwargs or {}))

    def backward_mms(module) -> int:
        x = torch.randn(2, 16, h, requires_grad=True)
        out = module(x).sum()
        with CountMm() as counter:
            out.backward()
        return counter.mm

    torch.manual_seed(0)
    plain = Block()
    wrapped = ac.SelectiveAC(ac.SelectiveAC.Config())._wrap_block(Block())
    recomputed = backward_mms(wrapped) - backward_mms(plain)
    spec = LLAMA3_8B.model_copy(update={"num_kv_heads": None})
    shares = sac.recompute_shares(sac.block_mms(spec, Shape(microbatch_size=1, seq_len=16), moe_layer=False))
    assert recomputed == 2
    assert shares == {"attn_out": 1.0, "mlp": pytest.approx(1 / 3)}  # wo and w3: two mms
