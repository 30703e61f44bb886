"""FSDP2 under torch.distributed.pipelining keeps a stage's gradients and gathered parameters unsharded through the
step (torch 2.13 torch/distributed/pipelining/stage.py lines 844-847 and 1164-1177): the planner stack prices it
(behaviour.memory.fsdp_unsharded_through_pp_step), only with pp > 1 and ZeRO-2/3."""

import dataclasses

import pytest

from planner import api
from planner.cost.model import Candidate, CostModel
from planner.cost.stack import options_for


def _parts(pp: int, zero: int, *, fact: bool):
    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=8192,
                                framework="planner")
    options = dataclasses.replace(options_for("planner", "bf16"), fsdp_unsharded_through_pp_step=fact)
    model = CostModel(request, options=options)
    cand = Candidate(dp=8 // pp, tp=1, pp=pp, zero_stage=zero, microbatch_size=1, num_microbatches=64 // (8 // pp),
                     schedule="1f1b")
    mem = model.evaluate(cand).stage_memory[0]
    return mem.params_bytes, mem.grads_bytes, mem.peak_bytes


def test_profile_states_the_fact():
    assert options_for("planner", "bf16").fsdp_unsharded_through_pp_step is True
    assert options_for("megatron-core", "bf16").fsdp_unsharded_through_pp_step is False


@pytest.mark.parametrize("zero", [2, 3])
def test_pp_fsdp_holds_unsharded_grads_and_gathered_params(zero):
    params, grads, peak = _parts(2, zero, fact=True)
    base_params, base_grads, base_peak = _parts(2, zero, fact=False)
    dp = 4
    # unsharded 16-bit gradients beside the sharded ones: grads grow from 2/dp to 2/dp + 2 bytes per parameter
    assert grads == pytest.approx(base_grads * (1 + dp), rel=1e-6)
    # parameters: sharded 2/dp + gathered 2 (ZeRO-2 counted 2 whole before; ZeRO-3 2/dp)
    expected = base_params * (1 + dp) if zero == 3 else base_params * (1 + 1 / dp)
    assert params == pytest.approx(expected, rel=1e-6)
    assert peak > base_peak


@pytest.mark.parametrize("pp, zero", [(1, 2), (1, 3), (2, 1), (2, 0)])
def test_no_change_without_pp_or_fsdp(pp, zero):
    assert _parts(pp, zero, fact=True) == _parts(pp, zero, fact=False)
