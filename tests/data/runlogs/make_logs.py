"""Writes the calibration fixtures of this folder: logs in Megatron-LM's and torchtitan's own formats (README.md).

The step times are synthetic and known: the planner's cost model at a GEMM ceiling of TRUE_CEILING with a per-step
overhead of TRUE_OVERHEAD_S, times a fixed small deviation per run (NOISE), so `planner calibrate` must recover
those constants (tests/unit/test_calibrate.py). Rerun after a cost-model change moves them:

    PYTHONPATH=. python tests/data/runlogs/make_logs.py
"""

from __future__ import annotations

from pathlib import Path

from planner.calibrate.fit import priced_case
from planner.models import load_model
from planner.schemas.runs import MeasuredRun
from planner.topology import load_topology

HERE = Path(__file__).resolve().parent
TRUE_CEILING, TRUE_OVERHEAD_S = 0.55, 0.10
NOISE = (0.01, -0.015, 0.005)
MODEL = "llama3-8b"
# Megatron-LM runs of a Llama-3-8B-shaped model on 2 DGX H100 nodes: (file, tp, pp, vpp, dp, mbs, gbs, recompute, sp)
MEGATRON = (("megatron-tp2.log", 2, 1, 1, 8, 1, 128, None, True),
            ("megatron-tp4-pp2.log", 4, 2, 2, 2, 1, 128, None, True),
            ("megatron-dp16.log", 1, 1, 1, 16, 1, 128, "full", False))
# torchtitan runs of llama3 8B on one DGX H100: (stem, dp_shard, tp, local_batch_size, ac mode)
TORCHTITAN = (("torchtitan-fsdp8", 8, 1, 2, "selective"), ("torchtitan-tp2", 4, 2, 2, "full"))
SEQ = 4096


def step_time(run: dict, noise: float) -> float:
    case = priced_case(MeasuredRun(**run), load_model(MODEL), load_topology("dgx-h100", gpus=run["gpus"]))
    return (case.step_s(TRUE_CEILING) + TRUE_OVERHEAD_S) * (1 + noise)


def megatron_args(tp: int, pp: int, vpp: int, dp: int, mbs: int, gbs: int, recompute: str | None, sp: bool) -> dict:
    """A subset of the namespace Megatron-LM prints (arguments.py _print_args), for pretrain_gpt.py of Llama-3-8B."""
    return {"add_bias_linear": False, "add_qkv_bias": False, "bf16": True, "context_parallel_size": 1,
            "expert_model_parallel_size": 1, "ffn_hidden_size": 14336, "fp16": False, "fp8": None,
            "global_batch_size": gbs, "group_query_attention": True, "hidden_size": 4096, "kv_channels": 128,
            "log_interval": 10, "lr": 0.0003, "max_position_embeddings": 8192, "micro_batch_size": mbs,
            "normalization": "RMSNorm", "num_attention_heads": 32, "num_layers": 32, "num_query_groups": 8,
            "overlap_grad_reduce": True, "padded_vocab_size": 128256, "pipeline_model_parallel_size": pp,
            "position_embedding_type": "rope", "recompute_granularity": recompute, "rotary_base": 500000,
            "seq_length": SEQ, "sequence_parallel": sp, "swiglu": True, "tensor_model_parallel_size": tp,
            "train_iters": 50, "untie_embeddings_and_output_weights": True, "use_distributed_optimizer": True,
            "virtual_pipeline_model_parallel_size": vpp if vpp > 1 else None, "data_parallel_size": dp,
            "world_size": tp * pp * dp}


def megatron_log(args: dict, step_s: float) -> str:
    """The log as Megatron-LM prints it: _print_args, then training_log lines and report_memory lines."""
    lines = ["using world size: {}, data-parallel size: {}, context-parallel size: 1, tensor-model-parallel size: {}, "
             "pipeline-model-parallel size: {}".format(args["world_size"], args["data_parallel_size"],
                                                      args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"]),
             "------------------------ arguments ------------------------"]
    lines += sorted(("  {} {} {}".format(name, "." * (48 - len(name)), value) for name, value in args.items()), key=str.lower)
    lines.append("-------------------- end of arguments ---------------------")
    lines.append("[after dataloaders are built] datetime: 2026-11-20 10:00:00 ")
    jitter = (1.004, 0.998, 1.001, 0.997, 1.0)
    for k, factor in enumerate((1.9, *jitter)):  # the first interval holds start-up
        iteration = 10 * (k + 1)
        lines.append(f" [2026-11-20 10:0{k}:00.000000] iteration {iteration:8d}/{args['train_iters']:8d} | consumed samples: "
                     f"{iteration * args['global_batch_size']:12d} | elapsed time per iteration (ms): {step_s * factor * 1000:.1f} | "
                     f"learning rate: 3.000000E-04 | global batch size: {args['global_batch_size']:5d} | lm loss: 7.512345E+00 | "
                     "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |")
        if k == 0:
            for rank in range(0, args["world_size"], max(1, args["world_size"] // args["pipeline_model_parallel_size"])):
                lines.append(f"[Rank {rank}] (after 10 iterations) memory (MB) | allocated: 30123.45 | max allocated: "
                             f"{52345.67 + rank:.2f} | reserved: 60234.00 | max reserved: {61234.00 + rank:.2f}")
    return "\n".join(lines) + "\n"


def titan_files(dp_shard: int, tp: int, lbs: int, ac: str, step_s: float) -> tuple[str, str]:
    """(TOML config in torchtitan's train_configs layout, log with MetricsProcessor.log lines, colours on)."""
    config = (f'[job]\ndump_folder = "./outputs"\ndescription = "Llama 3 8B training"\n\n[metrics]\nlog_freq = 10\n\n'
              f'[model]\nname = "llama3"\nflavor = "8B"\n\n[training]\nlocal_batch_size = {lbs}\nseq_len = {SEQ}\nsteps = 60\n\n'
              f'[parallelism]\ndata_parallel_replicate_degree = 1\ndata_parallel_shard_degree = {dp_shard}\n'
              f'tensor_parallel_degree = {tp}\npipeline_parallel_degree = 1\ncontext_parallel_degree = 1\n\n'
              f'[activation_checkpoint]\nmode = "{ac}"\n')
    world = dp_shard * tp
    tokens = lbs * dp_shard * SEQ
    red, green, orange, turq, blue, cyan, magenta, reset = ("\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[34m",
                                                           "\x1b[96m", "\x1b[35m", "\x1b[39m")
    lines = [f"[rank0]:[titan] 2026-11-20 10:00:00,000 - root - INFO - Building 1-D device mesh with ['dp_shard'], [{world}]"]
    for k, factor in enumerate((3.0, 1.003, 0.999, 1.0, 0.998, 1.002)):
        tps = tokens / (step_s * factor * world)
        lines.append(f"[rank0]:[titan] 2026-11-20 10:0{k}:00,000 - root - INFO - {red}step: {1 + 10 * k:2}  {green}loss: "
                     f" 7.12345  {orange}grad_norm:  1.2345  {turq}memory: 61.23GiB(77.43%)  {blue}tps: {round(tps):,}  "
                     f"{cyan}tflops: 345.67  {magenta}mfu: 34.95%{reset}")
    return config, "\n".join(lines) + "\n"


def main() -> None:
    for (name, tp, pp, vpp, dp, mbs, gbs, recompute, sp), noise in zip(MEGATRON, NOISE):
        run = {"name": name, "model": MODEL, "framework": "megatron-core", "gpus": tp * pp * dp, "global_batch_size": gbs,
               "seq_len": SEQ, "configuration": {"parallelism": {"dp": dp, "tp": tp, "pp": pp, "vpp": vpp, "sp": sp, "zero_stage": 1},
                                                 "microbatch_size": mbs, "schedule": "interleaved" if vpp > 1 else "1f1b",
                                                 "recompute": recompute or "none"}, "step_time_s": 1.0}
        (HERE / name).write_text(megatron_log(megatron_args(tp, pp, vpp, dp, mbs, gbs, recompute, sp), step_time(run, noise)))
    for (stem, dp_shard, tp, lbs, ac), noise in zip(TORCHTITAN, NOISE):
        run = {"name": stem, "model": MODEL, "framework": "torchtitan", "gpus": dp_shard * tp, "global_batch_size": lbs * dp_shard,
               "seq_len": SEQ, "configuration": {"parallelism": {"dp": dp_shard, "tp": tp, "pp": 1, "sp": tp > 1, "zero_stage": 3},
                                                 "microbatch_size": lbs, "recompute": ac}, "step_time_s": 1.0}
        config, log = titan_files(dp_shard, tp, lbs, ac, step_time(run, noise))
        (HERE / f"{stem}.toml").write_text(config)
        (HERE / f"{stem}.log").write_text(log)


if __name__ == "__main__":
    main()
