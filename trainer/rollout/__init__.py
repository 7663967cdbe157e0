"""The episode side: the episode loop (`episode`), its job and trajectory records, env handles, the two
token tracks, the processor, reward functions, runners, and the generation engines (`engines/`)."""
