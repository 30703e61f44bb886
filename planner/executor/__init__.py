"""The executor: a LaunchPlan becomes a torch.distributed training job.

Submodules (import them directly; they import torch, this package file does not):
- `parallelize`: apply_tp / apply_ep / apply_ac / apply_dp / build_optimizer / sync_gradients on the plain
  reference model of `planner.nn`;
- `domino`: Domino-style TP overlap (`tp_overlap="domino"`) and its timing helper;
- `train`: `train_steps`, the loop the runtime and the tests share, and deterministic synthetic batches.
"""
