"""Privilege separation, end to end and as an attacker would try it: a root `deltad serve
--listen` accepts HTTP in a process of its own that is not root, holds no capability and has
no_new_privs; an answer over HTTP still resumes its run; the inbox killed is started again and
resumes never notice; and an inbox taken over (the tests-only hook runs Python inside it) can
read no tenant's workspace, no secret store, no core key, write no answer, signal no resume,
and every request it forges over the protocol is refused by the core, which goes on.

Real users (created and removed here; root needed), the real `delta`, the fake model.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from deltad.engine.secrets import SecretStore
from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import EventReader, client, http_url, make_token
from tests.support.webhooks import Receiver

from ..conftest import llm_env, write_agent
from ..users import Accounts, User, accounts, chown_tree, executable_by_all, shared_tmp

DELTA = str(Path(sys.executable).parent / "delta")
REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]
HOOK = {"DELTAD_INBOX_TEST_HOOK": "1"}


@dataclass
class Split:
    d: Daemon
    url: str
    root: Path
    base: Path
    acc: Accounts
    fake: FakeLLM


@pytest.fixture
def split(fake: FakeLLM) -> Iterator[Split]:
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        root = base / "root"
        root.mkdir()
        d = Daemon(base, [root], resume_command=REAL_CLIENT, http={"listen": "127.0.0.1:0"})
        d.start(env={**llm_env(fake), **HOOK})
        try:
            yield Split(d, http_url(d), root, base, acc, fake)
        finally:
            d.stop()
            d.kill_children()


def _pause(s: Split, ws: Path, prompt: str = "Which colour?") -> str:
    s.fake.call(
        "ask_human",
        {"prompt": prompt, "input_type": "choice", "options": ["Red", "Blue"]},
        id="ask1",
    )
    s.fake.reply("painted")
    ws.mkdir(parents=True)
    agent = write_agent(s.base / f"agent-{ws.name}")
    argv = [DELTA, "run", "--agent", str(agent), "--task", "paint", "--work-dir", str(ws)]
    out = subprocess.run(argv, env=llm_env(s.fake), capture_output=True, text=True, timeout=60)
    assert out.returncode == 101, out.stderr
    doc = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    return str(doc["request_id"])


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def _inbox_pid(d: Daemon, after: int | None = None) -> int:
    """The pid of the inbox process serving now (a new one, if `after` was the last)."""

    def serving() -> int | None:
        starts = d.events("inbox_started")
        pid = starts[-1]["pid"] if starts else None
        return pid if pid != after and d.events("inbox_serving", pid=pid) else None

    return wait_for(serving, "an inbox serving")


def _tcp_inodes(port: int, state: str) -> set[int]:
    """Socket inodes on 127.0.0.1:`port` in `state` (0A listening, 01 established)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and f[3] == state:
            found.add(int(f[9]))
    return found


def _holders(inodes: set[int]) -> set[int]:
    """Every pid with one of these sockets open."""
    pids = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            for fd in (p / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                    pids.add(int(p.name))
        except OSError:
            continue
    return pids


def _hook(s: Split, code: str) -> Any:
    """Run `code` inside the inbox process; its `result` comes back."""
    with httpx.Client(base_url=s.url, timeout=60) as http:
        r = http.post("/__test__/exec", json={"code": code})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert "error" not in doc, doc["error"]
    return doc["result"]


def test_the_process_accepting_http_is_unprivileged_and_an_http_answer_resumes(
    split: Split,
) -> None:
    s = split
    token = make_token(s.d.state_dir, "alice")
    inbox = _inbox_pid(s.d)
    port = int(s.url.rsplit(":", 1)[1])
    stream = EventReader(s.url, token)  # one connection held open: who accepted it?
    accepted = wait_for(lambda: _holders(_tcp_inodes(port, "01")) - {os.getpid()}, "accepted")
    assert accepted == {inbox}
    assert s.d.proc is not None and inbox != s.d.proc.pid
    st = _status(inbox)
    uid = int(st["Uid"].split()[0])
    assert uid != 0 and set(st["Uid"].split()) == {str(uid)}  # real, effective, saved, fs
    assert set(st["Gid"].split()) != {"0"} and st["Groups"] == ""
    assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0
    assert int(st["CapAmb"], 16) == 0 and int(st["CapInh"], 16) == 0
    assert st["NoNewPrivs"] == "1"
    # The listening socket: the core (which bound it) and the inbox hold it, nobody else.
    assert _holders(_tcp_inodes(port, "0A")) == {s.d.proc.pid, inbox}

    ws = s.root / "ws1"
    rid = _pause(s, ws)
    stream.wait(lambda e: e["type"] == "request.created", "request.created")
    with client(s.url, token) as http:
        r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "b"})
        assert r.status_code == 202, r.text
    stream.wait(lambda e: e["type"] == "run.status" and e["to"] == "COMPLETED", "COMPLETED")
    stream.close()
    assert metadata_status(ws) == "COMPLETED"


def test_the_inbox_killed_is_started_again_and_resumes_go_on(split: Split) -> None:
    s = split
    token = make_token(s.d.state_dir, "alice")
    first = _inbox_pid(s.d)
    ws = s.root / "ws1"
    rid = _pause(s, ws)
    with client(s.url, token) as http:
        wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question listed")
        assert http.post(f"/v1/requests/{rid}/answer", json={"answer": "b"}).status_code == 202
    os.kill(first, signal.SIGKILL)  # while the resume runs
    second = _inbox_pid(s.d, after=first)
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")
    [exited] = s.d.events("inbox_exited", pid=first)
    assert exited["code"] == -signal.SIGKILL
    assert not s.d.events("resume_failed") and s.d.proc is not None and s.d.proc.poll() is None
    with client(s.url, token) as http:  # the same port, the same token: served again
        assert http.get("/v1/requests").json()["requests"] == []
        [run] = http.get("/v1/runs").json()["runs"]
        assert run["status"] == "COMPLETED"
    assert _status(second)["NoNewPrivs"] == "1"


def _tenant_workspace(s: Split, owner: User) -> tuple[Path, str, Path]:
    """A tenant's paused run as a tenant keeps it: theirs, 0700, with a secret stored."""
    ws = s.root / "tenant"
    rid = _pause(s, ws, "Tenant's question?")
    run_id = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
    secrets_dir = ws / ".delta" / "runs" / run_id / "secrets"
    SecretStore(secrets_dir).put("ask0", "hunter2")
    secret = next(p for p in secrets_dir.iterdir() if not p.name.startswith("."))
    chown_tree(ws, owner)
    os.chmod(ws, 0o700)
    return ws, rid, secret


def _tree(ws: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(ws.rglob("*"))
        if p.is_file()
    }


TRY = """
import os, errno
def attempt(fn):
    try:
        fn()
        return "done"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
"""


def test_a_compromised_inbox_cannot_reach_tenants_the_core_or_resumes(split: Split) -> None:
    s = split
    tenant = s.acc.user()
    ws, _, secret = _tenant_workspace(s, tenant)
    request_file = ws / ".delta" / "interaction" / "request.json"
    answer_file = ws / ".delta" / "interaction" / "response.json"
    state = s.d.state_dir
    sleeper = subprocess.Popen(tenant.argv("sleep", "120"))  # a process running as the tenant
    assert s.d.proc is not None
    # The resumes' parent (root), with the default executor; the core itself otherwise.
    forks = s.d.events("fork_server_started")
    fork_server = forks[-1] if forks else {"pid": s.d.proc.pid}
    before = _tree(ws)
    try:
        code = (
            TRY
            + f"""
result = {{
    "uid": os.getuid(),
    "read_request": attempt(lambda: open({str(request_file)!r}).read()),
    "list_workspace": attempt(lambda: os.listdir({str(ws)!r})),
    "read_secret": attempt(lambda: open({str(secret)!r}).read()),
    "write_answer": attempt(lambda: open({str(answer_file)!r}, "w").write('{{"answer": "a"}}')),
    "read_link_key": attempt(lambda: open({str(state / "link.key")!r}).read()),
    "read_status": attempt(lambda: open({str(state / "status.json")!r}).read()),
    "kill_tenant": attempt(lambda: os.kill({sleeper.pid}, 9)),
    "kill_core": attempt(lambda: os.kill({s.d.proc.pid}, 9)),
    "kill_fork_server": attempt(lambda: os.kill({fork_server["pid"]}, 9)),
    "setuid_root": attempt(lambda: os.setuid(0)),
}}
"""
        )
        got = _hook(s, code)
        assert got["uid"] not in (0, tenant.uid)
        assert got == {
            "uid": got["uid"],
            "read_request": "EACCES",
            "list_workspace": "EACCES",
            "read_secret": "EACCES",
            "write_answer": "EACCES",
            "read_link_key": "EACCES",
            "read_status": "EACCES",
            "kill_tenant": "EPERM",
            "kill_core": "EPERM",
            "kill_fork_server": "EPERM",
            "setuid_root": "EPERM",
        }
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert _tree(ws) == before and not answer_file.exists()


def test_a_compromised_inbox_cannot_mint_a_token(split: Split) -> None:
    """Its directory is shared with root: the inbox cannot replace root's tokens.json, and a
    token file it made would not count in the core."""
    s = split
    make_token(s.d.state_dir, "reader", role="reader")
    code = (
        TRY
        + """
import json
state = [p for p in (f"/proc/self/fd/{n}" for n in os.listdir("/proc/self/fd"))
         if os.path.isdir(p) and os.path.exists(p + "/session.key")][0]
def replace():
    with open(state + "/forged", "w") as f:
        json.dump({}, f)
    os.replace(state + "/forged", state + "/tokens.json")
result = {
    "write": attempt(lambda: open(state + "/tokens.json", "a").write("x")),
    "replace": attempt(replace),
    "unlink": attempt(lambda: os.unlink(state + "/tokens.json")),
}
"""
    )
    assert _hook(s, code) == {"write": "EACCES", "replace": "EPERM", "unlink": "EPERM"}


FORGE = """
from deltad import wire
from deltad.inbox.ops import ApiError
from deltad import wire
def ask(msg):
    # Sent as given, past the typed client's checks: the op, the token named, the arguments.
    msg = dict(msg)
    op, token = msg.pop("op"), msg.pop("token", None)
    try:
        return remote.send(op, token, msg)
    except ApiError as e:
        return [e.http, e.code]
def raw(frame, wait=True):
    # Malformed on purpose, bypassing the typed client: the core answers a 400 by call id.
    import concurrent.futures
    fut = concurrent.futures.Future()
    remote._waiting[frame_id] = fut
    with remote._sending:
        remote.sock.sendall(wire.HEADER.pack(len(frame)) + frame)
    if not wait:
        return None
    reply = fut.result(30)
    return [reply.error.http, reply.error.code]
frame_id = 10**9
big = "x" * (1024 * 1024 + 64)  # over what a resume reads, under the frame cap
"""


def test_a_token_file_the_inbox_planted_is_never_used_nor_adopted_by_deltad_token(
    split: Split,
) -> None:
    """Before the first token exists the inbox may create tokens.json in its directory (it is
    the inbox's, group-writable). The core ignores it, and so must `deltad token`: adding a
    token would otherwise write the planted entries back as root's file, and the planted admin
    token would then work from the network."""
    s = split
    planted = "dlt_planted-by-the-inbox"
    code = (
        TRY
        + f"""
import hashlib, json
state = [p for p in (f"/proc/self/fd/{{n}}" for n in os.listdir("/proc/self/fd"))
         if os.path.isdir(p) and os.path.exists(p + "/session.key")][0]
doc = {{"evil": {{"sha256": hashlib.sha256({planted!r}.encode()).hexdigest(), "role": "admin",
                 "scopes": ["/**"], "created_at": "2026-01-01T00:00:00Z"}}}}
fd = os.open(state + "/tokens.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, json.dumps(doc).encode())
os.close(fd)
result = os.stat(state + "/tokens.json").st_uid
"""
    )
    assert _hook(s, code) != 0  # planted, as the inbox's user
    for argv in (["add", "alice"], ["list"], ["revoke", "evil"]):
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "deltad"),
                "token",
                *argv,
                "--state-dir",
                str(s.d.state_dir),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "not owned" in done.stderr, (
            done.stderr
        )
    with client(s.url, planted) as http:
        assert http.get("/v1/requests").status_code == 401


def test_requests_forged_over_the_protocol_are_refused_by_the_core(split: Split) -> None:
    s = split
    make_token(s.d.state_dir, "alice")
    make_token(s.d.state_dir, "elsewhere", "/nowhere/**")
    make_token(s.d.state_dir, "reader", role="reader")
    ws = s.root / "ws1"
    rid = _pause(s, ws)
    with client(s.url, make_token(s.d.state_dir, "probe")) as http:
        wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question listed")
    interaction = ws / ".delta" / "interaction"
    before = sorted(p.name for p in interaction.iterdir())
    code = (
        FORGE
        + f"""
rid = {rid!r}
answer = {{"op": "answer", "request_id": rid, "body": {{"answer": "b"}}}}
result = {{
    "no_such_request": ask({{**answer, "token": "alice", "request_id": "req-nope"}}),
    "wrong_kind": ask({{**answer, "token": "alice", "body": {{"answer": "purple"}}}}),
    "no_answer": ask({{**answer, "token": "alice", "body": {{}}}}),
    "too_large": ask({{**answer, "token": "alice", "body": {{"answer": big}}}}),
    "out_of_scope": ask({{**answer, "token": "elsewhere"}}),
    "reader": ask({{**answer, "token": "reader"}}),
    "unknown_token": ask({{**answer, "token": "mallory"}}),
    "forged_link": ask({{"op": "link_answer", "link": "e30.AAAA", "body": {{"answer": "b"}}}}),
    "extra_field": raw(b'{{"op": "answer", "id": %d, "token": "alice", "args": {{"request_id":'
                       b' "%s", "body": {{"answer": "b"}}, "force": true}}}}'
                       % (frame_id, rid.encode())),
    "unknown_op": raw(b'{{"op": "write_file", "id": %d, "args": {{"path": "/etc/passwd"}}}}'
                      % frame_id),
    "not_json": raw(b'{{"op": "answer", "id": %d, ' % frame_id, wait=False),
    "too_deep": raw(b"[" * 100_000, wait=False),
    "after": ask({{**answer, "token": "alice", "request_id": "req-nope"}}),
}}
"""
    )
    got = _hook(s, code)
    assert got == {
        "no_such_request": [404, "unknown_request"],
        "wrong_kind": [422, "misfit"],
        "no_answer": [422, "misfit"],
        "too_large": [413, "too_large"],
        "out_of_scope": [404, "unknown_request"],
        "reader": [403, "forbidden"],
        "unknown_token": [401, "unauthorized"],
        "forged_link": [404, "bad_link"],
        "extra_field": [400, "protocol"],
        "unknown_op": [400, "protocol"],
        "not_json": None,  # no call id to be read from it: refused and logged only
        "too_deep": None,  # 100,000 nested [: no call id either, and the monitor goes on
        "after": [404, "unknown_request"],  # the connection goes on
    }
    assert sorted(p.name for p in interaction.iterdir()) == before  # nothing written
    assert len(s.d.events("inbox_message_refused")) >= 3
    # A frame over the cap ends that connection (the inbox is started again); the core goes on.
    first = _inbox_pid(s.d)
    over = "x = remote.sock.sendall(wire.HEADER.pack(64 * 1024 * 1024) + b'{' * 4096)"
    with httpx.Client(base_url=s.url, timeout=60) as http, contextlib.suppress(httpx.HTTPError):
        http.post("/__test__/exec", json={"code": FORGE + over})
    _inbox_pid(s.d, after=first)
    assert s.d.proc is not None and s.d.proc.poll() is None
    with client(s.url, make_token(s.d.state_dir, "after")) as http:
        [q] = http.get("/v1/requests").json()["requests"]
        assert q["request_id"] == rid  # still open, unanswered
        assert http.post(f"/v1/requests/{rid}/answer", json={"answer": "b"}).status_code == 202
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")


def test_an_inbox_started_on_its_own_connects_as_its_user_only(fake: FakeLLM) -> None:
    """deltad-inbox.service's way: the core listens on http.inbox_socket and serves the first
    process of the inbox's user that connects; anyone else is turned away. That process also
    makes the webhook deliveries (its uid owns the socket the receiver sees)."""
    with accounts() as acc, executable_by_all(), shared_tmp() as base, Receiver() as hook:
        inbox_user, stranger = acc.user(), acc.user()
        root = base / "root"
        root.mkdir()
        sock = base / "run" / "inbox.sock"
        http = {"listen": "127.0.0.1:0", "inbox_socket": str(sock), "user": inbox_user.name}
        notify = {"webhooks": [{"url": hook.url, "events": ["request.created"]}]}
        d = Daemon(base, [root], resume_command=REAL_CLIENT, http=http, notify=notify)
        d.start(env=llm_env(fake))
        procs: list[subprocess.Popen[bytes]] = []
        try:
            url = http_url(d)
            d.wait_event("inbox_socket_listening")
            deltad = str(Path(sys.executable).parent / "deltad")
            argv = ["env", "PATH=/usr/bin:/bin", deltad, "inbox", "--connect", str(sock)]
            log = open(base / "inbox.log", "wb")  # noqa: SIM115 - closed below
            procs.append(subprocess.Popen(stranger.argv(*argv), stdout=log, stderr=log))
            d.wait_event("inbox_peer_refused", uid=stranger.uid)
            procs.append(subprocess.Popen(inbox_user.argv(*argv), stdout=log, stderr=log))
            [connected] = d.wait_event("inbox_connected", uid=inbox_user.uid)
            st = _status(connected["pid"])
            assert st["NoNewPrivs"] == "1" and int(st["CapEff"], 16) == 0
            s = Split(d, url, root, base, acc, fake)
            ws = root / "ws1"
            rid = _pause(s, ws)
            with client(url, make_token(d.state_dir, "alice")) as c:
                wait_for(lambda: c.get("/v1/requests").json()["requests"], "the question listed")
                assert c.post(f"/v1/requests/{rid}/answer", json={"answer": "b"}).status_code == 202
            wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")
            [delivered] = wait_for(hook.delivered, "the question's webhook")
            assert delivered.uid == inbox_user.uid
        finally:
            print((base / "inbox.log").read_text(errors="replace")[-3000:])  # on a failure
            d.stop()
            d.kill_children()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
                p.kill()
            log.close()
        assert procs[0].returncode == 1  # the stranger: turned away at the handshake
        assert procs[1].returncode == 3  # the inbox: ends when the core hangs up


def test_tls_is_served_by_the_inbox_from_a_key_only_root_can_read(
    tmp_path: Path, fake: FakeLLM
) -> None:
    """The key file stays root's 0600: the core hands the inbox an in-memory copy."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the key must be unreadable to the inbox's user")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    os.chmod(key, 0o600)
    root = tmp_path / "root"
    root.mkdir()
    http = {"listen": "127.0.0.1:0", "tls_cert": str(cert), "tls_key": str(key)}
    d = Daemon(tmp_path, [root], http=http).start(env=llm_env(fake))
    try:
        url = http_url(d)
        assert url.startswith("https://")
        inbox = _inbox_pid(d)
        assert int(_status(inbox)["Uid"].split()[0]) != 0
        tls = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=url, verify=tls, timeout=30) as c:
            # /healthz is readiness: 200 once the core's index holds every workspace
            wait_for(lambda: c.get("/healthz").status_code == 200, "ready over TLS", timeout=60)
            assert c.get("/healthz").json() == {"status": "ok"}
    finally:
        d.stop()


def test_a_daemon_that_is_not_root_runs_its_inbox_as_itself(fake: FakeLLM) -> None:
    """A developer's, or deployment (b)'s: no setuid, still no capability and no_new_privs."""
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        me = acc.user()
        root = base / "root"
        root.mkdir()
        chown_tree(base, me)
        wrapper = me.argv("env", f"PATH={os.environ['PATH']}")
        d = Daemon(base, [root], wrapper=wrapper, http={"listen": "127.0.0.1:0"})
        chown_tree(base, me)  # the config just written
        d.start()
        try:
            url = http_url(d)
            inbox = _inbox_pid(d)
            [same] = d.wait_event("inbox_same_user")
            assert same["uid"] == me.uid
            st = _status(inbox)
            assert st["Uid"].split() == [str(me.uid)] * 4 and st["NoNewPrivs"] == "1"
            assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0
            assert _mode_of(d.state_dir / "inbox") == (0o700, me.uid)
            with httpx.Client(base_url=url, timeout=30) as c:
                wait_for(lambda: c.get("/healthz").status_code == 200, "ready", timeout=60)
                assert c.get("/healthz").json() == {"status": "ok"}
        finally:
            d.stop()


def _mode_of(p: Path) -> tuple[int, int]:
    st = os.lstat(p)
    return st.st_mode & 0o7777, st.st_uid
