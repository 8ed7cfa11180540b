"""`plan --help` is short and every option is still reachable and documented (issue 33:
the help was 243 lines). Referee for "documented": docs/options.md, the options' reference."""

from __future__ import annotations

import re
from pathlib import Path

import click
from click.testing import CliRunner

from planner.cli.helptopics import MAIN, OTHER, TOPICS, long_name, topic_params
from planner.cli.main import cli

DOCS = Path(__file__).resolve().parent.parent / "docs" / "options.md"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan", terminal_width=100)


def all_options() -> list[str]:
    return [long_name(p) for p in cli.params if isinstance(p, click.Option)]


def test_help_is_under_100_lines_and_names_every_topic():
    r = run("--help")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert len(lines) < 100, len(lines)
    for topic in TOPICS:
        assert re.search(rf"^  {topic} ", r.stdout, re.M), topic


def test_every_option_is_in_the_main_list_or_a_topic():
    with click.Context(cli) as ctx:
        assert topic_params(ctx, OTHER) == [], "an option in no help topic: add it to planner/cli/helptopics.py"
    named = set(MAIN) | {n for _, names in TOPICS.values() for n in names}
    assert set(all_options()) <= named
    assert named - {"--help"} <= set(all_options()), "a help topic names an option plan does not have"


def test_every_option_is_documented_in_docs_options_md():
    text = DOCS.read_text()
    missing = [o for o in all_options() if o not in ("--help", "--version")
               and not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert missing == [], missing


def test_help_topics_print_their_options_and_refuse_unknown_ones():
    r = run("help", "cost")
    assert r.exit_code == 0 and "--deadline" in r.stdout and "--budget" in r.stdout and "--tp" not in r.stdout
    everything = run("help", "all").stdout
    assert all(o in everything for o in all_options() if o not in MAIN)
    listed = run("help").stdout
    assert all(f"plan help {t}" in listed for t in TOPICS)
    bad = run("help", "nonsense")
    assert bad.exit_code == 2 and "no help topic" in bad.output


def test_each_default_is_read_from_its_one_place():
    # issue 31: a default is written once. The training set-up's live in TrainingSetup
    # (training.setup.DEFAULT_SETUP), the post-training ones in training.posttrain's DISTILL_DEFAULTS and
    # RL_DEFAULTS;
    # Options and click read them. Here every click default of `plan` equals Options' (which
    # commands without the option see) and the post-training set-ups take the same values.
    from dataclasses import fields

    from planner.cli.options import Options
    from planner.training.posttrain import (
        DISTILL_DEFAULTS,
        RL_DEFAULTS,
        DistillSetup,
        RLSetup,
        teacher_weight_bytes,
    )

    options = Options()
    checked = 0
    for p in cli.params:
        # flags without a default carry click's UNSET sentinel; --method shows "full", Options' None means it
        if not isinstance(p, click.Option) or p.name == "method" or p.default is None \
                or repr(p.default).startswith("Sentinel"):
            continue
        assert p.default == getattr(options, str(p.name)), p.name
        checked += 1
    assert checked >= 35, checked
    for defaults in (DISTILL_DEFAULTS, RL_DEFAULTS):
        for f in fields(defaults):
            assert getattr(options, f.name) == getattr(defaults, f.name), f.name
    rl, d = RLSetup(task="grpo"), DistillSetup(teacher="t")
    assert (rl.prompt_len, rl.response_len, rl.response_mean, rl.group_size, rl.prompts_per_step, rl.placement,
            rl.engine_tp, rl.engine_memory_fraction, rl.offload_train_states) == (
        options.prompt_len, options.response_len, options.response_mean, options.group_size,
        options.prompts_per_step, options.rollout, options.rollout_tp, options.rollout_memory_fraction,
        options.offload_train_states)
    assert (d.teacher_weight_bytes, d.teacher_quant, d.teacher_sharding, d.kd_loss, d.kd_hidden_layers,
            d.offline_topk) == (teacher_weight_bytes(options.teacher_precision), options.teacher_quant,
                                options.teacher_sharding, options.kd_loss, options.kd_hidden_layers,
                                options.kd_offline_topk)


def test_the_choices_spelt_in_the_cli_agree_with_their_home():
    # cli.cost_options spells SOLVERS so that `plan --help` loads no pulp; cost.solve owns them
    from planner.cli import cost_options, training_options
    from planner.cost import solve
    from planner.report.intervals import memory_data
    from planner.timing.intervals import levels

    assert cost_options.SOLVERS == solve.SOLVERS
    # --fit-confidence and --time-confidence (plan and plan buy) take the levels both interval tables hold
    assert tuple(float(x) for x in training_options.CONFIDENCE_LEVELS) == levels()
    levels_in_cli = sorted(float(x) for x in training_options.CONFIDENCE_LEVELS)
    assert levels_in_cli == sorted(float(x) for x in memory_data()["levels"])


def test_an_option_of_one_kind_of_post_training_needs_its_kind():
    # cli.posttrain.stray_option reads the kinds from training.posttrain's DistillDefaults and
    # RLDefaults: a distillation option without --teacher, an RL option without --task grpo|ppo|dpo
    for args, words in ((["--kd-loss", "full"], "--kd-loss is a distillation option: it needs --teacher"),
                        (["--teacher-quant", "nf4"], "--teacher-quant is a distillation option"),
                        (["--group-size", "4"], "--group-size is an RL option: it needs --task grpo, ppo or dpo"),
                        (["--rl-steps", "3"], "--rl-steps is an RL option")):
        r = run("--model", "8b", "--gpus", "h100", *args)
        assert r.exit_code == 2 and words in r.output, (args, r.output)
