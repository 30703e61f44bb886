"""parallelize.adamw_impl: the executor's AdamW is fused on CUDA unless DTensors and plain tensors mix in one list,
which DTensor's dispatcher refuses for the fused and the foreach kernels alike (checked here on CPU tensors with
torch's own optimizer: the dispatch is device-independent), so those lists take torch's per-tensor loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import os, socket, torch, torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from planner.executor.parallelize import adamw_impl
    mesh = init_device_mesh("cpu", (1,))
    a = torch.nn.Parameter(distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)]))
    b = torch.nn.Parameter(torch.randn(4))
    assert adamw_impl([a, b], on_cuda=True) == {"foreach": False}
    assert adamw_impl([a], on_cuda=True) == adamw_impl([b], on_cuda=True) == {"fused": True}
    assert adamw_impl([a, b], on_cuda=False) == {}
    for kwargs, ok in (({"fused": True}, False), ({"foreach": True}, False), (adamw_impl([a, b], on_cuda=True), True),
                       ({"fused": True, "params": [a]}, True)):
        params = kwargs.pop("params", [a, b])
        opt = torch.optim.AdamW(params, lr=1e-3, **kwargs)
        for p in params:
            p.grad = torch.ones_like(p)
        try:
            opt.step()
            ran = True
        except RuntimeError as error:
            ran = False
            assert "mixed torch.Tensor and DTensor" in str(error), error
        assert ran == ok, (kwargs, ran)
    dist.destroy_process_group()
    print("ok")
    from planner.executor.lifetime import exit_now
    exit_now(0)  # a clean return can abort in finalization (lifetime.exit_now says why)
""")


def test_fused_adamw_only_over_homogeneous_parameters():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
