"""The training job perfmodel validates against and calibrates with: torch only.

In the spirit of torchtitan's split:

- model.py        the GPT-style transformer, cut into pipeline chunks
- parallelize.py  its DeviceMesh, DTensor tensor/sequence parallel styles, FSDP2, cp / ep groups
- context_parallel.py  the sequence over cp ranks: ring (send/recv), all-gather, Ulysses attention
- moe.py          the mixture-of-experts MLP and its expert-parallel all-to-all dispatch
- settings.py     the cp / ep settings and their rules (standard library only)
- equivalence.py  one step of a plan against one process (python -m workload.equivalence)
- trainer.py      one rank's training loop: micro-batches, pipeline schedules, gradient sync
- timers.py       what a rank measures: clock, collectives (counted and timed), peak memory
- process.py      a rank's process: loopback rendezvous, exit with the launcher, allocator
- job.py          the job's entry point (python -m workload.job CONFIG.json), its run files
- launcher.py     the one launcher of local ranks (validation jobs, calibration, layouts)
- layouts/        the 2D (SUMMA), 3D and Pr x Pc grid layouts, their equivalence checks and timing

The job's modules (job.py and what it imports) use only the standard library and torch: `perfmodel
validate --emit` copies them to a cluster. The launcher and the layouts also use perfmodel's
errors and files; nothing here imports calibration or validation, which both import this package.
Importing the package imports nothing.
"""
