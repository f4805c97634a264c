"""Resume executors side by side (a script, not timed tests): fresh process vs warm fork server.

    .venv/bin/python bench/executor_bench.py                       # 20 sequential, burst 100
    .venv/bin/python bench/executor_bench.py --samples 5 --burst 20   # quick look

Two `deltad` daemons run at once on two roots of paused workspaces, one per executor, with the
real `delta` client against the fake OpenAI server (one `ask_human`, then the model answers
"done"). Sequential: one answer at a time, alternating between the executors, and the next
only once the previous resume has exited (nothing overlaps): close(response.txt) →
ACTION_RESULT journaled, and close → `resume_exited` in deltad's log. Burst: B answers written
at once into one root, then the other; time until every resume exited, and how many
workspaces were resumed zero or several times. Ratios are fork / fresh from the same run.
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
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deltad.testing import FakeLLM  # noqa: E402
from tests.support.daemon import Daemon  # noqa: E402

EXECUTORS = ("fresh", "fork")
DELTA = str(Path(sys.executable).parent / "delta")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _stamp(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# -- workspaces -----------------------------------------------------------------------------
def template(work: Path, fake: FakeLLM, env: dict[str, str]) -> Path:
    """One run paused on a real `ask_human`, made by the real client; copied for every sample."""
    agent = work / "agent"
    agent.mkdir()
    (agent / "config.yaml").write_text("name: a\nllm:\n  model: fake\ntools: []\n")
    (agent / "system_prompt.md").write_text("bench\n")
    ws = work / "template"
    ws.mkdir()
    fake.call("ask_human", {"prompt": "q?"}, id="ask")
    subprocess.run(
        [DELTA, "run", "--agent", str(agent), "--task", "t", "--work-dir", str(ws)],
        env=env,
        capture_output=True,
        check=False,
    )
    if not (ws / ".delta" / "interaction" / "request.json").exists():
        raise SystemExit("the template run did not pause on its question")
    return ws


def copies(tpl: Path, root: Path, prefix: str, n: int) -> list[Path]:
    spaces = [root / f"{prefix}{i:04d}" for i in range(n)]
    for ws in spaces:
        shutil.copytree(tpl, ws, symlinks=True)
    return spaces


def write_answer(ws: Path, text: str = "benchmark answer") -> float:
    path = ws / ".delta" / "interaction" / "response.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, text.encode())
    t = time.time()
    os.close(fd)
    return t


def action_results(ws: Path) -> list[float]:
    rid = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
    journal = ws / ".delta" / "runs" / rid / "execution" / "journal.jsonl"
    out = []
    for line in journal.read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "ACTION_RESULT":
            out.append(_stamp(e["timestamp"]))
    return out


def wait(cond: Any, what: str, timeout: float = 300) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := cond():
            return value
        time.sleep(0.005)
    raise TimeoutError(what)


def start_daemon(
    home: Path, root: Path, executor: str, env: dict[str, str], **settings: Any
) -> Daemon:
    """A daemon on one root with one executor; a fork server is warm before it is returned."""
    home.mkdir()
    d = Daemon(home, [root], log_level="info", executor=executor, **settings).start(env=env)
    if executor == "fork":
        d.wait_event("fork_server_ready", timeout=120)
    return d


# -- measurements ---------------------------------------------------------------------------
def sequential(daemons: dict[str, Daemon], spaces: dict[str, list[Path]]) -> dict[str, Any]:
    out: dict[str, dict[str, list[float]]] = {e: {"result": [], "exit": []} for e in EXECUTORS}
    samples = len(spaces["fresh"])
    for i in range(samples):
        order = EXECUTORS if i % 2 == 0 else EXECUTORS[::-1]  # neither always goes first
        for ex in order:
            d, ws = daemons[ex], spaces[ex][i]
            t = write_answer(ws)
            journaled = wait(lambda ws=ws: action_results(ws), f"ACTION_RESULT in {ws}")[0]
            [exited] = wait(
                lambda d=d, ws=ws: d.events("resume_exited", workspace=str(ws)), f"{ws} exit"
            )
            out[ex]["result"].append(journaled - t)
            out[ex]["exit"].append(_stamp(exited["timestamp"]) - t)
    return {
        ex: {
            "samples": samples,
            **{f"{k}_p50_ms": pct(v, 50) * 1000 for k, v in out[ex].items()},
            **{f"{k}_p99_ms": pct(v, 99) * 1000 for k, v in out[ex].items()},
        }
        for ex in EXECUTORS
    }


def burst(d: Daemon, spaces: list[Path]) -> dict[str, Any]:
    before = len(d.events("resume_exited"))
    t0 = time.monotonic()
    for ws in spaces:
        write_answer(ws)
    wait(
        lambda: len(d.events("resume_exited")) >= before + len(spaces),
        "every burst resume exited",
        timeout=60 + 5 * len(spaces),
    )
    elapsed = time.monotonic() - t0
    counts = [len(action_results(ws)) for ws in spaces]
    return {
        "n": len(spaces),
        "all_exited_s": elapsed,
        "per_s": len(spaces) / elapsed,
        "missed": counts.count(0),
        "doubled": sum(1 for c in counts if c > 1),
    }


# -- report ---------------------------------------------------------------------------------
def table(seq: dict[str, Any], bursts: dict[str, Any]) -> str:
    f, k = seq["fresh"], seq["fork"]
    rows = [
        "| measure | fresh | fork | fork / fresh |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("result_p50_ms", "close → ACTION_RESULT p50 ms"),
        ("result_p99_ms", "close → ACTION_RESULT p99 ms"),
        ("exit_p50_ms", "close → resume exited p50 ms"),
        ("exit_p99_ms", "close → resume exited p99 ms"),
    ):
        rows.append(f"| {label} | {f[key]:.0f} | {k[key]:.0f} | ×{k[key] / f[key]:.3f} |")
    if bursts:
        bf, bk = bursts["fresh"], bursts["fork"]
        rows.append(
            f"| burst of {bf['n']}: resumes/s (missed / doubled) | {bf['per_s']:.2f} "
            f"({bf['missed']} / {bf['doubled']}) | {bk['per_s']:.2f} "
            f"({bk['missed']} / {bk['doubled']}) | ×{bk['per_s'] / bf['per_s']:.1f} |"
        )
    return "\n".join([*rows, "", f"sequential samples per executor: {f['samples']}"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=20, help="sequential resumes per executor")
    ap.add_argument("--burst", type=int, default=100, help="answers at once (0: skip)")
    ap.add_argument("--parallel", type=int, default=4, help="max_parallel_resumes")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="deltad-exbench-", dir=os.environ.get("BENCH_DIR")))
    daemons: dict[str, Daemon] = {}
    try:
        with FakeLLM() as fake:
            env = {**os.environ, "OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "x"}
            tpl = template(work, fake, env)
            fake.always("done")
            seq_spaces, burst_spaces = {}, {}
            for ex in EXECUTORS:
                root = work / ex / "root"
                seq_spaces[ex] = copies(tpl, root, "seq", args.samples)
                burst_spaces[ex] = copies(tpl, root, "burst", args.burst)
                daemons[ex] = start_daemon(
                    work / ex / "daemon",
                    root,
                    ex,
                    env,
                    max_parallel_resumes=args.parallel,
                    max_parallel_resumes_per_owner=args.parallel,  # one owner: every slot
                    resume_command=["delta", "run", "--work-dir", "{workspace}"],
                )
            seq = sequential(daemons, seq_spaces)
            bursts = (
                {ex: burst(daemons[ex], burst_spaces[ex]) for ex in EXECUTORS} if args.burst else {}
            )
    finally:
        for d in daemons.values():
            d.stop(timeout=300)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sequential": seq,
        "burst": bursts,
        "parallel": args.parallel,
        "loadavg_after": os.getloadavg(),
    }
    out = HERE / "results" / f"executors-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(seq, bursts))
    print(f"\n(JSON: {out})")


if __name__ == "__main__":
    main()
