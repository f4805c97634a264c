"""How long the unit layer takes serially (`pytest tests/unit -p no:xdist`), against a baseline
commit run the same way in turn (a script, not a timed test: the README's figure comes from here).

    .venv/bin/python bench/unit_layer_bench.py                    # this tree only, 3 runs
    .venv/bin/python bench/unit_layer_bench.py --base main --runs 5

Each run is a fresh pytest process; the figures are its wall time and its CPU time (user + sys of
the process and its children: `resource.getrusage(RUSAGE_CHILDREN)`), the number of tests, and
the load average around it (the machine may be shared: CPU time is the steadier figure, and head
and base alternate so both see the same load). The baseline is `git archive BASE` unpacked in a
temporary directory and run from there with this venv (its `tests/` and `deltad/` come first on
sys.path). Results: Markdown on stdout and JSON + Markdown in bench/results/.

Each tree is collected once first, untimed, with bytecode writing on (whatever
PYTHONDONTWRITEBYTECODE says): the timed runs then read cached bytecode in both trees, as a
developer's tree does after its first run. Without that, a freshly unpacked base under
PYTHONDONTWRITEBYTECODE=1 compiles all of deltad and its tests at every run (~3 s of CPU) and
a head that has been run before does not: the ratio would be the caches', not the code's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def warm(tree: Path) -> None:
    """Compile and cache the tree's bytecode (pytest's rewritten test modules included)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        [sys.executable, "-m", "pytest", "tests/unit", "-p", "no:xdist", "-q", "--collect-only"],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        capture_output=True,
        check=True,
    )


def one_run(tree: Path) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/unit",
            "-p",
            "no:xdist",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    passed = re.search(r"(\d+) passed", summary)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: pytest exited {done.returncode}: {summary}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "tests": float(passed.group(1)) if passed else 0.0,
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def unpack(rev: str, into: Path) -> Path:
    blob = subprocess.run(
        ["git", "-C", str(HERE), "archive", rev], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def median(runs: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 2)


def least(runs: list[dict[str, float]], key: str) -> float:
    """The run least disturbed by the rest of a shared machine."""
    return round(min(r[key] for r in runs), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--base", help="a commit to run the same way, in turn with this tree")
    ap.add_argument("--head", help="a commit to time instead of this working tree")
    args = ap.parse_args()
    head: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = unpack(args.base, Path(tmp) / "base") if args.base else None
        head_tree = unpack(args.head, Path(tmp) / "head") if args.head else HERE
        for tree in (head_tree, base_tree):
            if tree is not None:
                warm(tree)
        for _ in range(args.runs):
            head.append(one_run(head_tree))
            if base_tree is not None:
                base.append(one_run(base_tree))
    rev = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", args.head or "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip() + ("" if args.head else " (working tree)")
    result = {
        "head": {"rev": rev, "runs": head},
        "base": {"rev": args.base, "runs": base} if base else None,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    lines = [
        f"# The unit layer, serially ({os.cpu_count()} cores, Python {result['python']})",
        "",
        "| tree | tests | wall median (min), s | CPU median (min), s | load (1 min) before each |",
        "|---|---|---|---|---|",
    ]
    for name, runs, r in (("head " + rev, head, True), (f"base {args.base}", base, bool(base))):
        if r:
            loads = ", ".join(f"{x['load_before']:.1f}" for x in runs)
            lines.append(
                f"| {name} | {int(runs[0]['tests'])} "
                f"| {median(runs, 'wall_s')} ({least(runs, 'wall_s')}) "
                f"| {median(runs, 'cpu_s')} ({least(runs, 'cpu_s')}) | {loads} |"
            )
    if base:
        lines += [
            "",
            f"head/base: wall {median(head, 'wall_s') / median(base, 'wall_s'):.2f}, "
            f"CPU {median(head, 'cpu_s') / median(base, 'cpu_s'):.2f}",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    out = HERE / "bench" / "results" / f"unit-layer-{stamp}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
