"""Run a command inside the sandbox a systemd unit file describes, without systemd: its
SystemCallFilter= (every other call fails with EPERM, as SystemCallErrorNumber=EPERM says), its
CapabilityBoundingSet=, NoNewPrivileges= and UMask=, the unit's drop-ins added as systemd adds
them (allow lists and capability sets are unions).

    /usr/bin/python3 tests/systemd_sandbox.py UNIT [DROP-IN ...] -- COMMAND ...

Debian's python3 with python3-seccomp (libseccomp's own bindings), and setpriv (util-linux).
The syscall groups are expanded by `systemd-analyze syscall-filter`, so the filter is the one
this systemd would install. Not emulated: the namespaces (ProtectSystem=, PrivateTmp=...).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import seccomp  # type: ignore[import-not-found]


def syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter"], capture_output=True, text=True, check=True
    ).stdout
    groups: dict[str, list[str]] = {}
    group = None
    for line in out.splitlines():
        if line.startswith("@"):
            group = line.split()[0]
            groups[group] = []
        elif group and line.strip() and not line.strip().startswith("#"):
            groups[group].append(line.split()[0])
    return groups


def expand(item: str, groups: dict[str, list[str]], seen: set[str]) -> set[str]:
    if not item.startswith("@"):
        return {item}
    if item in seen:
        return set()
    seen.add(item)
    return {call for member in groups.get(item, []) for call in expand(member, groups, seen)}


def settings(paths: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if "=" in line and not line.startswith(("#", ";", "[")):
                    key, value = line.split("=", 1)
                    found.setdefault(key.strip(), []).append(value.strip())
    return found


def main(argv: list[str]) -> None:
    split = argv.index("--")
    unit = settings(argv[:split])
    command = argv[split + 1 :]
    groups = syscall_groups()
    allowed = {
        call
        for line in unit["SystemCallFilter"]
        for item in line.split()
        for call in expand(item, groups, set())
    }
    assert unit.get("SystemCallErrorNumber") == ["EPERM"]
    caps = [
        c.removeprefix("CAP_").lower()
        for line in unit["CapabilityBoundingSet"]
        for c in line.split()
    ]
    os.umask(int(unit["UMask"][-1], 8))
    flt = seccomp.SyscallFilter(defaction=seccomp.ERRNO(1))
    for call in sorted(allowed):
        # A name this kernel or architecture lacks is left out, as systemd does.
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            flt.add_rule(seccomp.ALLOW, call)
    setpriv = ["setpriv", "--bounding-set", ",".join(["-all", *(f"+{c}" for c in caps)])]
    if unit.get("NoNewPrivileges") == ["yes"]:
        setpriv.append("--no-new-privs")
    flt.load()  # inherited across exec, by setpriv and then by the command and its children
    os.execvp(setpriv[0], [*setpriv, "--inh-caps", "-all", *command])


if __name__ == "__main__":
    main(sys.argv[1:])
