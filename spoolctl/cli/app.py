"""The spoolctl command line's click group: its verbs load lazily, so that a
verb imports only what it needs. `spoolctl.cli.main` comes here for every
command line the lean path (`cli/lean.py`) does not answer itself."""

from __future__ import annotations

import importlib
import io
import os
from contextlib import redirect_stderr
from typing import Any

import click
from click.shell_completion import CompletionItem

from spoolctl import __version__
from spoolctl.cli.completion import COMPLETE_VAR, attach, completing_bash
from spoolctl.cli.render import from_click, unknown_command
from spoolctl.cli.reply import emit_error
from spoolctl.cli.verbs import FAMILY_HELP, GROUPS, VERBS, available_verbs, verb_of, wants_json
from spoolctl.errors import InvalidInput, MissingRequired, SpoolError


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return available_verbs()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = VERBS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        command: click.Command = getattr(module, attr)
        if os.environ.get(COMPLETE_VAR):  # a shell's TAB: offer what the queue holds
            attach(cmd_name, command)
        return command

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """A verb's first word: a family of two-word verbs is offered once, as
        its family's name (`schedule`), never as `schedule add` with a space
        in it; the next TAB offers its sub-verbs."""
        items: list[CompletionItem] = []
        for name in self.list_commands(ctx):
            word = name.split(" ")[0]
            if not word.startswith(incomplete) or any(i.value == word for i in items):
                continue
            if completing_bash():
                items.append(CompletionItem(word))
            elif word in GROUPS:
                items.append(CompletionItem(word, help=FAMILY_HELP.get(word)))
            else:
                command = self.get_command(ctx, name)
                items.append(CompletionItem(word, help=short_help(command)))
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = verb_of(args) or args[0]
        if name in GROUPS:
            subs = [v for v in self.list_commands(ctx) if v.startswith(f"{name} ")]
            rest = args[1:]
            if rest and not rest[0].startswith("-"):
                raise unknown_command(f"{name} {rest[0]}", subs)
            return name, VerbFamily(name, subs, self), rest
        command = self.get_command(ctx, name)
        if command is None:
            raise unknown_command(name, self.list_commands(ctx))
        return name, command, args[1 if args[0] == name else 2 :]


def short_help(command: click.Command | None) -> str | None:
    return None if command is None else command.get_short_help_str()


class VerbFamily(click.Command):
    """A family of two-word verbs named without a sub-verb (`spoolctl
    schedule`). Alone or with --help it lists the family's verbs and exits 0,
    as a click group does; with --json it is MISSING_REQUIRED (`detail.verbs`
    names them), as `spoolctl --json` is, so that stdout stays one envelope."""

    def __init__(self, name: str, verbs: list[str], group: LazyGroup) -> None:
        super().__init__(
            name,
            help=FAMILY_HELP.get(name),
            epilog=f"Run 'spoolctl {name} VERB --help' for one verb's flags and examples.",
            params=[click.Option(["--json", "as_json"], is_flag=True, help="Answer as JSON.")],
            context_settings={"help_option_names": ["-h", "--help"], "allow_extra_args": True},
        )
        self.verbs = verbs
        self.group = group

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """A word after the family's flags (`schedule --json lsit`) is named
        as the sub-verb it tries to be: the sub-verb comes first."""
        rest = super().parse_args(ctx, args)
        if ctx.args and not ctx.resilient_parsing:  # completion parses half a line
            tried = f"{self.name} {ctx.args[0]}"
            if tried not in self.verbs:
                raise unknown_command(tried, self.verbs)
            raise InvalidInput(f"the sub-verb comes first: spoolctl {tried} [OPTIONS]")
        return rest

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "VERB [ARGS]...")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The family's verbs (by their second word, as typed after the
        family's name), then its own options."""
        found = [(v.split(" ", 1)[1], self.group.get_command(ctx, v)) for v in self.verbs]
        commands = [(word, command) for word, command in found if command is not None]
        if commands:
            limit = formatter.width - 6 - max(len(word) for word, _ in commands)
            with formatter.section("Commands"):
                formatter.write_dl([(w, c.get_short_help_str(limit)) for w, c in commands])
        super().format_options(ctx, formatter)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        items = []
        for verb_name in self.verbs:
            word = verb_name.split(" ", 1)[1]
            if not word.startswith(incomplete):
                continue
            command = None if completing_bash() else self.group.get_command(ctx, verb_name)
            items.append(CompletionItem(word, help=short_help(command)))
        return items + super().shell_complete(ctx, incomplete)

    def invoke(self, ctx: click.Context) -> int:
        if ctx.params["as_json"]:
            listed = ", ".join(self.verbs)
            raise MissingRequired(f"{self.name} needs a sub-verb: {listed}", verbs=self.verbs)
        click.echo(ctx.get_help())
        return 0


@click.group(
    cls=LazyGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", prog_name="spoolctl")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """spoolctl: a durable job queue for shell commands, with no daemon.

    The queue is one SQLite file, or a PostgreSQL database that workers on
    many machines share. Submit with `add`, run with `work`, inspect with `status`, `list`, `show`,
    `output` and `feedback`. Every verb takes --json.

    \b
    Example:
      spoolctl add -- make test
      spoolctl work --drain
      spoolctl status
    """
    if ctx.invoked_subcommand is None:
        click.echo("verbs: " + ", ".join(ctx.command.list_commands(ctx)), err=True)  # type: ignore[attr-defined]
        raise MissingRequired("no verb given; run `spoolctl --help`", verbs=available_verbs())


def run(args: list[str]) -> int:
    """Parse and run one command line with the click group; return the exit
    code. Raises only what no verb expected (`spoolctl.cli.run`, the one
    catch-all, makes that INTERNAL)."""
    as_json = wants_json(args)
    verb = verb_of(args)
    if args and all(a == "--json" for a in args):
        return emit_error(MissingRequired("no verb given; run `spoolctl --help`"), as_json)
    try:
        result: Any = cli.main(args, prog_name="spoolctl", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:  # click's own interrupt (Ctrl-C at one of its reads)
        return 130
    except click.ClickException as exc:
        return emit_error(from_click(exc), as_json, verb)
    except SpoolError as exc:
        return emit_error(exc, as_json, verb)
    return int(result) if isinstance(result, int) else 0


def complete(instruction: str) -> int:
    """Answer one shell's completion request (`cli/completion.py`): exit 0
    whatever happens inside, with no candidates where anything failed, so
    that no error reaches the prompt; 1 for a shell click does not know."""
    from click.shell_completion import shell_complete

    try:
        with redirect_stderr(io.StringIO()):
            return shell_complete(cli, {}, "spoolctl", COMPLETE_VAR, instruction)
    except Exception:  # a completion never shows an error: no candidates
        return 0
