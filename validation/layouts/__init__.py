"""2D (SUMMA/Optimus), 3D (Bian et al. / Colossal-AI) and Pr x Pc (Gholami et al.) layouts written
with torch.distributed collectives on DeviceMesh sub-groups, their equivalence checks against a
single-process reference, and their timing for `perfmodel validate`.

Modules: comm (mesh, logged collectives, shared autograd Functions), block (the transformer block
and its reference), summa2d, cube3d, grid_prpc, harness (check, time_layout, launch, run_layout).
"""

from .comm import CommLog, CommRecord, Grid
from .harness import check, launch, run_layout, time_layout

__all__ = ["CommLog", "CommRecord", "Grid", "check", "launch", "run_layout", "time_layout"]
