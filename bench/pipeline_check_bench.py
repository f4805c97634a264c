"""`delta pipeline check` on large graphs (a script, not timed tests): before and after the
edge index and the regex lexer.

    .venv/bin/python bench/pipeline_check_bench.py                  # 1k, 10k, 20k nodes
    .venv/bin/python bench/pipeline_check_bench.py --sizes 1000 --old-max 1000   # quick look

Shapes: `chain` (start -> n0 -> n1 -> ... -> exit: N nodes, N+1 edges) and `wide` (start -> every
node -> exit: N nodes, 2N edges). For each: the wall time of the real `delta pipeline check`
process (median of --runs), and the check in-process (parse, type, validate, lint, describe;
CPU time). The old code (commit cc2f931's deltad/pipeline, extracted into a temporary package)
is timed in-process up to --old-max nodes; above that its cost is its model: every
`Graph.outgoing()` scanned every edge, so reachability alone compared nodes × edges, and the
time is that count at the per-comparison cost measured at the largest size that was run.
Results: Markdown on stdout and JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from deltad.pipeline.describe import describe  # noqa: E402
from deltad.pipeline.load import check_file  # noqa: E402

DELTA = str(Path(sys.executable).parent / "delta")
OLD_COMMIT = "cc2f931"


def chain(n: int) -> str:
    lines = ["digraph chain {", "start [shape=Mdiamond]", "exit [shape=Msquare]"]
    lines += [f'n{i} [prompt="step {i}"]' for i in range(n)]
    lines += ["start -> n0"] + [f"n{i} -> n{i + 1}" for i in range(n - 1)] + [f"n{n - 1} -> exit"]
    return "\n".join([*lines, "}"])


def wide(n: int) -> str:
    lines = ["digraph wide {", "start [shape=Mdiamond]", "exit [shape=Msquare]"]
    lines += [f"n{i} [prompt=p]" for i in range(n)]
    lines += [f"start -> n{i}" for i in range(n)] + [f"n{i} -> exit" for i in range(n)]
    return "\n".join([*lines, "}"])


SHAPES: dict[str, Callable[[int], str]] = {"chain": chain, "wide": wide}


def edges_of(shape: str, n: int) -> int:
    return n + 1 if shape == "chain" else 2 * n


def old_package(tmp: Path) -> Any:
    """The old deltad/pipeline as the package `oldpipe` (its `deltad.protocol` imports resolve
    to today's, which it only uses for reading files and questions)."""
    pkg = tmp / "oldpipe"
    pkg.mkdir()
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", OLD_COMMIT, "deltad/pipeline/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in names:
        text = subprocess.run(
            ["git", "show", f"{OLD_COMMIT}:{name}"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        (pkg / Path(name).name).write_bytes(text)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("oldpipe")


def cpu(fn: Callable[[], object]) -> float:
    begin = time.process_time()
    fn()
    return time.process_time() - begin


def wall_check(path: Path, runs: int) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(runs):
        begin = time.perf_counter()
        p = subprocess.run([DELTA, "pipeline", "check", str(path)], capture_output=True)
        times.append(time.perf_counter() - begin)
        code = p.returncode
    return statistics.median(times), code


def bench(sizes: list[int], old_max: int, runs: int, out: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        old = old_package(tmp)
        per_compare: dict[str, float] = {}
        for shape, make in SHAPES.items():
            for n in sizes:
                path = tmp / f"{shape}-{n}.dot"
                path.write_text(make(n))
                m = edges_of(shape, n)
                checked = check_file(path)
                new_cpu = cpu(lambda p=path: describe(check_file(p).graph, str(p)))
                wall, code = wall_check(path, runs)
                row: dict[str, Any] = {
                    "shape": shape,
                    "nodes": n,
                    "edges": m,
                    "exit_code": code,
                    "warnings": len(checked.warnings),
                    "new_cpu_s": round(new_cpu, 3),
                    "new_wall_s": round(wall, 3),
                    "old_compares": n * m,
                }
                if n <= old_max:
                    old_cpu = cpu(lambda p=path: old.load_pipeline(p))
                    per_compare[shape] = old_cpu / (n * m)
                    row["old_cpu_s"], row["old_measured"] = round(old_cpu, 3), True
                else:
                    row["old_cpu_s"] = round(per_compare[shape] * n * m, 1)
                    row["old_measured"] = False
                rows.append(row)
                print(row, file=sys.stderr)
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    result = {
        "sizes": sizes,
        "old_max": old_max,
        "runs": runs,
        "rows": rows,
        "stamp": stamp,
        "cpus": os.cpu_count(),
        "load_average": [load_before, os.getloadavg()[0]],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pipeline-check-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| graph | nodes | edges | check (process, wall) | check in-process (CPU) | old code (CPU) "
        "| old nodes × edges |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        old = f"{r['old_cpu_s']} s" + ("" if r["old_measured"] else " (model)")
        lines.append(
            f"| {r['shape']} | {r['nodes']} | {r['edges']} | {r['new_wall_s']} s (exit "
            f"{r['exit_code']}) | {r['new_cpu_s']} s | {old} | {r['old_compares']:,} |"
        )
    lines += [
        "",
        f"wall: median of {result['runs']} runs of the `delta pipeline check` process (start-up "
        f"included); old code measured up to {result['old_max']} nodes, above that modelled as "
        "nodes × edges comparisons at the measured cost per comparison. Load average "
        f"{result['load_average'][0]:.1f} at the start, {result['load_average'][1]:.1f} at the "
        f"end, on {result['cpus']} CPUs (other work ran beside it: CPU times are the steadier "
        "figure).",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 20000])
    ap.add_argument("--old-max", type=int, default=1000, help="largest size the old code runs")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    result = bench(sorted(args.sizes), args.old_max, args.runs, args.out)
    text = markdown(result)
    (args.out / f"pipeline-check-{result['stamp']}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
