import time, os
t0=time.time()
import torch, torch.distributed as dist
t1=time.time()
from validation.layouts import harness
harness.init_from_env()
t2=time.time()
from validation.layouts.comm import Grid
g=Grid.build((2,2,2),("x","y","z"))
t3=time.time()
r=harness.check("3d", harness.BLOCK_DIMS, {"q":2})
t4=time.time()
dist.barrier(); t5=time.time()
print(dist.get_rank(), f"import {t1-t0:.1f} init {t2-t1:.1f} mesh {t3-t2:.1f} check {t4-t3:.1f} barrier {t5-t4:.1f}", flush=True)
dist.destroy_process_group()
