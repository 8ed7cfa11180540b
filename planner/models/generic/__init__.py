"""The generic path: any causal LM transformers can build, for a model_type no family
translator is written for (planner.models.families). Its parameters are counted exactly on
transformers' model on the meta device, its saved tensors and FLOPs per token measured under
fake tensors, once per config (cache.py); the memory and time models read the profile
(profile.py) instead of their per-family formulas. Layouts: data parallel, ZeRO/FSDP and
pipeline stages; tensor, context and expert parallelism need a written family.
"""
