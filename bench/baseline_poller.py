"""The baseline a user would write instead of deltad: every second, glob for answers and run
the resume command for each one found (one at a time). Used by `bench/daemon_bench.py`.

    python bench/baseline_poller.py ROOT -- COMMAND... {workspace}
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time


def main() -> None:
    root, command = sys.argv[1], sys.argv[3:]
    pattern = os.path.join(glob.escape(root), "*", ".delta", "interaction", "response.txt")
    first = True
    while True:
        for answer in glob.glob(pattern):
            ws = answer.split(os.sep + ".delta" + os.sep)[0]
            subprocess.run([part.replace("{workspace}", ws) for part in command], check=False)
        if first:  # tell the benchmark the first full scan is done (its "READY")
            print("scanned", flush=True)
            first = False
        time.sleep(1.0)


if __name__ == "__main__":
    main()
