"""Reading a HuggingFace `config.json`: key spellings, per-family defaults, and one-line errors.

Transformers renames keys between versions and maps old spellings through `attribute_map` (e.g. 5.x writes a
Qwen3-MoE config with `num_local_experts` where 4.x wrote `num_experts`, configuration_qwen3_moe.py; Falcon's
`n_head`/`n_layer`, configuration_falcon.py in 4.x). HFConfig.req/get take every spelling of one concept and return
the first present. A key missing from the file falls back to the family's defaults: the values of the
transformers configuration class that change the parameter count (tie_word_embeddings, head_dim, bias switches,
num_key_value_heads where the class does not default it to num_attention_heads).
"""

from collections.abc import Mapping
from typing import Any

from planner.errors import BadInputError

MAX_DEFAULT_SEQ_LEN = 8192

# Spellings of one concept, newest first where versions differ (configuration_<type>.py attribute_map).
NUM_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")
HIDDEN_ACT = ("hidden_act",)
GEMMA_ACT = ("hidden_activation", "hidden_act")  # modeling_gemma2.Gemma2MLP reads hidden_activation


class HFConfig:
    """A config dict, the family's defaults and where it came from, so that errors name the field and the file."""

    def __init__(self, data: dict[str, Any], source: str, defaults: Mapping[str, Any] | None = None):
        self.data = data
        self.source = source
        self.defaults = dict(defaults or {})
        self.model_type = data.get("model_type")

    def _lookup(self, keys: tuple[str, ...]) -> Any:
        for key in keys:
            if self.data.get(key) is not None:
                return self.data[key]
        for key in keys:
            if self.defaults.get(key) is not None:
                return self.defaults[key]
        return None

    def req(self, *keys: str) -> Any:
        """The first of `keys` (spellings of one field) present, else the family default; BadInputError when none is."""
        value = self._lookup(keys)
        if value is None:
            spellings = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
            raise BadInputError(
                f"{self.source}: missing field {keys[0]!r}{spellings} in HuggingFace config (model_type={self.model_type!r}): "
                "add it to the config.json"
            )
        return value

    def get(self, *keys: str, default: Any = None) -> Any:
        """The first of `keys` present, else the family default, else `default`."""
        value = self._lookup(keys)
        return default if value is None else value

    def flag(self, *keys: str, default: bool = False) -> bool:
        return bool(self.get(*keys, default=default))

    def refuse(self, key: str, value: Any, why: str) -> BadInputError:
        """The one-line error for a value the schema cannot express."""
        return BadInputError(
            f"{self.source}: {key}={value!r} (model_type={self.model_type!r}) cannot be expressed as a ModelSpec: {why}; "
            "write a model spec YAML instead"
        )

    def require_values(self, expected: Mapping[str, Any]) -> None:
        """Refuse keys whose value (or default) differs from the only one the schema expresses."""
        for key, want in expected.items():
            value = self.get(key, default=want)
            if value != want:
                raise self.refuse(key, value, f"only {key}={want!r} is supported")


def seq_len(cfg: HFConfig, *keys: str) -> int:
    """min(longest supported context, MAX_DEFAULT_SEQ_LEN): configs give no training length."""
    return min(int(cfg.req(*(keys or ("max_position_embeddings",)))), MAX_DEFAULT_SEQ_LEN)


def activation(cfg: HFConfig, keys: tuple[str, ...], *, gated: bool, default: str = "silu") -> str:
    """HF activation name -> ours: gated silu/swish = swiglu, gated gelu* = geglu; plain gelu* = gelu, relu = relu."""
    act = str(cfg.get(*keys, default=default))
    if gated and act in ("silu", "swish"):
        return "swiglu"
    if act.startswith("gelu"):
        return "geglu" if gated else "gelu"
    if not gated and act == "relu":
        return "relu"
    allowed = "silu or gelu" if gated else "gelu or relu"
    raise BadInputError(
        f"{cfg.source}: {keys[0]}={act!r} is not supported for a {'gated' if gated else 'plain'} FFN "
        f"(model_type={cfg.model_type!r}): use {allowed}"
    )
