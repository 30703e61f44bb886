"""Base class of every boundary schema: strict (unknown fields rejected), immutable, with units in names."""

from pydantic import BaseModel, ConfigDict


class Schema(BaseModel):
    """Pydantic model with extra="forbid" and frozen=True: invalid input raises, it is never repaired."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())
