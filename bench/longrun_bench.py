"""Long runs and a loop that never stalls (a script, not timed tests), before/after side by side.

    .venv/bin/python bench/longrun_bench.py --before /path/to/old/.venv/bin     # everything
    .venv/bin/python bench/longrun_bench.py --only model,journal --events 10000  # a quick look

`--before` is the bin directory of another install of deltad (e.g. the previous release in its
own venv); each measurement runs both installs one after the other on the same data, and the
result is reported as a ratio. Without it only this checkout is measured.

- model: one model call on a 66,668-message conversation through `OpenAIChatModel` (the SDK's
  request path, body serialised once) vs the same body as a plain `http.client` POST (its
  `json.dumps` included), both against the fake server.
- journal: a run paused after `--events` journal events (100,000: built by inflating a real
  paused run with synthetic tool turns); `delta status`, `delta respond` and the resume
  `delta run` (to COMPLETED against the fake server) timed with peak RSS from `/usr/bin/time -v`;
  the first resume meets a journal without a cut or snapshot (as an older release left it), the
  second one what the first left (a long run's steady state). That second resume also through
  each install's `deltad`: answer written → `resume_exited`, per executor.
- reconcile: N workspaces (`--sizes`, 10,000 and 50,000) under a periodic full reconcile
  (`rescan_interval_seconds`); answers written one at a time meanwhile; close → the resume
  command's first instruction, for the answers closed while a full reconcile was running.
- removal: 10,000 workspaces, `rm -rf` of 1,000 of them, answers to the others written
  meanwhile: close → resume.
An answer not resumed within 300 s, or later than 1 s, is listed under `late` with the daemon's
log lines for its workspace (`missed` counts the former); the run goes on.
Results: JSON in bench/results/ and a summary on stdout.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deltad.agent import LLMSettings  # noqa: E402
from deltad.engine.llm import OpenAIChatModel  # noqa: E402
from deltad.protocol.fsio import compact_json  # noqa: E402
from deltad.testing import FakeLLM  # noqa: E402
from deltad.testing.stub import paused_workspace  # noqa: E402

THIS = Path(sys.executable).parent
STUB = """#!/bin/bash
printf '%s %s\\n' "$EPOCHREALTIME" "$1" >> {record}
rm -f -- "$1/.delta/interaction/response.txt"
"""


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": max(ms or [0])}


# -- model call -------------------------------------------------------------------------------
def model_call(n: int = 66_668, rounds: int = 3) -> dict[str, Any]:
    msgs = [{"role": "user", "content": f"message {i}: some words of text"} for i in range(n)]
    with FakeLLM() as fake:
        fake.always("ok")
        os.environ.update(DELTA_BASE_URL=fake.url, DELTA_API_KEY="bench")
        model = OpenAIChatModel(LLMSettings(model="fake"))
        assert model.client is not None  # built once, as in a run
        u = urlparse(fake.url)
        sdk, plain = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            model.complete(msgs, [], compact_json(model.request_body(msgs, [])))
            sdk.append(time.perf_counter() - t)
            t = time.perf_counter()
            conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port)
            body = json.dumps(model.request_body(msgs, []))
            conn.request("POST", f"{u.path}/chat/completions", body, JSON_HEADERS)
            conn.getresponse().read()
            conn.close()
            plain.append(time.perf_counter() - t)
    s, p = pct(sdk, 50), pct(plain, 50)
    return {"messages": n, "sdk_s": s, "plain_http_s": p, "ratio": s / p}


JSON_HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench"}


# -- a long run -------------------------------------------------------------------------------
def timed(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        ["/usr/bin/time", "-v", *argv], env=env, capture_output=True, text=True, check=False
    )
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", proc.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    assert wall and rss, proc.stderr[-2000:]
    h, m, s = wall.groups()
    seconds = int(h or 0) * 3600 + int(m) * 60 + float(s)
    return {"exit": proc.returncode, "wall_s": seconds, "max_rss_mb": int(rss.group(1)) / 1024}


def inflate(journal: Path, events: int) -> None:
    """Insert synthetic tool turns (THOUGHT, ACTION_REQUEST, ACTION_RESULT) after RUN_START,
    renumbering, until the journal holds `events` events."""
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    head, tail = lines[:1], lines[1:]
    stamp = head[0]["timestamp"]
    turns = max(0, (events - len(lines)) // 3)
    made: list[dict[str, Any]] = []
    for i in range(turns):
        cid = f"bench_{i}"
        call = {"id": cid, "type": "function", "function": {"name": "noop", "arguments": "{}"}}
        made += [
            {"type": "THOUGHT", "payload": {"content": f"step {i}", "tool_calls": [call]}},
            {
                "type": "ACTION_REQUEST",
                "payload": {"action_id": cid, "tool_name": "noop", "tool_args": {}},
            },
            {
                "type": "ACTION_RESULT",
                "payload": {
                    "action_id": cid,
                    "status": "SUCCESS",
                    "observation_content": f"result {i}: " + "output text " * 6,
                    "execution_ref": cid,
                },
            },
        ]
    out = []
    for seq, e in enumerate(head + made + tail, 1):
        out.append(
            json.dumps(
                {
                    "seq": seq,
                    "timestamp": e.get("timestamp", stamp),
                    "type": e["type"],
                    "payload": e["payload"],
                },
                separators=(",", ":"),
            )
        )
    journal.write_text("\n".join(out) + "\n")


def long_run(work: Path, bins: dict[str, Path], events: int) -> dict[str, Any]:
    agent = work / "agent"
    agent.mkdir()
    (agent / "config.yaml").write_text("name: a\nllm:\n  model: fake\ntools: []\n")
    (agent / "system_prompt.md").write_text("bench\n")
    template = work / "template"
    template.mkdir()
    out: dict[str, Any] = {"events": events}
    with FakeLLM() as fake:
        env = {**os.environ, "OPENAI_BASE_URL": fake.url, "OPENAI_API_KEY": "x"}
        for k in ("DELTA_BASE_URL", "DELTA_API_KEY"):
            env.pop(k, None)
        fake.call("ask_human", {"prompt": "q?"}, id="ask")
        rc = subprocess.run(
            [str(THIS / "delta"), "run", "--agent", str(agent), "--task", "t", "-w", str(template)],
            env=env,
            capture_output=True,
            check=False,
        ).returncode
        assert rc == 101, rc
        rid = (template / ".delta" / "runs" / "LATEST").read_text().strip()
        inflate(template / ".delta" / "runs" / rid / "execution" / "journal.jsonl", events)
        fake.always("done")
        for label, bindir in bins.items():
            ws = work / f"ws-{label}"
            shutil.copytree(template, ws, symlinks=True)
            delta = str(bindir / "delta")
            r: dict[str, Any] = {"status": timed([delta, "status", "-w", str(ws)], env)}
            r["respond"] = timed([delta, "respond", "-w", str(ws), "benchmark answer"], env)
            # The first resume meets a journal written without a context budget; its model call
            # asks again, so a second resume shows a journal that has one (as a real long run's
            # would: it cuts as it grows).
            fake.call("ask_human", {"prompt": "again?"}, id="ask_again")
            r["resume"] = timed([delta, "run", "-w", str(ws)], env)
            paused = work / f"paused-{label}"  # as a long run waits: cut, snapshot, question
            shutil.copytree(ws, paused, symlinks=True)
            timed([delta, "respond", "-w", str(ws), "second answer"], env)
            r["second_resume"] = timed([delta, "run", "-w", str(ws)], env)
            # The same resume as deltad runs it: before, every resume was a fresh process;
            # now the fork server is the default (and the fresh process still an option).
            for executor in ("fresh",) if label == "before" else ("fresh", "fork"):
                w = work / f"deltad-{label}-{executor}"
                w.mkdir()
                r[f"deltad_{executor}"] = through_deltad(w, bindir, paused, env, executor)
            out[label] = r
            print(f"  {label}: {json.dumps(r)}", flush=True)
    return out


def through_deltad(
    work: Path, bindir: Path, paused: Path, env: dict[str, str], executor: str
) -> dict[str, Any]:
    """A copy of the paused long run under that install's `deltad` (`executor`): the answer
    written → `resume_exited` in its log (the run then completes against the fake model)."""
    root = work / "root"
    root.mkdir()
    ws = root / "ws"
    shutil.copytree(paused, ws, symlinks=True)
    config = {
        "roots": [str(root)],
        "state_dir": str(work / "state"),
        "log_format": "json",
        "log_level": "info",
        "executor": executor,
    }
    (work / "deltad.yaml").write_text(json.dumps(config))
    log = work / "deltad.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(bindir / "deltad"), "serve", "--config", str(work / "deltad.yaml")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        ready = "fork_server_ready" if executor == "fork" else "daemon_ready"
        _wait_log(log, proc, ready)
        t = answer(ws)
        [exited] = _wait_log(log, proc, "resume_exited")
        return {
            "exit": exited["exit_code"],
            "close_to_exit_s": round(_ts(exited) - t, 3),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def _wait_log(log: Path, proc: subprocess.Popen[bytes], name: str) -> list[dict[str, Any]]:
    end = time.monotonic() + 600
    while time.monotonic() < end and proc.poll() is None:
        if found := log_events(log, name):
            return found
        time.sleep(0.005)
    raise TimeoutError(f"no {name} in {log}")


def log_events(log: Path, name: str | None) -> list[dict[str, Any]]:
    """The JSON lines of a deltad log whose event is `name` (all of them for None)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and name in (None, e.get("event")):
            out.append(e)
    return out


# -- the daemon -------------------------------------------------------------------------------
def farm(root: Path, work: Path, n: int) -> list[Path]:
    """N paused workspaces as root/gNN/wsNNNN, built once and unpacked per thousand."""
    per = min(n, 1000)
    one = work / "one"
    paused_workspace(one)
    block = work / "block"
    for i in range(per):
        shutil.copytree(one, block / f"ws{i:04d}", symlinks=True)
    archive = work / "block.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(block, arcname=".")
    spaces = []
    for g in range(n // per):
        dest = root / f"g{g:02d}"
        dest.mkdir(parents=True)
        subprocess.run(["tar", "-xf", str(archive), "-C", str(dest)], check=True)
        spaces += [dest / f"ws{i:04d}" for i in range(per)]
    return spaces


class Served:
    """`deltad serve` from a given install, with a bash stub as the resume command."""

    def __init__(self, work: Path, bindir: Path, root: Path, **settings: Any) -> None:
        self.record = work / "record"
        self.record.write_text("")
        stub = work / "stub.sh"
        stub.write_text(STUB.format(record=self.record))
        stub.chmod(0o755)
        config = {
            "roots": [str(root)],
            "state_dir": str(work / "state"),
            "log_format": "json",
            "log_level": "info",
            "settle_seconds": 1.0,
            "resume_command": [str(stub), "{workspace}"],
            **settings,
        }
        (work / "deltad.yaml").write_text(json.dumps(config))
        self.log = work / "deltad.log"
        self.proc = subprocess.Popen(
            [str(bindir / "deltad"), "serve", "--config", str(work / "deltad.yaml")],
            stdout=open(self.log, "wb"),  # noqa: SIM115 - the process owns it
            stderr=subprocess.STDOUT,
        )
        self.offset = 0

    def events(self, name: str) -> list[dict[str, Any]]:
        return log_events(self.log, name)

    def wait(self, name: str, timeout: float = 600) -> None:
        end = time.monotonic() + timeout
        while not self.events(name):
            if time.monotonic() > end or self.proc.poll() is not None:
                raise TimeoutError(f"no {name} in {self.log}")
            time.sleep(0.05)

    def resumed(self, ws: Path, timeout: float) -> float | None:
        """The stub's start time for `ws` (the next record line naming it), or None."""
        end = time.monotonic() + timeout
        name = str(ws)
        while time.monotonic() < end:
            with open(self.record) as f:
                f.seek(self.offset)
                data = f.read()
            complete = data[: data.rfind("\n") + 1]
            self.offset += len(complete.encode())
            for line in complete.splitlines():
                t, w = line.split(" ", 1)
                if w == name:
                    return float(t.replace(",", "."))
            time.sleep(0.001)
        return None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def _ts(e: dict[str, Any]) -> float:
    return datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()


def answer(ws: Path) -> float:
    path = ws / ".delta" / "interaction" / "response.txt"
    # The stub records its start before it removes the answer: a workspace drawn again at once
    # may still hold the previous answer, which the stub would remove after this write (a miss
    # of the bench's making, not the daemon's). Wait for it to go (a missed one stays: bounded).
    end = time.monotonic() + 10
    while path.exists() and time.monotonic() < end:
        time.sleep(0.005)
    with open(path, "w") as f:
        f.write("yes")
    return time.time()


def probe(
    served: Served, spaces: list[Path], done: Callable[[], bool], gap: float
) -> tuple[list[tuple[float, float]], list[dict[str, Any]]]:
    """Answers one at a time until `done()`: (close, resumed) pairs, and the answers not
    resumed within 300 s or slower than 1 s, each with the daemon's log lines about its
    workspace (the finding to read; the bench goes on)."""
    samples: list[tuple[float, float]] = []
    late: list[dict[str, Any]] = []
    while not done():
        ws = random.choice(spaces)
        closed = answer(ws)
        started = served.resumed(ws, timeout=300)
        if started is None or started - closed > 1.0:
            about = [e for e in log_events(served.log, None) if e.get("workspace") == str(ws)]
            wait = None if started is None else round(started - closed, 3)
            late.append({"workspace": str(ws), "closed": closed, "waited_s": wait, "log": about})
        if started is not None:
            samples.append((closed, started))
        time.sleep(gap)
    return samples, late


def during_reconcile(work: Path, bindir: Path, n: int, interval: float) -> dict[str, Any]:
    root = work / "root"
    spaces = farm(root, work, n)
    served = Served(work, bindir, root, rescan_interval_seconds=interval)
    try:
        served.wait("daemon_ready")
        ready = served.events("daemon_ready")[0]
        cap = time.time() + 900

        def two_periodic() -> bool:
            return len(served.events("reconcile_full")) >= 3 or time.time() > cap

        samples, late = probe(served, spaces, two_periodic, gap=0.05)
        fulls = served.events("reconcile_full")[1:]  # the startup one is before READY
        windows = [(_ts(e) - e["duration_ms"] / 1000, _ts(e)) for e in fulls]
        # Waiting across a reconcile counts: when the loop is blocked, the answer written just
        # before one starts is the one that waits for all of it.
        inside = [s - c for c, s in samples if any(c <= b and s >= a for a, b in windows)]
    finally:
        served.stop()
    return {
        "workspaces": n,
        "ready_ms": ready["duration_ms"],
        "full_reconcile_ms": [round((b - a) * 1000) for a, b in windows],
        "answers_during_reconcile": summary(inside),
        "answers_in_all": len(samples),
        "all_answers": summary([s - c for c, s in samples]),
        "missed": sum(1 for x in late if x["waited_s"] is None),
        "late": late,  # not resumed within 300 s, or after more than 1 s: the daemon's lines
    }


def during_removal(work: Path, bindir: Path, n: int, removed: int) -> dict[str, Any]:
    root = work / "root"
    spaces = farm(root, work, n)
    groups = removed // 1000
    doomed = [root / f"g{g:02d}" for g in range(groups)]
    kept = [ws for ws in spaces if ws.parent not in doomed]
    served = Served(work, bindir, root)
    try:
        served.wait("daemon_ready")
        time.sleep(1)
        t0 = time.time()
        rm = threading.Thread(target=lambda: subprocess.run(["rm", "-rf", *map(str, doomed)]))
        rm.start()
        end = time.time() + 20
        samples, late = probe(served, kept, lambda: time.time() > end, gap=0.05)
        rm.join()
    finally:
        served.stop()
    lat = [s - c for c, s in samples if c >= t0]
    missed = sum(1 for x in late if x["waited_s"] is None)
    return {
        "workspaces": n,
        "removed": removed,
        "answers": summary(lat),
        "missed": missed,
        "late": late,
    }


# -- main -------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--before", type=Path, help="bin dir of the install to compare against")
    ap.add_argument("--only", default="model,journal,reconcile,removal")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--sizes", default="10000,50000")
    ap.add_argument("--interval", type=float, default=0, help="rescan interval (default: by N)")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    bins = {"after": THIS}
    if args.before:
        bins = {"before": args.before, **bins}
    results: dict[str, Any] = {"date": datetime.now().isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory(prefix="longrun-bench-") as tmp:
        work = Path(tmp)
        if "model" in parts:
            results["model"] = model_call()
            print("model:", json.dumps(results["model"]), flush=True)
        if "journal" in parts:
            (work / "journal").mkdir()
            results["journal"] = long_run(work / "journal", bins, args.events)
        for n in [int(x) for x in args.sizes.split(",")] if "reconcile" in parts else []:
            interval = args.interval or max(10.0, n / 1000)
            for label, bindir in bins.items():
                w = work / f"reconcile-{n}-{label}"
                w.mkdir()
                r = during_reconcile(w, bindir, n, interval)
                results.setdefault("reconcile", {}).setdefault(str(n), {})[label] = r
                print(f"reconcile {n} {label}:", json.dumps(r), flush=True)
                shutil.rmtree(w)
        if "removal" in parts:
            for label, bindir in bins.items():
                w = work / f"removal-{label}"
                w.mkdir()
                r = during_removal(w, bindir, 10_000, 1_000)
                results.setdefault("removal", {})[label] = r
                print(f"removal {label}:", json.dumps(r), flush=True)
                shutil.rmtree(w)
    out = HERE / "results" / f"longrun-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
