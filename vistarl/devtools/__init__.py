"""Development tooling: the tiny Qwen-VL checkpoint writer, the model shapes benchmarks use, and the
real servers that tests, demos and benchmarks start on loopback (`servers.py`)."""
