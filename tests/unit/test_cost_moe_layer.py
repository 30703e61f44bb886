"""The MoE layer as the stacks run it besides the expert GEMMs and the EP all-to-all (planner.cost.moe_layer,
compute.moe_rows / moe_permutation_rows / expert_launches, memory's expert input): each term against its formula,
and where the framework is installed, against the framework's own code."""

import dataclasses
import inspect

import pytest

from planner import api
from planner.cost import comm, compute, memory, moe_comm, moe_layer
from planner.cost.layer_terms import Env, ep_options, tp_times
from planner.cost.layers import decoder_cost
from planner.cost.model import Candidate, CostModel
from planner.cost.stack import options_for
from planner.models import counting

MOE_OFF = dict(moe_sp_dispatch=False, moe_expert_launches="per_expert", moe_expert_sort="never", moe_count_exchange="none")


def _model(framework="megatron-core", model="mixtral-8x7b", **options):
    m = CostModel(api.build_request(model=model, topology="dgx-h100", gpus=16, global_batch_size=16, seq_len=4096,
                                    framework=framework))
    return CostModel(m.request, options=dataclasses.replace(m.options, **options)) if options else m


def _env(m, cand):
    return Env(spec=m.spec, device=m.device, cal=m.cal, precision=m.request.precision, shape=m.shape(cand),
                           links=m.links(cand), tp_overlap="none", moe_count_exchange=m.options.moe_count_exchange)


TP4 = Candidate(dp=4, tp=4, pp=1, ep=4, sp=True, microbatch_size=1, num_microbatches=4, zero_stage=1)


def test_profiles_state_how_each_stack_runs_its_moe_layer():
    mc, tt, ds = options_for("megatron-core", "bf16"), options_for("torchtitan", "bf16"), options_for("deepspeed", "bf16")
    assert (mc.moe_sp_dispatch, mc.moe_expert_launches, mc.moe_expert_sort, mc.moe_count_exchange) == (
        True, "per_expert", "several_local_experts", "all_gather")
    assert (tt.moe_sp_dispatch, tt.moe_expert_launches, tt.moe_expert_sort, tt.moe_count_exchange) == (
        False, "per_matmul", "expert_parallel", "all_to_all")
    assert (ds.moe_sp_dispatch, ds.moe_expert_launches, ds.moe_expert_sort, ds.moe_count_exchange) == (
        False, "per_expert", "never", "none")
    assert (mc.moe_combine_scores, tt.moe_combine_scores, ds.moe_combine_scores) == (
        "in_activation", "fp32_multiply", "in_activation")


def test_sequence_parallel_dispatch_sends_each_tp_ranks_shard():
    """Megatron-Core: the EP all-to-all carries tokens / tp per rank; replicated tokens carry all of them."""
    m = _model()
    env = _env(m, TP4)
    cfg, h, link = m.spec.moe, m.spec.hidden_size, env.links.ep
    local = env.shape.tokens / 4
    one = comm.all_to_all_s(local * cfg.top_k * h * 2, group=link)
    assert env.shape.moe_tokens == local
    assert ep_options(env)["alltoall"] == pytest.approx((2 * one, 2 * one))
    replicated = _env(_model(**MOE_OFF), TP4)
    full = comm.all_to_all_s(env.shape.tokens * cfg.top_k * h * 2, group=link)
    assert ep_options(replicated)["alltoall"] == pytest.approx((2 * full, 2 * full))


def test_expert_tp_all_gather_and_reduce_scatter_of_the_expert_rows():
    """dispatch_postprocess all-gathers, combine_preprocess reduce-scatters, over the expert-TP group (etp = tp
    by default): the expert-side rows of h, bf16, once each per direction; nothing with replicated tokens."""
    m = _model()
    env = _env(m, TP4)
    rows = env.shape.tokens * m.spec.moe.top_k  # etp = tp: the gathered rows are all tokens x top_k
    assert compute.moe_rows(m.spec, env.shape) == pytest.approx((rows / 4, rows))
    size = rows * m.spec.hidden_size * 2
    expected = comm.all_gather_s(size, group=env.links.tp) + comm.reduce_scatter_s(size, group=env.links.tp)
    assert moe_layer.expert_tp_s(env) == pytest.approx(expected) and expected > 0
    assert moe_layer.unhidden_s(env, "none")["alltoall"] == pytest.approx((expected, expected))
    assert moe_layer.expert_tp_s(_env(_model(**MOE_OFF), TP4)) == 0.0


def test_expert_tp_group_under_moe_folding_is_tp_over_the_fold():
    """ep = dp * k folds k tp ranks into EP: etp = tp / k, its collectives over that many ranks."""
    m = _model()
    folded = Candidate(dp=4, tp=4, pp=1, ep=8, sp=True, microbatch_size=1, num_microbatches=4, zero_stage=1)
    env = _env(m, folded)
    assert env.shape.etp == 2 and env.shape.expert_parallel == 8
    assert moe_layer.expert_tp_link(env).size == 2
    assert compute.moe_rows(m.spec, env.shape)[1] == pytest.approx(env.shape.tokens * m.spec.moe.top_k / 2)


def test_moe_block_keeps_only_the_shared_experts_tp_pair_under_sequence_parallel_dispatch():
    m = _model()
    env = _env(m, TP4)
    layer = decoder_cost(env, moe_layer=True)
    one_pair = tp_times(env, 0.0, 0.0, collectives=1)
    assert moe_layer.ffn_tp_collectives(m.spec, env.shape, moe_layer=True) == 0.0  # Mixtral: no shared experts
    assert (layer.tp_fwd_s, layer.tp_bwd_s) == pytest.approx(one_pair)  # attention's pair only
    shared = m.spec.model_copy(update={"moe": m.spec.moe.model_copy(update={"num_shared_experts": 1})})
    assert moe_layer.ffn_tp_collectives(shared, env.shape, moe_layer=True) == 1.0  # SharedExpertMLP's own AG/RS
    replicated = _env(_model(**MOE_OFF), TP4)
    assert moe_layer.ffn_tp_collectives(m.spec, replicated.shape, moe_layer=True) == 1.0


def test_token_count_exchange_is_a_forward_collective_of_expert_counts():
    m = _model()
    env = _env(m, TP4)
    group, per_rank = env.links.ep, m.spec.moe.num_experts * 8
    assert moe_layer.count_exchange_s(env, "all_gather") == pytest.approx(comm.all_gather_s(per_rank * group.size, group=group))
    assert moe_layer.count_exchange_s(env, "all_to_all") == pytest.approx(comm.all_to_all_s(per_rank, group=group))
    assert moe_layer.count_exchange_s(env, "none") == 0.0
    fwd, bwd = moe_layer.unhidden_s(env, "all_gather")["alltoall"]
    assert fwd - bwd == pytest.approx(moe_layer.count_exchange_s(env, "all_gather")) and fwd > bwd


def test_unhidden_communication_stays_exposed_under_the_batch_overlap():
    exposed = moe_comm.choose({"alltoall": (5.0, 5.0)}, layer_s=(10.0, 10.0), shared_s=(0.0, 0.0), batch_overlap=True,
                              shared_overlap=False, unhidden={"alltoall": (1.0, 0.5)})
    assert exposed == ("alltoall", 1.0, 0.5)


def test_expert_gemm_launches_follow_the_stack():
    m = _model()
    assert compute.expert_launches(m.spec, "per_expert", 4) == 8  # fc1 and fc2 per local expert
    assert compute.expert_launches(m.spec, "per_matmul", 4) == 3  # torchtitan: w1, w3, w2 grouped
    shape = dataclasses.replace(m.shape(TP4), moe_expert_launches="per_matmul")
    experts = next(g for g in compute.mlp_gemms(m.spec, shape, moe=counting.moe_params(m.spec)) if g.name == "experts")
    assert experts.calls == 3


def test_permutations_count_the_second_sort_where_the_stack_runs_it():
    m = _model()
    spec, base = m.spec, m.shape(TP4)  # Mixtral, 8 experts over ep 4: 2 local experts
    local, expert = compute.moe_rows(spec, base)
    assert compute.moe_permutation_rows(spec, base) == pytest.approx(2 * local + 2 * expert)
    one_local = dataclasses.replace(base, ep=8)
    assert compute.moe_permutation_rows(spec, one_local) == pytest.approx(2 * compute.moe_rows(spec, one_local)[0])
    never = dataclasses.replace(base, moe_expert_sort="never")
    assert compute.moe_permutation_rows(spec, never) == pytest.approx(2 * local)
    ep_sort = dataclasses.replace(one_local, moe_expert_sort="expert_parallel")
    assert compute.moe_permutation_rows(spec, ep_sort) == pytest.approx(2 * compute.moe_rows(spec, ep_sort)[0]
                                                                         + 2 * compute.moe_rows(spec, ep_sort)[1])


def test_expert_input_is_saved_as_whole_rows_of_h():
    """fc1 is column-parallel over the expert-TP ranks: its saved input is every routed row at full width h (not
    divided by tp); its intermediates are split (f / tp). A top_k step moves the saved bytes by exactly that."""
    m = _model()
    shape = m.shape(TP4)
    spec2 = m.spec.model_copy(update={"moe": m.spec.moe.model_copy(update={"top_k": 3})})
    delta = (memory.decoder_activation_bytes(spec2, shape, moe_layer=True).none
             - memory.decoder_activation_bytes(m.spec, shape, moe_layer=True).none)
    rows = shape.tokens  # one more expert per token
    saved_ffn = shape.kernels.saved_gated
    assert delta == pytest.approx(rows * (2 * m.spec.hidden_size + saved_ffn * m.spec.moe.expert_ffn_hidden_size / 4))


# ---- the frameworks' own code (skipped where not installed) ------------------------------------------------------

def test_megatron_core_dispatcher_runs_these_collectives():
    dispatcher = pytest.importorskip("megatron.core.transformer.moe.token_dispatcher")
    from megatron.core.model_parallel_config import ModelParallelConfig
    assert ModelParallelConfig(tensor_model_parallel_size=4).expert_tensor_parallel_size == 4  # etp defaults to tp
    init = inspect.getsource(dispatcher.MoETokenDispatcher.__init__)
    assert "self.tp_group = pg_collection.expt_tp" in init and "self.tp_ep_group = pg_collection.tp_ep" in init
    a2a = dispatcher.MoEAlltoAllTokenDispatcher
    post, pre = inspect.getsource(a2a.dispatch_postprocess), inspect.getsource(a2a.combine_preprocess)
    assert "gather_from_sequence_parallel_region" in post and "group=self.tp_group" in post
    assert "sort_chunks_by_idxs" in post and "self.num_local_experts > 1" in post
    assert "reduce_scatter_to_sequence_parallel_region" in pre and "group=self.tp_group" in pre
    assert "all_to_all(\n            self.ep_group" in inspect.getsource(a2a.token_dispatch)
    assert "group=self.tp_ep_group" in inspect.getsource(a2a.preprocess)  # the token-count all-gather
    callables = pytest.importorskip("megatron.core.models.gpt.fine_grained_callables")
    src = inspect.getsource(callables)
    moe_node = src[src.index("def submodule_moe_forward"):src.index("def submodule_combine_forward")]
    assert "routed_experts_compute" in moe_node  # the expert-TP collectives run in the compute node, not hidden


def test_torchtitan_grouped_experts_launch_one_grouped_mm_per_weight():
    torch = pytest.importorskip("torch")
    moe = pytest.importorskip("torchtitan.models.common.moe")
    experts = moe.GroupedExperts.Config(dim=16, hidden_dim=32, num_experts=4).build()
    for p in experts.parameters():
        torch.nn.init.normal_(p)
    calls, run = [], experts._grouped_mm
    experts._grouped_mm = lambda **kw: calls.append(kw["B_t"].shape) or run(**kw)
    try:
        experts(torch.randn(12, 16), torch.tensor([3, 3, 3, 3]))
    except RuntimeError as exc:  # a torch without the CPU grouped GEMM
        pytest.skip(f"torch._grouped_mm does not run here: {exc}")
    assert len(calls) == compute.expert_launches(_model().spec, "per_matmul", 4) == 3
    dispatcher = pytest.importorskip("torchtitan.models.common.token_dispatcher")
    exchange = inspect.getsource(dispatcher.AllToAllTokenDispatcher._token_count_exchange)
    assert "all_to_all_single" in exchange
    assert "self._permute(" in inspect.getsource(dispatcher.AllToAllTokenDispatcher.dispatch)


def test_without_ep_the_expert_tp_collectives_still_run():
    """ep 1, tp 4: no EP dispatch to choose, but the alltoall dispatcher the export writes for ep 1 still gathers
    and scatters the routed rows over the expert-TP ranks; replicated tokens pay the dense MLP's TP pair instead."""
    m = _model()
    cand = Candidate(dp=4, tp=4, pp=1, ep=1, sp=True, microbatch_size=1, num_microbatches=4, zero_stage=1)
    env = _env(m, cand)
    layer = decoder_cost(env, moe_layer=True)
    assert layer.moe_dispatcher is None
    assert (layer.ep_fwd_s, layer.ep_bwd_s) == pytest.approx((moe_layer.expert_tp_s(env),) * 2)
    assert layer.ep_fwd_s > 0


def test_fp32_score_multiply_moves_and_keeps_the_combined_rows():
    """torchtitan weights the combined rows by their scores as (x.to(fp32) * scores).to(bf16): 20 bytes moved and
    4 kept per element of the dispatch-side rows."""
    m = _model(framework="torchtitan")
    shape = m.shape(TP4)
    assert shape.moe_combine_scores == "fp32_multiply"
    plain = dataclasses.replace(shape, moe_combine_scores="in_activation")
    rows_h = compute.moe_rows(m.spec, shape)[0] * m.spec.hidden_size
    moved = compute.layer_elementwise_bytes(m.spec, shape, moe=counting.moe_params(m.spec))[1]
    assert moved - compute.layer_elementwise_bytes(m.spec, plain, moe=counting.moe_params(m.spec))[1] == pytest.approx(20 * rows_h)
    kept = memory.decoder_activation_bytes(m.spec, shape, moe_layer=True).none
    assert kept - memory.decoder_activation_bytes(m.spec, plain, moe_layer=True).none == pytest.approx(4 * rows_h)


def test_torchtitan_combine_keeps_an_fp32_copy_of_the_rows():
    """Run torchtitan's own combine on CPU and record what autograd saves: the fp32 rows x h copy."""
    torch = pytest.importorskip("torch")
    dispatcher = pytest.importorskip("torchtitan.models.common.token_dispatcher")
    tokens, top_k, experts, dim = 64, 2, 4, 32
    local = dispatcher.LocalTokenDispatcher.Config(num_experts=experts, top_k=top_k).build()
    x = torch.randn(tokens, dim, dtype=torch.bfloat16, requires_grad=True)
    scores = torch.rand(tokens, top_k, requires_grad=True)
    ids = torch.randint(0, experts, (tokens, top_k))
    routed, _, meta = local.dispatch(x, scores, ids, torch.bincount(ids.view(-1), minlength=experts))
    expert_out = routed.detach().clone().requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        local.combine(expert_out, meta, x)
    fp32_rows = [t for t in saved if t.dtype == torch.float32 and t.dim() == 2 and t.shape[1] == dim]
    assert [tuple(t.shape) for t in fp32_rows] == [(tokens * top_k, dim)]
    assert fp32_rows[0].untyped_storage().nbytes() == tokens * top_k * dim * 4
