"""The learner: models and FSDP sharding, packing, logprobs, advantages, losses, the PPO-family update
(`update`), weight sync to the engine, and checkpoints."""
