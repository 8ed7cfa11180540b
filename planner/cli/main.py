"""The command line: the `plan` group, its subcommands, and the error handling around
click's own printing. Only planner/cli/ knows click; it parses, calls the API, prints.

User errors end with one line on stderr and exit status 2; internal errors with a
short message, a hint to report them, and exit status 1. No traceback reaches a user.
The commands live beside this module: plan.py (the group's own command), buy.py,
catalogs.py (models, gpus, topologies, completion), measure.py and explain.py; their
options in options.py.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click
from click.core import ParameterSource

from planner.cli.alloc import keep_freed_memory
from planner.cli.buy import buy_cmd
from planner.cli.calibrate import calibrate_cmd
from planner.cli.catalogs import SHELLS, completion_cmd, gpus_cmd, models_cmd, topologies_cmd
from planner.cli.common import guarded_stdout, reader_left, run_safely
from planner.cli.cost_options import cost_options, time_options
from planner.cli.explain import explain_cmd
from planner.cli.helptopics import help_command
from planner.cli.layout_options import layout_options
from planner.cli.measure import measure_cmd
from planner.cli.options import Options
from planner.cli.output_options import output_options, quiet_option
from planner.cli.plan import plan
from planner.cli.task_options import method_options, posttrain_options, task_options
from planner.errors import UserError


class PlanGroup(click.Group):
    """`plan [OPTIONS]` plans; `plan COMMAND` runs a subcommand."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage("plan", "--model NAME|PATH --gpus NAME [OPTIONS]\n       plan COMMAND [ARGS]")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The main options and the help topics (planner.cli.helptopics), then the commands."""
        from planner.cli.helptopics import format_main_options

        format_main_options(ctx, formatter)
        self.format_commands(ctx, formatter)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """click's main, but a usage error (an unknown option, a bad value) ends as every
        other user error does: one line on stderr, status 2 (click would print three)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            where = e.ctx.command_path if isinstance(e, click.UsageError) and e.ctx is not None else "plan"
            message = " ".join(e.format_message().split()).rstrip(".")
            click.echo(f"error: {message}; `{where} --help` lists the options", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def _main_shell_completion(self, ctx_args: Any, prog_name: str, complete_var: str | None = None) -> None:
        """click's shell completion (``_PLAN_COMPLETE=bash_source`` prints the script, the shell's
        completion function sets ``bash_complete`` with COMP_WORDS and COMP_CWORD), with a
        wrong environment as a user error: a stray ``_PLAN_COMPLETE=bash_complete`` left in a
        shell's exports, or COMP_CWORD that is no number, gave a traceback and exit 1
        (issue 32, E4); an unknown value gave exit 1 and no word."""
        var = complete_var or f"_{prog_name.replace('-', '_').replace('.', '_')}_COMPLETE".upper()
        instruction = os.environ.get(var)
        if not instruction:
            return
        shell, _, what = instruction.partition("_")
        if shell not in SHELLS or what not in ("source", "complete"):
            _completion_error(f"{var}={instruction!r} is not a completion request (bash_source, zsh_source or "
                              f"fish_source print the script: `plan completion bash`); unset {var}")
        try:
            super()._main_shell_completion(ctx_args, prog_name, complete_var)
        except Exception as e:  # noqa: BLE001 - click reads the shell's variables unchecked
            _completion_error(f"{var}={instruction}: COMP_WORDS and COMP_CWORD are not a completion request "
                              f"({type(e).__name__}: {str(e)[:60]}); the shell's completion function sets them "
                              f"(install it with `eval \"$(plan completion {shell})\"`), or unset {var}")


def _completion_error(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.group(cls=PlanGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@layout_options
@method_options
@task_options
@posttrain_options
@time_options
@cost_options
@output_options
@quiet_option
@click.version_option(package_name="planner", prog_name="planner")
@click.pass_context
def cli(ctx: click.Context, **kw: Any) -> None:
    """Plan a distributed training run: how many GPUs, which layout, and the memory
    per rank by category.

    \b
      plan --model 70b --gpus h100
      plan --model llama3.1-8b --gpus a100 --dp 8 --zero 3 --micro-batch 2 --recompute none
      plan --model ./config.json --gpus h100 --json
    """
    if ctx.invoked_subcommand is not None:
        return
    o = Options.from_click(kw)
    if not o.model_name and not o.gpu_name:
        given = [p for p in ctx.command.params if p.name and p.name in kw
                 and ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]
        if not given:               # a bare `plan`: the help, status 0
            click.echo(ctx.get_help())
            return
        flag = next((opt for opt in given[0].opts if opt.startswith("--")), given[0].opts[0])
        run_safely(lambda: _missing_model(flag))
    run_safely(lambda: plan(o))


def _missing_model(flag: str) -> None:
    """`plan --json` (or any option) without --model and --gpus: an error, not the help."""
    raise UserError(f"{flag} needs --model and --gpus (e.g. plan --model 8b --gpus h100 {flag}); "
                    f"`plan --help` lists the options")


for _command in (models_cmd, gpus_cmd, buy_cmd, topologies_cmd, measure_cmd, explain_cmd, completion_cmd,
                 calibrate_cmd):
    cli.add_command(_command)
cli.add_command(help_command(cli))


def main() -> None:
    if sys.stdout is None:              # `plan ... >&-`: there is nowhere to print the answer
        if sys.stderr is not None:
            sys.stderr.write("error: stdout is closed, so there is nowhere to print the answer; "
                             "send it to a file or a pipe\n")
        sys.exit(2)
    keep_freed_memory()
    with guarded_stdout():
        try:
            cli(prog_name="plan")
        except SystemExit as e:
            # click meets a closed stdout itself while printing help or usage: it wraps stdout
            # in its PacifyFlushWrapper and exits 1; that is no error of ours either
            if e.code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
                reader_left()
            raise


if __name__ == "__main__":
    main()
