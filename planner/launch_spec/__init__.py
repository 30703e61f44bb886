"""What the executor and the exporters share, in one home below both (no torch here).

- options: RunOptions, the flags of an executor run (`planner run`/`planner launch` write them, the runtime parses them);
- commands: the torchrun command lines, the node layout and the sbatch script (`planner launch`, the torchrun/slurm
  exporters);
- runnable: check_runnable, the executor's own rules (the `planner` framework profile) checked before any process
  starts, which `planner run`, the launch scripts and the `planner` judge all apply;
- schedules: the schedule geometry the executor runs (V placement, zero bubble, stage -> rank) and the torch class
  each schedule name builds.

planner.executor and planner.export both import from here; this package imports neither (tests/unit/test_layering.py).
"""
