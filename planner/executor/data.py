"""Training data for the executor: deterministic synthetic tokens, or a flat token file.

Every batch is a pure function of (source, step), never of what ran before, so a job resumed at step k
sees exactly the batches an uninterrupted job sees, and every layout (any dp, micro-batching) trains on
the same global batch of `global_batch_size` sequences.

Token files (`--data`): a flat array of token ids, `.npy` (dtype from its header) or raw `.bin`
(uint16 by default, as nanoGPT / Megatron's GPT-2 shards write it; `int32` for vocabularies over 65,536).
Sequence j of step s (1-based) starts at token ((s-1) * global_batch_size + j) * seq_len, wrapping around
the file; inputs are seq_len tokens and targets the same window shifted by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from planner.errors import BadInputError

TOKEN_DTYPES = {"uint16": np.uint16, "int32": np.int32}
SYNTHETIC = "synthetic"


@dataclass(frozen=True, kw_only=True)
class BatchSource:
    """Where a step's global batch comes from. `path` None = synthetic tokens drawn from `seed`."""

    vocab_size: int
    global_batch_size: int
    seq_len: int
    seed: int = 0
    path: str | None = None
    dtype: str = "uint16"

    @property
    def label(self) -> str:
        return self.path if self.path is not None else SYNTHETIC


def synthetic_global_batch(source: BatchSource, step: int) -> torch.Tensor:
    """(global_batch_size, seq_len + 1) int64 tokens, uniform over the vocabulary, from a generator seeded by
    (seed, step) only."""
    gen = torch.Generator().manual_seed(source.seed * 1_000_003 + step)
    return torch.randint(0, source.vocab_size, (source.global_batch_size, source.seq_len + 1), generator=gen)


def open_tokens(path: str, dtype: str = "uint16") -> np.ndarray:
    """Memory-map a flat token file; checks it is 1-D and long enough for one sequence."""
    file = Path(path)
    if not file.is_file():
        raise BadInputError(f"--data {path}: file not found: pass a flat .npy or .bin file of token ids")
    if file.suffix == ".npy":
        tokens = np.load(file, mmap_mode="r")
    else:
        if dtype not in TOKEN_DTYPES:
            raise BadInputError(f"--data-dtype {dtype!r} is unknown: choose one of {sorted(TOKEN_DTYPES)}")
        tokens = np.memmap(file, dtype=TOKEN_DTYPES[dtype], mode="r")
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise BadInputError(f"--data {path}: expected a flat array of integer token ids, got shape {tokens.shape} {tokens.dtype}")
    return tokens


def file_global_batch(source: BatchSource, tokens: np.ndarray, step: int) -> torch.Tensor:
    """(global_batch_size, seq_len + 1) windows of the token file for `step` (1-based), wrapping around."""
    window = source.seq_len + 1
    if tokens.shape[0] < window:
        raise BadInputError(f"--data {source.path}: {tokens.shape[0]} tokens, fewer than seq_len + 1 = {window}")
    span = tokens.shape[0] - window + 1
    starts = [(((step - 1) * source.global_batch_size + j) * source.seq_len) % span for j in range(source.global_batch_size)]
    rows = np.stack([np.asarray(tokens[s:s + window], dtype=np.int64) for s in starts])
    top = int(rows.max())
    if top >= source.vocab_size or int(rows.min()) < 0:
        raise BadInputError(
            f"--data {source.path}: token id {top} at step {step} is outside the model's vocabulary "
            f"(vocab_size={source.vocab_size}): use a file tokenised for this model"
        )
    return torch.from_numpy(rows)


class Batches:
    """Step-indexed global batches, and this data-parallel rank's slice of them."""

    def __init__(self, source: BatchSource):
        self.source = source
        self.tokens = open_tokens(source.path, source.dtype) if source.path is not None else None

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (global_batch_size, seq_len) int64, for 1-based `step`."""
        rows = synthetic_global_batch(self.source, step) if self.tokens is None else file_global_batch(self.source, self.tokens, step)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def local_batch(self, step: int, *, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This dp rank's contiguous slice: global_batch_size / dp sequences."""
        inputs, targets = self.global_batch(step)
        if inputs.shape[0] % dp:
            raise BadInputError(f"global_batch_size={inputs.shape[0]} does not split over dp={dp}: use a multiple of dp")
        n = inputs.shape[0] // dp
        return inputs[dp_rank * n:(dp_rank + 1) * n], targets[dp_rank * n:(dp_rank + 1) * n]
