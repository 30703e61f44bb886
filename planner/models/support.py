"""What the executor's reference decoder (planner.nn.model) builds, checked without torch.

planner.nn.model.check_reference_supports raises on these at build time; planner.launch_spec.runnable.check_runnable
reads the same list before any process starts, so `planner run` refuses in one line instead of after torchrun.
"""

from planner.schemas.model import ModelSpec


def reference_unsupported(spec: ModelSpec) -> str | None:
    """The first spec feature the reference decoder does not build (so our executor would time other work), or None."""
    windowed = sorted(set(spec.layer_types or ()) - {"full", "linear", "mamba"})
    missing = {
        f"norms_per_layer={spec.norms_per_layer} (Gemma/Falcon layouts)": spec.norms_per_layer != 2,
        "qk_norm_scope='projection' (OLMo2)": spec.qk_norm and spec.qk_norm_scope == "projection",
        "moe.shared_expert_gate (Qwen2-MoE)": spec.moe is not None and spec.moe.shared_expert_gate,
        f"layer_types with {windowed} attention layers (its attention core is full causal)": bool(windowed),
        "Gated DeltaNet ('linear') layers": "linear" in (spec.layer_types or ()),
        "Mamba layers": "mamba" in (spec.layer_types or ()),
        "attention_output_gate (Qwen3-Next)": spec.attention_output_gate,
    }
    return next((what for what, present in missing.items() if present), None)


def reference_refusal(spec: ModelSpec) -> str | None:
    """The one-line refusal for reference_unsupported, naming the model and the missing piece."""
    what = reference_unsupported(spec)
    if what is None:
        return None
    return (f"model {spec.name!r}: {what} is not built by the executor's reference decoder (planner.nn): "
            "plan with the analytic cost model, or write a spec without it")
