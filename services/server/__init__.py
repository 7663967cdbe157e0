"""The environment server framework: routes, sessions, env pools and workers, limits, auth, metrics."""
