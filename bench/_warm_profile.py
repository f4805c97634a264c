"""Where an answer's resume spends its time, step by step, warm (fork server) beside fresh.

    .venv/bin/python bench/warm_breakdown.py                 # 20 answers per executor
    .venv/bin/python bench/warm_breakdown.py --samples 5     # quick look

Two `deltad` daemons on two roots of paused workspaces (one per executor), the real client
against the fake OpenAI server, as bench/executor_bench.py. The resume command is the client
with stamps: a small module (written beside the installed deltad for the run, removed after,
because the fork server runs `python -m MODULE` of its own interpreter warm and starts from a
clean environment) that records, in the resumed process, when it started, when it took the
workspace lock, loaded the agent, read the journal, appended each entry and made each fsync,
and its CPU time and page faults. The daemon's side comes from its own log (`resume_queued`,
`resume_spawned`). Every step is in ms after the answer's close (the close of response.txt),
median and p99, with fork / fresh from the same run. Results: Markdown on stdout, JSON in
bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from executor_bench import (  # noqa: E402
    EXECUTORS,
    _stamp,
    action_results,
    copies,
    pct,
    start_daemon,
    template,
    wait,
    write_answer,
)

from deltad.testing import FakeLLM  # noqa: E402
from tests.support.daemon import Daemon  # noqa: E402

MODULE = "deltad_bench_stamps"
STAMPS = ".delta-bench-stamps.json"  # in the workspace, written by the resumed process

# The resumed process: `delta run` with stamps (the `delta` console script's `main`).
STAMPING = (
    '''
"""Written by bench/warm_breakdown.py for one run, removed after: `delta` with stamps."""
import json, os, resource, sys, time

def _usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return [r.ru_utime + r.ru_stime, r.ru_minflt]

T = {"start": time.time(), "usage_start": _usage(), "appends": [], "fsyncs": [],
     "journal_read": [], "lock": [], "agent_loaded": [], "usage_at_result": None}
_fsync, _fdatasync = os.fsync, os.fdatasync

import traceback
def _timed(sync):
    def run(fd):
        if T["usage_at_result"] is None:
            T.setdefault("fsync_stacks", []).append(" < ".join(f"{fr.name}:{fr.lineno}" for fr in traceback.extract_stack()[-7:-1][::-1]))
        t = time.time()
        sync(fd)
        T["fsyncs"].append([t, time.time() - t])
    return run

os.fsync, os.fdatasync = _timed(_fsync), _timed(_fdatasync)

from deltad.client import runner
from deltad.protocol import journal, lock

def _wrap(owner, name, key, tag=None):
    orig = getattr(owner, name)
    def stamped(*a, **k):
        t = time.time()
        try:
            return orig(*a, **k)
        finally:
            entry = [t, time.time()] if tag is None else [tag(a, k), t, time.time()]
            T[key].append(entry)
            if key == "appends" and "ACTION_RESULT" in entry[0] and T["usage_at_result"] is None:
                T["usage_at_result"] = _usage()
    setattr(owner, name, stamped)

_wrap(journal.Journal, "__init__", "journal_read")
_wrap(journal.Journal, "append", "appends",
      tag=lambda a, k: str(a[1] if len(a) > 1 else k.get("type_")))
_wrap(runner, "load_agent", "agent_loaded")
_wrap(lock.WorkspaceLock, "acquire", "lock")

from deltad.client.cli import main

work_dir = sys.argv[sys.argv.index("--work-dir") + 1]
sys.argv = ["delta", *sys.argv[1:]]
import cProfile
_p = cProfile.Profile()
_p.enable()
try:
    main()
finally:
    _p.disable()
    _p.dump_stats(os.path.join(work_dir, ".delta-prof-%d" % os.getpid()))
    T["end"] = time.time()
    T["usage_end"] = _usage()
    with open(os.path.join(work_dir, "'''
    + STAMPS
    + """"), "w") as f:
        json.dump(T, f)
"""
)

# (key, label) in the order a resume goes through them
STEPS = (
    ("queued", "daemon: resume queued (look, decide, receipt)"),
    ("spawned", "daemon: resume spawned"),
    ("child_start", "child: running (fork or exec + interpreter start)"),
    ("lock", "child: CLI parsed, workspace lock taken"),
    ("agent_loaded", "child: agent loaded"),
    ("journal_read", "child: journal read"),
    ("action_result", "child: answer committed (ACTION_RESULT appended)"),
    ("exit", "resume exited (model call and the rest of the run)"),
)
SPANS = (
    ("cpu_ms", "child CPU until ACTION_RESULT, ms"),
    ("minflt", "child minor page faults until ACTION_RESULT"),
    ("fsyncs", "fsyncs before ACTION_RESULT"),
    ("fsync_ms", "time in those fsyncs, ms"),
)


def install_stamping() -> Path:
    path = Path(sysconfig.get_paths()["purelib"]) / f"{MODULE}.py"
    if path.exists():
        raise SystemExit(f"{path} exists: another run of this bench? remove it first")
    path.write_text(STAMPING)
    return path


def breakdown(d: Daemon, ws: Path, closed: float) -> dict[str, float]:
    """One answer's steps, ms after the close."""
    [exited] = wait(lambda: d.events("resume_exited", workspace=str(ws)), f"{ws} exit")
    stamps = wait(lambda: _stamps(ws), f"{ws} stamps")
    [queued] = d.events("resume_queued", workspace=str(ws))
    [spawned] = d.events("resume_spawned", workspace=str(ws))
    result = action_results(ws)[0]
    ar = next(a for a in stamps["appends"] if "ACTION_RESULT" in a[0])
    before = [f for f in stamps["fsyncs"] if f[0] <= ar[2]]
    usage = stamps["usage_at_result"] or stamps["usage_end"]

    def ms(t: float) -> float:
        return (t - closed) * 1000

    return {
        "queued": ms(_stamp(queued["timestamp"])),
        "spawned": ms(_stamp(spawned["timestamp"])),
        "child_start": ms(stamps["start"]),
        "lock": ms(stamps["lock"][0][1]),
        "agent_loaded": ms(stamps["agent_loaded"][0][1]),
        "journal_read": ms(stamps["journal_read"][0][1]),
        "action_result": ms(max(result, ar[2])),
        "exit": ms(_stamp(exited["timestamp"])),
        # a forked child's counts start at its fork; an exec'd one's include the interpreter
        "cpu_ms": (usage[0] - stamps["usage_start"][0]) * 1000,
        "minflt": float(usage[1] - stamps["usage_start"][1]),
        "fsyncs": float(len(before)),
        "fsync_ms": sum(f[1] for f in before) * 1000,
    }


def _stamps(ws: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((ws / STAMPS).read_text()))
    except (OSError, ValueError):
        return None


def table(rows: dict[str, list[dict[str, float]]]) -> str:
    out = [
        "| step (ms after the answer's close) | fresh p50 / p99 | fork p50 / p99 "
        "| fork / fresh p50 |",
        "|---|---|---|---|",
    ]

    def cell(ex: str, key: str) -> tuple[float, float]:
        values = [r[key] for r in rows[ex]]
        return statistics.median(values), pct(values, 99)

    for key, label in (*STEPS, *SPANS):
        f, k = cell("fresh", key), cell("fork", key)
        ratio = f"×{k[0] / f[0]:.3f}" if f[0] else "–"
        out.append(f"| {label} | {f[0]:.1f} / {f[1]:.1f} | {k[0]:.1f} / {k[1]:.1f} | {ratio} |")
    return "\n".join([*out, "", f"answers per executor: {len(rows['fresh'])}"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=20, help="answers per executor")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="deltad-warmbench-", dir=os.environ.get("BENCH_DIR")))
    stamping = install_stamping()
    daemons: dict[str, Daemon] = {}
    rows: dict[str, list[dict[str, float]]] = {ex: [] for ex in EXECUTORS}
    try:
        with FakeLLM() as fake:
            env = {**os.environ, "OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "x"}
            tpl = template(work, fake, env)
            fake.always("done")
            spaces: dict[str, list[Path]] = {}
            for ex in EXECUTORS:
                root = work / ex / "root"
                spaces[ex] = copies(tpl, root, "ws", args.samples)
                daemons[ex] = start_daemon(
                    work / ex / "daemon",
                    root,
                    ex,
                    env,
                    resume_command=[
                        sys.executable,
                        "-m",
                        MODULE,
                        "run",
                        "--work-dir",
                        "{workspace}",
                    ],
                )
            for i in range(args.samples):
                for ex in EXECUTORS if i % 2 == 0 else EXECUTORS[::-1]:
                    ws = spaces[ex][i]
                    closed = write_answer(ws)
                    rows[ex].append(breakdown(daemons[ex], ws, closed))
    finally:
        for d in daemons.values():
            d.stop(timeout=300)
        stamping.unlink(missing_ok=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "samples": rows,
        "loadavg_after": os.getloadavg(),
    }
    out = HERE / "results" / f"warm-breakdown-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(rows))
    print(f"\n(JSON: {out})")


if __name__ == "__main__":
    main()
