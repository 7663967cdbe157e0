"""Train a vision-language model on a vistarl env with TRL's GRPOTrainer (docs/trl.md).

python examples/trl_grpo.py ENV_URL --model CHECKPOINT [--env sokoban|geo3k|vsi] [--options JSON]
    [--tasks N] [--steps N] [--num-generations N] [--max-completion-length N] [--out DIR]

ENV_URL is a running `vistarl serve ENV`; CHECKPOINT a Qwen3-VL checkpoint (its chat template lists
tools, which TRL's tool calling needs): a local directory or a Hub id. Set VISTARL_API_TOKEN for an env
server with a token. Needs `pip install 'vistarl[trl]'`.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from trl import GRPOConfig, GRPOTrainer

from vistarl.clients import EnvClient
from vistarl.clients.trl import Geo3k, Sokoban, Vsi, dataset
from vistarl.devtools.hf_processor import load_processor

ENVS = {"sokoban": Sokoban, "geo3k": Geo3k, "vsi": Vsi}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("env_url")
    parser.add_argument("--model", required=True, help="a Qwen3-VL checkpoint: a directory or a Hub id")
    parser.add_argument("--env", choices=sorted(ENVS), default="sokoban", help="the env the server serves")
    parser.add_argument("--options", default="{}", help="the env's options for every episode, as JSON")
    parser.add_argument("--tasks", type=int, default=64, help="seeds 0..N-1 make the dataset")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--num-generations", type=int, default=8, help="rollouts per task (GRPO's group)")
    parser.add_argument("--max-completion-length", type=int, default=1024, help="tokens a rollout may hold")
    parser.add_argument("--out", default="runs/trl-grpo")
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental in TRL
    env_class, options = ENVS[args.env], json.loads(args.options)
    with EnvClient(args.env_url) as client:
        config = GRPOConfig(
            output_dir=args.out,
            max_steps=args.steps,
            per_device_train_batch_size=args.num_generations,  # one task's group per device and step
            num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            bf16=torch.cuda.is_available(),
            activation_checkpointing=torch.cuda.is_available(),
            logging_steps=1,
            save_strategy="no",
            report_to="none",
        )
        trainer = GRPOTrainer(
            model=args.model,
            args=config,
            processing_class=load_processor(args.model),
            train_dataset=dataset(client, seeds=range(args.tasks)),
            environment_factory=lambda: env_class(client, options),
        )
        trainer.train()
        for record in trainer.state.log_history:
            if "reward" in record:
                print(f"step {record['step']}: reward {record['reward']:+.3f}")


if __name__ == "__main__":
    main()
