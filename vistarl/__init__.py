"""vistarl: multi-turn reinforcement learning for vision-language models against HTTP environment servers.

The one import package of the project. `vistarl.clients` (the wire protocol and the env clients),
`vistarl.services` (the env servers) and `vistarl.trainer` (rollout, queue, learner) are the folders of
those names at the repository's top; `vistarl.cli`, `vistarl.launcher`, `vistarl.httpserver` and
`vistarl.devtools` live here (docs/architecture.md).
"""
