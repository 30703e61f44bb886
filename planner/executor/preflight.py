"""What `planner run` checks before torchrun starts: every refusal here costs a second, not a whole run.

Why: `run --device cuda` on a machine without a GPU, a bad `--data` file and an unwritable `--report` used to
fail only after torchrun had started every rank (or, for the report, after the whole run trained). These are
the same checks the ranks make, done once in the parent: the device asked for, the token file's shape, dtype,
length and (on its first million tokens) vocabulary, and the report's path. torch is imported only for
`--device cuda`; numpy reads the token file memory-mapped.
"""

from __future__ import annotations

from pathlib import Path

from planner.errors import BadInputError
from planner.io import check_writable, is_file
from planner.launch_spec.options import RunOptions
from planner.schemas.plan import LaunchPlan

TOKEN_DTYPES = ("uint16", "int32")  # as planner.executor.data.TOKEN_DTYPES (which imports torch)
VOCAB_SAMPLE_TOKENS = 1 << 20


def preflight(plan: LaunchPlan, options: RunOptions, report_path: str | Path | None) -> None:
    """Raise BadInputError (exit 2) for what would make the run fail after it starts."""
    check_writable(report_path, flag="--report")
    if options.device == "cuda":
        _check_cuda(plan.parallelism.world_size)
    if plan.request.precision == "fp8":
        _check_fp8(options.device)
    if options.data is not None:
        _check_tokens(options.data, options.data_dtype, seq_len=plan.batch.seq_len, vocab_size=plan.request.model.vocab_size)


def _check_cuda(world_size: int) -> None:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise BadInputError("--device cuda: no CUDA GPU is visible on this machine (torch.cuda.is_available() is False): "
                            "use --device cpu or --device auto")
    if count < world_size:
        raise BadInputError(f"--device cuda: the plan has {world_size} ranks but this machine has {count} GPUs: "
                            f"run it with `planner launch` on enough nodes, or use --device cpu")


def _check_fp8(device: str) -> None:
    """fp8 needs fp8 tensor cores (planner.executor.fp8): refused before launch on a CPU run or an older GPU."""
    import importlib.util

    from planner.executor.fp8 import fp8_refusal

    installed = importlib.util.find_spec("torchao") is not None
    if device == "cpu":
        reason = fp8_refusal("cpu", None, torchao_installed=installed)
    else:
        import torch

        cuda = torch.cuda.is_available()
        reason = fp8_refusal("cuda" if cuda else "cpu", torch.cuda.get_device_capability(0) if cuda else None,
                             torchao_installed=installed)
    if reason is not None:
        raise BadInputError(reason)


def _check_tokens(path: str, dtype: str, *, seq_len: int, vocab_size: int) -> None:
    import numpy as np

    if not is_file(path):
        raise BadInputError(f"--data {path}: file not found: pass a flat .npy or .bin file of token ids")
    if dtype not in TOKEN_DTYPES:
        raise BadInputError(f"--data-dtype {dtype!r} is unknown: choose one of {list(TOKEN_DTYPES)}")
    try:
        tokens = np.load(path, mmap_mode="r") if path.endswith(".npy") else np.memmap(path, dtype=dtype, mode="r")
    except (OSError, ValueError) as exc:
        raise BadInputError(f"--data {path}: not a readable token file ({str(exc)[:120]}): pass a flat .npy or .bin file of token ids") from None
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise BadInputError(f"--data {path}: expected a flat array of integer token ids, got shape {tokens.shape} {tokens.dtype}")
    if tokens.shape[0] < seq_len + 1:
        raise BadInputError(f"--data {path}: {tokens.shape[0]} tokens, fewer than seq_len + 1 = {seq_len + 1}: use a longer file")
    sample = np.asarray(tokens[:VOCAB_SAMPLE_TOKENS])
    if int(sample.max()) >= vocab_size or int(sample.min()) < 0:
        raise BadInputError(f"--data {path}: token id {int(sample.max())} is outside the model's vocabulary "
                            f"(vocab_size={vocab_size}): use a file tokenised for this model, or check --data-dtype")
