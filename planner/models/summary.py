"""Plain-data summaries of a ModelSpec for `planner models list/show` and the service: no rendering here."""

from typing import Any

from planner.models import counting
from planner.schemas.model import ModelSpec

BILLION = 1e9


def model_row(spec: ModelSpec) -> dict[str, Any]:
    """One line of `planner models list`: size, shape and MoE routing of a model."""
    total, active = counting.total_params(spec), counting.active_params(spec)
    return {
        "name": spec.name,
        "total_params": total,
        "active_params": active,
        "params_b": round(total / BILLION, 3),
        "active_params_b": round(active / BILLION, 3),
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_kv_heads": spec.kv_heads,
        "num_experts": spec.moe.num_experts if spec.moe else None,
        "top_k": spec.moe.top_k if spec.moe else None,
        "seq_len": spec.seq_len,
    }


def parameter_breakdown(spec: ModelSpec) -> dict[str, Any]:
    """Where the parameters are: embedding, one layer's parts, all layers, head, total and active."""
    moe_layers = spec.num_moe_layers
    dense_layers = spec.num_layers - moe_layers
    dense_ffn = counting.mlp_params(spec, spec.ffn_hidden_size)
    breakdown: dict[str, Any] = {
        "embedding": counting.embedding_params(spec),
        "attention_per_layer": counting.attention_params(spec),
        "norms_per_layer": counting.layer_norm_params(spec),
        "dense_layers": dense_layers,
        "dense_ffn_per_layer": dense_ffn if dense_layers else 0,
        "moe_layers": moe_layers,
        "head": counting.head_params(spec),
        "layers_total": sum(counting.decoder_layer_params(spec, i) for i in range(spec.num_layers)),
        "total": counting.total_params(spec),
        "active": counting.active_params(spec),
    }
    for mixer in spec.mixers:  # hybrid stacks: how many layers of each token mixer, and one mixer's parameters
        if mixer != "attention":
            breakdown[f"{mixer}_mixer_layers"] = sum(spec.mixer(i) == mixer for i in range(spec.num_layers))
            breakdown[f"{mixer}_mixer_per_layer"] = counting.mixer_params(spec, mixer)
    if spec.moe is not None:
        moe = counting.moe_params(spec)
        breakdown.update(
            moe_router_per_layer=moe.router,
            moe_expert_params=moe.per_expert,
            moe_shared_per_layer=moe.shared,
            moe_ffn_per_layer=moe.total,
            moe_active_ffn_per_layer=moe.active,
        )
    return breakdown


def model_report(spec: ModelSpec) -> dict[str, Any]:
    """`planner models show --json`: the resolved spec plus the parameter breakdown."""
    return {"spec": spec.model_dump(mode="json"), "params": parameter_breakdown(spec)}
