"""The cost model: pure, cited formulas for compute (compute.py), memory (memory.py), communication (comm.py) and
pipeline schedules (schedule.py), calibrated per device family (calibration.yaml), behind one facade
(model.CostModel) that the search and `planner estimate` (estimate.py) call.
"""

from planner.cost.model import Candidate, CostModel, CostOptions, Evaluation, LayerCosts

__all__ = ["Candidate", "CostModel", "CostOptions", "Evaluation", "LayerCosts"]
