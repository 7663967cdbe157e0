"""Generation engines: one interface, `async generate(GenerateRequest) -> GenerateResult` (`base`), and

- `SGLangEngine` (`sglang`): SGLang's native HTTP API (production), or `vistarl engine serve`;
- `HFEngine` (`hf`): transformers in this process, also served over HTTP by `server`;
- `ScriptedEngine` (`scripted`): replies from a function, for baselines such as a random policy;
- `EnginePool` (`pool`): several engines as one, each request to the least loaded, an episode's turns to
  one engine.

`spec.EngineSpec` names one; `loading.make_engine` / `loading.load_engine` build it. docs/engines.md
has the details.
"""
