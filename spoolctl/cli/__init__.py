"""The spoolctl command line. Its entry point is light: a command line the
lean path answers (`cli/lean.py`: `add` on an SQLite queue, without
SQLAlchemy or click) never loads the click group of `cli/app.py`; every
other one goes there, as does anything the lean path cannot answer exactly
as the group would (it has written nothing by then)."""

from __future__ import annotations

import gc
import os
import sys


def main(argv: list[str] | None = None) -> None:
    """Console entry point.

    A spoolctl process is short-lived (a worker re-enables collection once it
    is set up): the cyclic garbage collector is off while the verb's modules
    load, and everything alive at exit is frozen, so neither the import of
    SQLAlchemy nor interpreter shutdown pays for scanning its objects.
    """
    gc.disable()
    if argv is None and os.environ.get("_SPOOLCTL_COMPLETE"):  # a shell's TAB, not a verb
        from spoolctl.cli.app import complete

        code = complete(os.environ["_SPOOLCTL_COMPLETE"])
    else:
        code = run(sys.argv[1:] if argv is None else argv)
    gc.freeze()
    sys.exit(code)


def run(args: list[str]) -> int:
    """Parse and run one command line; return the exit code. Never raises:
    the lean path answers, else the click group; whatever neither expected
    is INTERNAL here, the one catch-all (no traceback reaches a user)."""
    from spoolctl.cli.lean import answer

    try:
        code = answer(args)
        if code is not None:
            return code
        from spoolctl.cli.app import run as run_app

        return run_app(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # totality: no traceback ever reaches a user
        from spoolctl.cli.reply import emit_error
        from spoolctl.cli.verbs import verb_of, wants_json
        from spoolctl.errors import Internal

        error = Internal(f"unexpected {type(exc).__name__}: {exc}")
        return emit_error(error, wants_json(args), verb_of(args))
