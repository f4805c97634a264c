"""The inbox at fleet size (a script, not timed tests): a real `deltad serve --listen` over N
stub-paused workspaces, real HTTP with httpx.

    .venv/bin/python bench/inbox_bench.py                          # 1,000 and 10,000 (~5 min)
    .venv/bin/python bench/inbox_bench.py --old /tmp/old           # and the old code, side by side
    .venv/bin/python bench/inbox_bench.py --sizes 1000 --streams 0 # a quick look

Per N: the time from the index complete (`/readyz`) until the core has read every question's
document ahead of the pages (`deltad_inbox_documents_kept`; this code only); then a page of 100
(`GET /v1/requests?limit=100`, following `next` round the list) p50/p99; 20 clients × 10 pages
at once, total time, each page's p50/p99 and failures; an answer posted as that load starts,
the time until the stub resume has run; the daemon's RSS growth per question against the same
daemon over an empty root, right after READY and after paging (documents kept); and the index's
own cost: the RSS at READY of the same daemon over the same workspaces with the index on and
with it off (`bench/noindex`: the registry's change hook does nothing), the difference per
question. The load average (/proc/loadavg) is recorded before and after each measurement.
Once (at the first N): 500 open event streams, the time from writing a new question until
every stream has its `request.created`. `--old DIR` runs the same against
the code in DIR (`git worktree add DIR <commit>`; it is put first on the daemon's PYTHONPATH),
which lists everything in one response: its "page" is the whole list.

Waits are for conditions with deadlines, never fixed sleeps. Results are written as they come
to bench/results/inbox-<time>.json (one object per contender and size).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
NO_INDEX = HERE / "noindex"  # a sitecustomize that turns the inbox's index off
sys.path.insert(0, str(HERE.parent))

from deltad.testing.stub import paused_workspace  # noqa: E402
from tests.support.daemon import DELTAD, Daemon, wait_for  # noqa: E402
from tests.support.inbox import http_url  # noqa: E402

STARTUP_DEADLINE = 900.0  # 10,000 workspaces' first reconcile on a loaded, shared machine
PAGE = 100
CALLS = 60  # sequential pages for p50/p99
CLIENTS, PAGES_EACH = 20, 10


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages now (the machine is shared)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def build(root: Path, n: int) -> list[Path]:
    spaces = [root / f"g{i // 1000:02}" / f"ws{i:05}" for i in range(n)]
    for ws in spaces:
        if not (ws / ".delta").exists():
            paused_workspace(ws, prompt=f"{ws.name}?")
    return spaces


class Contender:
    """One daemon (this checkout, or `pythonpath`'s) over `root`, its URL and a token."""

    def __init__(self, work: Path, root: Path, pythonpath: str | None) -> None:
        self.started = time.perf_counter()
        work.mkdir(parents=True, exist_ok=True)
        self.daemon = Daemon(
            work, [root], http={"listen": "127.0.0.1:0"}, log_level="info", settle_seconds=0.2
        )
        env = {"PYTHONPATH": pythonpath} if pythonpath else {}
        self.daemon.start(env=env, wait=False)
        self.daemon.wait_event("daemon_ready", timeout=STARTUP_DEADLINE)
        self.ready_s = time.perf_counter() - self.started
        self.url = http_url(self.daemon)
        # The contender's own `deltad token`: code from before the split keeps tokens.json in
        # the state dir itself, this code in its inbox directory.
        argv = [DELTAD, "token", "add", "bench", "--state-dir", str(self.daemon.state_dir)]
        made = subprocess.run(
            argv, env={**os.environ, **env}, capture_output=True, text=True, check=True
        )
        self.token = made.stdout.strip().splitlines()[-1]
        self.headers = {"Authorization": f"Bearer {self.token}"}
        argv = [*argv[:3], "bench-metrics", "--role", "metrics", *argv[4:]]
        made = subprocess.run(
            argv, env={**os.environ, **env}, capture_output=True, text=True, check=True
        )
        self.metrics = made.stdout.strip().splitlines()[-1]

    @property
    def pid(self) -> int:
        assert self.daemon.proc is not None
        return self.daemon.proc.pid

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=120)

    def stop(self) -> None:
        self.daemon.stop(timeout=120)
        self.daemon.kill_children()


def kept(c: Contender, what: str = "kept") -> float:
    """deltad_inbox_documents_kept (or _bytes) as the contender's /metrics says it."""
    with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.metrics}"}) as m:
        text = m.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(f"deltad_inbox_documents_{what} "):
            return float(line.split()[1])
    return 0.0


def listed(http: httpx.Client) -> int:
    """How many questions the list shows now, every page followed."""
    total, params = 0, {"limit": 1000}
    while True:
        doc = http.get("/v1/requests", params=params).json()
        total += len(doc["requests"])
        if not doc.get("next"):
            return total
        params["cursor"] = doc["next"]


class Pager:
    """Page after page of 100, round the list (the old code: the whole list every time)."""

    def __init__(self, http: httpx.Client) -> None:
        self.http, self.cursor = http, None

    def next(self) -> tuple[float, bool]:
        params: dict[str, Any] = {"limit": PAGE}
        if self.cursor:
            params["cursor"] = self.cursor
        t0 = time.perf_counter()
        try:
            r = self.http.get("/v1/requests", params=params)
            ok = r.status_code == 200
            self.cursor = r.json().get("next") if ok else None
        except httpx.HTTPError:
            ok = False
        return time.perf_counter() - t0, ok


def page_times(c: Contender, calls: int) -> dict[str, Any]:
    """Pages round the list (each item read once more from disk unless kept), then the first
    page again and again (what a person's inbox asks most: its documents kept)."""
    with c.client() as http:
        pager = Pager(http)
        pager.next()  # warm
        rounds = [pager.next() for _ in range(calls)]
        firsts = [Pager(http).next() for _ in range(calls)]
    times, first = [t for t, _ in rounds], [t for t, _ in firsts]
    return {
        # Pages that were not a 200 (timed like the others: there must be none).
        "page_failures": sum(not ok for _, ok in rounds + firsts),
        "page_p50_ms": 1000 * pct(times, 50),
        "page_p99_ms": 1000 * pct(times, 99),
        "first_page_p50_ms": 1000 * pct(first, 50),
        "first_page_p99_ms": 1000 * pct(first, 99),
    }


def load_with_answer(c: Contender, answered: Path) -> dict[str, Any]:
    """20 clients × 10 pages at once; an answer to `answered` posted as they start."""
    rid = json.loads((answered / ".delta/interaction/request.json").read_text())["request_id"]
    failures: list[int] = []
    times: list[float] = []  # each page's, every client's (list.append: one at a time)
    go = threading.Barrier(CLIENTS + 1)

    def one_client() -> None:
        with c.client() as http:
            pager = Pager(http)
            go.wait()
            for _ in range(PAGES_EACH):
                took, ok = pager.next()
                times.append(took)
                failures.extend([] if ok else [1])

    threads = [threading.Thread(target=one_client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.perf_counter()
    with c.client() as http:
        posted = http.post(
            f"/v1/requests/{rid}/answer", params={"workspace": str(answered)}, json={"answer": "y"}
        )
    post_s = time.perf_counter() - t0
    resumed_after = None
    if posted.status_code == 202:
        wait_for(lambda: c.daemon.resumed(answered), "the answer resumed", timeout=600)
        resumed_after = time.perf_counter() - t0  # from sending the answer
    for t in threads:
        t.join()
    return {
        "load_20x10_s": time.perf_counter() - t0,
        "load_failures": len(failures),
        "load_page_p50_ms": 1000 * pct(times, 50),
        "load_page_p99_ms": 1000 * pct(times, 99),
        "answer_status": posted.status_code,
        "answer_post_s": post_s,
        "answer_resumed_s": resumed_after,
    }


async def streams_reached(c: Contender, root: Path, count: int) -> dict[str, Any]:
    """`count` open event streams; the time from writing a new question to each one's event."""
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    reached: dict[int, float] = {}
    connected = 0
    everyone = asyncio.Event()

    async def follow(i: int, http: httpx.AsyncClient) -> None:
        nonlocal connected
        async with http.stream("GET", "/v1/events", params={"type": "request.created"}) as r:
            connected += 1
            async for line in r.aiter_lines():
                if line.startswith("event: request.created"):
                    reached[i] = time.perf_counter()
                    if len(reached) == count:
                        everyone.set()
                    return

    async with httpx.AsyncClient(
        base_url=c.url, headers=c.headers, timeout=None, limits=limits
    ) as http:
        tasks = [asyncio.create_task(follow(i, http)) for i in range(count)]
        deadline = time.monotonic() + 300
        while connected < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # polling a condition, with a deadline
        ws = root / "new" / f"ws-{time.time_ns()}"
        t0 = time.perf_counter()
        await asyncio.to_thread(paused_workspace, ws, "new?")
        written = time.perf_counter()
        with contextlib.suppress(TimeoutError):  # counted below: who was not reached
            await asyncio.wait_for(everyone.wait(), 120)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    times = sorted(reached.values())
    return {
        "streams": count,
        "streams_connected": connected,
        "streams_reached": len(times),
        # From the start of writing the question (the old code may announce it before the
        # writer's last step, LATEST, is done).
        "all_reached_s": (times[-1] - t0) if len(times) == count else None,
        "first_to_last_s": (times[-1] - times[0]) if times else None,
        "write_s": written - t0,
    }


def measure(label: str, work: Path, root: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    pythonpath = args.old if label == "old" else None
    empty = work / f"empty-{label}-{n}"
    (empty / "root").mkdir(parents=True, exist_ok=True)
    base = Contender(empty, empty / "root", pythonpath)
    with base.client() as http:
        http.get("/v1/requests")
    rss_empty = rss_kb(base.pid)
    base.stop()

    spaces = build(root, n)
    out: dict[str, Any] = {"contender": label, "pending": n, "loadavg_before": loadavg()}
    if args.index_off:  # the same daemon over the same workspaces, its index off
        off_path = os.pathsep.join(p for p in (str(NO_INDEX), pythonpath) if p)
        off = Contender(work / f"{label}-{n}-noindex", root, off_path)
        with off.client() as http:
            assert http.get("/v1/requests", params={"limit": 1}).json()["requests"] == []
        rss_off = rss_kb(off.pid)
        off.stop()
    c = Contender(work / f"{label}-{n}", root, pythonpath)
    out["ready_s"] = c.ready_s
    try:
        with c.client() as http:
            http.get("/v1/requests", params={"limit": 1})  # READY: the index is full
            rss_on = rss_kb(c.pid)
            out["rss_growth_at_ready_bytes_per_question"] = 1024 * (rss_on - rss_empty) / n
            if args.index_off:
                out["rss_index_off_kb"], out["rss_index_on_kb"] = rss_off, rss_on
                out["rss_index_bytes_per_question"] = 1024 * (rss_on - rss_off) / n
            if label == "new":
                # Nothing asks a page until the core has read the documents ahead (the pages
                # timed next are then never asked before): from the index complete to all kept.
                wait_for(lambda: http.get("/readyz").status_code == 200, "the index complete")
                t0 = time.perf_counter()
                wait_for(lambda: kept(c) >= n, f"{n} read ahead", timeout=STARTUP_DEADLINE)
                out["read_ahead_s"] = time.perf_counter() - t0
                out["read_ahead_bytes_per_question"] = kept(c, "bytes") / n
            wait_for(lambda: listed(http) >= n, f"{n} questions listed", timeout=STARTUP_DEADLINE)
        # Fewer calls where one takes seconds (the old code lists 10,000 from disk each time).
        out |= page_times(c, CALLS if n <= 1000 else (20 if label == "new" else 5))
        # After paging round the list: with the documents kept for pages (at most 2,048).
        out["rss_growth_bytes_per_question"] = 1024 * (rss_kb(c.pid) - rss_empty) / n
        if n <= args.load_max:
            out |= load_with_answer(c, spaces[n // 2])
            paused_workspace(spaces[n // 2])  # waiting again, for the next contender
        if args.streams and n == args.sizes[0]:
            out |= asyncio.run(streams_reached(c, root, args.streams))
    finally:
        c.stop()
    out["loadavg_after"] = loadavg()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 10000])
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--load-max", type=int, default=1000, help="the 20x10 load up to this N")
    ap.add_argument(
        "--no-index-off",
        dest="index_off",
        action="store_false",
        help="skip the daemon with its index off (the index's own RSS cost)",
    )
    ap.add_argument("--old", help="a checkout of the old code, run side by side")
    ap.add_argument("--work", type=Path, default=None, help="where to build (default: a temp dir)")
    args = ap.parse_args()
    work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"inbox-bench-{os.getpid()}"
    root = work / "root"
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    out_path = HERE / "results" / f"inbox-{stamp}.json"
    results: list[dict[str, Any]] = []
    for n in args.sizes:
        for label in ["new", "old"] if args.old else ["new"]:
            r = measure(label, work, root, n, args)
            results.append(r)
            out_path.write_text(json.dumps(results, indent=2) + "\n")  # as it goes
            print(json.dumps(r), flush=True)
    print(f"results: {out_path}")


if __name__ == "__main__":
    main()
