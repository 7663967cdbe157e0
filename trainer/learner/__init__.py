"""The learner: models and FSDP sharding, packing, logprobs, advantages, losses, the PPO-family update
(`update`), SFT's step (`imitation`), and checkpoints. Weights reach the engines through
`vistarl.trainer.weights`."""
