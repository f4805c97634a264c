"""The warm path of two installs side by side: an answer's close → ACTION_RESULT through a
deltad of another install (`--old-venv`, say the code before a change) and through this one,
each with the fork server, answers alternating between them (a script, not timed tests).

    git worktree add --detach /tmp/old <commit>
    python3 -m venv /tmp/oldvenv && /tmp/oldvenv/bin/pip install -q /tmp/old
    .venv/bin/python bench/fork_ab_bench.py --old-venv /tmp/oldvenv              # 30 a side
    .venv/bin/python bench/fork_ab_bench.py --old-venv /tmp/oldvenv --pauses 0.1,0.3,1

The fork server runs `python -m deltad.executors.forkserver` of its daemon's own interpreter,
so the two sides are two installs, not two checkouts on one PYTHONPATH. Two daemons at once,
one per install, each on its own root of copies of one run paused by the real client on an
`ask_human`; the real `delta run` resumes against the fake OpenAI server. Each answer is
written `--pause` seconds after the previous resume (of either side) exited, the sides in turn
(`old, new` then `new, old`): one answer at a time, nothing overlaps. Per side: close of
response.txt → ACTION_RESULT in the journal (p50, p90, max), close → `resume_spawned` in
deltad's log, and which child each resume was (`child`, where the side logs it). Results:
Markdown on stdout, JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from executor_bench import _stamp, action_results, copies, template, wait, write_answer  # noqa: E402

import tests.support.daemon as support  # noqa: E402
from deltad.testing import FakeLLM  # noqa: E402


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run(old_venv: Path, samples: int, pause: float, work: Path) -> dict[str, Any]:
    sides = {
        "old": str(old_venv / "bin" / "deltad"),
        "new": str(Path(sys.executable).parent / "deltad"),
    }
    out: dict[str, dict[str, list[Any]]] = {
        s: {"result": [], "spawned": [], "child": []} for s in sides
    }
    with FakeLLM() as fake:
        env = {**os.environ, "OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "x"}
        tpl = template(work, fake, env)
        fake.always("done")
        daemons, spaces = {}, {}
        try:
            for side, binary in sides.items():
                spaces[side] = copies(tpl, work / side / "root", "ws", samples)
                (work / side / "d").mkdir()
                support.DELTAD = binary  # the binary `Daemon.start` runs
                daemons[side] = support.Daemon(
                    work / side / "d",
                    [work / side / "root"],
                    log_level="info",
                    executor="fork",
                    resume_command=["delta", "run", "--work-dir", "{workspace}"],
                ).start(env=env)
                daemons[side].wait_event("fork_server_ready", timeout=120)
            for i in range(samples):
                for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                    ws, d = spaces[side][i], daemons[side]
                    time.sleep(pause)  # the pause between answers is what is measured against
                    closed = write_answer(ws)
                    result = wait(lambda ws=ws: action_results(ws), f"ACTION_RESULT in {ws}")[0]
                    wait(lambda d=d, ws=ws: d.events("resume_exited", workspace=str(ws)), "exit")
                    [spawned] = d.events("resume_spawned", workspace=str(ws))
                    out[side]["result"].append((result - closed) * 1000)
                    out[side]["spawned"].append((_stamp(spawned["timestamp"]) - closed) * 1000)
                    out[side]["child"].append(spawned.get("child"))
        finally:
            for d in daemons.values():
                d.stop(timeout=60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--old-venv", type=Path, required=True, help="a venv with the other deltad")
    ap.add_argument("--samples", type=int, default=30, help="answers per side and pause")
    ap.add_argument("--pauses", default="0.3,1", help="seconds between answers, comma-separated")
    args = ap.parse_args()
    if not (args.old_venv / "bin" / "deltad").exists():
        sys.exit(f"fork_ab_bench: {args.old_venv}/bin/deltad does not exist")
    rows: dict[str, Any] = {}
    lines = [
        "| pause between answers | side | close → ACTION_RESULT p50 / p90 / max ms "
        "| close → resume_spawned p50 ms | children | new / old p50 |",
        "|---|---|---|---|---|---|",
    ]
    load_before = os.getloadavg()
    for pause in [float(p) for p in args.pauses.split(",")]:
        work = Path(tempfile.mkdtemp(prefix="deltad-fork-ab-", dir=os.environ.get("BENCH_DIR")))
        try:
            out = run(args.old_venv, args.samples, pause, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows[str(pause)] = out
        p50 = {s: statistics.median(out[s]["result"]) for s in out}
        for side, r in out.items():
            kinds = ", ".join(f"{k} {n}" for k, n in Counter(c or "–" for c in r["child"]).items())
            ratio = f"×{p50['new'] / p50['old']:.3f}" if side == "new" else ""
            res = r["result"]
            lines.append(
                f"| {pause:g} s | {side} | {p50[side]:.1f} / {pct(res, 90):.1f} / {max(res):.1f} "
                f"| {statistics.median(r['spawned']):.1f} | {kinds} | {ratio} |"
            )
    load = f"load {load_before[0]:.1f} → {os.getloadavg()[0]:.1f}"
    lines += ["", f"answers per side and pause: {args.samples}, in turn; {load}"]
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "old_venv": str(args.old_venv),
        "samples": rows,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    path = HERE / "results" / f"fork-ab-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print("\n".join(lines))
    print(f"\n(JSON: {path})")


if __name__ == "__main__":
    main()
