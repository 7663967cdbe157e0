"""The run driver: the RL loop (`train`), the parts it drives (`stack`: env server, queue, engine,
workers), what each step plays (`prompts`), the ranks' commands and learners (`ranks`, `rank_commands`,
`rank_learner`), the weights the engine serves (`weight_keeper`), and what a run leaves (`directory`,
`outputs`, `wandb_sink`, `rollout_metrics`). It may import every other room of `trainer/`; none of
them imports it."""
