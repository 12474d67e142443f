"""`perfmodel validate` for the 2D, 3D and Pr x Pc layouts (run by workload.layouts): compare
(timings and collectives against the model's predictions and ledger) and cli_hook (the command)."""
