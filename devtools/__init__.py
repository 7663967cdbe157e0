"""Development tooling: the tiny Qwen-VL checkpoint writer and the model shapes benchmarks use."""
