"""The model, its sharding and its optimizer as planner.measure.trackers builds them for a
measured step: transformers' model from its config (PEFT's LoRA or a frozen base where the
set-up says so), per-block activation checkpointing, FSDP2 per block, and the optimizer.
torch, transformers and peft are imported inside the functions that need them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from planner.errors import UserError
from planner.measure.fakes import outside_fake_mode
from planner.measure.images import freeze_image_side, is_vlm
from planner.training.setup import SGD_MOMENTUM

if TYPE_CHECKING:
    from planner.measure.trackers import MeasureSetup

# Learning rates only matter for values, never for memory.
LR = {"adamw": 1e-4, "sgd": 1e-2, "adafactor": 1e-2}


def build_model(setup: MeasureSetup, device: Any) -> Any:
    """The transformers model for hf_config, in the params dtype, in train mode, on device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    cfg = dict(setup.hf_config)
    model_type = cfg.pop("model_type")
    for key in ("_attn_implementation", "attn_implementation", "torch_dtype", "dtype"):
        cfg.pop(key, None)
    config = AutoConfig.for_model(model_type, **cfg)
    config.use_cache = False
    auto_cls: Any = AutoModelForMaskedLM if model_type == "bert" else AutoModelForCausalLM
    if is_vlm(setup.hf_config):
        from transformers import AutoModelForImageTextToText

        auto_cls = AutoModelForImageTextToText
    dtype = torch.bfloat16 if setup.precision == "bf16" else torch.float32
    with torch.device(device):
        model = auto_cls.from_config(config, attn_implementation=setup.attention, dtype=dtype)
    model.train()
    if is_vlm(setup.hf_config) and setup.freeze_vision:
        freeze_image_side(model, torch.bfloat16 if setup.precision == "bf16-mixed" else None)
    return model


def build_finetuned(setup: MeasureSetup, device: Any) -> Any:
    """The base model in 16 bits (fp32 for "fp32") with LoRA adapters (peft) or with only its
    last blocks trainable (in fp32). Under fake tensors the model is built on the meta device
    and then given fake storage, since module dtype casts cannot swap fake parameters."""
    import torch

    base_dtype = torch.float32 if setup.precision == "fp32" else torch.bfloat16
    build_device = torch.device("meta") if setup.fake else device
    with outside_fake_mode():
        model = build_model(replace_dtype(setup, base_dtype), build_device)
        if setup.method == "lora":
            from peft import LoraConfig, get_peft_model

            config = LoraConfig(r=setup.lora_rank, lora_alpha=setup.lora_alpha, lora_dropout=setup.lora_dropout,
                                target_modules=setup.lora_targets)
            model = get_peft_model(model, config)
        else:
            for p in model.parameters():
                p.requires_grad_(False)
            for block in blocks(model)[-setup.trainable_layers:]:
                block.float()
                for p in block.parameters():
                    p.requires_grad_(True)
    if setup.fake:
        made: dict[int, Any] = {}

        def fake_like(t: Any) -> Any:   # one storage per original tensor: tied weights stay tied
            if id(t) not in made:
                made[id(t)] = torch.empty(t.shape, dtype=t.dtype, device=device)
            return made[id(t)]

        places: dict[int, list[tuple[Any, str]]] = {}
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                places.setdefault(id(p), []).append((module, name))
        model = model._apply(fake_like)
        for where in places.values():        # re-tie: _apply gives each module its own Parameter
            first = getattr(where[0][0], where[0][1])
            for module, name in where[1:]:
                setattr(module, name, first)
    model.train()
    return model


def replace_dtype(setup: MeasureSetup, dtype: Any) -> MeasureSetup:
    """The setup whose build_model dtype is ``dtype`` (bf16 -> "bf16", fp32 -> "fp32")."""
    import torch

    return dataclasses.replace(setup, precision="bf16" if dtype == torch.bfloat16 else "fp32")


def checkpoint_blocks(model: Any) -> None:
    """Recompute every decoder block in backward: torch.utils.checkpoint, use_reentrant=False.

    transformers checkpoints each block's ``forward`` (not ``__call__``), so FSDP2's hooks stay
    outside the checkpoint and do not all-gather a second time in the recompute.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def blocks(model: Any) -> list[Any]:
    """The model's transformer blocks: the first ModuleList as long as num_hidden_layers."""
    import torch

    n_layers = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return list(module)
    raise UserError(f"measure: no list of {n_layers} blocks found in {type(model).__name__}")


def shard(model: Any, setup: MeasureSetup, mesh: Any) -> None:
    """FSDP2: fully_shard each block, then the root (torchtitan's order)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if setup.precision == "bf16-mixed":
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp_policy = MixedPrecisionPolicy()
    reshard = setup.sharding == "full"
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)


def build_optimizer(model: Any, setup: MeasureSetup) -> Any:
    """foreach=False always: under FakeTensorMode with FSDP2 a foreach optimizer is over-counted
    about 13x (docs/facts.md), and per-tensor loops are what the formulas assume anyway."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    lr = LR[setup.optimizer]
    if setup.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, foreach=False)
    if setup.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM, foreach=False)
    return torch.optim.Adafactor(params, lr=lr, foreach=False)
