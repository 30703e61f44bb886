"""The profiler on a tiny model: FLOPs against the analytic formulas, parameter bytes against the module,
saved bytes against an independent walk of the autograd graph, schema round trip, OOM and bad input."""

import pytest

torch = pytest.importorskip("torch")

from planner.errors import BadInputError  # noqa: E402
from planner.io import canonical_json  # noqa: E402
from planner.nn.model import TransformerBlock, count_parameters  # noqa: E402
from planner.profiling import measure  # noqa: E402
from planner.profiling.measure import profile_model  # noqa: E402
from planner.profiling.measure_layers import build_case  # noqa: E402
from planner.profiling.measure_timing import constant_keys, storage_key  # noqa: E402
from planner.profiling.options import ProfileOptions, parse_int_list  # noqa: E402
from planner.schemas.model import ModelSpec  # noqa: E402
from planner.schemas.profile import Profile  # noqa: E402

SPEC = ModelSpec(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4, num_kv_heads=2,
                 vocab_size=256, seq_len=32, activation="swiglu", norm="rmsnorm", position="rope")
B, S = 2, 32
OPTS = ProfileOptions(seq_len=S, microbatch_sizes=(B,), tp=(1, 2), warmup=0, repeats=1, op_warmup=0, op_repeats=1,
                      clock="process")


@pytest.fixture(scope="module")
def profile() -> Profile:
    return profile_model(SPEC, OPTS, command="test")


def entry(profile, kind, tp):
    return next(e for e in profile.entries if e.layer_type == kind and e.tp == tp)


def op(layer, name):
    return next(o for o in layer.ops if o.name == name)


@pytest.mark.parametrize("tp", [1, 2])
def test_operator_flops_match_the_analytic_formulas(profile, tp):
    h, a, kv, d, f, v = 64, 4, 2, 16, 96, 256
    tokens = B * S
    expected = {
        "qkv": 2 * tokens * h * (a + 2 * kv) * d / tp,
        "attn_core": 2 * 2 * B * S * S * a * d / tp,  # scores and A@V over the full s x s matrix
        "attn_out": 2 * tokens * a * d * h / tp,
        "mlp_up": 2 * 2 * tokens * h * f / tp,  # gate and up GEMMs
        "mlp_down": 2 * tokens * f * h / tp,
    }
    layer = entry(profile, "decoder", tp)
    for name, flops in expected.items():
        assert op(layer, name).forward_flops == flops, name
        assert op(layer, name).backward_flops == 2 * flops, name  # grad of input and grad of weight
    head = entry(profile, "head", tp)
    assert op(head, "lm_head").forward_flops == 2 * tokens * h * (v // tp)


@pytest.mark.parametrize("tp", [1, 2])
def test_parameter_bytes_match_the_module(profile, tp):
    block = TransformerBlock(SPEC, 0, tp=tp)
    layer = entry(profile, "decoder", tp)
    assert layer.params_bytes == 4 * count_parameters(block)
    assert sum(o.params_bytes for o in layer.ops) == layer.params_bytes
    assert entry(profile, "embedding", tp).params_bytes == 4 * (SPEC.vocab_size // tp) * SPEC.hidden_size
    assert entry(profile, "head", tp).params_bytes == 4 * ((SPEC.vocab_size // tp) * SPEC.hidden_size + SPEC.hidden_size)


def _graph_saved_bytes(outputs, exclude) -> int:
    """Independent count: walk the autograd graph and read every node's `_saved_*` tensors."""
    seen, stack, storages = set(), [o.grad_fn for o in outputs], {}
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if attr.startswith("_saved_"):
                value = getattr(node, attr, None)
                for t in value if isinstance(value, (tuple, list)) else [value]:
                    if isinstance(t, torch.Tensor) and storage_key(t) not in exclude:
                        storages[storage_key(t)] = t.untyped_storage().nbytes()
        stack += [n for n, _ in node.next_functions]
    return sum(storages.values())


@pytest.mark.parametrize("kind", ["decoder", "head"])
def test_saved_bytes_match_an_independent_count(profile, kind):
    torch.manual_seed(0)
    case = build_case(SPEC, kind, tp=1, ep=1, microbatch_size=B, seq_len=S, device=torch.device("cpu"),
                      param_dtype=torch.float32)
    inputs = case.make_inputs()
    outputs = case.apply(inputs)
    exclude = constant_keys([case.module], case.constants)
    layer = entry(profile, kind, 1)
    assert layer.saved_bytes == _graph_saved_bytes(outputs, exclude)
    assert layer.saved_bytes_full == 4 * B * S * SPEC.hidden_size + (8 * B * S if kind == "head" else 0)
    if kind == "decoder":
        assert layer.saved_bytes_full < layer.saved_bytes_selective <= layer.saved_bytes


def test_every_layer_type_and_shape_is_measured(profile):
    assert [(e.layer_type, e.tp) for e in profile.entries] == [
        (k, tp) for k in ("embedding", "decoder", "head") for tp in (1, 2)]
    for e in profile.entries:
        assert e.status == "ok" and e.forward_s > 0 and e.backward_s > 0
        assert e.ops[-1].name == "other"
    assert profile.kind == "measured" and profile.command == "test" and "torch" in profile.software


def test_profile_round_trips_through_its_schema(profile, tmp_path):
    from planner.cost.profiled import load_profile

    text = canonical_json(profile)
    path = tmp_path / "p.json"
    path.write_text(text)
    again = load_profile(path)
    assert canonical_json(again) == text
    assert Profile.model_validate_json(text).entries[0].layer_type == "embedding"


def test_shape_beyond_free_memory_is_recorded_as_not_fitting(monkeypatch):
    monkeypatch.setattr(measure, "free_memory_bytes", lambda device: 1024)
    opts = ProfileOptions(seq_len=S, layer_types=("decoder",), warmup=0, repeats=1, ops=False)
    result = profile_model(SPEC, opts)
    assert [e.status for e in result.entries] == ["oom"]
    assert "does not fit" in result.entries[0].message


def test_out_of_memory_while_measuring_is_recorded(monkeypatch):
    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(measure, "measure_case", boom)
    result = profile_model(SPEC, ProfileOptions(seq_len=S, layer_types=("head",), ops=False))
    assert result.entries[0].status == "oom" and "out of memory" in result.entries[0].message


def test_cuda_without_a_gpu_is_bad_input():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(BadInputError, match=r"CUDA requested but torch.cuda.is_available\(\) is False: use --device cpu"):
        profile_model(SPEC, ProfileOptions(seq_len=S, device="cuda"))


def test_bad_options_name_the_field():
    with pytest.raises(BadInputError, match="dtype='int8'"):
        ProfileOptions(seq_len=S, dtype="int8")
    with pytest.raises(BadInputError, match="clock='gpu'"):
        ProfileOptions(seq_len=S, clock="gpu")
    with pytest.raises(BadInputError, match="--tp"):
        parse_int_list("1,x", name="--tp")
    with pytest.raises(BadInputError, match="tp=3 must divide num_attention_heads=4"):
        build_case(SPEC, "decoder", tp=3, ep=1, microbatch_size=1, seq_len=S, device=torch.device("cpu"),
                   param_dtype=torch.float32)


def test_moe_layer_with_expert_parallelism():
    from planner.schemas.model import MoESpec

    moe_spec = SPEC.model_copy(update={"name": "tiny-moe", "moe": MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32)})
    opts = ProfileOptions(seq_len=S, layer_types=("moe_decoder",), ep=(1, 2), warmup=0, repeats=1, op_warmup=0, op_repeats=1)
    result = profile_model(moe_spec, opts)
    one, two = result.entries
    assert (one.ep, two.ep) == (1, 2) and one.status == two.status == "ok"
    experts = {e.ep: op(e, "experts") for e in (one, two)}
    assert experts[2].params_bytes * 2 == experts[1].params_bytes  # half the experts on each EP rank
    # the same tokens x top_k assignments; on CPU the experts run as one zero-padded bmm (planner/nn/moe.py), so
    # uneven routing adds the padding rows' FLOPs (the ep=2 emulation spreads its assignments evenly)
    assert experts[2].forward_flops <= experts[1].forward_flops < 2 * experts[2].forward_flops
    assert "ep=2" in two.message and op(one, "router").forward_flops == 2 * S * 64 * 4  # mbs 1
