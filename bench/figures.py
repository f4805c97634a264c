"""Every speed figure the docs quote, in one run (a script, not timed tests): each bench in turn,
so none shares the machine with another, each printing its figures beside its own baseline.

    .venv/bin/python bench/figures.py                      # about 15 minutes
    .venv/bin/python bench/figures.py --old /tmp/old       # and the old code's, side by side

The steps, and the baseline each figure is a ratio to:
  1. `daemon_bench.py --sizes 10000`: READY, the questions read after READY, close of the answer
     → resume spawned, idle CPU, RSS; beside a 1-second polling loop (the floor). With `--old`,
     the same bench run again on the old code (put first on PYTHONPATH), old then new.
  2. `executor_bench.py --burst 100`: close → ACTION_RESULT and → exit, the warm fork server
     against a fresh process, and the throughput: a burst of answers, each a full model round
     trip with the scripted model, in runs finished per second.
  3. `warm_breakdown.py`: the same resume step by step (the daemon's look and spawn, the child's
     start, lock, agent, journal, the answer's commit with its fsyncs), fork beside fresh.
  4. `look_bench.py`: one look at a paused workspace (with `--old`, beside the old code's).
  5. `client_bench.py`: the model client a resume builds, the server's TLS context vs its own.
  6. `inbox_bench.py --sizes 1000,10000`: list pages at 1,000 and 10,000 pending (with `--old`,
     the old code's beside them).

Each step's tables, the load average before and after it, and the commit go to
bench/results/figures-<time>.md (and stdout); each bench also keeps its own raw results.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
# A bench's progress lines ("12:00:01 1,000 / 10,000 written") are not its figures.
PROGRESS = re.compile(r"^\d\d:\d\d:\d\d ")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def step(title: str, argv: list[str], code: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(code)}
    before, t0 = load(), time.monotonic()
    done = subprocess.run(argv, cwd=code, env=env, capture_output=True, text=True)
    took = time.monotonic() - t0
    lines = [ln for ln in done.stdout.splitlines() if not PROGRESS.match(ln)]
    if done.returncode != 0:
        lines += ["", f"(failed, exit {done.returncode}: {done.stderr.strip()[-500:]})"]
    return "\n".join(
        [
            f"## {title}",
            "",
            f"`{' '.join(Path(a).name if a == PY else a for a in argv)}` in {code}, "
            f"{took:.0f} s, load {before} → {load()}",
            "",
            *lines,
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, help="a checkout of the old code (git worktree add)")
    ap.add_argument("--size", type=int, default=10000, help="workspaces for the daemon figures")
    args = ap.parse_args()
    new = HERE.parent
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=new, capture_output=True, text=True
    ).stdout.strip()
    daemon = [PY, "bench/daemon_bench.py", "--sizes", str(args.size), "--e2e", "0", "--burst", "0"]
    parts = [f"# Speed figures, {datetime.now():%Y-%m-%d %H:%M}, commit {commit}", ""]
    if args.old is not None:
        old = args.old.resolve()
        parts.append(step("Daemon: the old code", [*daemon, "--only-deltad"], old))
    parts.append(step("Daemon (beside a polling loop)", daemon, new))
    parts.append(
        step(
            "Resume: warm fork server vs a fresh process; throughput",
            [PY, "bench/executor_bench.py", "--samples", "20", "--burst", "100"],
            new,
        )
    )
    parts.append(
        step(
            "Resume step by step: warm fork server vs a fresh process",
            [PY, "bench/warm_breakdown.py", "--samples", "20"],
            new,
        )
    )
    look = [PY, "bench/look_bench.py"]
    if args.old is not None:
        look += ["--old", str(args.old.resolve())]
    parts.append(step("One look at a paused workspace", look, new))
    parts.append(step("The model client a resume builds", [PY, "bench/client_bench.py"], new))
    inbox = [PY, "bench/inbox_bench.py", "--sizes", "1000,10000", "--streams", "0"]
    if args.old is not None:
        inbox += ["--old", str(args.old.resolve())]
    parts.append(step("Inbox pages", inbox, new))
    text = "\n".join(parts)
    out = HERE / "results" / f"figures-{datetime.now():%Y%m%dT%H%M%S}.md"
    out.write_text(text)
    print(text)
    print(f"(written to {out})")


if __name__ == "__main__":
    main()
