"""A real Postfix on 127.0.0.1 for the email channel's tests (module-scoped): its own config
dir (`postfix -c`), queue and mailboxes in a temporary directory, delivering two test domains
into Maildirs (virtual mailboxes) and nothing anywhere else: every other destination is the
`error` transport, so no test mail can leave the machine.

deltad's own mailbox is delivered as the inbox process's user (`deltad-inbox`, made here when
missing as `deltad serve` would), the operator's step in docs/inbox.md ("Email"): the inbox
reads and parses the mail, never the root core. People's mailboxes are `nobody`'s.

Skipped only where it cannot run: not root, or Postfix not installed outside CI. With
`CI=true` (`.ci/run` installs Postfix) a missing piece fails instead.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import smtplib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path

import pytest

POSTFIX = "/usr/sbin/postfix"
DELTAD_DOMAIN = "deltad.example.test"
PEOPLE_DOMAIN = "people.example.test"
NOBODY = 65534  # the virtual mailboxes' owner (virtual(8) refuses root)
DEADLINE = 60.0

MASTER = """\
{port} inet n - n - - smtpd
cleanup unix n - n - 0 cleanup
qmgr unix n - n 300 1 qmgr
tlsmgr unix - - n 1000? 1 tlsmgr
rewrite unix - - n - - trivial-rewrite
bounce unix - - n - 0 bounce
defer unix - - n - 0 bounce
trace unix - - n - 0 bounce
verify unix - - n - 1 verify
flush unix n - n 1000? 0 flush
proxymap unix - - n - - proxymap
showq unix n - n - - showq
error unix - - n - - error
retry unix - - n - - error
discard unix - - n - - discard
virtual unix - n n - - virtual
anvil unix - - n - 1 anvil
scache unix - - n - 1 scache
postlog unix-dgram n - n - 1 postlogd
"""

MAIN = """\
compatibility_level = 3.6
queue_directory = {dir}/queue
data_directory = {dir}/data
meta_directory = /etc/postfix
mail_owner = postfix
setgid_group = postdrop
myhostname = mta.example.test
mydomain = example.test
myorigin = mta.example.test
mydestination =
local_recipient_maps =
alias_maps =
alias_database =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject_unauth_destination
smtpd_peername_lookup = no
smtp_dns_support_level = disabled
default_transport = error:test MTA: no mail leaves this machine
relay_transport = error:test MTA: no mail leaves this machine
virtual_mailbox_domains = {deltad}, {people}
virtual_mailbox_base = {dir}/mail
virtual_mailbox_maps = texthash:{dir}/vmailbox
virtual_uid_maps = texthash:{dir}/vuids
virtual_gid_maps = texthash:{dir}/vgids
recipient_delimiter = +
smtpd_tls_security_level = may
smtpd_tls_cert_file = {dir}/cert.pem
smtpd_tls_key_file = {dir}/key.pem
maillog_file_prefixes = {dir}
maillog_file = {dir}/maillog
biff = no
"""


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: runs its own Postfix instance"
    if not os.access(POSTFIX, os.X_OK) or shutil.which("openssl") is None:
        return "Postfix is not installed: apt-get install postfix (.ci/run does)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Mta:
    dir: Path
    port: int

    @property
    def cert(self) -> Path:
        return self.dir / "cert.pem"

    @property
    def deltad_maildir(self) -> Path:
        return self.dir / "mail" / "deltad" / "Maildir"

    def maildir(self, person: str) -> Path:
        """A person's Maildir, by name or by address."""
        return self.dir / "mail" / "people" / person.partition("@")[0] / "Maildir"

    def messages(self, person: str) -> list[EmailMessage]:
        """A person's mail, oldest first (new/ and cur/)."""
        box = self.maildir(person)
        paths = [p for sub in ("new", "cur") if (box / sub).is_dir() for p in (box / sub).iterdir()]
        out = []
        for p in sorted(paths, key=lambda p: p.stat().st_mtime_ns):
            msg = BytesParser(policy=policy.default).parsebytes(p.read_bytes())
            assert isinstance(msg, EmailMessage)
            out.append(msg)
        return out

    def send(self, msg: EmailMessage) -> None:
        """Through the MTA's SMTP port on loopback, as a person's mail client would."""
        with smtplib.SMTP("127.0.0.1", self.port, timeout=30) as s:
            s.starttls()
            s.send_message(msg)

    def send_raw(self, sender: str, recipient: str, data: bytes) -> None:
        """Bytes as they are (headers no mail client would write), to one envelope recipient."""
        with smtplib.SMTP("127.0.0.1", self.port, timeout=30) as s:
            s.starttls()
            s.sendmail(sender, [recipient], data)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "maillog").read_text(errors="replace")
        return ""


def _start(d: Path, milter: int | None = None, dmarc: Path | None = None) -> Mta:
    port = _free_port()
    conf = d / "conf"
    conf.mkdir()
    (conf / "master.cf").write_text(MASTER.format(port=f"127.0.0.1:{port}"))
    main = MAIN.format(dir=d, deltad=DELTAD_DOMAIN, people=PEOPLE_DOMAIN, nobody=NOBODY)
    if milter is not None:  # every mail through the milters; deferred when one does not answer
        chain = f"inet:127.0.0.1:{milter}" + (f", unix:{dmarc}" if dmarc is not None else "")
        main += f"smtpd_milters = {chain}\nmilter_default_action = tempfail\n"
    (conf / "main.cf").write_text(main)
    people = ("alice", "bob", "mallory")
    (d / "vmailbox").write_text(
        f"reply@{DELTAD_DOMAIN} deltad/Maildir/\n"
        + "".join(f"{p}@{PEOPLE_DOMAIN} people/{p}/Maildir/\n" for p in people)
    )
    # deltad's mailbox as the inbox's user, everyone else's as nobody (virtual(8) looks up the
    # recipient, then @domain).
    inbox = _inbox_user()
    for name, index in (("vuids", 2), ("vgids", 3)):
        (d / name).write_text(f"reply@{DELTAD_DOMAIN} {inbox[index]}\n@{PEOPLE_DOMAIN} {NOBODY}\n")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"),
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    (d / "key.pem").chmod(0o600)
    for sub in ("mail", "data", "queue"):
        (d / sub).mkdir()
    os.chown(d / "mail", NOBODY, NOBODY)
    (d / "mail" / "deltad").mkdir(mode=0o700)  # install -d -o deltad-inbox -m 0700 ...
    os.chown(d / "mail" / "deltad", inbox[2], inbox[3])
    os.chown(d / "data", *_postfix_ids())
    mta = Mta(d, port)
    started = subprocess.run([POSTFIX, "-c", str(conf), "start"], capture_output=True, check=False)
    if started.returncode != 0:  # Postfix says why in its log, not on a pipe
        raise AssertionError(f"postfix start failed:\n{mta.log()}")
    end = time.monotonic() + DEADLINE
    while True:  # the master listens once it has started: wait for that, not a time
        try:
            with smtplib.SMTP("127.0.0.1", port, timeout=5) as s:
                s.noop()
            return mta
        except OSError:
            if time.monotonic() > end:
                raise AssertionError(f"Postfix did not listen on {port}:\n{mta.log()}") from None
            time.sleep(0.05)


def _inbox_user() -> pwd.struct_passwd:
    """The user a root `deltad serve` runs its inbox as (made as the daemon would)."""
    from deltad.privsep.core import DEFAULT_USER, account

    account(DEFAULT_USER)
    return pwd.getpwnam(DEFAULT_USER)


def _postfix_ids() -> tuple[int, int]:
    pw = pwd.getpwnam("postfix")
    return pw.pw_uid, pw.pw_gid


def _needed(why: str | None) -> None:
    """Skip where a piece is missing, but fail under CI (`.ci/run` installs every piece)."""
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the email tests must run in CI: {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def postfix() -> Iterator[Mta]:
    _needed(unavailable())
    # Not under pytest's 0700 tmp: Postfix's unprivileged processes must reach it.
    d = Path(tempfile.mkdtemp(prefix="deltad-mta-"))
    d.chmod(0o755)
    try:
        yield _start(d)
    finally:
        subprocess.run([POSTFIX, "-c", str(d / "conf"), "stop"], capture_output=True, check=False)
        if not os.environ.get("DELTAD_KEEP_MTA"):  # to read its maillog after a failure
            shutil.rmtree(d, ignore_errors=True)


AUTHSERV_ID = "mx.example.test"  # the authserv-id the DKIM milter writes
OPENDKIM = "/usr/sbin/opendkim"
SELECTOR = "sel"


@dataclass
class Dkim:
    """An `opendkim` milter verifying every mail the MTA takes (no DNS: the people's domain's
    public key is given to it as test data), and the people's domain's private key."""

    key: Path
    process: subprocess.Popen[bytes]

    def sign(self, data: bytes, domain: str = PEOPLE_DOMAIN, key: Path | None = None) -> bytes:
        """`data` signed as the people's domain's MTA would sign it (opendkim-testmsg)."""
        done = subprocess.run(
            ["/usr/sbin/opendkim-testmsg", "-C", "-d", domain, "-k", str(key or self.key),
             "-s", SELECTOR],
            input=data.replace(b"\r\n", b"\n"), capture_output=True, check=True, timeout=30,
        )  # fmt: skip
        return done.stdout

    def other_key(self, d: Path) -> Path:
        """A key nobody published: a signature made with it fails."""
        subprocess.run(
            ["/usr/sbin/opendkim-genkey", "-D", str(d), "-d", PEOPLE_DOMAIN, "-s", "other"],
            check=True, capture_output=True,
        )  # fmt: skip
        return d / "other.private"


def _opendkim(d: Path, port: int) -> Dkim:
    subprocess.run(
        ["/usr/sbin/opendkim-genkey", "-D", str(d), "-d", PEOPLE_DOMAIN, "-s", SELECTOR],
        check=True, capture_output=True,
    )  # fmt: skip
    # The TXT record as DNS would serve it (opendkim-testmsg signs rsa-sha1: no h=sha256).
    txt = "".join(re.findall(r'"([^"]*)"', (d / f"{SELECTOR}.txt").read_text()))
    (d / "keys").write_text(
        f"{SELECTOR}._domainkey.{PEOPLE_DOMAIN} {txt.replace('h=sha256; ', '')}\n"
    )
    (d / "opendkim.conf").write_text(
        f"Mode v\nAuthservID {AUTHSERV_ID}\nTestPublicKeys {d}/keys\nSyslog no\n"
        # Loopback is where the test's mail comes from: not "internal" (that is signed, not
        # verified); a verdict on every mail, unsigned ones too.
        "InternalHosts 192.0.2.1\nAlwaysAddARHeader yes\n"
        f"Socket inet:{port}@127.0.0.1\nPidFile {d}/opendkim.pid\nUMask 022\n"
    )
    process = subprocess.Popen(
        [OPENDKIM, "-f", "-x", str(d / "opendkim.conf")],
        stdout=(d / "opendkim.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    end = time.monotonic() + DEADLINE
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return Dkim(d / f"{SELECTOR}.private", process)
        except OSError:
            if process.poll() is not None or time.monotonic() > end:
                process.kill()
                log = (d / "opendkim.log").read_text(errors="replace")
                raise AssertionError(f"opendkim did not listen on {port}:\n{log}") from None
            time.sleep(0.05)


OPENDMARC = "/usr/sbin/opendmarc"
DMARC_RECORD = "v=DMARC1; p=reject"  # the people's domain's policy, as its DNS would publish it

# A DNS server of one record, for `opendmarc` alone (in a network namespace of its own): TXT
# `_dmarc.<people's domain>`; any other name does not exist. Standard library only.
DNS_SERVER = r"""
import socket, struct, sys

name, record = sys.argv[1].lower(), sys.argv[2].encode()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 53))
while True:
    q, peer = s.recvfrom(512)
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1 : i + 1 + q[i]].decode(errors="replace").lower())
        i += 1 + q[i]
    qtype = struct.unpack("!H", q[i + 1 : i + 3])[0]
    question = q[12 : i + 5]
    found = ".".join(labels) == name and qtype == 16
    flags = 0x8180 if found else 0x8183  # a response, recursion available; NXDOMAIN
    head = q[:2] + struct.pack("!HHHHH", flags, 1, 1 if found else 0, 0, 0)
    answer = b""
    if found:
        rdata = bytes([len(record)]) + record
        answer = struct.pack("!HHHIH", 0xC00C, 16, 1, 60, len(rdata)) + rdata
    s.sendto(head + question + answer, peer)
"""

# opendmarc in a network and mount namespace of its own: its loopback serves the record, and
# its /etc/resolv.conf names it (OpenDMARC has no resolver setting; the host's is untouched).
IN_NAMESPACE = """
ip link set lo up
mount --bind "$1/resolv.conf" /etc/resolv.conf
"$2" "$1/dns.py" "_dmarc.$3" "$4" &
exec /usr/sbin/opendmarc -f -c "$1/opendmarc.conf"
"""


def _opendmarc(d: Path) -> tuple[subprocess.Popen[bytes], Path]:
    sock = d / "opendmarc.sock"
    (d / "dns.py").write_text(DNS_SERVER)
    (d / "resolv.conf").write_text("nameserver 127.0.0.1\noptions attempts:2 timeout:2\n")
    (d / "ignore").write_text("192.0.2.1\n")  # not loopback, where the test's mail comes from
    (d / "opendmarc.conf").write_text(
        f"AuthservID {AUTHSERV_ID}\nTrustedAuthservIDs {AUTHSERV_ID}\n"
        f"Socket local:{sock}\nPidFile {d}/opendmarc.pid\nUMask 000\nSyslog false\n"
        f"IgnoreHosts {d}/ignore\nIgnoreAuthenticatedClients false\n"
        # deltad decides: a verdict in the header, never a rejection at SMTP time
        "RejectFailures false\nSPFIgnoreResults true\nSPFSelfValidate false\n"
        "FailureReports false\n"
    )
    argv = ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-euc"]
    argv += [IN_NAMESPACE, "sh", str(d), sys.executable, PEOPLE_DOMAIN, DMARC_RECORD]
    process = subprocess.Popen(
        argv, stdout=(d / "opendmarc.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,  # the DNS server goes with it (killpg)
    )  # fmt: skip
    end = time.monotonic() + DEADLINE
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as c:
                c.connect(str(sock))
            return process, sock
        except OSError:
            if process.poll() is not None or time.monotonic() > end:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                log = (d / "opendmarc.log").read_text(errors="replace")
                raise AssertionError(f"opendmarc did not listen on {sock}:\n{log}") from None
            time.sleep(0.05)


@pytest.fixture(scope="module")
def postfix_dkim() -> Iterator[tuple[Mta, Dkim]]:
    """The MTA with a real milter chain in front, as a site verifying mail runs it: `opendkim`
    (verify mode) then `opendmarc` (the DMARC policy of the people's domain from DNS, its
    verdict in the header, nothing rejected), both writing authserv-id AUTHSERV_ID."""
    missing = [p for p in (OPENDKIM, OPENDMARC) if not os.access(p, os.X_OK)]
    _needed(unavailable() or (f"{missing[0]} is not installed" if missing else None))
    d = Path(tempfile.mkdtemp(prefix="deltad-mta-"))
    d.chmod(0o755)
    (d / "dkim").mkdir()
    (d / "dmarc").mkdir()
    dkim: Dkim | None = None
    dmarc: subprocess.Popen[bytes] | None = None
    try:
        port = _free_port()
        dkim = _opendkim(d / "dkim", port)
        dmarc, sock = _opendmarc(d / "dmarc")
        yield _start(d, milter=port, dmarc=sock), dkim
    finally:
        subprocess.run([POSTFIX, "-c", str(d / "conf"), "stop"], capture_output=True, check=False)
        if dkim is not None:
            dkim.process.kill()
            dkim.process.wait(30)
        if dmarc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(dmarc.pid, signal.SIGKILL)
            dmarc.wait(30)
        if not os.environ.get("DELTAD_KEEP_MTA"):
            shutil.rmtree(d, ignore_errors=True)


class Tap:
    """A TCP relay on 127.0.0.1 in front of the MTA that records, for each connection, the uid
    owning the sending socket (/proc/net/tcp: which process sent it, as the kernel says);
    the first `hold` connections are left unanswered (no greeting) until the tap closes, as
    an MTA that hangs mid-conversation."""

    def __init__(self, mta: Mta, hold: int = 0) -> None:
        from tests.support.webhooks import socket_uid

        self._socket_uid = socket_uid
        self.mta, self.hold = mta, hold
        self.uids: list[int | None] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._open: list[socket.socket] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            uid = self._socket_uid(int(peer[1]), self.port)
            with self._lock:
                self.uids.append(uid)
                held = len(self.uids) <= self.hold
                self._open.append(conn)
            if not held:
                threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", self.mta.port), timeout=DEADLINE)
        except OSError:
            conn.close()
            return
        with self._lock:
            self._open.append(up)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        threading.Thread(target=pump, args=(up, conn), daemon=True).start()
        pump(conn, up)

    def connections(self) -> list[int | None]:
        with self._lock:
            return list(self.uids)

    def close(self) -> None:
        self._closing.set()
        self.sock.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.close()

    def __enter__(self) -> Tap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
