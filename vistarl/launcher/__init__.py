"""`vistarl up`: the whole system as processes on one host. `plan.py` says which processes and how each
is started (`addresses.py`: where they listen and are reached), `preflight.py` refuses what cannot work
before any starts, `lock.py` keeps a directory to one run, `supervisor.py` runs and watches them,
`gpus.py` samples the GPUs, `status.py` reads a run back for `vistarl status`."""
