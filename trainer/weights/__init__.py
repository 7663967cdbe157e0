"""Weights from the trainer to the generation engines: one place for the trainer's and the engines' side.

- `names`: the trainer's (live module) parameter names and the checkpoint names engines load;
- `buckets`: the pushed parameters in buckets, each gathered whole on the trainer's device;
- `transport`: what a transport is (`Transport`), the kinds engines name (`TransportKind`), and the
  bridge from the trainer's compute thread to the engine's event loop;
- `in_process`, `disk`, `nccl`: the three transports; `receiver`: the NCCL transport's engine side
  (`vistarl engine serve`); `group`: the process group both sides of it join;
- `sync`: `WeightSync`, what every trainer rank holds, and `weight_sync`, which picks the transport the
  engine names.

Both the learner and the engines import this package; it imports neither (the engines' SGLang request
bodies aside, `vistarl.trainer.rollout.engines.sglang_api`, which is the wire format and nothing else).
"""
