"""A long pipeline run's cost per step (a script, not timed tests): does node N cost what node
100 costs?

    .venv/bin/python bench/pipeline_run_bench.py --nodes 5000
    .venv/bin/python bench/pipeline_run_bench.py --nodes 2000 --old /tmp/old   # beside the old code

The graph is a chain start -> t0 -> ... -> t(N-1) -> exit of tool nodes (`true`), run by one
real `delta run --pipeline` process against the fake model (no node calls it). The time of a
node is the gap between consecutive NODE_START timestamps in the journal; the figure at node K
is the median over the 100 nodes ending at K. `--old DIR` runs the same with the deltad package
of another checkout (e.g. `git worktree add /tmp/old cc2f931`) on PYTHONPATH.
Results: Markdown on stdout and JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from deltad.testing import FakeLLM  # noqa: E402

WINDOW = 100
# `delta` from the given checkout: the venv's editable install would otherwise win the import.
LAUNCH = (
    "import sys; root = sys.argv.pop(1); "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
    "sys.path.insert(0, root); sys.argv[0] = 'delta'; "
    "import deltad; assert deltad.__file__.startswith(root), deltad.__file__; "
    "from deltad.client.cli import main; main()"
)


def chain(n: int) -> str:
    tools = "\n".join(f'  t{i} [shape=parallelogram, tool_command="true"]' for i in range(n))
    path = " -> ".join(f"t{i}" for i in range(n))
    return (
        f'digraph chain {{\n  graph [goal="bench", max_steps={n + 10}]\n'
        f"  start [shape=Mdiamond]\n  exit [shape=Msquare]\n{tools}\n"
        f"  start -> {path} -> exit\n}}\n"
    )


def run(code_root: Path, nodes: int, fake: FakeLLM) -> list[float]:
    """Seconds per node, in order, from the journal of one run."""
    with tempfile.TemporaryDirectory(prefix="pipebench-") as tmp:
        base = Path(tmp)
        agent = base / "agent"
        agent.mkdir()
        (agent / "config.yaml").write_text("name: bench\nllm:\n  model: fake\ntools: []\n")
        (agent / "system_prompt.md").write_text("bench\n")
        dot = base / "chain.dot"
        dot.write_text(chain(nodes))
        ws = base / "ws"
        ws.mkdir()
        env = {
            **os.environ,
            "OPENAI_BASE_URL": fake.url,
            "OPENAI_API_KEY": "bench",
        }
        argv = [sys.executable, "-c", LAUNCH, str(code_root)]
        argv += ["run", "--pipeline", str(dot), "--agent", str(agent), "-w", str(ws)]
        started = time.monotonic()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        print(f"  {code_root}: exit {done.returncode} in {time.monotonic() - started:.0f} s",
              file=sys.stderr)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        runs = ws / ".delta" / "runs"
        rid = (runs / "LATEST").read_text().strip()
        lines = (runs / rid / "execution" / "journal.jsonl").read_text().splitlines()
        starts = [
            datetime.fromisoformat(e["timestamp"])
            for e in map(json.loads, lines)
            if e["type"] == "NODE_START"
        ]
        return [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]


def at(gaps: list[float], k: int) -> float:
    """Median ms per node over the WINDOW nodes ending at node k."""
    window = gaps[max(0, k - WINDOW) : k]
    return statistics.median(window) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--old", type=Path, help="another checkout's root, run beside this one")
    args = ap.parse_args()
    points = sorted({100, args.nodes // 4, args.nodes // 2, args.nodes})
    roots = [("this", ROOT)] + ([("old", args.old)] if args.old else [])
    table: dict[str, dict[int, float]] = {}
    with FakeLLM() as fake:
        for name, root in roots:
            gaps = run(root, args.nodes, fake)
            table[name] = {k: round(at(gaps, k), 2) for k in points}
    head = "| code | " + " | ".join(f"ms/node at {k}" for k in points) + " |"
    print(head)
    print("|" + "---|" * (len(points) + 1))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.1f}" for k in points) + " |")
    out: dict[str, Any] = {
        "nodes": args.nodes,
        "window": WINDOW,
        "ms_per_node": table,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    dest = HERE / "results" / f"pipeline-run-{stamp}.json"
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten to {dest.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
