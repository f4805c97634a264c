"""deltad benchmarks (a script, not timed tests): deltad side by side with a 1-second polling loop.

    .venv/bin/python bench/daemon_bench.py                 # N = 100, 1000, 10000 (~6 min)
    .venv/bin/python bench/daemon_bench.py --sizes 100 --e2e 5 --files 1000   # quick look

Per N paused workspaces (bench/trees.py): startup → READY (deltad: READY=1 on a notify socket;
baseline: first full scan), detection latency close(response.txt) → resume spawned (deltad's
`resume_spawned` log time) and → first instruction of the resume command (a bash stub recording
$EPOCHREALTIME and removing the answer), idle CPU and RSS, a burst of 1,000 answers (time until
all resumed, missed, doubled). At the largest N also the kernel's
inotify watch count before/after 100,000 files are added to one workspace. Separately, end to
end with the real `delta` client and the fake OpenAI server: close → ACTION_RESULT journaled.
Results are written as they are measured, one JSON line per step (with the 1-minute load average
at that moment) to bench/results/daemon-<time>.jsonl, so a crash or a kill keeps what was
measured; a Markdown table on stdout at the end. Every wait is for a condition, with a deadline
that grows with N (`deadline`), never a fixed one. With two sizes or more, each size after the
first adds a `slope` line: per-workspace RSS and READY time between it and the size before, and
their projection to `--project` workspaces (1,000,000). Built for 1,000,000: the workspaces are
named on demand (`trees.Spaces`), only the sampled ones are touched, nothing is O(N²).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import trees  # noqa: E402
from deltad.testing import FakeLLM  # noqa: E402
from tests.support.daemon import Daemon  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
RESULTS = HERE / "results"


def deadline(n: int) -> float:
    """How long a step over N workspaces may take before the bench calls it failed: a minute,
    plus 5 ms per workspace (READY took 1.5 ms per workspace before it was made lazy; a reload
    reads every workspace)."""
    return 60.0 + 0.005 * n


class Lines:
    """The results file, one JSON object per line, flushed and fsynced per line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(exist_ok=True)
        self.path = path

    def emit(self, step: str, **fields: Any) -> None:
        load = [round(x, 2) for x in os.getloadavg()]  # 1, 5, 15 min: other jobs share the VM
        # The bench's own peak RSS: at 1,000,000 workspaces it must stay small (no list of them).
        bench_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        row = {
            "step": step,
            "at": time.time(),
            "load1": load[0],
            "loadavg": load,
            "bench_maxrss_mb": round(bench_mb, 1),
            **fields,
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


STUB = """#!/bin/bash
printf '%s %s\\n' "$EPOCHREALTIME" "$1" >> {record}
rm -f -- "$1/.delta/interaction/response.txt"
"""


# -- measuring a process --------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def inotify_watches(pid: int) -> int:
    """The kernel's count: `inotify wd:` lines in the fdinfo of the process's inotify fds."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify":
                info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
                total += sum(1 for x in info.splitlines() if x.startswith("inotify wd:"))
        except OSError:
            continue
    return total


def idle(pid: int, seconds: float) -> tuple[float, float]:
    time.sleep(3)  # let the last resume's reconcile and status write finish: idle means idle
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0), rss_mb(pid)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# -- the stub's record ----------------------------------------------------------------------
class Record:
    """The stub's lines, read incrementally: per workspace the latest time and how many."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.last: dict[str, float] = {}
        self.count: Counter[str] = Counter()

    def poll(self) -> list[tuple[float, str]]:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind("\n") + 1]
        self.offset += len(complete.encode())
        new = [
            (float(t.replace(",", ".")), ws)
            for t, ws in (line.split(" ", 1) for line in complete.splitlines())
        ]
        for t, ws in new:
            self.last[ws] = max(t, self.last.get(ws, t))
            self.count[ws] += 1
        return new

    def wait_for(self, ws: set[str], timeout: float) -> bool:
        pending = set(ws)
        end = time.monotonic() + timeout
        while pending and time.monotonic() < end:
            for _, w in self.poll():
                pending.discard(w)
            if pending:
                time.sleep(0.001)
        return not pending


# An answer resumed later than this (a close event is served in milliseconds) is listed under
# `late` with the contender's log lines for its workspace.
LATE_AFTER = 1.0


def write_answer(ws: Path, text: str = "yes") -> float:
    """In place, open-write-close, like `echo yes > response.txt`; returns close time."""
    with open(ws / ".delta" / "interaction" / "response.txt", "w") as f:
        f.write(text)
    return time.time()


# -- the two contenders ---------------------------------------------------------------------
class Deltad:
    name = "deltad"

    def __init__(
        self, work: Path, root: Path, stub: Path, n: int, backend: str | None = None
    ) -> None:
        self.n = n
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock_path = work / "notify.sock"
        self.sock.bind(str(self.sock_path))
        self.d = Daemon(
            work,
            [{"path": str(root), "backend": backend} if backend else root],
            resume_command=[str(stub), "{workspace}"],
            log_level="info",
            settle_seconds=1.0,
            backoff_initial_seconds=5,
        )

    def start(self) -> float:
        t0 = time.monotonic()
        self.d.start(env={"NOTIFY_SOCKET": str(self.sock_path)}, wait=False)
        end = t0 + deadline(self.n)
        while True:
            self.sock.settimeout(max(0.1, end - time.monotonic()))
            if b"READY=1" in self.sock.recv(65536):  # a timeout raises: READY never came
                return time.monotonic() - t0

    def backend(self) -> str:
        ready = self.d.wait_event("daemon_ready", timeout=deadline(self.n))[0]
        return ",".join(k for k, v in ready["watches"].items() if v)

    def questions_read_s(self) -> float:
        """From READY to the end of the background reads of questions known by a glance."""
        ready = self.d.wait_event("daemon_ready", timeout=deadline(self.n))[0]
        done = self.d.wait_event("questions_read", timeout=deadline(self.n))[0]
        return _ts(done) - _ts(ready)

    def reconciles(self) -> dict[str, int]:
        """Full reconciles started, by reason (a second one must never start on its own)."""
        return dict(Counter(e["reason"] for e in self.d.events("reconcile_full_started")))

    @property
    def pid(self) -> int:
        assert self.d.proc is not None
        return self.d.proc.pid

    def rescan(self) -> None:
        self.d.reload(timeout=deadline(self.n))

    def spawn_times(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for e in self.d.events("resume_spawned"):
            out.setdefault(e["workspace"], []).append(_ts(e))
        return out

    def about(self, ws: Path) -> list[dict[str, Any]]:
        return [e for e in self.d.lines() if e.get("workspace") == str(ws)]

    def stop(self) -> None:
        self.d.stop(timeout=deadline(self.n))
        self.sock.close()


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


class Baseline:
    name = "1 s polling loop"

    def __init__(self, work: Path, root: Path, stub: Path, n: int) -> None:
        self.argv = [
            sys.executable,
            str(HERE / "baseline_poller.py"),
            str(root),
            "--",
            str(stub),
            "{workspace}",
        ]
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> float:
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.proc.stdout.readline()
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rescan(self) -> None:
        time.sleep(2.2)  # two more loops

    def spawn_times(self) -> dict[str, list[float]]:
        return {}

    def about(self, ws: Path) -> list[dict[str, Any]]:
        return []

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()


# -- one size -------------------------------------------------------------------------------
def detection(
    contender: Any,
    record: Record,
    spaces: Sequence[Path],
    samples: int,
    jitter: float = 0.0,
    wait: float = 120.0,
    late_after: float = LATE_AFTER,
) -> dict[str, Any]:
    closes: dict[str, float] = {}
    to_stub: list[float] = []
    missed: list[dict[str, Any]] = []
    late: list[dict[str, Any]] = []
    for ws in random.sample(spaces, samples):
        time.sleep(random.uniform(0, jitter))  # a loop must not be in phase with the writes
        record.poll()
        closes[str(ws)] = t = write_answer(ws)
        if not record.wait_for({str(ws)}, timeout=wait):
            # Not resumed within the wait: a finding, not a crash of the bench (a run once
            # aborted here with a ValueError from max() of nothing). Keep what the contender
            # logged about that workspace so the cause can be read afterwards.
            missed.append({"workspace": str(ws), "closed": t, "log": contender.about(ws)})
            continue
        took = record.last[str(ws)] - t
        to_stub.append(took)
        if took > late_after:  # resumed, but by something slower than its close event
            late.append(
                {"workspace": str(ws), "waited_s": round(took, 3), "log": contender.about(ws)}
            )
    spawned = contender.spawn_times()
    to_spawn = [spawned[w][-1] - t for w, t in closes.items() if w in spawned]
    ms = 1000
    return {
        "spawn_p50_ms": pct(to_spawn, 50) * ms,
        "spawn_p99_ms": pct(to_spawn, 99) * ms,
        "stub_p50_ms": pct(to_stub, 50) * ms,
        "stub_p99_ms": pct(to_stub, 99) * ms,
        "samples": samples,
        "missed": missed,
        "late": late,
    }


def burst(contender: Any, record: Record, spaces: Sequence[Path], size: int) -> dict[str, Any]:
    chosen = [str(ws) for ws in random.sample(spaces, size)]
    record.poll()
    before = {ws: record.count[ws] for ws in chosen}
    t0 = time.time()
    for ws in chosen:
        write_answer(Path(ws))
    complete = record.wait_for(set(chosen), timeout=deadline(len(spaces)))
    took = max(record.last.get(ws, t0) for ws in chosen) - t0
    contender.rescan()
    record.poll()
    counts = [record.count[ws] - before[ws] for ws in chosen]
    return {
        "answers": size,
        "all_resumed_s": took if complete else float("nan"),
        "missed": counts.count(0),
        "doubled": sum(1 for c in counts if c > 1),
    }


def many_files(
    contender: Deltad, record: Record, ws: Path, files: int, wait: float
) -> dict[str, Any]:
    before = inotify_watches(contender.pid)
    per_dir = 1000
    for i in range(0, files, per_dir):
        d = ws / "work" / f"d{i // per_dir:04d}"
        d.mkdir(parents=True, exist_ok=True)  # a reused root may have them
        for j in range(min(per_dir, files - i)):
            (d / f"f{j}.txt").write_bytes(b"x")
    time.sleep(1)
    after = inotify_watches(contender.pid)
    record.poll()
    write_answer(ws)
    still_detected = record.wait_for({str(ws)}, timeout=wait)
    return {
        "files": files,
        "watches_before": before,
        "watches_after": after,
        "answer_still_detected": still_detected,
    }


def run_size(
    kind: type,
    work: Path,
    root: Path,
    spaces: Sequence[Path],
    args: argparse.Namespace,
    largest: bool,
    lines: Lines,
) -> dict[str, Any]:
    record_path = work / f"{kind.__name__}.record"
    stub = work / f"{kind.__name__}-stub.sh"
    stub.write_text(STUB.format(record=record_path))
    stub.chmod(0o755)
    record = Record(record_path)
    n = len(spaces)
    extra = (args.backend,) if kind is Deltad else ()
    contender = kind(work, root, stub, n, *extra)
    out: dict[str, Any] = {"contender": contender.name, "n": len(spaces)}
    about = {"contender": contender.name, "n": len(spaces)}
    try:
        out["ready_s"] = contender.start()
        # CPU seconds to READY: what READY would take on an idle machine with a warm cache
        # (the wall time above also holds other jobs' share of the 2 cores, and disk reads).
        out["ready_cpu_s"] = cpu_seconds(contender.pid)
        out["ready_rss_mb"] = rss_mb(contender.pid)
        lines.emit(
            "ready",
            **about,
            ready_s=out["ready_s"],
            ready_cpu_s=out["ready_cpu_s"],
            rss_mb=out["ready_rss_mb"],
            backend=contender.backend() if kind is Deltad else "scan",
        )
        if kind is Deltad:
            out["questions_read_s"] = contender.questions_read_s()
            out["watches"] = inotify_watches(contender.pid)
            out["read_rss_mb"] = rss_mb(contender.pid)
            lines.emit(
                "questions_read",
                **about,
                after_ready_s=out["questions_read_s"],
                inotify_watches=out["watches"],
                rss_mb=out["read_rss_mb"],
            )
        samples = args.samples if kind is Deltad else args.baseline_samples
        jitter = 1.0 if kind is Baseline else 0.0
        # The baseline's answers wait for its poll loop (1 s plus jitter): never "late".
        late_after = LATE_AFTER if kind is Deltad else float("inf")
        n = min(samples, len(spaces))
        out["detection"] = detection(
            contender, record, spaces, n, jitter, wait=args.wait, late_after=late_after
        )
        lines.emit("detection", **about, **out["detection"])
        out["idle_cpu_pct"], out["rss_mb"] = idle(contender.pid, args.idle)
        lines.emit("idle", **about, cpu_pct=out["idle_cpu_pct"], rss_mb=out["rss_mb"])
        if args.burst and len(spaces) >= args.burst:
            out["burst"] = burst(contender, record, spaces, args.burst)
            lines.emit("burst", **about, **out["burst"])
        if largest and kind is Deltad and args.files:
            out["many_files"] = many_files(contender, record, spaces[0], args.files, args.wait)
            lines.emit("many_files", **about, **out["many_files"])
        if kind is Deltad:
            out["reconciles"] = contender.reconciles()
            lines.emit("reconciles", **about, started=out["reconciles"])
    finally:
        contender.stop()
    return out


# -- end to end with the real client --------------------------------------------------------
def e2e(work: Path, n: int) -> dict[str, Any]:
    root = work / "e2e"
    agent = work / "agent"
    agent.mkdir()
    (agent / "config.yaml").write_text("name: a\nllm:\n  model: fake\ntools: []\n")
    (agent / "system_prompt.md").write_text("bench\n")
    delta = str(Path(sys.executable).parent / "delta")
    with FakeLLM() as fake:
        env = {**os.environ, "OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "x"}
        spaces = [root / f"ws{i:03d}" for i in range(n)]
        for i, ws in enumerate(spaces):
            ws.mkdir(parents=True)
            fake.call("ask_human", {"prompt": "q?"}, id=f"ask{i}")
            subprocess.run(
                [delta, "run", "--agent", str(agent), "--task", "t", "--work-dir", str(ws)],
                env=env,
                capture_output=True,
                check=False,
            )
        fake.always("done")
        (work / "e2e-daemon").mkdir()
        d = Daemon(
            work / "e2e-daemon",
            [root],
            log_level="info",
            resume_command=["delta", "run", "--work-dir", "{workspace}"],
        )
        d.start(env=env)
        latencies = []
        try:
            for ws in spaces:
                t = write_answer(ws, "benchmark answer")
                journaled = _wait_action_result(ws)
                latencies.append(journaled - t)
        finally:
            d.stop(timeout=120)
    return {"n": n, "p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000}


def _wait_action_result(ws: Path, timeout: float = 60) -> float:
    rid = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
    journal = ws / ".delta" / "runs" / rid / "execution" / "journal.jsonl"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for line in journal.read_text().splitlines():
            e = json.loads(line)
            if e["type"] == "ACTION_RESULT":
                return datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
        time.sleep(0.005)
    raise TimeoutError(f"no ACTION_RESULT in {journal}")


# -- per-workspace costs ----------------------------------------------------------------------
# What grows with N, measured at two sizes in one run: (name, field in a result, unit factor).
# The slope between the sizes is the cost of one more workspace (what is paid once, the
# interpreter and the modules, cancels out); the projection extends it from the larger size.
GROWING = (
    ("rss_at_ready", "ready_rss_mb", 2**20),  # bytes per workspace
    ("rss_questions_read", "read_rss_mb", 2**20),
    ("rss_idle", "rss_mb", 2**20),
    ("ready", "ready_s", 1e6),  # microseconds per workspace
    ("ready_cpu", "ready_cpu_s", 1e6),
    ("questions_read", "questions_read_s", 1e6),
)


def slope(a: dict[str, Any], b: dict[str, Any], project_to: int) -> dict[str, Any]:
    """Per-workspace costs between results `a` and `b` (bytes or microseconds per workspace)
    and each value projected to `project_to` workspaces (MB or seconds, as measured)."""
    small, large = sorted((a, b), key=lambda r: int(r["n"]))
    dn = large["n"] - small["n"]
    if dn <= 0:
        raise ValueError(f"two different sizes are needed, not {a['n']} and {b['n']}")
    row: dict[str, Any] = {"from_n": small["n"], "to_n": large["n"], "project_to": project_to}
    for name, field, unit in GROWING:
        if field not in small or field not in large:
            continue
        per = (large[field] - small[field]) / dn
        unit_name = "bytes" if unit == 2**20 else "us"
        row[f"{name}_{unit_name}_per_ws"] = round(per * unit, 3)
        row[f"projected_{field}"] = round(large[field] + per * (project_to - large["n"]), 3)
    return row


def slope_table(slopes: list[dict[str, Any]]) -> str:
    if not slopes:
        return ""
    rows = [
        "| sizes | RSS B/ws at READY / read / idle | READY µs/ws (CPU) | projected at N: "
        "READY s, RSS MB at READY / idle |",
        "|---|---|---|---|",
    ]
    for s in slopes:
        rows.append(
            f"| {s['from_n']:,} → {s['to_n']:,} | {s.get('rss_at_ready_bytes_per_ws', 'n/a')} / "
            f"{s.get('rss_questions_read_bytes_per_ws', 'n/a')} / "
            f"{s.get('rss_idle_bytes_per_ws', 'n/a')} | {s.get('ready_us_per_ws', 'n/a')} "
            f"({s.get('ready_cpu_us_per_ws', 'n/a')}) | N={s['project_to']:,}: "
            f"{s.get('projected_ready_s', 'n/a')}, {s.get('projected_ready_rss_mb', 'n/a')} / "
            f"{s.get('projected_rss_mb', 'n/a')} |"
        )
    return "\n".join(rows)


# -- report ---------------------------------------------------------------------------------
def table(results: list[dict[str, Any]], e2e_result: dict[str, Any] | None) -> str:
    rows = [
        "| N | contender | READY s | questions read s after | close→spawn p50 / p99 ms "
        "| close→stub p50 / p99 ms | idle CPU % | RSS MB "
        "| burst 1,000: all resumed s (missed / doubled) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        det = r["detection"]
        spawn = (
            f"{det['spawn_p50_ms']:.1f} / {det['spawn_p99_ms']:.1f}"
            if det["spawn_p50_ms"] == det["spawn_p50_ms"]
            else "n/a"
        )
        b = r.get("burst")
        burst_cell = f"{b['all_resumed_s']:.2f} ({b['missed']} / {b['doubled']})" if b else "–"
        rows.append(
            f"| {r['n']:,} | {r['contender']} | {r['ready_s']:.2f} | "
            f"{r.get('questions_read_s', float('nan')):.1f} | {spawn} | "
            f"{det['stub_p50_ms']:.1f} / {det['stub_p99_ms']:.1f} ({det['samples']} samples) | "
            f"{r['idle_cpu_pct']:.2f} | {r['rss_mb']:.0f} | {burst_cell} |"
        )
    extra = []
    for r in results:
        if mf := r.get("many_files"):
            extra.append(
                f"- inotify watches (kernel count) at N={r['n']:,}: "
                f"{mf['watches_before']:,} before and {mf['watches_after']:,} after adding "
                f"{mf['files']:,} files in {mf['files'] // 1000} directories to one "
                f"workspace; an answer there was still detected: "
                f"{mf['answer_still_detected']}"
            )
    if e2e_result:
        extra.append(
            f"- end to end, real `delta` + fake OpenAI server, {e2e_result['n']} runs "
            f"resumed one by one: close → ACTION_RESULT journaled p50 "
            f"{e2e_result['p50_ms']:.0f} ms, p99 {e2e_result['p99_ms']:.0f} ms"
        )
    return "\n".join([*rows, "", *extra])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--samples", type=int, default=200, help="detection samples for deltad")
    ap.add_argument("--baseline-samples", type=int, default=20)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement")
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--e2e", type=int, default=20, help="real-client runs (0: skip)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument(
        "--wait", type=float, default=120.0, help="seconds an answer may wait before it is missed"
    )
    ap.add_argument(
        "--project",
        type=int,
        default=1_000_000,
        help="the size the per-workspace slopes are projected to (default 1,000,000)",
    )
    ap.add_argument("--only-deltad", action="store_true", help="skip the polling baseline")
    ap.add_argument(
        "--backend", choices=("fanotify", "inotify"), help="deltad's backend (default: auto)"
    )
    ap.add_argument(
        "--reuse",
        type=Path,
        help="keep the paused workspaces in DIR/root<N> and use them again (built, or a "
        "half-built tree finished, by bench/trees.py)",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="deltad-bench-", dir=os.environ.get("BENCH_DIR")))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    lines = Lines(RESULTS / f"daemon-{stamp}.jsonl")
    print(f"results: {lines.path}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    slopes: list[dict[str, Any]] = []
    try:
        for n in sizes:
            root = args.reuse / f"root{n}" if args.reuse else work / f"n{n}" / "root"
            if not trees.complete(root):  # a tree an earlier build left half done is finished
                try:
                    lines.emit("built", n=n, seconds=trees.build(root, n))
                except trees.DiskFull as e:
                    sys.exit(f"daemon_bench: no room for {n:,} workspaces: {e}")
            spaces = trees.Spaces(root, n)
            for kind in (Deltad,) if args.only_deltad else (Deltad, Baseline):
                sub = work / f"n{n}" / kind.__name__.lower()
                sub.mkdir(parents=True)
                r = run_size(kind, sub, root, spaces, args, n == max(sizes), lines)
                results.append(r)
            if (ours := [r for r in results if r["contender"] == Deltad.name])[1:]:
                slopes.append(slope(ours[-2], ours[-1], project_to=args.project))
                lines.emit("slope", **slopes[-1])
        e2e_result = e2e(work, args.e2e) if args.e2e else None
        if e2e_result:
            lines.emit("e2e", **e2e_result)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results, e2e_result))
    print(slope_table(slopes))


if __name__ == "__main__":
    main()
