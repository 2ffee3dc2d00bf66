"""Instructions per verb: what one fresh `add`, `status`, `list` and `show`
process executes, ours against the original 0.4.11, counted by valgrind's
callgrind (user-space instructions of the process, `Collected`), beside
each interpreter's own `python -c pass`.

A count does not depend on the machine's load, which the CPU time of a
50 ms process on a shared 2-core machine does (the same process measured
between 160 and 230 ms of CPU within one hour here): it is the measure to
compare two builds by on a busy machine. It is not a time: CPU time is
`bench/run --only coldstart`'s (the target is set on it), and a count
leaves out what the kernel does for the process (its system time: the
file opens, the fsync of a commit). Each process runs on its own copy of a
queue its implementation made (one job, run), so each count is one
process's from start to exit; the queues live in a temporary folder on the
file system the bench runs on. Needs valgrind (Debian: `apt-get install
valgrind`); about 3 s per process under callgrind.

    .venv/bin/python bench/instructions.py [--repeat N]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from fixtures import IMPLS, Impl, clean_env, median, run_cli, seed

VERBS: dict[str, tuple[str, ...]] = {
    "python -c pass": (),
    "add --json": ("add", "--json", "--", "true"),
    "add": ("add", "--", "true"),
    "status --json": ("status", "--json"),
    "list --json": ("list", "--json"),
    "show --json": ("show", "--json", "1"),
    "status": ("status",),
}
COLLECTED = re.compile(r"Collected : (\d+)")


def count(argv: list[str], cwd: Path, impl: Impl) -> int:
    """The instructions one process executed, by callgrind."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        cwd=cwd,
        env=impl.environ(clean_env()),
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    found = COLLECTED.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"{impl.name} {argv}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def queue_of(impl: Impl, root: Path) -> Path:
    """A queue made by impl's own CLI: one job, run to its end."""
    folder = root / impl.name
    folder.mkdir()
    db = folder / "queue.db"
    seed(impl, db, folder)
    run_cli(impl, "work", "--drain", "--db", str(db), "--json", cwd=folder)
    return db


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="processes per verb and side")
    repeat = parser.parse_args().repeat
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (Debian: apt-get install valgrind)")
    counts: dict[tuple[str, str], list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="spoolctl-instructions-") as tmp:
        root = Path(tmp)
        queues = {impl.name: queue_of(impl, root) for impl in IMPLS}
        for i in range(repeat):
            for impl in IMPLS if i % 2 == 0 else IMPLS[::-1]:  # A B B A
                for verb, args in VERBS.items():
                    if args:
                        run = root / f"{impl.name}-run"
                        shutil.rmtree(run, ignore_errors=True)
                        shutil.copytree(queues[impl.name].parent, run)
                        argv = [*impl.argv(args[0], "--db", str(run / "queue.db")), *args[1:]]
                    else:
                        argv = [str(impl.python), "-c", "pass"]
                    counts.setdefault((impl.name, verb), []).append(count(argv, root, impl))
    head = f"instructions (M), median of {repeat}"
    print(f"{head:32} {'ours':>8} {'0.4.11':>8} {'ratio':>7}")
    for verb in VERBS:
        ours = median([float(c) for c in counts[("ours", verb)]]) / 1e6
        ref = median([float(c) for c in counts[("ref", verb)]]) / 1e6
        print(f"{verb:32} {ours:8.1f} {ref:8.1f} {ours / ref:6.2f}x")


if __name__ == "__main__":
    main()
