"""What the fork server does before an answer comes, side by side: a resume's child forked from
a server that only imported and warmed the SDK and the CLI (before); from one that also ran a
resume in itself (rehearsed: deltad/executors/rehearsal.py); that child having first done, as
a spare does while it waits, the CLI parse and logging set-up every resume starts with
(touched: `forkserver._touch_what_a_resume_writes_first`); and having then rehearsed a whole
resume itself, as a spare asked for nothing for a while does (now: `_wait_or_rehearse`).

    .venv/bin/python bench/rehearsal_bench.py               # 30 resumes a side, in turn
    .venv/bin/python bench/rehearsal_bench.py --samples 10  # quick look

Four server processes (this script with `--serve SIDE`) prepare as the fork server does
(`forkserver.preload`'s steps, the rehearsal in three of them), then fork one child
per paused workspace they are given. The child runs the resume as the fork server's children
do (`delta run --work-dir WS`, the `delta` entry in the warm interpreter) and reports, from its
first instruction after any spare's touch to the moment ACTION_RESULT is appended: wall time,
CPU time and minor page faults. The workspaces are copies of one run paused on a real
`ask_human`, made by the real client against the fake model, which also answers the resumed
runs. Results: Markdown on stdout, JSON in bench/results/. Waits are for the children's
reports, never fixed sleeps.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SIDES = ("before", "rehearsed", "touched", "now")
DELTA = str(Path(sys.executable).parent / "delta")


def serve(side: str) -> None:
    """Prepare as the fork server does, then fork a child per workspace read from stdin."""
    import importlib

    from deltad.executors import forkserver
    from deltad.executors.rehearsal import rehearse
    from deltad.protocol import journal

    for name in forkserver.PRELOAD:
        importlib.import_module(name)
    forkserver._warm_up_the_sdk()
    forkserver._warm_up_the_cli()
    if side != "before" and (why := rehearse(forkserver._delta)) is not None:
        raise SystemExit(f"the rehearsal did not run through: {why}")
    gc.collect()
    gc.freeze()

    appended = journal.Journal.append
    mark: dict[str, Any] = {}

    def append(self: journal.Journal, type_: Any, payload: dict[str, Any]) -> Any:
        event = appended(self, type_, payload)
        if str(type_) == "ACTION_RESULT" and "at" not in mark:
            mark["at"] = time.perf_counter()
            mark["usage"] = resource.getrusage(resource.RUSAGE_SELF)
        return event

    journal.Journal.append = append  # type: ignore[method-assign]
    print("ready", flush=True)
    for line in sys.stdin:
        ws = line.strip()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            if side in ("touched", "now"):  # a spare's touch, before its resume comes
                forkserver._touch_what_a_resume_writes_first()
            if side == "now":  # and its own rehearsal, as `_wait_or_rehearse` does it
                if (why := rehearse(forkserver._delta)) is not None:
                    raise SystemExit(f"the spare's rehearsal did not run through: {why}")
                gc.collect()
                mark.clear()  # the rehearsal's own ACTION_RESULT is not the resume's
            os.chdir(ws)
            u0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            with contextlib.suppress(SystemExit):
                forkserver._delta([DELTA, "run", "--work-dir", ws])
            u = mark.get("usage")
            report = (
                {"error": "no ACTION_RESULT"}
                if u is None
                else {
                    "wall_ms": (mark["at"] - t0) * 1000,
                    "cpu_ms": (u.ru_utime + u.ru_stime - u0.ru_utime - u0.ru_stime) * 1000,
                    "minflt": u.ru_minflt - u0.ru_minflt,
                }
            )
            os.write(w, json.dumps(report).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        with os.fdopen(r, "rb") as f:
            print(f.read().decode(), flush=True)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=30, help="resumes per side")
    ap.add_argument("--serve", choices=SIDES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    from executor_bench import copies, template, write_answer

    from deltad.testing import FakeLLM

    work = Path(tempfile.mkdtemp(prefix="deltad-rehearsal-bench-"))
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in SIDES}
    load_before = os.getloadavg()
    try:
        with FakeLLM() as fake:
            env = {**os.environ, "OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "x"}
            tpl = template(work, fake, env)
            fake.always("done")
            servers = {
                s: subprocess.Popen(
                    [sys.executable, __file__, "--serve", s],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                for s in SIDES
            }
            for s, p in servers.items():
                assert p.stdout is not None
                if p.stdout.readline().strip() != "ready":
                    raise SystemExit(f"the {s} server did not start")
            spaces = {s: copies(tpl, work / s, "ws", args.samples) for s in SIDES}
            for i in range(args.samples):
                k = i % len(SIDES)
                for s in SIDES[k:] + SIDES[:k]:  # none always goes first
                    ws, p = spaces[s][i], servers[s]
                    assert p.stdin is not None and p.stdout is not None
                    write_answer(ws)
                    p.stdin.write(f"{ws}\n")
                    p.stdin.flush()
                    report = json.loads(p.stdout.readline())
                    if "error" in report:
                        raise SystemExit(f"{s} {ws}: {report['error']}")
                    rows[s].append(report)
            for p in servers.values():
                assert p.stdin is not None
                p.stdin.close()
                p.wait(timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        "| child, from its start to ACTION_RESULT, p50 / p99 | "
        + " | ".join(SIDES)
        + " | "
        + " | ".join(f"{s} / before" for s in SIDES[1:])
        + " |",
        "|---" * (2 * len(SIDES)) + "|",
    ]
    for key, label in (("wall_ms", "wall, ms"), ("cpu_ms", "CPU, ms"), ("minflt", "minor faults")):
        cells, p50 = [], {}
        for side in SIDES:
            values = [x[key] for x in rows[side]]
            p50[side] = statistics.median(values)
            cells.append(f"{p50[side]:.1f} / {pct(values, 99):.1f}")
        ratios = [f"×{p50[side] / p50['before']:.3f}" for side in SIDES[1:]]
        lines.append(f"| {label} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    load = f"load {load_before[0]:.1f} → {os.getloadavg()[0]:.1f}"
    lines += ["", f"resumes per side: {args.samples}, in turn; {load}"]
    out = HERE / "results" / f"rehearsal-{time.strftime('%Y%m%dT%H%M%S')}.json"
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "samples": rows,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    out.write_text(json.dumps(result, indent=2))
    print("\n".join(lines))
    print(f"\n(JSON: {out})")


if __name__ == "__main__":
    main()
