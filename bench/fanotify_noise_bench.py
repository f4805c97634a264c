"""What other processes' writes cost an idle deltad (a script, not a timed test).

    .venv/bin/python bench/fanotify_noise_bench.py                       # fanotify and inotify
    .venv/bin/python bench/fanotify_noise_bench.py --backends fanotify --label before

A fanotify filesystem mark sees every write on the filesystem, ours or not. Here deltad watches
N paused workspaces while a writer process, elsewhere on the same filesystem, creates, writes,
closes and removes files at a fixed pace (`--rate` files/s for `--seconds`): 3 records each for
the mark (CREATE, CLOSE_WRITE, DELETE), none of them ours. Measured: the daemon's CPU time
(utime + stime from /proc) over the writer's run, as % of a core and µs per file written, and
over as long a quiet spell before it (others' writes go on: this machine is shared). A mark of
the bench's own counts the records the filesystem produced meanwhile, so the daemon's CPU is
also given per record, the figure to compare between runs (by ratio, never a threshold; the
load average is recorded beside each line). One JSON line per backend
to bench/results/fanotify-noise-<time>.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deltad.testing.stub import paused_workspace  # noqa: E402
from deltad.watch.fanotify import Fanotify  # noqa: E402
from tests.support.daemon import Daemon  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
WRITER = """
import os, sys, time
where, rate, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
batch = max(1, rate // 100)  # 100 batches a second
start = time.monotonic()
done = 0
while (now := time.monotonic()) - start < seconds:
    for i in range(batch):
        path = f"{where}/f{i}"
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
    done += batch
    time.sleep(max(0.0, start + done / rate - time.monotonic()))
print(done, time.monotonic() - start)
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


class Counter:
    """Counts the records a filesystem mark of its own sees (the writer's and everyone
    else's on this shared machine), so that the daemon's CPU can be put per record."""

    def __init__(self, path: Path) -> None:
        self.fan = Fanotify()
        self.fan.mark_filesystem(path)
        self.records = 0
        self.stop = False
        self.thread = threading.Thread(target=self._count, daemon=True)
        self.thread.start()

    def _count(self) -> None:
        while not self.stop:
            select.select([self.fan.fd], [], [], 0.2)
            try:
                buf = os.read(self.fan.fd, 1 << 20)
            except BlockingIOError:
                continue
            off = 0
            while off + 4 <= len(buf) and (n := struct.unpack_from("=I", buf, off)[0]):
                self.records += 1
                off += n

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        self.fan.close()


def quiet(pid: int, seconds: float, counter: Counter) -> dict[str, float]:
    """The daemon's CPU over `seconds` with no writer of ours (others' writes go on)."""
    before, seen = cpu_seconds(pid), counter.records
    time.sleep(seconds)  # a measurement window, not a wait for a condition
    used, records = cpu_seconds(pid) - before, counter.records - seen
    return {
        "idle_cpu_percent": round(used / seconds * 100, 2),
        "idle_records_per_s": round(records / seconds),
    }


def noisy(pid: int, where: Path, rate: int, seconds: float, counter: Counter) -> dict[str, float]:
    where.mkdir()
    before, t0, seen = cpu_seconds(pid), time.monotonic(), counter.records
    out = subprocess.run(
        [sys.executable, "-c", WRITER, str(where), str(rate), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.monotonic() - t0
    used, records = cpu_seconds(pid) - before, counter.records - seen
    files, writer_seconds = out.stdout.split()
    return {
        "files": int(files),
        "files_per_s": round(int(files) / float(writer_seconds)),
        "records_per_s": round(records / wall),
        "cpu_percent": round(used / wall * 100, 2),
        "cpu_us_per_record": round(used / max(1, records) * 1e6, 2),
    }


def run(backend: str, workspaces: int, rate: int, seconds: float, tmp: Path) -> dict[str, Any]:
    root = tmp / backend / "root"
    for i in range(workspaces):
        paused_workspace(root / f"ws{i:05d}")
    d = Daemon(
        tmp / backend,
        [{"path": str(root), "backend": backend}],
        log_level="info",
        rescan_interval_seconds=3600,
    ).start()
    counter = Counter(tmp)
    try:
        assert d.proc is not None
        d.wait_event("questions_read")  # the background read after READY is done
        return {
            "backend": backend,
            "workspaces": workspaces,
            "rate": rate,
            "seconds": seconds,
            **quiet(d.proc.pid, seconds, counter),
            **noisy(d.proc.pid, tmp / backend / "elsewhere", rate, seconds, counter),
            "load1": os.getloadavg()[0],
        }
    finally:
        counter.close()
        d.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default="fanotify,inotify")
    p.add_argument("--workspaces", type=int, default=1000)
    p.add_argument("--rate", type=int, default=5000, help="files written and removed per second")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--label", default="", help="e.g. before/after, kept in each line")
    args = p.parse_args()
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    out = HERE / "results" / f"fanotify-noise-{stamp}.jsonl"
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="deltad-noise-") as tmp:
        for backend in args.backends.split(","):
            line = {
                "label": args.label,
                **run(backend, args.workspaces, args.rate, args.seconds, Path(tmp)),
            }
            print(json.dumps(line), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(line) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
