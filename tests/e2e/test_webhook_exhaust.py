"""What a webhook receiver or a tenant sends exhausts nothing of the daemon's: a 200 with a 1 GiB
body is read at most 64 KiB (the peak RSS of the inbox process, which delivers, and of the core
are measured before and after; the sending socket is the inbox user's), a status line dripped a
byte at a time is cut off at the attempt's deadline and the target's later deliveries go on,
and a tenant's 900 KB `context` makes a delivery of at most 64 KiB, marked truncated. The
receivers are raw sockets on 127.0.0.1; the 1 GiB is sent from one 1 MiB buffer, never held.
"""

from __future__ import annotations

import contextlib
import json
import pwd
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from deltad.protocol.models import QuestionContext
from tests.support.daemon import Daemon, answer, paused_workspace, wait_for
from tests.support.webhooks import socket_uid

MIB = 1024 * 1024
GIB = 1024 * MIB


class Stub:
    """A receiver: the first `attacks` connections get `attack(conn)`, later ones a 204; every
    request body is kept."""

    def __init__(self, attack: Callable[[socket.socket, Stub], None], attacks: int = 1) -> None:
        self.attack, self.attacks = attack, attacks
        self.bodies: list[bytes] = []
        self.uids: list[int | None] = []  # each connection's sending socket's owner
        self.sent = 0  # bytes the attacks got out
        self.cut = threading.Event()  # an attack's connection was closed by the daemon
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        uid = socket_uid(conn.getpeername()[1], conn.getsockname()[1])
        with self._lock:
            self.uids.append(uid)
        with conn, contextlib.suppress(OSError):
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            top, _, body = head.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in top.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += conn.recv(65536)
            with self._lock:
                self.bodies.append(body)
                attacking = self.attacks > 0
                self.attacks -= 1
            if attacking:
                self.attack(conn, self)
                return
            conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    def documents(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(b) for b in self.bodies]

    def close(self) -> None:
        self.stopping.set()
        self.sock.close()


def huge_body(conn: socket.socket, stub: Stub) -> None:
    """A 200 saying 1 GiB follows, and as much of it as the daemon takes."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % GIB)
    chunk = b"x" * MIB
    try:
        for _ in range(GIB // MIB):
            conn.sendall(chunk)
            stub.sent += len(chunk)
    except OSError:
        stub.cut.set()


def drip(conn: socket.socket, stub: Stub) -> None:
    """The status line a byte every 0.2 s, for as long as the daemon listens."""
    line = b"HTTP/1.1 200 OK\r\n" * 1000
    try:
        for i in range(len(line)):
            if stub.stopping.is_set():
                return
            conn.sendall(line[i : i + 1])
            stub.sent += 1
            time.sleep(0.2)  # the attack's pace, not a wait for anything
    except OSError:
        stub.cut.set()


@contextlib.contextmanager
def receiving(attack: Callable[[socket.socket, Stub], None]) -> Iterator[Stub]:
    stub = Stub(attack)
    try:
        yield stub
    finally:
        stub.close()


def _daemon(tmp: Path, url: str, **hook: Any) -> Daemon:
    """A daemon notifying `url`, with two questions waiting from before its start (never
    announced: a start fills its index quietly), for resumes before and during the attack."""
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    paused_workspace(root / "calm")
    paused_workspace(root / "during")
    webhook = {"url": url, "events": ["request.created"], "backoff_seconds": 0.05, **hook}
    return Daemon(
        tmp, [root], notify={"webhooks": [webhook]}, http={"listen": "127.0.0.1:0"}
    ).start()


def _inbox_pid(d: Daemon) -> int:
    """The inbox process delivering now."""
    starts = wait_for(lambda: d.events("inbox_serving"), "the inbox process")
    return int(starts[-1]["pid"])


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


def _resume(d: Daemon, name: str) -> None:
    """Answer a waiting question and wait for its resume; the latency is printed, not
    asserted (the first resume after a start is the slow one: the baseline on this machine)."""
    t0 = time.monotonic()
    answer(d.tmp / "root" / name)
    d.wait_resumed(d.tmp / "root" / name)
    when = "before" if name == "calm" else name
    print(f"resume latency ({when} the attack): {time.monotonic() - t0:.3f} s")


def test_a_1gib_answer_from_a_receiver_is_not_read(tmp_path: Path) -> None:
    with receiving(huge_body) as stub:
        d = _daemon(tmp_path, stub.url)
        try:
            assert d.proc is not None
            _resume(d, "calm")
            inbox = _inbox_pid(d)
            before = {pid: _vm_hwm_kib(pid) for pid in (d.proc.pid, inbox)}
            paused_workspace(d.tmp / "root" / "ws1")
            wait_for(lambda: stub.bodies, "the delivery on its way")
            _resume(d, "during")
            d.wait_event("notify_sent", target="webhook0")  # its status was a 200
            wait_for(stub.cut.is_set, "the inbox closing the 1 GiB answer")
            grown = {pid: (_vm_hwm_kib(pid) - kib) / 1024 for pid, kib in before.items()}
            assert d.events("inbox_started")[-1]["pid"] == inbox  # the same inbox throughout
        finally:
            d.stop()
    # Before: 1 GiB read whole took the daemon from 55 MB to 2.16 GB. Now the inbox process
    # reads the answer (as its user, not root) and the core reads nothing of it.
    assert stub.uids == [pwd.getpwnam("deltad-inbox").pw_uid]
    assert grown[inbox] < 100, f"the inbox's peak RSS grew by {grown[inbox]:.0f} MiB"
    assert grown[d.proc.pid] < 100, f"the core's peak RSS grew by {grown[d.proc.pid]:.0f} MiB"
    assert stub.sent < 64 * MIB, stub.sent  # what socket buffers took, not the body


def test_a_dripping_receiver_is_cut_off_and_later_deliveries_go_on(tmp_path: Path) -> None:
    with receiving(drip) as stub:
        d = _daemon(tmp_path, stub.url, timeout_seconds=2, max_attempts=10)
        try:
            _resume(d, "calm")
            paused_workspace(d.tmp / "root" / "ws1")
            wait_for(lambda: stub.sent, "the drip begun")
            _resume(d, "during")
            retry = d.wait_event("notify_retry", target="webhook0")[0]
            assert retry["error"] == "deadline"
            wait_for(stub.cut.is_set, "the inbox closing the dripping connection")
            paused_workspace(d.tmp / "root" / "ws2")
            sent = d.wait_event("notify_sent", target="webhook0", count=2)
            assert {e["event_id"] for e in sent} == {
                json.loads(b)["id"] for b in {bytes(x) for x in stub.bodies}
            }
        finally:
            d.stop()
    assert stub.sent < 200  # the drip did not go on for long
    assert set(stub.uids) == {pwd.getpwnam("deltad-inbox").pw_uid}  # cut off by the inbox


def test_a_tenants_large_context_makes_a_small_delivery(tmp_path: Path) -> None:
    # A receiver that is down: every delivery waits in the outbox.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    d = _daemon(tmp_path, down, backoff_seconds=60, max_attempts=50)
    try:
        big = QuestionContext(task="t" * 900_000, last_message="m" * 50_000)
        for i in range(3):
            paused_workspace(d.tmp / "root" / f"ws{i}", context=big)

        def waiting() -> list[Path] | None:
            box = d.state_dir / "inbox" / "outbox"  # the inbox process's, handed over or taken
            files = sorted([*box.glob("*/*.json"), *box.glob("*/new/*.json")])
            return files if len(files) == 3 else None

        files = wait_for(waiting, "three deliveries in the outbox")
    finally:
        d.stop()
    for path in files:
        assert path.stat().st_size < 80 * 1024  # the body, JSON-escaped in the file
        body = json.loads(json.loads(path.read_text())["body"])
        assert len(json.dumps(body)) <= 64 * 1024
        request = body["request"]
        assert request["context_truncated"] is True
        assert len(request["context"]["task"]) == 2049  # 2048 and the ellipsis
        assert request["context"]["task"].endswith("\u2026")
