"""Base class of every boundary schema: strict (unknown fields rejected), immutable, with units in names."""

from pydantic import BaseModel, ConfigDict


class Schema(BaseModel):
    """Pydantic model with extra="forbid" and frozen=True: invalid input raises, it is never repaired."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class InputSchema(Schema):
    """A schema users write (model spec, topology, request): NaN and infinities are refused, since a cost or a
    size computed from them is meaningless (`time_limit_s: Infinity` would never stop)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), allow_inf_nan=False)


def without(data, **absent: bool):
    """A serialised model (`data`) less the keys whose flag is true: optional fields are left out while they hold
    their default, so files written before the field existed serialise byte-identically (the golden plans)."""
    if isinstance(data, dict):
        for key, drop in absent.items():
            if drop:
                data.pop(key, None)
    return data
