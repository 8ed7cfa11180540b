"""Vision-language models: a wrapper config.json (``qwen3_vl``, ``qwen3_vl_moe``, ``llama4``,
``mistral3``, ``gemma3``, ``qwen3_5``, ``qwen3_5_moe``) is planned as its text tower, read from
``text_config`` by the tower's written family, plus the vision encoder's parameters (and the
projector's), counted exactly on transformers' whole model built on the meta device (probe.py)
and cached per config like the generic path's profiles (load.py), so that torch is imported
only the first time a config is seen.
"""
