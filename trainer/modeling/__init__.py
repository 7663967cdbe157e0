"""How the HF Qwen-VL models run, shared by the learner and the HF engine: packed-row attention
(`attention`), the vision tower's features (`image_features`) and host-side inputs (`vision_inputs`),
and host-to-device copies (`device`). It imports nothing else of `trainer/`."""
