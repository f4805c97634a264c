"""One look at a paused workspace (`reconcile.inspect`), this code vs another checkout (a
script, not timed tests).

    .venv/bin/python bench/look_bench.py                          # this code only
    git worktree add --detach /tmp/oldlooks main
    .venv/bin/python bench/look_bench.py --old /tmp/oldlooks      # side by side, with the ratio
    .venv/bin/python bench/look_bench.py -n 5000 --rounds 7

N paused workspaces (`deltad.testing.stub.paused_workspace`: a question, no answer) are made
once in a temp dir; each side then runs in its own process (PYTHONPATH = its checkout), looks
at every workspace once to warm up, then `--rounds` times, and reports the best round's mean
µs per look: the daemon's read of every question after READY is N such looks. Both sides look
at the same workspaces, alternately, so a busy machine weighs on both alike.
Results: Markdown on stdout and JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW = HERE.parent

# Run in each side's process: only names both the old and the new code have.
LOOKER = """
import json, sys, time
from pathlib import Path
from deltad.core import reconcile
from deltad.core.tenancy import Policy
from deltad.watch.hints import Why

root, rounds = Path(sys.argv[1]), int(sys.argv[2])
wss = sorted(p for p in root.iterdir())
policy = Policy()
for ws in wss:
    v = reconcile.inspect(ws, Why.CHECK, 2.0, policy)
    assert v.request_id is not None and v.problem is None, v
best = []
for _ in range(rounds):
    t = time.perf_counter()
    for ws in wss:
        reconcile.inspect(ws, Why.CHECK, 2.0, policy)
    best.append((time.perf_counter() - t) / len(wss) * 1e6)
print(json.dumps(best))
"""


def make(root: Path, n: int) -> None:
    sys.path.insert(0, str(NEW))
    from deltad.testing.stub import paused_workspace

    for i in range(n):
        paused_workspace(root / f"ws{i:06d}", "q?")


def look(checkout: Path, root: Path, rounds: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run(
        [sys.executable, "-c", LOOKER, str(root), str(rounds)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=root,
    )
    rounds_us: list[float] = json.loads(out.stdout)
    return rounds_us


def commit(checkout: Path) -> str:
    """The checkout's commit, with a `+` when its deltad/ differs from it."""
    git = ["git", "-C", str(checkout)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "deltad"], check=False)
    return head.stdout.strip() + ("+" if dirty.returncode else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=2000, help="paused workspaces")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--old", type=Path, help="a checkout of the code to compare with")
    ap.add_argument("--pairs", type=int, default=3, help="alternating runs per side")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="look-bench-"))
    try:
        make(tmp, args.n)
        sides = {"new": NEW} | ({"old": args.old.resolve()} if args.old else {})
        runs: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.pairs):
            for name, checkout in sides.items():
                runs[name] += look(checkout, tmp, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    best = {name: min(v) for name, v in runs.items()}
    lines = [
        f"# One look at a paused workspace: {args.n} workspaces, best of "
        f"{args.pairs}x{args.rounds} rounds",
        "",
        "| code | µs per look (best) | µs per look (median) |",
        "|---|---|---|",
    ]
    for name, v in runs.items():
        at = f"{sides[name]} @ {commit(sides[name])}"
        lines.append(f"| {name} ({at}) | {best[name]:.0f} | {sorted(v)[len(v) // 2]:.0f} |")
    ratio = best["new"] / best["old"] if "old" in best else None
    if ratio is not None:
        lines += ["", f"new / old: {ratio:.2f}"]
    print("\n".join(lines))
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    out = HERE / "results" / f"look-{stamp}.json"
    record = {"n": args.n, "rounds": args.rounds, "pairs": args.pairs, "us_per_look": runs}
    out.write_text(json.dumps(record | {"best": best, "ratio": ratio}, indent=2) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"\n{out}")


if __name__ == "__main__":
    main()
