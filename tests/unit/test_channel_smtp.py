"""How the email channel's mail is handed to an MTA (the inbox's transport,
`senders.smtp_sender`), against a small SMTP server in this process on 127.0.0.1: STARTTLS
verified against the test's own CA, a login only inside TLS, a 4xx retried and a 5xx given up
at once."""

from __future__ import annotations

import base64
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deltad.outbound import senders
from deltad.outbound.config import EmailConfig
from deltad.outbound.courier import Send
from deltad.outbound.outbox import Delivery

pytestmark = pytest.mark.spawns  # one openssl run makes the module's test certificate


class FakeSmtp(socketserver.ThreadingTCPServer):
    """Just enough ESMTP: EHLO, STARTTLS, AUTH PLAIN, MAIL, RCPT, DATA, QUIT."""

    daemon_threads = allow_reuse_address = True

    def __init__(self, tls: ssl.SSLContext, rcpt_code: int = 250) -> None:
        super().__init__(("127.0.0.1", 0), Session)
        self.tls, self.rcpt_code = tls, rcpt_code
        self.got: list[dict[str, Any]] = []

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that refuses the certificate ends its session: expected here

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class Session(socketserver.StreamRequestHandler):
    server: FakeSmtp

    def handle(self) -> None:
        sock: socket.socket = self.request
        # A reply of several lines is several small writes: with Nagle's algorithm each one
        # after the first waits for the client's delayed ACK (40 ms on Linux)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = sock.makefile("rwb")
        seen: dict[str, Any] = {"tls": False, "login": None}

        def say(line: str) -> None:
            f.write(line.encode() + b"\r\n")
            f.flush()

        say("220 fake ESMTP")
        while line := f.readline().decode().strip():
            verb = line.split(" ")[0].upper()
            if verb == "EHLO":
                say("250-fake")
                say("250-AUTH PLAIN" if seen["tls"] else "250-STARTTLS")
                say("250 8BITMIME")
            elif verb == "STARTTLS":
                say("220 go ahead")
                sock = self.server.tls.wrap_socket(sock, server_side=True)
                f = sock.makefile("rwb")
                seen["tls"] = True
            elif verb == "AUTH":
                _, user, password = base64.b64decode(line.split(" ")[2]).split(b"\0")
                seen["login"] = (user.decode(), password.decode())
                say("235 ok" if password == b"right" else "535 no")
            elif verb == "MAIL":
                say("250 ok")
            elif verb == "RCPT":
                seen["rcpt"] = line
                code = self.server.rcpt_code
                say(f"{code} {'ok' if code < 400 else 'no'}")
            elif verb == "DATA":
                say("354 go")
                body = b""
                while (chunk := f.readline()) not in (b".\r\n", b""):
                    body += chunk
                seen["body"] = body
                self.server.got.append(seen)
                say("250 queued")
            elif verb == "QUIT":
                say("221 bye")
                return
            else:
                say("502 what")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    """One certificate for the module, with an EC key (an RSA one is ~0.3 s of openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a test certificate")
    tmp_path = tmp_path_factory.mktemp("tls")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "2",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx, cert


@pytest.fixture
def server(tls: tuple[ssl.SSLContext, Path]) -> Iterator[FakeSmtp]:
    s = FakeSmtp(tls[0])
    # its shutdown waits up to one poll interval (0.5 s by default)
    threading.Thread(target=s.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield s
    finally:
        s.shutdown()
        s.server_close()


def _channel(tmp: Path, port: int, monkeypatch: pytest.MonkeyPatch, **smtp: Any) -> Send:
    """The email channel's transport, as the inbox process is handed it."""
    monkeypatch.setenv("SMTP_PASSWORD", "right")
    config = EmailConfig.model_validate(
        {
            "from_address": "deltad@d.example",
            "reply_domain": "d.example",
            "maildir": str(tmp / "Maildir"),
            "smtp": {"host": "127.0.0.1", "port": port, **smtp},
        }
    )
    return senders.smtp_sender(senders.email_target(config))


def _delivery() -> Delivery:
    return Delivery("msg_1", 1, "question", "alice@example.org", "Subject: hi\r\n\r\nhello\r\n", 0)


def test_starttls_then_login_then_the_mail(
    tmp_path: Path,
    server: FakeSmtp,
    tls: tuple[ssl.SSLContext, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    login = {"username": "deltad", "password": {"secret_env": "SMTP_PASSWORD"}}
    ch = _channel(tmp_path, server.port, monkeypatch, ca_file=str(tls[1]), **login)
    assert ch(_delivery()) is None
    [got] = server.got
    assert got["tls"] and got["login"] == ("deltad", "right")
    assert "alice@example.org" in got["rcpt"] and b"hello" in got["body"]


def test_a_server_the_ca_does_not_vouch_for_is_never_sent_to(
    tmp_path: Path, server: FakeSmtp, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = _channel(tmp_path, server.port, monkeypatch)(_delivery())  # system CAs
    assert failed is not None and not failed.permanent and "SSL" in failed.why
    assert server.got == []


@pytest.mark.parametrize(("code", "permanent"), [(450, False), (550, True)])
def test_a_refused_recipient_is_retried_or_given_up(
    tmp_path: Path,
    server: FakeSmtp,
    tls: tuple[ssl.SSLContext, Path],
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    permanent: bool,
) -> None:
    server.rcpt_code = code
    failed = _channel(tmp_path, server.port, monkeypatch, ca_file=str(tls[1]))(_delivery())
    assert failed is not None and failed.permanent is permanent and str(code) in failed.why


def test_an_unreachable_server_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the test sends: nothing listens
    failed = _channel(tmp_path, port, monkeypatch, security="none")(_delivery())
    assert failed is not None and not failed.permanent
