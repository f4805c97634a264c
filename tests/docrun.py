"""Runs a page's shell blocks (tests/docblocks.py) as a reader would, against real processes.

One bash session per page, in namespaces of its own (root only): a private network, so the
pages' fixed `127.0.0.1:8470` never meets another test's daemon; a private /tmp and /srv, so
`/tmp/ws` and `/srv/delta-workspaces` are the page's own; a PID namespace, so whatever a
block leaves running ends with the page. The session starts in a copy of the checkout (blocks
may write in it: `delta run` without `-w` makes its `.delta/` there) with `.venv` pointing at
this interpreter's venv, whose `bin` leads PATH; HOME is a fresh directory (so `deltad`'s
state dir is too). The model is the fake one (deltad/testing/fakellm.py) playing
tests/docs_model.yaml on 127.0.0.1, in OPENAI_BASE_URL. `curl` fails on an HTTP error
(`--fail-with-body`): an example answered 4xx is a broken example. `sudo CMD` is CMD (the session is
root).

Run one page outside pytest: `.venv/bin/python -m tests.docrun docs/quickstart.md`
(`--repo DIR` for another checkout's pages).
"""

from __future__ import annotations

import argparse
import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests import docblocks
from tests.docblocks import Block, NotRun, Run

MODEL = Path(__file__).resolve().parent / "docs_model.yaml"
CHECKOUT = MODEL.parent.parent  # the tests' own checkout (an editable install's source)
VENV = Path(sys.prefix)
OUTPUT_TAIL = 25  # lines of a failed block's output in the message
START_TIMEOUT = 60.0

_PRELUDE = r"""
set +e -m
exec 2>>"$__H/session.log"
ip link set lo up || exit 90
mount --make-rprivate / || exit 91
# A fresh /tmp; a checkout or venv that lives under the old one is bound back where it was.
mkdir -p "$__H/host-tmp" && mount --bind /tmp "$__H/host-tmp" || exit 91
mount -t tmpfs -o mode=1777 tmpfs /tmp || exit 91
while IFS= read -r __k; do
    [ -n "$__k" ] || continue
    mkdir -p "$__k" && mount --bind "$__H/host-tmp/${__k#/tmp/}" "$__k" || exit 91
done <<<"$__KEEP"
mkdir -p /srv && mount -t tmpfs -o mode=755 tmpfs /srv || exit 92
export HOME="$__H/home" PATH="$__VENV/bin:$PATH" OPENAI_API_KEY=docs DELTA_LLM_MAX_RETRIES=0
unset DELTA_BASE_URL DELTA_API_KEY DELTA_FAULT DELTA_HOLD OPENAI_BASE_URL
cd "$__H/repo" || exit 93
"$__VENV/bin/python" -W ignore -m deltad.testing.fakellm --script "$__MODEL" \
    >"$__H/model.url" 2>>"$__H/session.log" </dev/null &
until [ -s "$__H/model.url" ]; do kill -0 $! 2>/dev/null || exit 94; sleep 0.02; done
export OPENAI_BASE_URL=$(cat "$__H/model.url")
__CURL=$(command -v curl)
mkdir -p "$__H/bin" && export PATH="$__H/bin:$PATH"
printf '#!/bin/sh\nexec %s --fail-with-body "$@"\n' "$(command -v curl)" >"$__H/bin/curl"
printf '#!/bin/sh\nexec "$@"\n' >"$__H/bin/sudo"
chmod +x "$__H/bin/curl" "$__H/bin/sudo"

__docs_said() { echo "$*" >&3; }
__docs_err() { printf '%s\t%s\n' "$1" "$2" >"$__H/err.$__N"; }
__docs_run() {  # N FILE: a block in this shell, so what it sets stays for the next
    __N=$1
    set -euo pipefail
    trap '__docs_err "$LINENO" "$BASH_COMMAND"' ERR
    source "$2" </dev/null >"$__H/out.$1" 2>&1 3>&-
    trap - ERR
    set +euo pipefail
    __docs_said "done $1 0"
}
__docs_sub() {  # N FILE: a block whose exit status is checked, in a subshell
    ( set -euo pipefail; source "$2" ) </dev/null >"$__H/out.$1" 2>&1 3>&-
    __docs_said "done $1 $?"
}
__docs_cmd() {  # N FILE: one command of a transcript; $? carries over to the next
    local prev=$?
    __N=$1
    set -uo pipefail
    (exit $prev)
    source "$2" </dev/null >"$__H/out.$1" 2>&1 3>&-
    local s=$?
    set +uo pipefail
    __docs_said "done $1 $s"
    return $s
}
__docs_ready() {
    case $1 in
        http://*|https://*) "$__CURL" -sf -o /dev/null --max-time 5 "$1" ;;
        *) eval "$1" ;;
    esac
}
__docs_bg() {  # N FILE READY DEADLINE: a server the later blocks use
    ( set -euo pipefail; source "$2" ) </dev/null >"$__H/out.$1" 2>&1 3>&- &
    local pid=$! until=$((SECONDS + $4))
    while [ -n "$3" ] && ! __docs_ready "$3" >/dev/null 2>&1; do
        if ! kill -0 $pid 2>/dev/null; then wait $pid; __docs_said "ended $1 $?"; return; fi
        if [ $SECONDS -ge $until ]; then __docs_said "unready $1 0"; return; fi
        sleep 0.05
    done
    __docs_said "done $1 0"
}
__docs_kids() {  # PID: its descendants, deepest first
    local p
    for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do __docs_kids "$p"; echo "$p"; done
}
__docs_stream() {  # N FILE: runs until it has printed something, then ^C
    # ulimit -f: an example that floods its output stops at 256 MiB, never fills the disk.
    ( ulimit -f 262144; set -euo pipefail; source "$2" ) </dev/null >"$__H/out.$1" 2>&1 3>&- &
    local pid=$! i
    until [ -s "$__H/out.$1" ]; do
        if ! kill -0 $pid 2>/dev/null; then wait $pid; __docs_said "done $1 $?"; return; fi
        sleep 0.05
    done
    # ^C as a terminal sends it: to the group and, should a pipeline have a group of its own,
    # to each process under the block; what outlives 10 s of it is killed.
    kill -INT -- -$pid $(__docs_kids $pid) 2>/dev/null
    for i in $(seq 200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
    kill -KILL -- -$pid $(__docs_kids $pid) $pid 2>/dev/null
    wait $pid
    __docs_said "done $1 0"
}
__docs_said started
"""


@dataclass
class Outcome:
    """What one page's run came to: the blocks run, those marked not run, the first failure."""

    page: str
    ran: list[Block] = field(default_factory=list[Block])
    not_run: list[tuple[Block, str]] = field(default_factory=list[tuple[Block, str]])
    failure: str | None = None

    def summary(self) -> str:
        lines = [f"{self.page}: {len(self.ran)} block(s) run, {len(self.not_run)} not run"]
        lines += [f"  not run: {b.where}: {why}" for b, why in self.not_run]
        return "\n".join(lines)


class BlockFailed(Exception):
    """Why a block failed, as the message says it."""


@dataclass
class Failed(Exception):
    """The session ended in a block: `set -e` saw a command fail (`where`: the line of the
    block's file and the command, when the ERR trap could say)."""

    code: int
    out: str
    where: tuple[int, str] | None


def _copy_checkout(repo: Path, dest: Path) -> None:
    """The checkout's files as they are in the working tree (tracked or new, not ignored)."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        name = os.fsdecode(raw)
        src, dst = repo / name, dest / name
        if not os.path.lexists(src):
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_file():
            shutil.copy(src, dst)
    (dest / ".venv").symlink_to(VENV)


class Session:
    """One page's bash, in its own namespaces, fed one block at a time."""

    def __init__(self, repo: Path, work: Path) -> None:
        self.work = work
        (work / "home").mkdir()
        _copy_checkout(repo, work / "repo")
        read, write = os.pipe()
        env = {
            **os.environ,
            "__H": str(work),
            "__VENV": str(VENV),
            "__MODEL": str(MODEL),
            "__KEEP": "\n".join(_under_tmp(CHECKOUT, VENV)),
        }
        self.proc = subprocess.Popen(
            [
                "unshare",
                "--net",
                "--mount",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "bash",
                "--noprofile",
                "--norc",
                "-c",
                f"exec 3>&{write}; exec {write}>&-; exec bash --noprofile --norc",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            pass_fds=(write,),
            text=True,
        )
        os.close(write)
        self._said = read
        self._buffer = b""
        self._send(_PRELUDE)
        said = self._next(START_TIMEOUT)
        if said != "started":
            raise BlockFailed(f"the session did not start ({said}):\n{self._log()}")
        self.n = 0

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # --kill-child: the namespace's processes end with it
        self.proc.wait()
        os.close(self._said)

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(text + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the session has ended; _next says how

    def _next(self, timeout: float) -> str | None:
        """The session's next report; "" when the session ended, None when `timeout` passed."""
        end = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = end - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._said], [], [], left)
            if ready:
                chunk = os.read(self._said, 4096)
                if not chunk:
                    return ""  # the session ended
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode().strip()

    def _log(self) -> str:
        return _tail((self.work / "session.log").read_text(errors="replace"))

    def file(self, name: str, text: str) -> Path:
        path = self.work / name
        path.write_text(text + "\n")
        return path

    def output(self, n: int) -> str:
        try:
            return (self.work / f"out.{n}").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def error_line(self, n: int) -> tuple[int, str] | None:
        """The line of a block's file and the command that failed (the ERR trap's note)."""
        try:
            line, _, command = (self.work / f"err.{n}").read_text().rstrip("\n").partition("\t")
        except FileNotFoundError:
            return None
        return int(line), command

    def call(self, function: str, script: Path, timeout: float, *extra: str) -> tuple[int, str]:
        """Runs one step; its number and the session's report (`done N STATUS` and the like).
        Raises BlockFailed with what it printed when the session ends or the step overruns."""
        self.n += 1
        n = self.n
        args = " ".join(shlex.quote(a) for a in (str(n), str(script), *extra))
        self._send(f"{function} {args}")
        said = self._next(timeout)
        if said:
            return n, said
        out = self.output(n)
        if said is None:
            raise BlockFailed(f"did not finish within {timeout:g} s{_printed(out)}")
        code = self.proc.wait(START_TIMEOUT)
        raise Failed(code, out, self.error_line(n))


def _tail(text: str, n: int = OUTPUT_TAIL) -> str:
    lines = text.rstrip("\n").split("\n")
    cut = len(lines) > n
    return "\n".join((["    ..."] if cut else []) + ["    " + ln for ln in lines[-n:]])


def _printed(out: str) -> str:
    return f"\n  its output:\n{_tail(out)}" if out.strip() else " (it printed nothing)"


def _hint(command: str, code: int, out: str) -> str:
    if (code == 22 and "curl" in command) or "curl: (22)" in out:
        return (
            "\n  (curl fails on an HTTP error here, --fail-with-body: the example got a 4xx/5xx,"
            " its body above)"
        )
    return ""


def _run_block(s: Session, block: Block) -> None:
    assert isinstance(block.mark, Run)
    mark = block.mark
    if docblocks.is_transcript(block):
        _run_transcript(s, block)
        return
    script = s.file(f"b{s.n + 1}.sh", block.text)
    try:
        if mark.background:
            n, said = s.call(
                "__docs_bg", script, mark.timeout + 5, mark.ready or "", f"{mark.timeout:g}"
            )
        elif mark.interrupt:
            n, said = s.call("__docs_stream", script, mark.timeout)
        elif mark.exit:
            n, said = s.call("__docs_sub", script, mark.timeout)
        else:
            n, said = s.call("__docs_run", script, mark.timeout)
    except Failed as e:
        if e.where is None:
            raise BlockFailed(f"ended with status {e.code}{_printed(e.out)}") from None
        line, command = e.where
        raise BlockFailed(
            f"{block.path}:{block.line + line}: `{_one_line(command)}` exited {e.code}"
            f"{_printed(e.out)}{_hint(command, e.code, e.out)}"
        ) from None
    kind, _, status = said.rpartition(" ")
    out = s.output(n)
    if kind.startswith("ended"):
        raise BlockFailed(f"ended (status {status}) before it was ready{_printed(out)}")
    if kind.startswith("unready"):
        raise BlockFailed(f"not ready ({mark.ready}) within {mark.timeout:g} s{_printed(out)}")
    if int(status) != mark.exit:
        raise BlockFailed(f"exit status {status}, not {mark.exit}{_printed(out)}")


def _run_transcript(s: Session, block: Block) -> None:
    assert isinstance(block.mark, Run)
    timeout = block.mark.timeout
    cmds = docblocks.commands(block)
    for i, cmd in enumerate(cmds):
        script = s.file(f"b{s.n + 1}.sh", cmd.text)
        where = f"{block.path}:{cmd.line}: `$ {_one_line(cmd.text)}`"
        try:
            n, said = s.call("__docs_cmd", script, timeout)
        except Failed as e:
            raise BlockFailed(f"{where} ended the shell ({e.code}){_printed(e.out)}") from None
        except BlockFailed as e:
            raise BlockFailed(f"{where} {e.args[0]}") from None
        status = int(said.rpartition(" ")[2])
        out = s.output(n)
        following = cmds[i + 1] if i + 1 < len(cmds) else None
        if status != 0 and not cmd.expected and not docblocks.reads_status(following):
            raise BlockFailed(
                f"{where} exited {status} (neither output shown under it nor an `echo $?`"
                " after it says it may)"
                f"{_printed(out)}{_hint(cmd.text, status, out)}"
            )
        diff = docblocks.mismatch(cmd.expected, out)
        if diff is not None:
            raise BlockFailed(f"{where} printed other than the page shows:\n{_indent(diff)}")


def _one_line(text: str) -> str:
    first = text.split("\n")[0]
    return first if len(first) <= 100 else first[:97] + "..."


def _indent(text: str) -> str:
    return "\n".join("    " + ln for ln in text.split("\n"))


def _under_tmp(*paths: Path) -> list[str]:
    """Of `paths`, those under /tmp (which a session mounts anew), none inside another."""
    tmp = [p.resolve() for p in paths if p.resolve().is_relative_to("/tmp")]
    return sorted({str(p) for p in tmp if not any(p != q and p.is_relative_to(q) for q in tmp)})


@contextmanager
def _workdir() -> Iterator[Path]:
    # Not under /tmp: the session mounts its own /tmp over it.
    base = Path(tempfile.mkdtemp(prefix="docs-contract-", dir="/var/tmp"))
    try:
        yield base
    finally:
        if os.environ.get("DOCRUN_KEEP"):
            print(f"docrun: kept {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


def run_page(repo: Path, page: Path) -> Outcome:
    """Runs every block of `page` that is not marked not run, in order, stopping at the first
    failure (the later blocks may need what it would have done)."""
    rel = str(page.relative_to(repo))
    found = docblocks.blocks(rel, page.read_text())
    outcome = Outcome(rel)
    outcome.not_run = [(b, b.mark.reason) for b in found if isinstance(b.mark, NotRun)]
    runnable = [b for b in found if isinstance(b.mark, Run)]
    if not runnable:
        return outcome
    with _workdir() as work:
        session = Session(repo, work)
        try:
            for i, block in enumerate(runnable):
                try:
                    _run_block(session, block)
                except BlockFailed as e:
                    left = len(runnable) - i - 1
                    later = f"\n  ({left} later block(s) of the page not run)" if left else ""
                    outcome.failure = (
                        f"{block.where}:\n  {e.args[0]}{later}\n"
                        "  Fix the block or the code; a block that cannot run here gets"
                        " `<!-- not run: REASON -->` on the line before its fence"
                        " (tests/docblocks.py)."
                    )
                    return outcome
                outcome.ran.append(block)
        finally:
            session.close()
    return outcome


def main() -> None:
    ap = argparse.ArgumentParser(description="Run the shell blocks of documentation pages.")
    ap.add_argument("pages", nargs="*", type=Path, help="pages (default: README.md, docs/*.md)")
    ap.add_argument("--repo", type=Path, default=Path.cwd(), help="the checkout they are in")
    args = ap.parse_args()
    repo = args.repo.resolve()
    chosen = [(repo / p).resolve() for p in args.pages] or docblocks.pages(repo)
    failed = False
    for page in chosen:
        try:
            outcome = run_page(repo, page)
        except docblocks.MarkError as e:
            print(f"{e}", file=sys.stderr)
            failed = True
            continue
        print(outcome.summary())
        if outcome.failure:
            print("FAILED " + outcome.failure)
            failed = True
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
