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
