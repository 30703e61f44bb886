"""The bridge from a Profile to per-layer costs (least-squares fit over micro-batch sizes) and the
alpha-beta fit of communication calibrations: torch-free, on synthetic profiles with known answers."""

from pathlib import Path

import pytest

from planner.cost.profiled import EXTRAPOLATION_LIMIT, coverage, profiled_layer_costs, require_profile_matches
from planner.errors import BadInputError
from planner.profiling.calibration import CommCalibration, CommPoint, bus_factor, fit_collective, ring_steps
from planner.schemas.profile import LayerProfile, Profile

SEQ = 512


def linear_entry(mbs: int, *, tp: int = 1, kind: str = "decoder", status: str = "ok") -> LayerProfile:
    """Times alpha + beta*tokens (alpha = 1 ms fixed cost, beta = 2 us/token), bytes exactly per token."""
    tokens = mbs * SEQ
    return LayerProfile(
        layer_type=kind, tp=tp, microbatch_size=mbs, seq_len=SEQ, status=status,
        forward_s=1e-3 + 2e-6 * tokens, backward_s=2e-3 + 4e-6 * tokens,
        recompute_selective_s=1e-4 + 1e-7 * tokens, recompute_full_s=1e-3 + 2e-6 * tokens,
        params_bytes=1000, saved_bytes=100 * tokens, saved_bytes_selective=80 * tokens, saved_bytes_full=10 * tokens,
    )


def make_profile(*entries: LayerProfile) -> Profile:
    return Profile(kind="measured", model_name="m", device="cpu", dtype="fp32", entries=entries)


def test_measured_sizes_come_back_as_measured():
    got = profiled_layer_costs(make_profile(linear_entry(1), linear_entry(4)), layer_type="decoder", tp=1, ep=1,
                               microbatch_size=4, seq_len=SEQ)
    assert got.fit == "measured" and got.forward_s == pytest.approx(1e-3 + 2e-6 * 4 * SEQ)
    assert got.measured_microbatch_sizes == (1, 4)


@pytest.mark.parametrize("mbs", [2, 3, 6, 8])
def test_least_squares_recovers_a_linear_cost_between_and_beyond_measured_sizes(mbs):
    got = profiled_layer_costs(make_profile(linear_entry(1), linear_entry(2), linear_entry(4)),
                               layer_type="decoder", tp=1, ep=1, microbatch_size=mbs, seq_len=SEQ)
    tokens = mbs * SEQ
    if mbs in (2,):
        assert got.fit == "measured"
    else:
        assert got.fit == "least-squares"
    assert got.forward_s == pytest.approx(1e-3 + 2e-6 * tokens)
    assert got.backward_s == pytest.approx(2e-3 + 4e-6 * tokens)
    assert got.recompute_full_s == pytest.approx(1e-3 + 2e-6 * tokens)
    assert got.saved_bytes == 100 * tokens and got.saved_bytes_full == 10 * tokens
    assert got.params_bytes == 1000


def test_one_measured_size_scales_with_tokens():
    got = profiled_layer_costs(make_profile(linear_entry(2)), layer_type="decoder", tp=1, ep=1, microbatch_size=1,
                               seq_len=SEQ)
    assert got.fit == "proportional"
    assert got.forward_s == pytest.approx((1e-3 + 2e-6 * 2 * SEQ) / 2)


def test_uncovered_shapes_are_left_to_the_analytic_model():
    profile = make_profile(linear_entry(1), linear_entry(2), linear_entry(4, status="oom"))
    query = {"layer_type": "decoder", "tp": 1, "ep": 1, "seq_len": SEQ}
    assert profiled_layer_costs(profile, **{**query, "tp": 2}, microbatch_size=1) is None
    assert profiled_layer_costs(profile, **{**query, "seq_len": 1024}, microbatch_size=1) is None
    assert profiled_layer_costs(profile, **{**query, "layer_type": "head"}, microbatch_size=1) is None
    assert profiled_layer_costs(profile, **query, microbatch_size=int(2 * EXTRAPOLATION_LIMIT) + 1) is None
    assert profiled_layer_costs(profile, **query, microbatch_size=4).fit == "least-squares"  # the oom entry is ignored
    assert profiled_layer_costs(make_profile(linear_entry(1, status="oom")), **query, microbatch_size=1) is None


def test_noisy_fit_never_goes_negative():
    a, b = linear_entry(1), linear_entry(2)
    noisy = make_profile(a.model_copy(update={"forward_s": 5e-3}), b.model_copy(update={"forward_s": 1e-3}))
    got = profiled_layer_costs(noisy, layer_type="decoder", tp=1, ep=1, microbatch_size=3, seq_len=SEQ)
    assert got.forward_s == pytest.approx(3e-3)  # falling times are noise: the mean


def test_coverage_and_model_mismatch():
    profile = make_profile(linear_entry(1), linear_entry(2), linear_entry(1, kind="head"))
    assert coverage(profile) == ["decoder tp=1 ep=1 seq_len=512 mbs 1,2", "head tp=1 ep=1 seq_len=512 mbs 1"]
    with pytest.raises(BadInputError, match="profile model_name='m' does not match model 'llama3-8b'"):
        require_profile_matches(profile, model_name="llama3-8b")


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"])
def test_alpha_beta_fit_recovers_latency_and_bandwidth(collective):
    n, alpha, bandwidth_GBps = 4, 50e-6, 12.5
    sizes = [2**k for k in range(12, 27, 2)]
    points = [CommPoint(message_bytes=s, time_s=alpha + bus_factor(collective, n) * s / (bandwidth_GBps * 1e9)) for s in sizes]
    fit = fit_collective(collective, n, points)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.bus_bandwidth_GBps == pytest.approx(bandwidth_GBps, rel=1e-6)
    assert fit.latency_s == pytest.approx(alpha / ring_steps(collective, n))
    assert fit.predict_s(2**20) == pytest.approx(points[0].time_s + bus_factor(collective, n) * (2**20 - 2**12) / 12.5e9)
    calibration = CommCalibration(backend="gloo", device="cpu", world_size=n, fits=(fit,))
    assert CommCalibration.model_validate_json(calibration.model_dump_json()) == calibration
    assert calibration.fit(collective) == fit and calibration.fit("nope") is None


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("send_recv", 8) == 1


def test_a_topology_references_a_calibration(tmp_path):
    from planner.io import canonical_json
    from planner.profiling.calibration import resolve_comm_calibration
    from planner.topology import load_topology

    n = 2
    points = [CommPoint(message_bytes=s, time_s=3e-4 * 2 * (n - 1) + bus_factor("all_reduce", n) * s / 0.9e9)
              for s in (4096, 1 << 20, 16 << 20)]
    calibration = CommCalibration(backend="gloo", device="cpu", world_size=n, fits=(fit_collective("all_reduce", n, points),))
    (tmp_path / "comm.json").write_text(canonical_json(calibration))
    topology = load_topology("cpu").model_copy(update={"comm_calibration": "comm.json"})
    calibrated = resolve_comm_calibration(topology, relative_to=tmp_path)
    assert calibrated.intra_node.bandwidth_GBps == pytest.approx(0.9)
    assert calibrated.intra_node.latency_s == pytest.approx(3e-4)
    assert resolve_comm_calibration(load_topology("cpu")) == load_topology("cpu")



def test_each_calibrated_collective_is_priced_at_its_own_rates():
    """gloo's reduce-scatter is slower than its all-reduce suggests: the calibrated topology keeps every fit, and
    the cost model prices each collective with its own (bus bandwidth, latency per ring step)."""
    from planner.cost import comm
    from planner.profiling.calibration import calibrated_topology
    from planner.topology import load_topology
    from planner.topology.placement import make_link

    n, sizes = 4, (4096, 1 << 20, 16 << 20)
    rates = {"all_reduce": (4e-4, 0.45), "all_gather": (8e-4, 0.30), "reduce_scatter": (1.7e-3, 0.16),
             "all_to_all": (4e-4, 0.65), "send_recv": (4e-4, 1.96)}
    fits = tuple(fit_collective(c, n, [CommPoint(message_bytes=s, time_s=lat * ring_steps(c, n) + bus_factor(c, n) * s / (bw * 1e9))
                                       for s in sizes]) for c, (lat, bw) in rates.items())
    topology = calibrated_topology(load_topology("cpu"), CommCalibration(backend="gloo", device="cpu", world_size=n, fits=fits))
    link = make_link(topology, size=n, num_nodes=1, ranks_per_node=n)
    size = 8 << 20
    for collective, cost in (("all_reduce", comm.ring_all_reduce_s), ("all_gather", comm.all_gather_s),
                             ("reduce_scatter", comm.reduce_scatter_s), ("all_to_all", comm.all_to_all_s)):
        fit = next(f for f in fits if f.collective == collective)
        assert cost(size, group=link) == pytest.approx(fit.predict_s(size), rel=1e-6), collective
    assert comm.p2p_s(size, group=link) == pytest.approx(fits[-1].predict_s(size), rel=1e-6)
    assert comm.reduce_scatter_s(size, group=link) > comm.all_gather_s(size, group=link) > 0
    assert comm.reduce_scatter_s(size, group=link.without_latency()) < comm.reduce_scatter_s(size, group=link)

VALIDATION = str(Path(__file__).resolve().parents[2] / "validation" / "h100_hf_tinyllama.jsonl")


def test_autocast_activation_count_for_tinyllama():
    from planner.cost import autocast
    from planner.cost.compute import Shape
    from planner.models import load_model

    spec = load_model("tinyllama-1.1b")
    acts = autocast.decoder_activation_bytes(spec, Shape(microbatch_size=1, seq_len=2048))
    sbh = 2048 * 2048
    # 16 (fp32 norms) + 10 (five bf16 input casts) + 2.5 (q, k, v) + 4 (SDPA out, out-proj input) + 22 (gated MLP)
    assert acts.none == pytest.approx(54.5 * sbh + 4 * 32 * 2048)
    assert acts.full == 4 * sbh


@pytest.mark.parametrize("row_index", range(8))
def test_amp_bf16_allocated_peak_matches_the_h100_rows(row_index):
    """Allocated peak (the cost model's peak less the allocator allowance) within 5% of peak_alloc_gib."""
    import json
    from pathlib import Path

    from planner import api
    from planner.cost.calibration import memory_calibration
    from planner.schemas.plan import Configuration, Parallelism

    if not Path(VALIDATION).is_file():
        pytest.skip("validation data not present")
    rows = [json.loads(line) for line in Path(VALIDATION).read_text().splitlines() if '"status": "ok"' in line]
    row = rows[row_index]
    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=1, global_batch_size=row["micro_batch"],
                                seq_len=row["seq"], precision="amp-bf16")
    config = Configuration(parallelism=Parallelism(dp=1, tp=1, pp=1), microbatch_size=row["micro_batch"],
                           recompute="full" if row["checkpointing"] else "none")
    from planner.cost.model import CostModel
    from planner.cost.notes import candidate_of
    from planner.cost.stack import hf_eager_options  # HuggingFace's recipe, not the executor's code

    cal = memory_calibration()
    peak = CostModel(request, options=hf_eager_options("amp-bf16")).evaluate(candidate_of(request, config)).peak_bytes
    allocated_gib = (peak - cal.fragmentation_fixed_bytes) / (1 + cal.fragmentation_fraction) / 2**30
    assert allocated_gib == pytest.approx(row["peak_alloc_gib"], rel=0.05)


def test_precision_note_flags_a_profile_of_another_dtype():
    from planner.cost.profiled import precision_note

    profile = make_profile(linear_entry(1))  # fp32
    assert precision_note(profile, "fp32") is None
    assert "profile dtype fp32 differs from precision bf16" in precision_note(profile, "bf16")
