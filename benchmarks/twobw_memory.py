"""PipeDream-2BW's measured memory against the planner's prediction of two weight versions (CPU, gloo, fp32).

`planner.api.estimate` plans a 2-stage pipeline of a model whose stages hold ~8M parameters (~32 MiB per
weight version) with 1F1B and with 2BW; `planner run` trains each for a few steps. Per rank it prints the
predicted weight bytes (params_bytes: one version under 1F1B, two under 2BW), the weights the run holds
(counted from its parameter storages) and the peak RSS of both runs: 2BW's extra RSS over 1F1B should be about
one weight version. RSS also holds the interpreter, torch and each schedule's own transients
(torch.distributed.pipelining's last stage allocates more than the 2BW loop), so it is compared, not asserted.

    python benchmarks/twobw_memory.py [--layers 2] [--steps 2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from planner import api
from planner.executor.run import run_plan
from planner.io import atomic_write_text, canonical_json
from planner.launch_spec.options import RunOptions
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Configuration, Parallelism
from planner.schemas.topology import DeviceSpec, InterNodeFabric, IntraNodeFabric, Topology

MiB = 2**20
CPU = Topology(
    name="cpu-memory", device=DeviceSpec(name="cpu", memory_bytes=2**33, peak_bf16_tflops=0.05, peak_fp32_tflops=0.05,
                                         hbm_bandwidth_GBps=10.0),
    gpus_per_node=2, num_nodes=1, intra_node=IntraNodeFabric(kind="loopback", bandwidth_GBps=3.0, latency_s=5e-5),
    inter_node=InterNodeFabric(kind="none", nics_per_node=0, nic_bandwidth_GBps=0.0, latency_s=0.0, topology="none"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    spec = ModelSpec(name="mid", num_layers=args.layers, hidden_size=512, ffn_hidden_size=2048, num_attention_heads=8,
                     vocab_size=8192, seq_len=16, activation="swiglu", norm="rmsnorm")
    request = api.build_request(model=spec, topology=CPU, gpus=2, global_batch_size=2, seq_len=16, precision="fp32")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for schedule in ("1f1b", "2bw"):
            plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=1, tp=1, pp=2), microbatch_size=1, schedule=schedule))
            path = Path(tmp) / f"{schedule}.json"
            atomic_write_text(path, canonical_json(plan))
            report = run_plan(path, options=RunOptions(steps=args.steps, lr=1e-3, timeout_s=300))
            predicted = [s.memory.params_bytes for s in sorted(plan.stages, key=lambda s: s.stage)]
            rows[schedule] = [(p, m.weights_bytes, m.peak_bytes) for p, m in zip(predicted, sorted(report.memory, key=lambda m: m.rank))]
    print("rank  schedule  predicted weights MiB  held weights MiB  peak RSS MiB")
    for schedule, per_rank in rows.items():
        for rank, (pred, held, rss) in enumerate(per_rank):
            print(f"{rank:4d}  {schedule:8s}  {pred / MiB:21.1f}  {held / MiB:16.1f}  {rss / MiB:12.0f}")
    for rank in range(2):
        extra_pred = rows["2bw"][rank][0] - rows["1f1b"][rank][0]
        extra_rss = rows["2bw"][rank][2] - rows["1f1b"][rank][2]
        print(f"rank {rank}: 2BW - 1F1B peak RSS {extra_rss / MiB:.1f} MiB, predicted second version {extra_pred / MiB:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
