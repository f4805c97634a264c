"""Whose workspace is this, may this daemon act on it, and as whom does its resume run.

The privilege model (docs/daemon.md, "Privilege model"):
- A resume runs as the workspace's owner (the uid owning the workspace directory). A root
  daemon switches to that uid, its primary gid and its supplementary groups; it never runs a
  workspace's files as itself unless the owner is root.
- A non-root daemon cannot switch: it resumes only workspaces owned by its own uid, or by an
  owner the config names in `trusted_owners` (then the resume runs as the daemon's user,
  which is what trusting that owner means).
- The workspace directory, `.delta/`, `.delta/interaction/`, `.delta/runs/` and the run's
  directory must be real directories owned by the owner (or root) and writable by nobody else:
  no o+w; g+w only on a setgid directory whose group is the configured `shared_group`.
- The resume gets a clean environment: HOME, USER, LOGNAME, PATH, the model endpoint settings
  (the daemon's own OPENAI_*/DELTA_* variables, or a credentials file from the config), and
  the names listed in `resume_env`.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deltad.core.facts import Owner
from deltad.platform import SAFE_PATH
from deltad.protocol import exitcodes, safefs
from deltad.protocol.errors import UnsafeFile
from deltad.protocol.layout import RUN_ID_RE, RunPaths, Workspace

MODEL_PREFIXES = ("OPENAI_", "DELTA_")
MAX_CREDENTIALS_BYTES = 64 * 1024


def owner_of(uid: int) -> Owner:
    """The account of `uid`, from /etc/passwd and /etc/group (`OWNERS` keeps them a while)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:  # a uid with no account: its own group, no supplementary ones
        return Owner(uid, uid, f"uid {uid}", "/")
    groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    return Owner(uid, pw.pw_gid, pw.pw_name, pw.pw_dir, groups)


class OwnerCache:
    """`owner_of` reads /etc/passwd and /etc/group (getpwuid, getgrouplist) each call: a
    read of every one of 100,000 workspaces paid that for a handful of owners. Kept for
    `ttl` seconds only, since accounts and group memberships can change."""

    def __init__(self, ttl: float = 10.0, size: int = 1024) -> None:
        self.ttl = ttl
        self.size = size
        self._owners: dict[int, tuple[float, Owner]] = {}

    def get(self, uid: int, now: float | None = None) -> Owner:
        now = time.monotonic() if now is None else now
        hit = self._owners.get(uid)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        if len(self._owners) >= self.size:  # many owners: start over rather than grow
            self._owners.clear()
        owner = owner_of(uid)
        self._owners[uid] = (now, owner)
        return owner


OWNERS = OwnerCache()


@dataclass(frozen=True)
class Policy:
    """What the config says about tenants, resolved to numbers once per (re)load."""

    daemon_uid: int = field(default_factory=os.geteuid)
    trusted_uids: frozenset[int] = frozenset()
    shared_gid: int | None = None

    @property
    def is_root(self) -> bool:
        return self.daemon_uid == 0

    @classmethod
    def from_names(cls, trusted: list[str], shared_group: str | None) -> Policy:
        """Raises ValueError naming an unknown user or group."""
        uids = set()
        for name in trusted:
            try:
                uids.add(int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid)
            except KeyError:
                raise ValueError(f"trusted_owners: no user {name!r}") from None
        gid = None
        if shared_group is not None:
            try:
                numeric = shared_group.isdigit()
                gid = int(shared_group) if numeric else grp.getgrnam(shared_group).gr_gid
            except KeyError:
                raise ValueError(f"shared_group: no group {shared_group!r}") from None
        return cls(os.geteuid(), frozenset(uids), gid)


class Refused(Exception):
    """This workspace may not be acted on; the message is one line naming the reason."""


def _dir_problem(path: Path, st: os.stat_result, owner: int, policy: Policy) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a real directory (a symlink or a file)"
    if st.st_uid not in (owner, 0):
        return f"{path} belongs to uid {st.st_uid}, not to the workspace owner (uid {owner})"
    if st.st_mode & stat.S_IWOTH:
        return f"{path} is writable by everyone"
    if st.st_mode & stat.S_IWGRP:
        shared = st.st_mode & stat.S_ISGID and st.st_gid == policy.shared_gid
        if not shared:
            return (
                f"{path} is group-writable (group {st.st_gid}); only a setgid directory of the "
                "configured shared_group may be"
            )
    return None


def check(
    ws: Path,
    run_id: str | None,
    policy: Policy,
    *,
    workspace: Workspace | None = None,
    run_dir: Path | None = None,
) -> Owner:
    """The owner a resume of `ws` runs as, or Refused with the reason. Every directory is
    lstat'ed beneath the workspace without following symlinks (within a look, relative to the
    handles it holds: `safefs.reusing_dirs`). A look passes its own `Workspace(ws)` and the
    directory of `run_id` in it (`run_paths`), so their paths are not derived again."""
    try:
        top = os.lstat(ws)
    except FileNotFoundError:
        raise Refused(f"{ws} is gone") from None
    if not stat.S_ISDIR(top.st_mode):
        raise Refused(f"{ws} is not a real directory")
    owner = top.st_uid
    if not policy.is_root and owner != policy.daemon_uid and owner not in policy.trusted_uids:
        name = OWNERS.get(owner).name
        raise Refused(
            f"{ws} belongs to {name}; this deltad runs as uid {policy.daemon_uid} and resumes "
            f"only its own workspaces (list {name} in trusted_owners to resume theirs as uid "
            f"{policy.daemon_uid})"
        )
    w = Workspace(ws) if workspace is None else workspace
    chain = [ws, w.delta_dir, w.interaction_dir, w.runs_dir]
    if run_id is not None:
        chain.append(safefs.child(w.runs_dir, run_id) if run_dir is None else run_dir)
    for i, path in enumerate(chain):
        try:
            st = top if i == 0 else safefs.lstat(path)
        except UnsafeFile as e:
            raise Refused(str(e)) from None
        if st is None:
            if i <= 1:
                raise Refused(f"{path} is gone")
            continue  # not made yet: the client makes it with the rule's modes
        if problem := _dir_problem(path, st, owner, policy):
            raise Refused(problem)
    return OWNERS.get(owner)


def run_paths(ws: Workspace, run_id: str) -> RunPaths:
    """`ws.run(run_id)` (CorruptFile for what is not a run id) without interning the run id
    (`safefs.child`)."""
    return (
        ws.run(run_id)
        if not RUN_ID_RE.match(run_id)
        else RunPaths(safefs.child(ws.runs_dir, run_id))
    )


# -- the resume's identity and environment ----------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """Who a resume runs as, and the Popen arguments for it (None: stay as the daemon)."""

    runs_as: Owner
    user: int | None = None
    group: int | None = None
    extra_groups: tuple[int, ...] | None = None

    @classmethod
    def for_owner(cls, owner: Owner, policy: Policy) -> Identity:
        if owner.uid == policy.daemon_uid:
            return cls(owner)
        if not policy.is_root:  # a trusted owner: runs as the daemon's own user
            return cls(owner_of(policy.daemon_uid))
        return cls(owner, owner.uid, owner.gid, owner.groups)


def load_credentials(path: Path, policy: Policy) -> dict[str, str]:
    """A KEY=VALUE file (comments and `export ` allowed). It holds keys, so it must be a
    regular file owned by root or the daemon's user that nobody else can read or write.
    Raises Refused with one line."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise Refused(f"credentials file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CREDENTIALS_BYTES:
            raise Refused(f"credentials file {path} is not a regular file under 64 KiB")
        if st.st_uid not in (0, policy.daemon_uid) or st.st_mode & 0o077:
            raise Refused(
                f"credentials file {path} must be owned by root or uid {policy.daemon_uid} "
                f"with mode 0600 (it is uid {st.st_uid}, {oct(stat.S_IMODE(st.st_mode))})"
            )
        text = os.read(fd, MAX_CREDENTIALS_BYTES).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
    values = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip().isidentifier():
            raise Refused(f"credentials file {path} line {n} is not KEY=VALUE")
        values[key.strip()] = value.strip().strip("'\"")
    return values


def resume_env(
    runs_as: Owner,
    allow: list[str],
    daemon_env: Mapping[str, str],
    credentials: Mapping[str, str] | None,
    fixed: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of a resume. The model settings are the daemon's own OPENAI_* and
    DELTA_* variables, or exactly the credentials file's when one applies; `allow` names what
    else may pass (PATH among them, to replace the safe default)."""
    env = {"HOME": runs_as.home, "USER": runs_as.name, "LOGNAME": runs_as.name, "PATH": SAFE_PATH}
    env |= {name: daemon_env[name] for name in allow if name in daemon_env}
    if credentials is None:
        env |= {k: v for k, v in daemon_env.items() if k.startswith(MODEL_PREFIXES)}
    else:
        env |= dict(credentials)
    env[exitcodes.RESUMED_BY] = "deltad"  # "nothing to do" is then busy (75), not a failure
    env |= fixed or {}  # the daemon's own (its public keys): after the credentials, which cannot
    return env


@dataclass(frozen=True)
class Launch:
    """Everything a resume needs besides its argv: who it runs as and its environment."""

    identity: Identity
    env: dict[str, str]


@dataclass
class Launcher:
    policy: Policy
    allow: list[str]
    root_credentials: dict[Path, Path]  # root directory -> credentials file
    owner_credentials: dict[str, Path]  # owner name -> credentials file
    daemon_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # Set on every resume whatever the credentials say: DELTA_DECISION_KEYS (the service).
    fixed: dict[str, str] = field(default_factory=dict)

    def credentials_file(self, ws: Path, owner: Owner) -> Path | None:
        if (path := self.owner_credentials.get(owner.name)) is not None:
            return path
        roots = [r for r in self.root_credentials if ws == r or r in ws.parents]
        return self.root_credentials[max(roots, key=lambda r: len(r.parts))] if roots else None

    def prepare(self, ws: Path, owner: Owner) -> Launch:
        """Raises Refused when the credentials file that applies is unusable."""
        identity = Identity.for_owner(owner, self.policy)
        path = self.credentials_file(ws, owner)
        creds = load_credentials(path, self.policy) if path is not None else None
        env = resume_env(identity.runs_as, self.allow, self.daemon_env, creds, self.fixed)
        return Launch(identity, env)
