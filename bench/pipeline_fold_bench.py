"""A long pipeline run (a script, not a timed test): does a step cost more as the run grows?

    .venv/bin/python bench/pipeline_fold_bench.py                 # a 2,000-node chain
    .venv/bin/python bench/pipeline_fold_bench.py --nodes 500     # quick look

A real `delta run --pipeline` of a chain of conditional nodes (no model calls: what is timed is
the driver, its journal and its metadata writes). The per-node time comes from the journal's
own NODE_START timestamps: the median over the first and the last 10% of the nodes. Before
the driver folded each journal line once, it replayed the whole journal at every step, so the
late nodes cost several times the early ones. Results: Markdown on stdout, JSON in
bench/results/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
DELTA = str(Path(sys.executable).parent / "delta")


def chain(n: int) -> str:
    lines = ["digraph chain {", "start [shape=Mdiamond]", "exit [shape=Msquare]"]
    lines += [f"n{i} [shape=diamond]" for i in range(n)]
    lines += ["start -> n0"] + [f"n{i} -> n{i + 1}" for i in range(n - 1)] + [f"n{n - 1} -> exit"]
    return "\n".join([*lines, "}"])


def agent(root: Path) -> Path:
    home = root / "agent"
    home.mkdir()
    (home / "config.yaml").write_text("name: bench\nllm:\n  model: none\ntools: []\n")
    (home / "system_prompt.md").write_text("bench\n")
    return home


def node_starts(ws: Path) -> list[float]:
    runs = ws / ".delta" / "runs"
    run = (runs / "LATEST").read_text().strip()
    stamps = []
    for line in (runs / run / "execution" / "journal.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "NODE_START":
            stamps.append(datetime.fromisoformat(e["timestamp"]).timestamp())
    return stamps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dot = root / "chain.dot"
        dot.write_text(chain(args.nodes))
        ws = root / "ws"
        ws.mkdir()
        argv = [DELTA, "run", "--pipeline", str(dot), "--agent", str(agent(root))]
        argv += ["--max-steps", str(args.nodes + 10), "-w", str(ws)]
        began = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.monotonic() - began
        if done.returncode != 0:
            sys.exit(f"delta run failed ({done.returncode}): {done.stderr.strip()}")
        stamps = node_starts(ws)
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    tenth = max(1, len(gaps) // 10)
    early, late = statistics.median(gaps[:tenth]), statistics.median(gaps[-tenth:])
    result = {
        "nodes": args.nodes,
        "wall_seconds": round(wall, 2),
        "early_ms_per_node": round(early * 1000, 2),
        "late_ms_per_node": round(late * 1000, 2),
        "late_over_early": round(late / early, 2) if early else None,
    }
    print("| nodes | wall s | ms/node (first 10%) | ms/node (last 10%) | last / first |")
    print("|---|---|---|---|---|")
    print(
        f"| {args.nodes} | {result['wall_seconds']} | {result['early_ms_per_node']} "
        f"| {result['late_ms_per_node']} | {result['late_over_early']} |"
    )
    out = HERE / "results" / f"pipeline-run-{datetime.now():%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
