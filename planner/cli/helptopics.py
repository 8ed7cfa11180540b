"""`plan --help` short, and `plan help TOPIC` for the rest (issue 33: the help was 243 lines).

`plan --help` shows MAIN, the options most runs need, then the topics and the commands.
Every other option belongs to one topic by name (TOPICS); an option no topic names (a new
one) falls into "other", so none is ever hidden. docs/options.md documents every option
(tests/test_cli_help.py checks both).
"""

from __future__ import annotations

from typing import Any

import click

from planner.layouts.layout import AXES

MAIN = ("--model", "--gpus", "--n-gpus", "--max-gpus", "--tokens", "--deadline", "--method", "--stack", "--out",
        "--json", "--quiet", "--help", "--version")

# topic -> (what it is about, its options: the main ones again where they belong)
TOPICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "layouts": ("parallel degrees, sharding, batch, recomputation",
                ("--n-gpus", "--max-gpus", *(a.flag for a in AXES), "--etp", "--zero", "--fsdp",
                 "--optimizer-instances", "--fsdp-pipeline-grad-sync", "--pp-balance", "--pp-layout",
                 "--vp", "--sp", "--micro-batch", "--seq-len",
                 "--global-batch", "--global-batch-tokens", "--grad-accum", "--recompute", "--recompute-every",
                 "--recompute-method", "--recompute-num-layers", "--recompute-modules", "--ds-checkpointing",
                 "--offload-activations", "--pp-microbatch-group")),
    "training": ("precision, optimizer, kernels, memory allowances",
                 ("--stack", "--compile", "--precision", "--fp8-recipe", "--fp8-param-gather", "--bf16-layers", "--mtp",
                  "--moe-imbalance", "--optimizer", "--cross-entropy",
                  "--moe-a2a-overlap", "--cuda-graphs", "--fp8-attention", "--moe-dispatcher",
                  "--attention", "--kernels", "--fragmentation", "--usable-memory", "--fit-confidence",
                  "--offload-optimizer", "--offload-params")),
    "methods": ("fine-tuning (LoRA, QLoRA, freeze) and inference memory",
                ("--method", "--lora-rank", "--lora-alpha", "--lora-targets", "--lora-dropout", "--quant",
                 "--trainable-layers", "--images-per-sample", "--freeze-vision", "--task", "--mla-cache")),
    "posttrain": ("distillation (--teacher) and RL (--task grpo|ppo|dpo)",
                  ("--teacher", "--teacher-precision", "--teacher-quant", "--teacher-sharding", "--kd-loss",
                   "--kd-hidden-layers", "--kd-offline-topk", "--prompt-len", "--response-len", "--response-mean",
                   "--group-size", "--prompts-per-step", "--rollout", "--rollout-tp", "--rollout-memory-fraction",
                   "--offload-train-states", "--rl-async", "--rl-steps")),
    "time": ("step time: the cluster and calibration",
             ("--topology", "--time-confidence", "--calibration")),
    "cost": ("training on N tokens: deadline, budget, prices, solver",
             ("--tokens", "--deadline", "--budget", "--objective", "--prices", "--solver")),
    "output": ("JSON, one line, configs and launch files, plots, cross-checks",
               ("--json", "--quiet", "--out", "--force", "--scheduler", "--stack", "--plot", "--crosscheck")),
}
OTHER = "other"


def long_name(p: click.Parameter) -> str:
    return next((o for o in p.opts if o.startswith("--")), p.opts[0])


def topic_params(ctx: click.Context, topic: str) -> list[click.Parameter]:
    """The options of ``topic`` in the command's order; "other": those no topic names."""
    params = [p for p in ctx.command.get_params(ctx) if isinstance(p, click.Option)]
    if topic == OTHER:
        named = {n for _, names in TOPICS.values() for n in names} | set(MAIN)
        return [p for p in params if long_name(p) not in named]
    wanted = TOPICS[topic][1]
    return [p for p in params if long_name(p) in wanted]


def topics(ctx: click.Context) -> list[str]:
    """The topics with options, "other" last when some option is in no topic."""
    return [*TOPICS, *([OTHER] if topic_params(ctx, OTHER) else [])]


def format_main_options(ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """`plan --help`: the main options, then the topics."""
    params = {long_name(p): p for p in ctx.command.get_params(ctx)}
    rows = [rec for name in MAIN if name in params and (rec := params[name].get_help_record(ctx))]
    with formatter.section("Main options"):
        formatter.write_dl(rows)
    with formatter.section("More options, by topic (plan help TOPIC; plan help all; every one in docs/options.md)"):
        formatter.write_dl([(name, f"{TOPICS[name][0] if name in TOPICS else 'options of no other topic'} "
                                   f"({len(topic_params(ctx, name))} options)") for name in topics(ctx)])


def topic_help(ctx: click.Context, topic: str) -> str:
    """The help text of ``topic``'s options ("all": every option of `plan`)."""
    formatter = ctx.make_formatter()
    names = topics(ctx) if topic == "all" else [topic]
    for name in names:
        rows = [rec for p in topic_params(ctx, name) if (rec := p.get_help_record(ctx))]
        title = TOPICS[name][0] if name in TOPICS else "options of no other topic"
        with formatter.section(f"{name}: {title}"):
            formatter.write_dl(rows)
    return formatter.getvalue()


def help_command(group: click.Command) -> click.Command:
    """`plan help [TOPIC]`: the options of one topic, or the list of topics."""

    @click.command("help", context_settings={"help_option_names": ["-h", "--help"]})
    @click.argument("topic", required=False)
    def help_cmd(topic: str | None) -> None:
        """The options of one topic: plan help layouts (or training, methods, posttrain, time, cost, output, all)."""
        with click.Context(group, info_name="plan", max_content_width=100) as ctx:
            known = topics(ctx)
            if topic is None:
                for name in known:
                    about: Any = TOPICS[name][0] if name in TOPICS else "options of no other topic"
                    click.echo(f"plan help {name:<9} {about}")
                click.echo("plan help all       every option")
                return
            if topic not in (*known, "all"):
                raise click.UsageError(f"no help topic {topic!r}; choose one of {', '.join(known)} or all")
            click.echo(topic_help(ctx, topic), nl=False)

    return help_cmd
