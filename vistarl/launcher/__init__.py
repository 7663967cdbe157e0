"""`vistarl up`: the whole system as processes on one host. `plan.py` says which processes and how each
is started, `supervisor.py` runs and watches them, `gpus.py` samples the GPUs, `status.py` reads a run
back for `vistarl status`."""
