"""train.py: the training script `plan --out DIR --stack deepspeed|hf` writes beside its configs.

This module is the script's text; planner/emit/script.py fills PLAN with the plan's numbers
and writes it as DIR/train.py. It imports nothing from the planner, so it runs wherever
torch and transformers are installed (plus deepspeed or accelerate for its stack):

    deepspeed ... train.py --deepspeed --deepspeed_config ds_config.json   (launch.sh, stack deepspeed)
    accelerate launch --config_file accelerate_config.yaml train.py        (launch.sh, stack hf)
    python train.py --steps 2                                              (one process, e.g. on a CPU)

What it does: builds the model from config.json beside it (random weights, as pretraining
does), or from ``--model`` (a directory or Hugging Face hub id; ``--pretrained`` loads its
weights); reads ``--dataset`` (a Hugging Face dataset name, or local .txt/.json/.jsonl/.parquet
files, tokenized with ``--tokenizer``, concatenated and cut into sequences), or, without
one, random token ids (a synthetic stand-in to check that the run starts); trains for PLAN's
optimizer steps with the plan's micro-batch, accumulation, optimizer and learning-rate schedule.
DeepSpeed takes the optimizer and schedule from ds_config.json; under accelerate they are
torch's AdamW and transformers' cosine schedule with warmup and a floor (the same numbers).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

PLAN: dict[str, Any] = {}   # filled by plan --out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=f"Train {PLAN.get('model', 'the model')} as planned "
                                            f"({PLAN.get('layout', '')}).")
    p.add_argument("--model", default=PLAN.get("model_source") or str(here),
                   help="a directory with config.json or a hub id (default: config.json beside this script)")
    p.add_argument("--pretrained", action="store_true", help="load --model's weights instead of initialising")
    p.add_argument("--dataset", default=None,
                   help="a Hugging Face dataset name or local data files; default: random tokens (synthetic)")
    p.add_argument("--dataset-config", default=None, help="the dataset's configuration name")
    p.add_argument("--text-column", default="text")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory or hub id (default: --model)")
    p.add_argument("--steps", type=int, default=PLAN.get("steps", 1), help="optimizer steps (default: the plan's)")
    p.add_argument("--seq-len", type=int, default=PLAN.get("seq_len", 128))
    p.add_argument("--micro-batch", type=int, default=PLAN.get("micro_batch", 1), help="(accelerate only)")
    p.add_argument("--grad-accum", type=int, default=PLAN.get("grad_accum", 1), help="(accelerate only)")
    p.add_argument("--output-dir", default=None, help="save the trained model here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deepspeed", action="store_true", help="run under DeepSpeed (the deepspeed launcher sets it)")
    p.add_argument("--deepspeed_config", default=None)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return p.parse_args(argv)


def build_model(args: argparse.Namespace) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if args.pretrained:
        model = AutoModelForCausalLM.from_pretrained(args.model)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model))
    if PLAN.get("recompute", "none") != "none":
        model.gradient_checkpointing_enable()      # the plan recomputes activations
    model.config.use_cache = False
    return model


def batches(args: argparse.Namespace, vocab_size: int, micro_batch: int, rank: int, world: int) -> Any:
    """Endless micro-batches of token ids, each rank its own share."""
    import torch

    if args.dataset is None:
        g = torch.Generator().manual_seed(args.seed + rank)
        while True:
            yield torch.randint(0, vocab_size, (micro_batch, args.seq_len), generator=g)
    from datasets import load_dataset
    from transformers import AutoTokenizer

    local = [f for f in args.dataset.split(",") if Path(f).exists()]
    if local:
        kind = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}[Path(local[0]).suffix]
        data = load_dataset(kind, data_files=local, split="train")
    else:
        data = load_dataset(args.dataset, args.dataset_config, split="train")
    data = data.shard(num_shards=world, index=rank)
    tok = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    buf: list[int] = []
    while True:
        for row in data:
            buf += tok(row[args.text_column])["input_ids"] + [tok.eos_token_id or 0]
            while len(buf) >= micro_batch * args.seq_len:
                chunk, buf = buf[:micro_batch * args.seq_len], buf[micro_batch * args.seq_len:]
                yield torch.tensor(chunk).view(micro_batch, args.seq_len)


def train_deepspeed(args: argparse.Namespace, model: Any) -> Any:
    """DeepSpeed: optimizer, scheduler, precision, ZeRO and batch sizes from ds_config.json."""
    import deepspeed
    import torch

    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                 ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)       # one process started without a launcher
    deepspeed.init_distributed()
    engine, _, _, _ = deepspeed.initialize(model=model, config=args.deepspeed_config,
                                           model_parameters=[p for p in model.parameters() if p.requires_grad])
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    data = batches(args, model.config.vocab_size, engine.train_micro_batch_size_per_gpu(), rank, world)
    start = time.time()
    while engine.global_steps < args.steps:
        ids = next(data).to(engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if engine.is_gradient_accumulation_boundary() and rank == 0:
            print(f"step {engine.global_steps}/{args.steps} loss {loss.item():.4f} "
                  f"lr {engine.get_lr()[0]:.3g} {time.time() - start:.1f} s, {world} process(es)", flush=True)
    return engine.module


def train_accelerate(args: argparse.Namespace, model: Any) -> Any:
    """accelerate (FSDP2 from accelerate_config.yaml under `accelerate launch`): torch AdamW and
    transformers' cosine schedule with warmup and a floor, the plan's numbers."""
    import torch
    from accelerate import Accelerator
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    acc = Accelerator(gradient_accumulation_steps=args.grad_accum)
    opt = torch.optim.AdamW(model.parameters(), lr=PLAN.get("lr", 3e-4), betas=tuple(PLAN.get("betas", (0.9, 0.95))),
                            eps=PLAN.get("eps", 1e-8), weight_decay=PLAN.get("weight_decay", 0.0))
    sched = get_cosine_with_min_lr_schedule_with_warmup(
        opt, num_warmup_steps=min(PLAN.get("warmup_steps", 0), max(args.steps - 1, 0)),
        num_training_steps=args.steps, min_lr_rate=PLAN.get("min_lr_ratio", 0.0))
    model, opt, sched = acc.prepare(model, opt, sched)
    data = batches(args, model.config.vocab_size, args.micro_batch, acc.process_index, acc.num_processes)
    step, start = 0, time.time()
    while step < args.steps:
        with acc.accumulate(model):
            ids = next(data).to(acc.device)
            loss = model(input_ids=ids, labels=ids).loss
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), PLAN.get("grad_clip", 1.0))
            opt.step()
            sched.step()
            opt.zero_grad()
        if acc.sync_gradients:
            step += 1
            if acc.is_main_process:
                print(f"step {step}/{args.steps} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.3g} "
                      f"{time.time() - start:.1f} s, {acc.num_processes} process(es)", flush=True)
    return acc.unwrap_model(model)


def main(argv: list[str] | None = None) -> None:
    import torch

    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model = build_model(args)
    model = train_deepspeed(args, model) if args.deepspeed else train_accelerate(args, model)
    if args.output_dir:
        model.save_pretrained(args.output_dir)


if __name__ == "__main__":
    main()
