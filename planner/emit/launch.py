"""The cluster side: a hostfile and a launch script with the multi-node command.

DeepSpeed plans launch with the ``deepspeed`` launcher (deepspeed/launcher/runner.py:
``--hostfile``, ``--num_nodes``, ``--num_gpus``, ``--master_addr``, ``--master_port``;
its hostfile has one ``HOST slots=N`` line per node). FSDP plans launch with accelerate or
torchrun, Megatron-LM plans with torchrun running pretrain_gpt.py; both are run on every
node (torchrun's c10d rendezvous joins them).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from planner.emit import EmitOptions, chosen, label, node_shape
from planner.emit.megatron import megatron_script

if TYPE_CHECKING:
    from planner.api import PlanResult


def host_names(n_nodes: int) -> list[str]:
    return [f"node-{i}" for i in range(n_nodes)]


def to_hostfile(r: PlanResult) -> str:
    """DeepSpeed's hostfile: one line per node, ``HOST slots=GPUS``. The names are
    placeholders (node-0, node-1, ...) to replace with the cluster's host names."""
    lay = chosen(r).layout
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    lines = ["# DeepSpeed hostfile: replace node-0, node-1, ... with your hosts' names",
             f"# {lay.n_gpus} GPUs: {n_nodes} node(s) x {per_node} {label(r.gpu.name)}"]
    lines += [f"{h} slots={per_node}" for h in host_names(n_nodes)]
    return "\n".join(lines) + "\n"


def to_deepspeed_command(r: PlanResult, opts: EmitOptions = EmitOptions(),
                         config_path: str = "ds_config.json", hostfile_path: str = "hostfile") -> list[str]:
    """The deepspeed launcher over the hostfile; the script gets --deepspeed_config.
    Its master address reads $MASTER_ADDR in the launch script."""
    lay = chosen(r).layout
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    cmd = ["deepspeed"]
    if n_nodes > 1:
        cmd += ["--hostfile", hostfile_path, "--num_nodes", str(n_nodes),
                "--master_addr", "${MASTER_ADDR}", "--master_port", str(opts.master_port)]
    cmd += ["--num_gpus", str(per_node), opts.script, "--deepspeed", "--deepspeed_config", config_path]
    return cmd


def _shell_word(word: str) -> str:
    """Quote for bash, keeping ${VAR} references expandable."""
    if "${" in word:
        return '"' + word.replace('"', '\\"') + '"'
    return shlex.quote(word)


def shell_command(cmd: list[str], extra: str = '"$@"') -> str:
    """A command as one bash line per flag, with ``extra`` (the script's own arguments) last."""
    lines, cur = [], _shell_word(cmd[0])
    for w in cmd[1:]:
        if w.startswith("-") or w.endswith(".py"):   # a flag, or the script: a new line
            lines.append(cur)
            cur = _shell_word(w)
        else:
            cur += " " + _shell_word(w)
    lines.append(cur + (" " + extra if extra else ""))
    return " \\\n    ".join(lines)


def stack_env(r: PlanResult, stack: str) -> dict[str, str]:
    """Environment every rank of the plan needs, with the reason in the launch files.

    CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron-LM's validate_args requires it for tp or cp
    before Blackwell without FSDP (planner.stacks.megatron). NCCL_DEBUG=WARN: NCCL's own
    default level, set so that a failing collective says why (NCCL environment docs).
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where the stack's own launchers set it
    (planner.stacks.runs_expandable_segments): the caching allocator maps pages into one growing
    segment per stream instead of fixed-size cudaMalloc segments (PyTorch "CUDA semantics" notes,
    Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF).
    """
    from planner.stacks import runs_expandable_segments

    env = {"NCCL_DEBUG": "WARN"}
    if runs_expandable_segments(stack):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if stack == "megatron":
        from planner.emit.megatron import megatron_env
        env.update(megatron_env(r))
    return env


def worker_command(r: PlanResult, opts: EmitOptions, stack: str, here: str = "${HERE}") -> tuple[list[str], list[str]]:
    """(torchrun's launcher flags' tail: the program and its arguments, extra shell words)
    that every node runs under a scheduler: torchrun starts the stack's program.

    hf: the user's script (FSDP2 applied by it, or accelerate's config is not needed under
    torchrun); deepspeed: the script with --deepspeed_config (deepspeed.initialize reads
    torchrun's environment); megatron: pretrain_gpt.py (pretrain_mamba.py for
    hybrid models) with megatron_args.txt; torchtitan:
    ``-m torchtitan.train --module torchtitan_job --config planner_job``.
    """
    from planner.stacks import runs_megatron_deepspeed
    if runs_megatron_deepspeed(stack, chosen(r).layout):     # Megatron-DeepSpeed: its pretrain_gpt.py
        return ["${MEGATRON}/pretrain_gpt.py"], ['"${MEGATRON_ARGS[@]}"', "--deepspeed_config",
                                                    f'"{here}/ds_config.json"']
    if stack == "deepspeed":
        return [opts.script, "--deepspeed", "--deepspeed_config", f"{here}/ds_config.json"], []
    if stack == "megatron":
        script = megatron_script(r.model)
        return [f"${{MEGATRON}}/{script}"], ['"${MEGATRON_ARGS[@]}"']
    if stack == "torchtitan":
        from planner.emit.torchtitan import CONFIG, MODULE
        return ["-m", "torchtitan.train", "--module", MODULE, "--config", CONFIG], []
    return [opts.script], []


def env_lines(env: dict[str, str]) -> list[str]:
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def to_launch_script(r: PlanResult, opts: EmitOptions = EmitOptions(), stack: str | None = None) -> str:
    """A bash script that launches the plan on the cluster, from the directory it sits in."""
    from planner.emit import stack_for
    from planner.emit.fsdp import to_fsdp2_settings, to_torchrun_command

    cand = chosen(r)
    lay = cand.layout
    eng = stack or stack_for(r, opts)
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    head = [
        "#!/usr/bin/env bash",
        f"# Written by planner: {label(r.model.name)} on {lay.n_gpus} x {label(r.gpu.name)} "
        f"({n_nodes} node(s) x {per_node} GPUs), stack: {eng}",
        f"# Layout: {lay.describe()}",
        f"# Global batch {lay.global_batch} sequences of {lay.seq_len} tokens, {r.setup.precision}, "
        f"{r.setup.optimizer}; the memory per rank is in plan.json.",
    ]
    if opts.offloads:
        head.append(f"# Offload: optimizer -> {opts.offload_optimizer}, parameters -> {opts.offload_params}")
    from planner.emit.schedule import training_schedule
    head.append(f"# Training: {training_schedule(r, opts).describe()}.")
    env = stack_env(r, eng)
    head += [
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'MASTER_ADDR="${{MASTER_ADDR:-{opts.master_addr}}}"',
    ]
    if "CUDA_DEVICE_MAX_CONNECTIONS" in env:
        head.append("# Megatron-LM (validate_args) requires one CUDA connection for tp/cp before Blackwell")
    head += env_lines(env)
    body: list[str] = []
    if eng == "deepspeed":
        if n_nodes > 1:
            body.append("# Run once, on node-0: the deepspeed launcher starts every node listed in hostfile (pdsh).")
        body.append(f"# {opts.script} (written here) builds the model from config.json and trains the planned steps;"
                    f" give it --dataset NAME|FILES (default: random tokens).")
        if lay.recompute != "none":
            body.append(f"# The plan recomputes activations ({lay.recompute}): {opts.script} calls "
                        f"model.gradient_checkpointing_enable().")
        cmd = to_deepspeed_command(r, opts, '${HERE}/ds_config.json', '${HERE}/hostfile')
        from planner.stacks import runs_megatron_deepspeed
        if runs_megatron_deepspeed(eng, lay):
            # Megatron-DeepSpeed: pretrain_gpt.py with megatron_args.txt (planner.emit.megatron_deepspeed)
            body += ["# Megatron-DeepSpeed (tp/pp): run from its checkout; MEGATRON points at it. Add your data and",
                     "# tokenizer arguments after the script name. megatron_args.txt holds the plan's arguments.",
                     'MEGATRON="${MEGATRON:-.}"',
                     'mapfile -t MEGATRON_ARGS < <(grep -v "^#" "$HERE/megatron_args.txt")']
            cmd = [*cmd[:cmd.index(opts.script)], "${MEGATRON}/pretrain_gpt.py"]
            body.append(shell_command(cmd, extra='"${MEGATRON_ARGS[@]}" --deepspeed_config "${HERE}/ds_config.json" '
                                                 '"$@"'))
        else:
            body.append(shell_command(cmd))
    elif eng == "hf":
        s = to_fsdp2_settings(r, opts)
        body += [
            "# Run on every node (e.g. with srun or pdsh). LAUNCHER=accelerate (default) or torchrun.",
            f"# {opts.script} (written here) trains the planned steps; give it --dataset NAME|FILES (default: random",
            "#   tokens). accelerate applies FSDP2 from accelerate_config.yaml. Under torchrun, a script of your own",
            f"#   applies it: fully_shard each {s['wrap']} and then the root,",
            f"#   mesh {s['mesh']}, reshard_after_forward={s['reshard_after_forward']},",
            f"#   mp_policy={s['mp_policy']}, offload_policy={s['offload_policy']}, "
            f"activation checkpointing: {s['activation_checkpointing']}.",
            'NODE_RANK="${NODE_RANK:-0}"',
            'if [ "${LAUNCHER:-accelerate}" = accelerate ]; then',
            "  " + shell_command(["accelerate", "launch", "--config_file", "${HERE}/accelerate_config.yaml",
                                  "--machine_rank", "${NODE_RANK}", "--main_process_ip", "${MASTER_ADDR}",
                                  opts.script]),
            "else",
            "  " + shell_command(to_torchrun_command(r, opts)),
            "fi",
        ]
    elif eng == "torchtitan":
        prog, _ = worker_command(r, opts, eng)
        body += [
            "# Run on every node (e.g. with srun or pdsh), where torchtitan 0.3.0 is installed.",
            "# torchtitan's ConfigManager imports torchtitan_job.py from this directory (PYTHONPATH).",
            "# Point it at your tokenizer and data with overrides after the command, e.g. --hf_assets_path DIR.",
            'export PYTHONPATH="${HERE}${PYTHONPATH:+:${PYTHONPATH}}"',
            shell_command(to_torchrun_command(r, opts, script=prog[0], script_args=tuple(prog[1:]))),
        ]
    else:
        script = megatron_script(r.model)
        body += [
            "# Run on every node (e.g. with srun or pdsh), from a Megatron-LM checkout.",
            "# Add your data and tokenizer arguments (--data-path, --tokenizer-type, ...) after the script name.",
            "# MEGATRON points at the checkout; megatron_args.txt holds the plan's arguments.",
            'MEGATRON="${MEGATRON:-.}"',
            'mapfile -t MEGATRON_ARGS < <(grep -v "^#" "$HERE/megatron_args.txt")',
            shell_command(to_torchrun_command(r, opts, script=f"${{MEGATRON}}/{script}"),
                          extra='"${MEGATRON_ARGS[@]}" "$@"'),
        ]
    return "\n".join(head + [""] + body) + "\n"
