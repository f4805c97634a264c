"""The Kubernetes API server hung under a real `deltad serve`: the Slurm outage bench's
scenario (`tests.support.slurmoutage`) against kmock's emulator (tests/kube.py).

    .venv/bin/python bench/kube_outage_bench.py [--pause 60] [--answers 4] [--out bench/results]

Needs root (the workspaces belong to a throw-away user) and the dev dependencies (kmock). The
daemon runs `executor: kubernetes` with its kubeconfig pointing at `tests.kube.HangingProxy`
in front of the emulator; the test kubelet (`tests.kube.Kubelet`) plays the node, talking to the
emulator directly. First, unless `--no-baseline`, `--pause` seconds with the API server up and
`--answers` answers (the loop's turns then are the baseline); then the proxy hangs (takes
connections and bytes, answers nothing: an API server stopped mid-flight) for `--pause` seconds
while as many answers arrive, every other one through the HTTP inbox. Reported as the Slurm
bench does: the loop's turns from its own histograms (`deltad_loop_turn_seconds`,
`deltad_loop_turn_cpu_seconds`), status lines and watchdog pings meanwhile (WATCHDOG_USEC 1 s),
and, from the proxy's answering again, each answer's Job created (`kubernetes_job_submitted`)
and the answer ingested; submits and resumes per answer; periodic reconciles (an hour away).
Nothing in the executor or the emulator is changed for it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from deltad.testing.stub import paused_workspace
from tests.kube import HangingProxy, Kubelet, emulator
from tests.support.daemon import Daemon, answer, records, stub_command, wait_for
from tests.support.inbox import make_token
from tests.support.slurmoutage import (
    TURN_CPU_METRIC,
    Pings,
    Turns,
    grown,
    turn_figures,
    turns,
    wall_of,
)
from tests.users import accounts, chown_tree, executable_by_all, shared_tmp

DEADLINE = 300.0


def scenario(base: Path, pause: float, n: int, watchdog_s: float, baseline: bool) -> dict[str, Any]:
    with accounts() as a, emulator(base) as emu, Kubelet(emu, base / "pods.log"):
        owner = a.user()
        proxy = HangingProxy(emu, base)
        root = base / "root"
        wss = [root / f"ws{i}" for i in range(n * (2 if baseline else 1) + 1)]
        for ws in wss:
            paused_workspace(ws)
            chown_tree(ws, owner)
        rec_dir = base / "records"
        rec_dir.mkdir()
        os.chown(rec_dir, owner.uid, owner.gid)
        record = rec_dir / "resumes.jsonl"
        home = base / "daemon"
        home.mkdir()
        options = {
            "image": "deltad:test",
            "pvc": "workspaces",
            "mount_path": str(root),
            "kubeconfig": str(proxy.kubeconfig),
            "daemon_id": f"k{os.getpid()}",
            "poll_every": 0.3,
            "request_timeout": 10,
        }
        d = Daemon(
            home,
            [root],
            executor="kubernetes",
            executors={"kubernetes": options},
            resume_command=stub_command(record, "consume"),
            max_parallel_resumes=8,
            rescan_interval_seconds=3600,
            http={"listen": "127.0.0.1:0"},
            log_level="info",
        )
        answerer = make_token(d.state_dir, "outage")
        scraper = make_token(d.state_dir, "prom", role="metrics")
        pings = Pings(base / "notify.sock")
        env = {
            "NOTIFY_SOCKET": str(base / "notify.sock"),
            "WATCHDOG_USEC": str(int(watchdog_s * 1e6)),
        }

        def ingested(ws: Path) -> list[dict[str, Any]]:
            return [r for r in records(record) if r.get("workspace") == str(ws)]

        @contextlib.contextmanager
        def http(token: str) -> Iterator[httpx.Client]:
            [e] = d.wait_event("http_listening")
            with httpx.Client(base_url=e["url"], timeout=30) as client:
                client.headers["Authorization"] = f"Bearer {token}"
                yield client

        def scrape() -> tuple[Turns, Turns]:
            with http(scraper) as client:
                text = client.get("/metrics").raise_for_status().text
            return turns(text), turns(text, TURN_CPU_METRIC)

        def since(before: tuple[Turns, Turns]) -> tuple[Turns, Turns]:
            after = scrape()
            return grown(before[0], after[0]), grown(before[1], after[1])

        def answer_all(some: list[Path]) -> tuple[float, int]:
            with http(answerer) as client:
                listed = client.get("/v1/requests", params={"limit": 1000}).json()["requests"]
            request_of = {q["workspace"]: q["request_id"] for q in listed}
            began = time.monotonic()
            for ws in some:
                if ws in some[::2]:
                    with http(answerer) as client:
                        path = f"/v1/requests/{request_of[str(ws)]}/answer"
                        r = client.post(path, json={"answer": "during"})
                        assert r.status_code == 202, r.text
                else:
                    answer(ws, "during")
            wait_for(
                lambda: all(d.events("resume_queued", workspace=str(ws)) for ws in some),
                "the answers queued",
                DEADLINE,
            )
            return began, sum(1 for ws in some if d.events("resume_queued", workspace=str(ws)))

        def resumed_all(some: list[Path]) -> None:
            wait_for(lambda: all(ingested(ws) for ws in some) or None, "all resumed", DEADLINE)
            for ws in some:
                d.wait_event("resume_exited", workspace=str(ws), timeout=DEADLINE)

        try:
            d.start(env=env)
            answer(wss[0], "before")
            resumed_all(wss[:1])
            base_turns = None
            if baseline:
                calm = wss[1 : n + 1]
                before = scrape()
                began, _ = answer_all(calm)
                time.sleep(max(0.0, pause - (time.monotonic() - began)))
                base_turns = since(before)
                resumed_all(calm)
            during = wss[-n:]
            before = scrape()
            with proxy.hung():
                began, queued = answer_all(during)
                time.sleep(max(0.0, pause - (time.monotonic() - began)))
                meanwhile = since(before)
                ended = time.monotonic()
            back = time.time()
            gaps = pings.between(began, ended)
            statuses = sum(1 for t in list(pings.statuses) if began <= t <= ended)
            resumed_all(during)
            names = {str(ws) for ws in during}
            spawned = [e for e in d.events("resume_spawned") if e.get("workspace") in names]
            jobs = {e["job"] for e in spawned}
            created = [e for e in d.events("kubernetes_job_submitted") if e["job"] in jobs]
            figures: dict[str, Any] = {
                **turn_figures("", *meanwhile),
                **(turn_figures("baseline_", *base_turns) if base_turns else {}),
                "pause_s": round(ended - began, 3),
                "answered_during": len(during),
                "answered_over_http": len(during[::2]),
                "queued_during": queued,
                "statuses_during": statuses,
                "pings_during": len(gaps) + 1,
                "ping_gap_max_s": max(gaps),
                "watchdog_s": watchdog_s,
                "watchdog_misses": sum(1 for g in gaps if g > watchdog_s),
                "submitted_after_s": sorted(round(max(0.0, wall_of(e) - back), 3) for e in created),
                "resumed_after_s": sorted(
                    round(max(0.0, ingested(ws)[0]["t"] - back), 3) for ws in during
                ),
                "submits_per_answer": sorted(
                    {sum(1 for e in spawned if e["workspace"] == w) for w in names}
                ),
                "resumes_per_answer": sorted({len(ingested(ws)) for ws in during}),
                "jobs_created_for_the_outage": len(created),
                "periodic_reconciles": len(d.events("reconcile_full", reason="periodic")),
            }
        finally:
            d.stop()
            pings.close()
            proxy.close()
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pause", type=float, default=60.0, help="seconds the API server hangs")
    ap.add_argument("--answers", type=int, default=4, help="answers written during the outage")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false")
    ap.add_argument("--watchdog", type=float, default=1.0, help="WATCHDOG_USEC, in seconds")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    load_before = os.getloadavg()
    with executable_by_all(), shared_tmp() as base:
        figures = scenario(base, args.pause, args.answers, args.watchdog, args.baseline)
    row = {
        "bench": "kube_outage",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["bench/kube_outage_bench.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in load_before],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        **figures,
    }
    print(json.dumps(row, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    with open(args.out / f"kube-outage-{stamp}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
