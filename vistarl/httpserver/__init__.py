"""HTTP-server plumbing that vistarl's servers share: the env servers (`vistarl.services.server`) and the LLM
engine server (`vistarl.trainer.rollout.engines.server`) both import it, and it imports neither.

errors.py: every failure as an `ErrorResponse` body; metrics.py: a server's own Prometheus registry and
its error counter; guard.py: bearer-token auth and the body size limit; launch.py: a `vistarl` server
as a child process on a free loopback port.
"""
