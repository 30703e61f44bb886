"""Reading a user's measured runs from the frameworks' own logs (or a JSON of MeasuredRun records).

Formats, as the frameworks print them (cited in tests/data/runlogs/README.md):
- Megatron-LM (megatron/training/arguments.py `_print_args`, megatron/training/training.py `training_log`,
  megatron/training/utils `report_memory`): the `---- arguments ----` block of `  name ....... value` lines, the
  `iteration N/ M | ... | elapsed time per iteration (ms): X | ...` lines, and the
  `[Rank r] (after N iterations) memory (MB) | allocated: A | max allocated: B | reserved: C | max reserved: D` lines.
- torchtitan (torchtitan/components/metrics.py MetricsProcessor.log): `step: N  loss: L  grad_norm: G  memory:
  X GiB(Y%)  tps: T  tflops: F  mfu: M%` (ANSI colours stripped), with the run's TOML config (job_config).
The steady-state step time is the median over the logged intervals after the first (the first holds start-up,
compilation and warm-up). Peak memory is the largest `max reserved` (what the allocator held) over ranks.
Every refusal is one BadInputError naming the file, the line where it matters, and the fix.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

from planner.errors import BadInputError
from planner.io import read_text_checked
from planner.schedules import DEFAULT, INTERLEAVED

MAX_LOG_BYTES = 256 << 20
ARGS_START = re.compile(r"-{8,} arguments -{8,}")
ARGS_END = re.compile(r"-{8,} end of arguments -{8,}")
ARG_LINE = re.compile(r"^\s*([A-Za-z_]\w*) \.+ (.*?)\s*$")
NUMBER = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
MEGATRON_ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?elapsed time per iteration \(ms\): " + NUMBER, re.I)
MEGATRON_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: " + NUMBER
                             + r" \| max allocated: " + NUMBER + r"(?: \| reserved: " + NUMBER + r" \| max reserved: " + NUMBER + ")?")
TITAN_STEP = re.compile(r"step:\s*(\d+)\s+loss:.*?memory:\s*" + NUMBER + r"\s*GiB\(.*?tps:\s*([\d,]+|nan)", re.I)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# torchtitan (model.name, model.flavor) -> our preset of the same architecture
TITAN_PRESETS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b"}


def _value(text: str) -> Any:
    """A printed Python value of the arguments block: int, float, bool, None, else the text."""
    if text in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def megatron_arguments(text: str, source: str) -> dict[str, Any]:
    """The `---- arguments ----` block of a Megatron-LM log as a dict."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if ARGS_START.search(line)), None)
    if start is None:
        raise BadInputError(f"{source}: no Megatron-LM arguments block ('------------------------ arguments "
                            "------------------------'): pass the whole log of rank 0, from the start of the run")
    args = {}
    for line in lines[start + 1:]:
        if ARGS_END.search(line):
            break
        match = ARG_LINE.match(ANSI.sub("", line))
        if match:
            args[match.group(1)] = _value(match.group(2))
    if not args:
        raise BadInputError(f"{source}: the arguments block at line {start + 1} is empty: pass the log as Megatron-LM printed it")
    return args


def _finite(value: str, what: str, source: str, line: int) -> float:
    number = float(value.replace(",", ""))
    if not math.isfinite(number) or number <= 0:
        raise BadInputError(f"{source}:{line}: {what} is {value}: a run that diverged or did not time its steps cannot "
                            "calibrate anything; pass the log of a healthy run")
    return number


def steady_step_s(times: list[tuple[int, float]], source: str, what: str) -> tuple[float, str]:
    """(median step time over the logged intervals after the first, the line range it read)."""
    if not times:
        raise BadInputError(f"{source}: no {what} lines: pass a log with at least one logged training step")
    kept = times[1:] if len(times) > 1 else times
    return statistics.median(value for _, value in kept), f"lines {kept[0][0]}-{kept[-1][0]}"


def megatron_peak_gib(text: str, source: str) -> float | None:
    """Largest `max reserved` (else `max allocated`) of the memory reports over ranks, GiB (Megatron prints MB)."""
    peaks = []
    for number, line in enumerate(text.splitlines(), 1):
        match = MEGATRON_MEMORY.search(line)
        if match:
            value = match.group(6) or match.group(4)
            peaks.append(_finite(value, "the peak memory", source, number) / 1024)
    return max(peaks) if peaks else None


def read_megatron(path: Path, *, model: Any = None, framework: str | None = None) -> dict:
    """A MeasuredRun (as a dict) from a Megatron-LM log: configuration from its arguments, step time and memory."""
    source = str(path)
    text = read_text_checked(path, max_bytes=MAX_LOG_BYTES)
    args = megatron_arguments(text, source)
    times = []
    for number, line in enumerate(text.splitlines(), 1):
        match = MEGATRON_ITERATION.search(line)
        if match:
            times.append((number, _finite(match.group(3), "the elapsed time per iteration", source, number) / 1000))
    step, lines = steady_step_s(times, source, "'iteration N/ M | ... | elapsed time per iteration (ms): X'")
    need = ("world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
            "global_batch_size", "seq_length")
    missing = [key for key in need if not isinstance(args.get(key), int)]
    if missing:
        raise BadInputError(f"{source}: the arguments block has no integer {', '.join(missing)}: pass the log as Megatron-LM printed it")
    vpp = args.get("virtual_pipeline_model_parallel_size") or 1
    parallelism = {"tp": args["tensor_model_parallel_size"], "pp": args["pipeline_model_parallel_size"],
                   "cp": args.get("context_parallel_size") or 1, "ep": args.get("expert_model_parallel_size") or 1,
                   "sp": bool(args.get("sequence_parallel")), "vpp": vpp,
                   "zero_stage": 1 if args.get("use_distributed_optimizer") else 0}
    parallelism["dp"] = args["world_size"] // (parallelism["tp"] * parallelism["pp"] * parallelism["cp"])
    return {
        "name": path.name, "model": model if model is not None else megatron_model(args, source, path.stem),
        "framework": framework or "megatron-core", "gpus": args["world_size"], "global_batch_size": args["global_batch_size"],
        "seq_len": args["seq_length"], "precision": "fp8" if args.get("fp8") else "bf16" if args.get("bf16") or args.get("fp16") else "fp32",
        "configuration": {"parallelism": parallelism, "microbatch_size": args["micro_batch_size"],
                          "schedule": INTERLEAVED.name if vpp > 1 else DEFAULT.name,
                          "recompute": args.get("recompute_granularity") or "none"},
        "step_time_s": step, "peak_memory_gib": megatron_peak_gib(text, source), "source": f"{source} ({lines})",
    }


def megatron_model(args: dict, source: str, name: str) -> dict:
    """A model spec from Megatron-LM's model arguments (or the fix: pass --model)."""
    vocab = args.get("padded_vocab_size") or args.get("vocab_size")
    need = {"num_layers": args.get("num_layers"), "hidden_size": args.get("hidden_size"),
            "num_attention_heads": args.get("num_attention_heads"), "vocab size": vocab}
    missing = [key for key, value in need.items() if not isinstance(value, int)]
    if missing:
        raise BadInputError(f"{source}: the arguments block gives no {', '.join(missing)}: pass --model with the "
                            "model the run trained (a preset, a config.json or a model spec)")
    spec: dict[str, Any] = {
        "name": f"megatron-{name}", "num_layers": args["num_layers"], "hidden_size": args["hidden_size"],
        "ffn_hidden_size": args.get("ffn_hidden_size") or 4 * args["hidden_size"],
        "num_attention_heads": args["num_attention_heads"], "vocab_size": vocab, "seq_len": args["seq_length"],
        "activation": "swiglu" if args.get("swiglu") else "gelu",
        "norm": "rmsnorm" if str(args.get("normalization")).lower() == "rmsnorm" else "layernorm",
        "position": "rope" if args.get("position_embedding_type") == "rope" else "learned",
        "tied_embeddings": not args.get("untie_embeddings_and_output_weights", False),
        "linear_bias": bool(args.get("add_bias_linear", False)), "qkv_bias": bool(args.get("add_qkv_bias", False)),
        "source": f"{source}: Megatron-LM arguments block",
    }
    if args.get("group_query_attention") and args.get("num_query_groups"):
        spec["num_kv_heads"] = args["num_query_groups"]
    if args.get("kv_channels"):
        spec["head_dim"] = args["kv_channels"]
    if spec["position"] == "learned":
        spec["num_positions"] = args.get("max_position_embeddings") or args["seq_length"]
    if args.get("num_experts"):
        spec["moe"] = {"num_experts": args["num_experts"], "top_k": args.get("moe_router_topk") or 2,
                       "expert_ffn_hidden_size": args.get("moe_ffn_hidden_size") or spec["ffn_hidden_size"]}
    return spec


def toml_config(config: Path) -> dict:
    """A torchtitan job config (TOML), parsed."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise BadInputError("reading a torchtitan TOML config needs Python >= 3.11 or `pip install tomli`") from None
    try:
        return tomllib.loads(read_text_checked(config, max_bytes=1 << 20))
    except tomllib.TOMLDecodeError as exc:
        raise BadInputError(f"{config}: not a TOML file ({exc}): pass the torchtitan config the run used") from None


def titan_degrees(par: dict, gpus: int | None, config: Path) -> dict[str, int]:
    """The [parallelism] degrees, data_parallel_shard_degree = -1 resolved from the world size."""
    degrees = {}
    for key in ("data_parallel_replicate", "data_parallel_shard", "tensor_parallel", "pipeline_parallel", "context_parallel"):
        value = par.get(f"{key}_degree", 1)
        if not isinstance(value, int) or value == 0 or (value < 0 and key != "data_parallel_shard"):
            raise BadInputError(f"{config}: [parallelism] {key}_degree = {value!r}: must be a positive integer (-1 for data_parallel_shard)")
        degrees[key] = value
    if degrees["data_parallel_shard"] < 0:
        if gpus is None:
            raise BadInputError(f"{config}: data_parallel_shard_degree = -1 takes the GPUs left: pass --gpus N (the run's world size)")
        inner = degrees["tensor_parallel"] * degrees["pipeline_parallel"] * degrees["context_parallel"]
        degrees["data_parallel_shard"] = max(1, gpus // (inner * degrees["data_parallel_replicate"]))
    return degrees


def read_torchtitan(path: Path, config: Path, *, model: Any = None, gpus: int | None = None, framework: str | None = None) -> dict:
    """A MeasuredRun (as a dict) from a torchtitan log and the TOML config it ran with."""
    source = str(path)
    text = ANSI.sub("", read_text_checked(path, max_bytes=MAX_LOG_BYTES))
    job = toml_config(config)
    training, par = job.get("training", {}), job.get("parallelism", {})
    if not isinstance(training.get("seq_len"), int) or not isinstance(training.get("local_batch_size"), int):
        raise BadInputError(f"{config}: [training] needs integer seq_len and local_batch_size: pass the config the run used")
    degrees = titan_degrees(par, gpus, config)
    dp = degrees["data_parallel_replicate"] * degrees["data_parallel_shard"]
    world = gpus or dp * degrees["tensor_parallel"] * degrees["pipeline_parallel"] * degrees["context_parallel"]
    global_batch = training.get("global_batch_size") or -1
    global_batch = global_batch if isinstance(global_batch, int) and global_batch > 0 else training["local_batch_size"] * dp
    steps = []
    for number, line in enumerate(text.splitlines(), 1):
        match = TITAN_STEP.search(line)
        if match:
            tps = _finite(match.group(3), "tps", source, number)
            steps.append((number, global_batch * training["seq_len"] / (tps * world), float(match.group(2))))
    step, lines = steady_step_s([(n, s) for n, s, _ in steps], source, "'step: N  loss: ...  memory: X GiB(Y%)  tps: T' metrics")
    if model is None:
        name = TITAN_PRESETS.get((job.get("model", {}).get("name"), job.get("model", {}).get("flavor")))
        if name is None:
            raise BadInputError(f"{config}: [model] {job.get('model', {})} has no preset of the same architecture: "
                                "pass --model (a preset, a config.json or a model spec)")
        model = name
    ac = job.get("activation_checkpoint", {}).get("mode", "selective")
    pp = degrees["pipeline_parallel"]
    # torchtitan's multi-stage schedules (Interleaved1F1B, ...) place 2 stages per rank unless the config says otherwise
    interleaved = pp > 1 and INTERLEAVED.name in str(par.get("pipeline_parallel_schedule", "")).lower()
    microbatch = int(par.get("pipeline_parallel_microbatch_size", 1)) if pp > 1 else training["local_batch_size"]
    return {
        "name": path.name, "model": model, "framework": framework or "torchtitan", "gpus": world,
        "global_batch_size": global_batch, "seq_len": training["seq_len"], "precision": "bf16",
        "configuration": {"parallelism": {"dp": dp, "tp": degrees["tensor_parallel"], "pp": pp,
                                          "cp": degrees["context_parallel"], "sp": degrees["tensor_parallel"] > 1, "vpp": 2 if interleaved else 1,
                                          "zero_stage": 3 if degrees["data_parallel_shard"] > 1 else 0,
                                          "dp_replicate": degrees["data_parallel_replicate"] if degrees["data_parallel_shard"] > 1 else 1},
                          "microbatch_size": microbatch,
                          "schedule": INTERLEAVED.name if interleaved else DEFAULT.name,
                          "recompute": ac if ac in ("none", "selective", "full") else "selective"},
        "step_time_s": step, "peak_memory_gib": max(memory for _, _, memory in steps), "source": f"{source} ({lines}), {config}",
    }
