"""systemd/: the unit's sandbox scores at most 4.5 on `systemd-analyze security --offline=yes`,
alone and with each documented drop-in; the drop-ins hold only keys systemd knows; the shipped
config's state_dir is the unit's StateDirectory=.

Needs `systemd-analyze` (Debian's systemd package): required with CI=true, skipped elsewhere."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "deltad.service"
DROP_INS = REPO / "systemd" / "deltad.service.d"
THRESHOLD = 45  # systemd-analyze's --threshold is on a 0..100 scale: 45 is the printed 4.5
EXAMPLES = sorted(p.name for p in DROP_INS.glob("*.conf.example"))


def _analyze() -> str:
    return _systemd_tool("systemd-analyze")


def _systemd_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        why = f"{name} is not installed (apt-get install systemd)"
        if os.environ.get("CI"):
            pytest.fail(f"the unit's sandbox must be scored in CI: {why}")
        pytest.skip(why)
    return found


def _unit_with(tmp_path: Path, drop_ins: list[str]) -> Path:
    """The unit, with these drop-ins installed beside it as systemd would read them."""
    unit = tmp_path / "deltad.service"
    shutil.copy(UNIT, unit)
    if drop_ins:
        (tmp_path / "deltad.service.d").mkdir()
    for name in drop_ins:
        shutil.copy(DROP_INS / name, tmp_path / "deltad.service.d" / name.removesuffix(".example"))
    return unit


def _settings(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@pytest.mark.parametrize("drop_ins", [[], *[[n] for n in EXAMPLES], EXAMPLES])
def test_the_sandbox_scores_at_most_4_5(tmp_path: Path, drop_ins: list[str]) -> None:
    unit = _unit_with(tmp_path, drop_ins)
    out = subprocess.run(
        [_analyze(), "security", "--offline=yes", f"--threshold={THRESHOLD}", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    score = re.search(r"Overall exposure level for deltad\.service: ([0-9.]+)", out.stdout)
    assert score, out.stdout + out.stderr
    assert out.returncode == 0, f"exposure {score[1]} > {THRESHOLD / 10} with {drop_ins}"
    assert float(score[1]) <= THRESHOLD / 10


def test_the_threshold_check_can_fail(tmp_path: Path) -> None:
    unit = _unit_with(tmp_path, [])
    loose = "\n".join(
        line
        for line in unit.read_text().splitlines()
        if not line.startswith(("SystemCallFilter=", "CapabilityBoundingSet=", "Protect"))
    )
    unit.write_text(loose + "\n")
    out = subprocess.run(
        [_analyze(), "security", "--offline=yes", f"--threshold={THRESHOLD}", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0


def test_the_drop_ins_hold_only_keys_systemd_knows(tmp_path: Path) -> None:
    unit = _unit_with(tmp_path, EXAMPLES)
    out = subprocess.run(
        [_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    # The one complaint allowed: ExecStart's /opt/deltad/venv is not installed here.
    problems = [
        line
        for line in (out.stdout + out.stderr).splitlines()
        if line.strip() and "/opt/deltad/venv/bin/deltad is not executable" not in line
    ]
    assert problems == []


def test_fanotify_needs_its_drop_in_the_unit_alone_cannot() -> None:
    unit = _settings(UNIT.read_text())
    fanotify = _settings((DROP_INS / "fanotify.conf.example").read_text())
    caps = {c for line in unit["CapabilityBoundingSet"] for c in line.split()}
    calls = {c for line in unit["SystemCallFilter"] for c in line.split()}
    assert "CAP_SYS_ADMIN" not in caps and calls == {"@system-service", "@mount"}
    assert fanotify["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
    assert set(fanotify["SystemCallFilter"][0].split()) == {"fanotify_init", "fanotify_mark"}


def test_the_slurm_and_lease_drop_ins_open_the_documented_directories() -> None:
    config = (REPO / "config" / "deltad.yaml").read_text()
    log_dir = re.search(r"#\s+log_dir: (\S+)", config)
    lease = re.search(r"#\s+lease: (\S+)", config)
    assert log_dir and lease
    slurm = _settings((DROP_INS / "slurm.conf.example").read_text())
    ha = _settings((DROP_INS / "ha-lease.conf.example").read_text())
    assert slurm["ReadWritePaths"] == [log_dir[1]]
    assert ha["ReadWritePaths"] == [str(Path(lease[1]).parent)]


def test_the_shipped_config_uses_the_units_state_directory() -> None:
    # `deltad token add --config /etc/deltad/deltad.yaml` from a shell has no $STATE_DIRECTORY:
    # only a state_dir in the config makes it write where the unit's daemon reads.
    [state] = _settings(UNIT.read_text())["StateDirectory"]
    config = yaml.safe_load((REPO / "config" / "deltad.yaml").read_text())
    assert Path(config["state_dir"]) == Path("/var/lib") / state


def _inbox_unit_with(drop_in: Path, tmp_path: Path) -> None:
    """The inbox unit with `drop_in` installed as its drop-in still scores ≤ 2.5."""
    unit = tmp_path / "deltad-inbox.service"
    shutil.copy(REPO / "systemd" / "deltad-inbox.service", unit)
    (tmp_path / "deltad-inbox.service.d").mkdir()
    shutil.copy(drop_in, tmp_path / "deltad-inbox.service.d" / drop_in.stem)
    out = subprocess.run(
        [_analyze(), "security", "--offline=yes", "--threshold=25", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    score = re.search(r"Overall exposure level for deltad-inbox\.service: ([0-9.]+)", out.stdout)
    assert score and out.returncode == 0, out.stdout + out.stderr


def test_the_inbox_units_webhook_drop_in_keeps_it_at_most_2_5(tmp_path: Path) -> None:
    """The inbox makes the webhook deliveries: its unit denies every address, and the
    documented drop-in opens only the receivers' (the unit still scores ≤ 2.5)."""
    drop_in = REPO / "systemd" / "deltad-inbox.service.d" / "webhooks.conf.example"
    _inbox_unit_with(drop_in, tmp_path)
    allowed = _settings(drop_in.read_text())
    assert set(allowed) == {"IPAddressAllow"} and "any" not in allowed["IPAddressAllow"][0]
    assert _settings((REPO / "systemd" / "deltad-inbox.service").read_text())["IPAddressDeny"] == [
        "any"
    ]


def test_the_inbox_units_email_drop_in_keeps_it_at_most_2_5(tmp_path: Path) -> None:
    """The inbox reads the email channel's Maildir: the documented drop-in makes that one
    path visible and writable to it, nothing else (the unit still scores ≤ 2.5)."""
    drop_in = REPO / "systemd" / "deltad-inbox.service.d" / "email.conf.example"
    _inbox_unit_with(drop_in, tmp_path)
    # `-`: a Maildir the MTA has not made yet is skipped, not a failure to start (226/NAMESPACE)
    assert _settings(drop_in.read_text()) == {"ReadWritePaths": ["-" + MAILDIR]}


MAILDIR = "/var/spool/deltad-mail/Maildir"


def _installed(tmp_path: Path) -> Path:
    """An empty root with the sysusers.d and tmpfiles.d files installed as the docs say, and
    `systemd-sysusers`, then `systemd-tmpfiles --create`, run on it (offline: --root)."""
    root = tmp_path / "root"
    for kind in ("sysusers.d", "tmpfiles.d"):
        (root / "etc" / kind).mkdir(parents=True)
        shutil.copy(REPO / "systemd" / kind / "deltad.conf", root / "etc" / kind / "deltad.conf")
    for argv in (["systemd-sysusers"], ["systemd-tmpfiles", "--create"]):
        tool = [_systemd_tool(argv[0]), *argv[1:], f"--root={root}", "deltad.conf"]
        out = subprocess.run(tool, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
    return root


def _ids(root: Path, name: str) -> tuple[int, int]:
    for line in (root / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2]), int(fields[3])
    raise AssertionError(f"no {name} in {root}/etc/passwd")


def test_sysusers_and_tmpfiles_make_what_the_units_need(tmp_path: Path) -> None:
    from deltad.privsep.core import DEFAULT_USER, INBOX_DIR

    root = _installed(tmp_path)
    uid, gid = _ids(root, DEFAULT_USER)
    assert uid != 0 and gid != 0
    group = {ln.split(":")[0]: ln for ln in (root / "etc" / "group").read_text().splitlines()}
    assert group[DEFAULT_USER].split(":")[2] == str(gid)
    unit = _settings(UNIT.read_text())
    inbox_unit = _settings((REPO / "systemd" / "deltad-inbox.service").read_text())
    assert inbox_unit["User"] == [DEFAULT_USER]
    state = Path("/var/lib") / unit["StateDirectory"][0]
    [workspaces] = unit["ReadWritePaths"]
    # path: (mode, uid, gid); the inbox's directory as deltad/privsep/core.py's prepare makes it
    want = {
        state: (0o700, 0, 0),
        state / INBOX_DIR: (0o1770, 0, gid),
        Path(workspaces): (0o755, 0, 0),
        Path(MAILDIR).parent: (0o700, uid, gid),
        Path(MAILDIR): (0o700, uid, gid),
        **{Path(MAILDIR) / sub: (0o700, uid, gid) for sub in ("new", "cur", "tmp")},
    }
    for path, (mode, owner, owner_group) in want.items():
        st = (root / path.relative_to("/")).stat()
        got = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        assert got == (mode, owner, owner_group), f"{path}: {got}"


def test_tmpfiles_puts_a_loosened_state_dir_right(tmp_path: Path) -> None:
    root = _installed(tmp_path)
    state = root / "var" / "lib" / "deltad"
    state.chmod(0o755)
    tool = [_systemd_tool("systemd-tmpfiles"), "--create", f"--root={root}", "deltad.conf"]
    subprocess.run(tool, capture_output=True, timeout=60, check=True)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_the_inbox_units_socket_is_in_the_root_units_runtime_directory() -> None:
    """deltad.service makes http.inbox_socket's directory writable to itself (/run is read-only
    under ProtectSystem=strict); deltad-inbox.service connects there."""
    [runtime] = _settings(UNIT.read_text())["RuntimeDirectory"]
    inbox_unit = _settings((REPO / "systemd" / "deltad-inbox.service").read_text())
    argv = inbox_unit["ExecStart"][0].split()
    sock = Path(argv[argv.index("--connect") + 1])
    assert sock.parent == Path("/run") / runtime
