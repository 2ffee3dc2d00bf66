"""The verbs and the modules that hold them, and which verb a command line
names: light, read by the entry point, the click group and the contract."""

from __future__ import annotations

import importlib.util

VERBS: dict[str, str] = {
    "add": "spoolctl.cli.jobs:add",
    "work": "spoolctl.cli.work:work",
    "wait": "spoolctl.cli.wait:wait",
    "status": "spoolctl.cli.status:status",
    "list": "spoolctl.cli.inspect:list_jobs",
    "show": "spoolctl.cli.inspect:show",
    "output": "spoolctl.cli.output:output",
    "feedback": "spoolctl.cli.feedback:feedback",
    "events": "spoolctl.cli.events:events",
    "workers": "spoolctl.cli.status:workers",
    "retry": "spoolctl.cli.steer:retry",
    "cancel": "spoolctl.cli.steer:cancel",
    "signal": "spoolctl.cli.control:signal",
    "suspend": "spoolctl.cli.control:suspend",
    "continue": "spoolctl.cli.control:continue_",
    "remove": "spoolctl.cli.remove:remove",
    "update": "spoolctl.cli.update:update",
    "prune": "spoolctl.cli.steer:prune",
    "pause": "spoolctl.cli.lanes:pause",
    "resume": "spoolctl.cli.lanes:resume",
    "web": "spoolctl.cli.web:web",
    "metrics": "spoolctl.cli.metrics:metrics",
    "migrate": "spoolctl.cli.migrate:migrate",
    "copy-to": "spoolctl.cli.copy:copy_to",
    "doctor": "spoolctl.cli.admin:doctor",
    "config-show": "spoolctl.cli.admin:config_show",
    "config-validate": "spoolctl.cli.admin:config_validate",
    "brief": "spoolctl.cli.brief:brief",
    "robot-docs": "spoolctl.cli.brief:robot_docs",
    "capabilities": "spoolctl.cli.capabilities:capabilities",
    "schema": "spoolctl.cli.contract:schema",
    "schedule add": "spoolctl.cli.schedules:schedule_add",
    "schedule list": "spoolctl.cli.schedules:schedule_list",
    "schedule show": "spoolctl.cli.schedules:schedule_show",
    "schedule pause": "spoolctl.cli.schedules:schedule_pause",
    "schedule resume": "spoolctl.cli.schedules:schedule_resume",
    "schedule remove": "spoolctl.cli.schedules:schedule_remove",
    "schedule run": "spoolctl.cli.schedules:schedule_run",
}
"""A verb of two words (`schedule add`) is one entry: its command line gives
the words as two arguments (`verb_of`)."""
GROUPS = frozenset(name.split(" ")[0] for name in VERBS if " " in name)
"""The families of two-word verbs (`schedule`)."""
FAMILY_HELP: dict[str, str] = {
    "schedule": "Recurring jobs: every slot of a cron expression or an interval becomes "
    "one job, fired by any running `spoolctl work` (no daemon).",
}
"""What each family is about, the first line of `spoolctl FAMILY --help`."""


def verb_of(args: list[str]) -> str | None:
    """The verb a command line names: one word, a family and its sub-verb, or
    a family alone (`spoolctl schedule`, which lists the family's verbs)."""
    if not args:
        return None
    if args[0] in GROUPS:
        pair = f"{args[0]} {args[1]}" if len(args) > 1 else ""
        return pair if pair in VERBS else args[0]
    return args[0] if args[0] in VERBS else None


def available_verbs() -> list[str]:
    """Verbs whose module is present (all of them in a complete build)."""
    found = []
    for name, target in VERBS.items():
        module = target.split(":")[0]
        if importlib.util.find_spec(module) is not None:
            found.append(name)
    return sorted(found)


def wants_json(args: list[str]) -> bool:
    """Whether a command line asks for JSON (`--json` before any `--`)."""
    head = args[: args.index("--")] if "--" in args else args
    return "--json" in head
