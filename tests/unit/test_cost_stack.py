"""The cost model reads the request's software stack (planner.cost.stack): each mechanism against its source."""

import dataclasses

import pytest

from planner import api
from planner.cost import comm
from planner.schedules import schedule
from planner.cost.evaluate import dp_comm_s
from planner.cost.model import Candidate, CostModel, CostOptions
from planner.cost.p2p import pp_comm_s
from planner.cost.stack import options_for
from planner.topology.groups import GroupLink


def _model(framework: str, **request) -> CostModel:
    req = api.build_request(**request)
    return CostModel(req.model_copy(update={"framework": framework}))


def test_profiles_map_to_options():
    """frameworks/*.yaml behaviour -> CostOptions: megatron-core overlaps and fuses; 2021 Megatron-LM neither
    overlaps the gradient all-reduce nor has flash attention, and splits pipeline sends over TP ranks; DeepSpeed's
    ZeRO-3 calls the same NCCL collectives as every stack (hierarchical cost) and re-gathers for the recompute forward."""
    core, lm, ds = (options_for(name, "bf16") for name in ("megatron-core", "megatron-lm", "deepspeed"))
    assert core.pp_overlap and core.flash_attention and core.tp_overlap and core.dp_overlap
    assert not lm.flash_attention and not lm.dp_overlap and not lm.pp_overlap and lm.pp_scatter_gather
    assert ds.zero3_hierarchical and ds.zero3_regather_for_recompute and core.zero3_hierarchical
    assert options_for("megatron-core", "fp32").flash_attention is False
    fsdp, titan = options_for("pytorch-fsdp", "bf16"), options_for("torchtitan", "bf16")
    assert fsdp.allocator == "default" and fsdp.allocator_fraction is None  # calibration.yaml memory.default
    assert titan.allocator == "expandable_segments" and core.allocator == "expandable_segments"  # their launch scripts


def test_overlapped_p2p_leaves_only_the_fill_exposed():
    """Megatron-Core --overlap-p2p-comm posts the steady-state sends beside compute: p - 1 transfers stay."""
    assert schedule("interleaved").p2p_transfers(pp=8, vpp=2, num_microbatches=32) == 32 * 2 + 7
    assert schedule("interleaved").p2p_transfers(pp=8, vpp=2, num_microbatches=32, overlapped=True) == 7
    assert schedule("1f1b").p2p_transfers(pp=1, vpp=1, num_microbatches=32, overlapped=True) == 0


def test_scatter_gather_sends_one_tp_share_over_the_nic():
    """Narayanan et al. 2021 Sec. 4.1: with TP t and no SP each rank sends 1/t of the boundary tensor."""
    kw = dict(model="gpt3-175b", topology="dgx-a100-80g", gpus=512, global_batch_size=512, seq_len=2048)
    cand = Candidate(dp=4, tp=8, pp=16, microbatch_size=1, num_microbatches=128)
    req = api.build_request(**kw).model_copy(update={"framework": "megatron-lm"})
    split = pp_comm_s(CostModel(req), cand)
    whole = pp_comm_s(CostModel(req, options=options_for("megatron-lm", "bf16").__class__(
        **{**options_for("megatron-lm", "bf16").__dict__, "pp_scatter_gather": False})), cand)
    link = CostModel(req).links(cand).pp
    latency_part = 2 * schedule("1f1b").p2p_transfers(pp=16, vpp=1, num_microbatches=128) * link.latency_s
    assert split - latency_part == pytest.approx((whole - latency_part) / 8, rel=1e-6)


def test_flat_ring_time_does_not_shrink_with_the_group():
    """A flat all-gather ring moves (n-1)/n of the buffer through each rank's NIC share: about bytes / share at any
    n, where the hierarchical one crosses the NICs once per node (bytes / ranks_per_node)."""
    def link(n):
        return GroupLink(size=n, num_nodes=n // 8, ranks_per_node=8, inter_bandwidth_GBps=23.0, inter_latency_s=0.0,
                         intra_bandwidth_GBps=230.0, intra_latency_s=0.0)
    big = 349e9
    flat_768, flat_1536 = comm.flat_ring_s(big, group=link(768)), comm.flat_ring_s(big, group=link(1536))
    assert flat_768 == pytest.approx(big / 23e9, rel=0.01) and flat_1536 == pytest.approx(flat_768, rel=0.01)
    assert comm.all_gather_s(big, group=link(768)) < flat_768 / 4


def test_zero3_regathers_for_the_recompute_forward():
    """DeepSpeed ZeRO-3 with full recompute: three all-gathers per micro-batch instead of two."""
    m = _model("deepspeed", model="gpt3-175b", topology="dgx-a100-80g", gpus=64, global_batch_size=64, seq_len=2048)
    full = Candidate(dp=64, tp=1, pp=1, zero_stage=3, microbatch_size=1, num_microbatches=1, recompute="full")
    none = Candidate(dp=64, tp=1, pp=1, zero_stage=3, microbatch_size=1, num_microbatches=1, recompute="none")
    link = m.links(full).dp
    gather = comm.all_gather_s(1e9 * m.recipe.gather_bytes, group=link)  # the NCCL collective every stack calls
    per_layer = comm.half_ring_latency_s(link)  # each further layer's own all-gather (compression.zero3_unit_latency_s)
    extra = gather + (m.spec.num_layers - 1) * per_layer
    assert dp_comm_s(m, full, 1e9, 0.0) - dp_comm_s(m, none, 1e9, 0.0) == pytest.approx(extra, rel=1e-9)


def _zero3_step(framework, gpus, mbs):
    m = _model(framework, model="gpt3-175b", topology="dgx-a100-80g", gpus=gpus, global_batch_size=1536, seq_len=2048)
    cand = Candidate(dp=gpus, tp=1, pp=1, zero_stage=3, microbatch_size=mbs, num_microbatches=1536 // (gpus * mbs),
                     recompute="full")
    return m, cand, m.evaluate(cand)


def test_zero3_collectives_cost_the_same_in_every_stack():
    """DeepSpeed's ZeRO-3 calls torch.distributed.all_gather_into_tensor / reduce_scatter_tensor on the dp group
    (partition_parameters.py _dist_allgather_fn, coalesced_collectives.py), the NCCL calls every stack makes: its
    step shrinks with dp as megatron-core's does (no flat-ring reading)."""
    for framework in ("deepspeed", "megatron-core"):
        assert _zero3_step(framework, 1536, 1)[2].step_time_s < 0.7 * _zero3_step(framework, 768, 2)[2].step_time_s


def test_deepspeed_2021_gathers_each_tensor_synchronously():
    """DeepSpeed before v0.5.6 (partition_parameters.py _allgather_param at v0.4.0): per parameter tensor a
    synchronous all_gather into world_size outputs, copied out one by one: exposed m * gathers * (collective +
    tensors * dp copies), the copies at the measured per-kernel time."""
    from planner.cost import zero3_legacy

    old_m, cand, old = _zero3_step("legacy/deepspeed-2021", 1536, 1)
    _, _, new = _zero3_step("deepspeed", 1536, 1)
    layer = float(old_m.detail(cand).dense_params[1])
    assert zero3_legacy.tensors_per_layer(old_m.spec) == (12 if old_m.spec.linear_bias else 8)
    per_rank = float(old_m.detail(cand).dense_params.sum())
    copies = 3 * per_rank / zero3_legacy.params_per_tensor(old_m.spec, layer) * 1536 * old_m.cal.eager_kernel_s
    assert old.breakdown.dp_comm_exposed_s > copies > 0
    assert old.step_time_s > new.step_time_s + copies * 0.99


def test_explicit_options_keep_the_old_defaults():
    options = CostOptions()
    assert options.zero3_hierarchical and not options.pp_overlap and options.allocator_fraction is None


def test_tp_overlap_hides_the_collectives_behind_the_gemms():
    """TE userbuffers (Megatron-Core --tp-comm-overlap) pipeline each AG/RS with its GEMM in tp chunks: the first
    chunk stays exposed, and whatever exceeds the GEMM time."""
    assert comm.chunked_overlap_exposed_s(8.0, 100.0, chunks=8) == pytest.approx(1.0)
    assert comm.chunked_overlap_exposed_s(8.0, 2.0, chunks=8) == pytest.approx(6.0)
    kw = dict(model="llama3-70b", topology="dgx-h100", gpus=8, global_batch_size=8, seq_len=4096)
    cand = Candidate(dp=1, tp=8, pp=1, sp=True, microbatch_size=1, num_microbatches=8, recompute="full")
    overlapped = _model("megatron-core", **kw).detail(cand).tp_s[1]  # one decoder layer
    exposed = _model("megatron-lm", **kw).detail(cand).tp_s[1]
    assert overlapped == pytest.approx(exposed / 8, rel=1e-9)


def test_deepspeed_reduces_gradients_in_the_16_bit_dtype():
    """DeepSpeed ZeRO's communication_data_type defaults to the model dtype: half the reduce bytes of Megatron's
    fp32 main-grad all-reduce (--accumulate-allreduce-grads-in-fp32)."""
    kw = dict(model="gpt3-175b", topology="dgx-a100-80g", gpus=64, global_batch_size=64, seq_len=2048)
    cand = Candidate(dp=64, tp=1, pp=1, zero_stage=1, microbatch_size=1, num_microbatches=1)
    ds, core = _model("deepspeed", **kw), _model("megatron-core", **kw)
    assert not options_for("deepspeed", "bf16").grad_reduce_fp32 and options_for("megatron-core", "bf16").grad_reduce_fp32
    link = ds.links(cand).dp
    rs16, rs32 = comm.reduce_scatter_s(2e9, group=link), comm.reduce_scatter_s(4e9, group=link)
    assert dp_comm_s(core, cand, 1e9, 0.0) - dp_comm_s(ds, cand, 1e9, 0.0) == pytest.approx(rs32 - rs16, rel=1e-9)


def test_kernel_bytes_follow_the_recipe_for_every_stack():
    """Flash attention from the stack; norm/activation kernel bytes from the precision recipe (planner.cost.stack)."""
    for framework in ("megatron-core", "planner", "torchtitan", "pytorch-fsdp"):
        for precision, fused in (("bf16", True), ("amp-bf16", False), ("fp32", False)):
            if framework == "planner" and precision == "bf16":
                fused = False  # the executor runs bf16 under autocast, eagerly (behaviour.executor.bf16_recipe)
            req = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=1, global_batch_size=1, precision=precision)
            assert CostModel(req.model_copy(update={"framework": framework})).fused_kernels is fused
    assert CostModel(api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=1, global_batch_size=1)
                     .model_copy(update={"framework": "megatron-lm"})).flash_attention is False


def test_torchtitan_selective_reruns_its_per_op_policy():
    """torchtitan's selective AC as 0.3 runs it (planner.cost.sac): wo and w3 rerun with the pointwise work, less than
    half a forward; the block keeps its input and the saved op outputs; Megatron's reruns only the attention core,
    the fused kernel's forward too (attention.py checkpoint_core_attention), a small part of the layer."""
    from planner.cost import sac

    kw = dict(model="llama3-8b", topology="dgx-a100-80g", gpus=8, global_batch_size=8, seq_len=4096)
    cand = Candidate(dp=8, tp=1, pp=1, zero_stage=3, microbatch_size=1, num_microbatches=1, recompute="selective")
    titan_model = _model("torchtitan", **kw)
    titan, core = titan_model.layer_costs(cand), _model("megatron-core", **kw).layer_costs(cand)
    assert 0 < titan.recompute_s[1] < titan.full_recompute_s[1] / 2
    assert 0 < core.recompute_s[1] < core.full_recompute_s[1] / 4
    saved = sac.saved_bytes(titan_model.spec, titan_model.shape(cand), moe_layer=False)
    assert titan.activation_bytes[1] == pytest.approx(saved, rel=1e-9)


def test_hierarchical_dispatch_crosses_each_node_once():
    """DeepSeek-V3 Sec. 3.2.2 / DeepEP: a token picks top_k experts over N nodes and crosses IB once per distinct
    remote node, N(1 - (1 - 1/N)^k)(N - 1)/N copies, against k (n - rpn)/n for a flat all-to-all."""
    link = GroupLink(size=64, num_nodes=8, ranks_per_node=8, inter_bandwidth_GBps=45.0, inter_latency_s=0.0,
                     intra_bandwidth_GBps=160.0, intra_latency_s=0.0)
    size = 4096 * 8 * 7168 * 2.0
    flat = comm.all_to_all_s(size, group=link)
    hier = comm.hierarchical_all_to_all_s(size, top_k=8, group=link)
    remote = 8 * (1 - (7 / 8) ** 8) * 7 / 8
    assert flat == pytest.approx(size * 56 / 64 / 45e9, rel=1e-9)
    assert hier == pytest.approx(remote * size / 8 / 45e9, rel=1e-9)
    assert options_for("hai-llm", "fp8").moe_overlap and options_for("hai-llm", "fp8").moe_hierarchical
    assert options_for("megatron-core", "bf16").moe_overlap  # --overlap-moe-expert-parallel-comm, a setting the plan sets
    assert not options_for("torchtitan", "bf16").moe_overlap and not options_for("deepspeed", "bf16").moe_overlap


def test_fp8_saves_gemm_inputs_in_one_byte():
    """Transformer Engine keeps the fp8 cast of a Linear's input for backward: the GEMM-input terms of
    Korthikanti's count (QKV input, out-proj input, FFN input, fc2 input) drop from 2 to 1 byte per element."""
    from planner.cost.compute import Shape
    from planner.cost.memory import decoder_activation_bytes
    from planner.models import load_model

    spec = load_model("gpt3-175b")  # plain GeLU FFN, f = 4h, MHA
    bf16 = decoder_activation_bytes(spec, Shape(microbatch_size=1, seq_len=2048), moe_layer=False)
    fp8 = decoder_activation_bytes(spec, Shape(microbatch_size=1, seq_len=2048, fp8_inputs=True), moe_layer=False)
    sbh = 2048 * spec.hidden_size
    # QKV input + FFN input + out-proj input (h each) + fc2 input (f = 4h): 7 sbh elements one byte cheaper
    assert bf16.none - fp8.none == pytest.approx(7 * sbh, rel=1e-9)


def test_deepseek_selective_drops_norms_and_up_projections():
    """hai-llm's selective recompute (DeepSeek-V3 Sec. 3.2.3) keeps the MLA latents instead of the up-projected
    Q, K, V and reruns the norms and the up-projection GEMMs."""
    kw = dict(model="deepseek-v3", topology="hgx-h800", gpus=256, global_batch_size=256, seq_len=4096, precision="fp8")
    cand = Candidate(dp=16, tp=1, pp=16, ep=8, zero_stage=1, microbatch_size=1, num_microbatches=16, recompute="selective")
    hai, core = _model("hai-llm", **kw), _model("megatron-core", **kw)
    assert options_for("hai-llm", "fp8").selective_mode == "norm_and_up_proj"
    hai_costs, core_costs = hai.layer_costs(cand), core.layer_costs(cand)
    assert hai_costs.activation_bytes[5] < 0.8 * core_costs.activation_bytes[5]
    assert 0 < hai_costs.recompute_s[5] < 0.2 * hai_costs.full_recompute_s[5]
    assert 0 < core_costs.recompute_s[5] < 0.2 * core_costs.full_recompute_s[5]  # Megatron's default: the fused core reruns
    modules = dataclasses.replace(cand, recompute_modules=("layernorm", "mla_up_proj"))
    none = dataclasses.replace(cand, recompute="none")
    same = core.layer_costs(modules)  # --recompute-modules layernorm mla_up_proj on megatron-core drops what hai-llm's does
    dropped = core.layer_costs(none).activation_bytes[5] - same.activation_bytes[5]
    assert dropped == pytest.approx(hai.layer_costs(none).activation_bytes[5] - hai_costs.activation_bytes[5], rel=1e-9)
    assert hai.layer_costs(modules).recompute_s[5] == pytest.approx(hai_costs.recompute_s[5], rel=1e-12)  # the mode is that set


def test_flash_attention_v1_runs_at_the_published_fraction_of_v2():
    """Dao 2023 (FlashAttention-2): ~2x over FlashAttention; a v1 stack's attention core takes twice as long."""
    from planner.cost.calibration import flash_attention_1_relative_rate

    kw = dict(model="llama3-8b", topology="dgx-a100-80g", gpus=8, global_batch_size=8, seq_len=8192)
    v1, v2 = _model("pytorch-fsdp", **kw), _model("torchtitan", **kw)
    assert options_for("pytorch-fsdp", "bf16").attention_kernel == "flash-attention-1"
    assert v1.cal.attention_fraction == pytest.approx(v2.cal.attention_fraction * flash_attention_1_relative_rate())
    assert flash_attention_1_relative_rate() == pytest.approx(0.5)


def test_overlapped_param_gather_hides_behind_the_first_forward():
    """Megatron-Core --overlap-param-gather: the ZeRO-1 weight all-gather runs beside the next step's first forward,
    the gradient reduce-scatter beside the last backward; a stack that gathers inside step() (dp_param_gather
    false) exposes what does not fit the backward. Same request, same candidate, only the option differs."""
    from planner.cost.evaluate import dp_gather_s

    req = api.build_request(model="gpt3-175b", topology="dgx-h100", gpus=768, global_batch_size=384, seq_len=2048)
    cand = Candidate(dp=48, tp=8, pp=2, zero_stage=1, microbatch_size=1, num_microbatches=8, schedule="1f1b", sp=True)
    core = options_for("megatron-core", "bf16")
    assert core.dp_gather_overlap and not options_for("deepspeed", "bf16").dp_gather_overlap
    overlapped = CostModel(req.model_copy(update={"framework": "megatron-core"}), options=core)
    serial = CostModel(req.model_copy(update={"framework": "megatron-core"}),
                       options=dataclasses.replace(core, dp_gather_overlap=False))
    a, b = overlapped.evaluate(cand), serial.evaluate(cand)
    assert a.step_time_s < b.step_time_s
    gather = dp_gather_s(overlapped, cand, 87.5e9 / 8, 0.0)  # one pipeline rank's parameters, tp-sharded
    assert gather > 0 and dp_gather_s(overlapped, dataclasses.replace(cand, zero_stage=3), 1e9, 0.0) == 0.0
    # what moved is the DP term only, by at most the gather (it hid behind the forward instead of the backward)
    moved = b.breakdown.dp_comm_exposed_s - a.breakdown.dp_comm_exposed_s
    assert 0 < moved <= gather * 1.01
    assert a.breakdown.compute_s == pytest.approx(b.breakdown.compute_s)


def test_zero3_legacy_tensor_count_follows_the_layer():
    """Megatron's layer as ZeRO-3 partitions it: fused QKV, out-proj, fc1, fc2 and two norms; GPT-style biases on
    every linear and LayerNorm double it (12), an RMSNorm model without biases has 6."""
    from planner.cost import zero3_legacy

    spec = _model("deepspeed", model="gpt3-175b", topology="dgx-a100-80g", gpus=8, global_batch_size=8, seq_len=2048).spec
    gpt = spec.model_copy(update={"linear_bias": True, "norm": "layernorm"})
    llama = spec.model_copy(update={"linear_bias": False, "norm": "rmsnorm"})
    assert zero3_legacy.tensors_per_layer(gpt) == 12 and zero3_legacy.tensors_per_layer(llama) == 6
    assert zero3_legacy.exposed_s(params=1.2e9, per_tensor=1e8, dp=100, gathers=3, num_microbatches=2,
                                  gather_s=0.5, copy_s=1e-5) == pytest.approx(2 * 3 * (0.5 + 12 * 100 * 1e-5))
    assert zero3_legacy.exposed_s(params=1e9, per_tensor=1e8, dp=1, gathers=3, num_microbatches=2, gather_s=0.5,
                                  copy_s=1e-5) == 0.0


def test_megatron_grad_reduce_in_bf16_keeps_a_bf16_gradient_buffer():
    """Megatron's --grad-reduce-in-bf16 (compression bf16-grads) sets DistributedDataParallelConfig.grad_reduce_in_fp32
    False, and the DDP buffer takes the parameter dtype (megatron/core/distributed/distributed_data_parallel.py:
    grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype): 2 bytes per parameter instead of 4. DeepSpeed's
    communication_data_type only changes the wire dtype: its buffer stays."""
    from planner.schemas.compression import Compression

    def grads(framework, methods):
        m = _model(framework, model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=4096)
        cand = Candidate(dp=8, tp=1, pp=1, zero_stage=1, microbatch_size=1, num_microbatches=8,
                         compression=Compression(methods=methods))
        return m.evaluate(cand).stage_memory[0].grads_bytes

    assert grads("megatron-core", ("bf16-grads",)) == pytest.approx(grads("megatron-core", ()) / 2)
    assert grads("deepspeed", ("bf16-grads",)) == pytest.approx(grads("deepspeed", ()))
