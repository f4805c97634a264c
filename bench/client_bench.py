"""The model client a resumed run builds, in a child forked from a warm server (a script, not a
timed test): as the fork server does it now (the TLS context made once in the server, shared by
every child: deltad/engine/llm.py `tls_context`) against the way before (each child's
`openai.OpenAI()` making its own, loading the CA bundle), side by side in one run.

    .venv/bin/python bench/client_bench.py               # 30 children a side
    .venv/bin/python bench/client_bench.py --n 100

The server here is this process after the fork server's preload (deltad/executors/forkserver.py
`preload`: the SDK imported and warmed, the context built, `gc.freeze()`). Each child is forked,
builds the client once (what a resume does before its first model call) and reports the wall
time; the two ways alternate, so both see the same load. Results: Markdown on stdout and JSON +
Markdown in bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deltad.agent import LLMSettings  # noqa: E402
from deltad.engine.llm import Endpoint, OpenAIChatModel  # noqa: E402
from deltad.executors.forkserver import preload  # noqa: E402

ENDPOINT = Endpoint("http://127.0.0.1:9/v1", "bench", None)


def now_way() -> None:
    OpenAIChatModel(LLMSettings(model="m"), endpoint=ENDPOINT).client.close()


def before_way() -> None:
    import openai

    openai.OpenAI(api_key="bench", base_url=ENDPOINT.base_url, max_retries=0, timeout=60).close()


def in_child(build: object) -> float:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what a resume does, timed; reported through the pipe
        os.close(r)
        t = time.perf_counter()
        build()  # type: ignore[operator]
        os.write(w, struct.pack("d", time.perf_counter() - t))
        os._exit(0)
    os.close(w)
    data = os.read(r, 8)
    os.close(r)
    os.waitpid(pid, 0)
    return float(struct.unpack("d", data)[0]) * 1000


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30)
    args = ap.parse_args()
    preload()
    ways = {"now": now_way, "before": before_way}
    got: dict[str, list[float]] = {k: [] for k in ways}
    load = os.getloadavg()[0]
    for _ in range(args.n):
        for name, build in ways.items():
            got[name].append(in_child(build))
    rows = {
        k: {"p50_ms": statistics.median(v), "p90_ms": pct(v, 90), "n": len(v)}
        for k, v in got.items()
    }
    ratio = rows["now"]["p50_ms"] / rows["before"]["p50_ms"]
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    md = [
        "# The model client built in a forked resume: shared TLS context vs its own",
        "",
        f"{args.n} children a side, alternating; load {load:.1f} → {os.getloadavg()[0]:.1f}; "
        f"`python bench/client_bench.py --n {args.n}`",
        "",
        "| way | p50 ms | p90 ms |",
        "|---|---|---|",
        *(f"| {k} | {v['p50_ms']:.1f} | {v['p90_ms']:.1f} |" for k, v in rows.items()),
        "",
        f"now ÷ before (p50): ×{ratio:.3f}",
    ]
    out = HERE / "results" / f"client-{stamp}"
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "ratio_p50": ratio}, indent=2))
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
