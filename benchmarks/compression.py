"""Where communication compression starts to pay: per inter-node bandwidth, the best plan without and with
compression (`--compression auto`: each configuration with the compression its framework runs, chosen only beyond the
model's ranking band), and the (de)compression kernels measured against the formulas that price them.

Sweep: planner/data/topologies/hgx-h100-roce-100g.yaml (8 x H100 per node, 2 NICs) with each NIC's bandwidth set to the
values below, and dgx-h100 (one 45 GB/s NIC per GPU) as the reference; TinyLlama-1.1B on our executor (PowerSGD,
16-bit gradient all-reduces, hpZ) and Llama-3-8B on DeepSpeed (ZeRO++) on 4 nodes, Llama-3-70B on DeepSpeed on 8.

Kernels (`--kernels`): on this machine's device (CPU here; CUDA where one is present), the work each method adds
on the communication path, timed, beside planner.cost.compression's price for it: gradient-sized passes at the
device's measured copy rate (a plain tensor copy, bytes read + written per second). The formula's pass counts are
what this checks; on a GPU the same command measures the GPU.

Run: python benchmarks/compression.py [--kernels] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NIC_GBPS = (1.5, 3.0, 6.0, 11.25, 22.5, 45.0)
CASES = (("tinyllama-1.1b", "planner", 256, 2048, 4), ("llama3-8b", "deepspeed", 128, 4096, 4),
         ("llama3-70b", "deepspeed", 64, 4096, 8))


def sweep() -> list[dict]:
    from planner import api
    from planner.schemas.plan import SearchLimits

    rows = []
    for model, framework, batch, seq, nodes in CASES:
        for topology, nic in [*(("hgx-h100-roce-100g", g) for g in NIC_GBPS), ("dgx-h100", None)]:
            topo = api.load_topology(topology, nodes=nodes)
            if nic is not None:
                topo = topo.model_copy(update={"inter_node": topo.inter_node.model_copy(update={"nic_bandwidth_GBps": nic})})
            plans = {}
            for mode in ("none", "auto"):
                limits = SearchLimits(compression="auto") if mode == "auto" else SearchLimits()
                request = api.build_request(model=model, topology=topo, global_batch_size=batch, seq_len=seq,
                                            framework=framework, search=limits)
                plans[mode] = api.plan(request)
            rows.append(_row(model, framework, topology, topo, plans))
    return rows


def _row(model, framework, topology, topo, plans) -> dict:
    plain, auto = plans["none"], plans["auto"]
    par = auto.parallelism
    return {
        "model": model, "framework": framework, "topology": topology,
        "nic_GBps_per_gpu": topo.inter_node.nics_per_node * topo.inter_node.nic_bandwidth_GBps / topo.gpus_per_node,
        "without_s": plain.prediction.step_time_s, "without": _degrees(plain.parallelism),
        "with_s": auto.prediction.step_time_s, "with": _degrees(par), "compression": par.compression.label,
        "gain": 1 - auto.prediction.step_time_s / plain.prediction.step_time_s,
    }


def _degrees(par) -> str:
    return f"dp{par.dp} tp{par.tp} pp{par.pp} zero{par.zero_stage}"


def kernels(elements: int = 1 << 24) -> list[dict]:
    """Each method's communication-path work on a gradient of `elements` fp32 values, timed, and its price."""
    import torch

    from planner.cost import compression as C

    device = "cuda" if torch.cuda.is_available() else "cpu"
    grad = torch.randn(elements, device=device)
    copy_Bps = 2 * grad.numel() * 4 / _time(lambda: grad.clone())
    n = int(elements ** 0.5)
    matrix, err = grad[: n * n].view(n, n), torch.zeros(n, n, device=device)
    q = torch.randn(n, 4, device=device)

    def powersgd():
        m = matrix + err
        p = torch.linalg.qr(m @ q).Q
        qq = m.T @ p
        approx = p @ qq.T
        err.copy_(m - approx)

    def cast():
        grad.to(torch.bfloat16).to(torch.float32)

    half = grad.to(torch.bfloat16)

    def quantize():  # qwZ: int8 per group of QWZ_GROUP with an fp32 absmax scale, then back
        groups = half[: elements // C.QWZ_GROUP * C.QWZ_GROUP].view(-1, C.QWZ_GROUP)
        scale = groups.abs().amax(dim=1, keepdim=True).float() / 127
        codes = (groups.float() / scale).round().to(torch.int8)
        (codes.float() * scale).to(torch.bfloat16)

    priced = {
        "powersgd (rank 4, per fp32 gradient element)": (powersgd, n * n * 4 * C.POWERSGD_PASSES),
        "bf16 gradient cast there and back": (cast, elements * C.CAST_PASS_BYTES),
        "qwZ int8 quantize + dequantize of bf16 weights": (quantize, elements * C.QUANT_PASS_BYTES),
    }
    out = []
    for name, (fn, bytes_moved) in priced.items():
        measured = _time(fn)
        out.append({"kernel": name, "device": device, "measured_s": measured, "priced_s": bytes_moved / copy_Bps,
                    "copy_GBps": copy_Bps / 1e9})
    return out


def _time(fn, repeats: int = 5) -> float:
    """The fastest of `repeats` calls after one warm-up (interference on a shared box only adds time)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", action="store_true", help="also time the compression kernels on this device")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)
    rows = sweep()
    print(f"{'model':15} {'framework':9} {'topology':19} {'GB/s/gpu':>8} {'without':>9} {'with':>9} {'gain':>6}  compression (layout)")
    for r in rows:
        print(f"{r['model']:15} {r['framework']:9} {r['topology']:19} {r['nic_GBps_per_gpu']:8.2f} {r['without_s']:9.4f} "
              f"{r['with_s']:9.4f} {r['gain']:6.1%}  {r['compression']} ({r['with']}; without: {r['without']})")
    result = {"sweep": rows}
    if args.kernels:
        result["kernels"] = kernels()
        print(f"\n{'kernel':48} {'device':6} {'measured s':>11} {'priced s':>10} {'copy GB/s':>9}")
        for k in result["kernels"]:
            print(f"{k['kernel']:48} {k['device']:6} {k['measured_s']:11.4g} {k['priced_s']:10.4g} {k['copy_GBps']:9.1f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
