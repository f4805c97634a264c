"""Reading an agent's config as the workspace's owner would. The daemon (often root) reads a
run's agent directory for its tool schemas and to check edited arguments; the path comes from
the workspace, so root must not read on its say-so what its owner could not, nor what someone
else could have planted.

An agent directory is read only if every component of its path, and its config and prompt
files, is reached without a symlink, is owned by the owner or root, is writable by nobody else
(group/other write is allowed on a parent only with the sticky bit, which keeps others from
renaming what they do not own) and is readable (searchable, for directories) by the owner.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from deltad.agent import CONFIG_NAMES, PROMPT_NAMES


@dataclass(frozen=True)
class Owner:
    uid: int
    gids: frozenset[int]

    @classmethod
    def of(cls, uid: int) -> Owner:
        try:
            pw = pwd.getpwuid(uid)
            gids = frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except KeyError:
            gids = frozenset()
        return cls(uid, gids)


def may(st: os.stat_result, who: Owner, bits: int) -> bool:
    """Whether `who` has permission `bits` (os.R_OK, os.X_OK, as 4/1) on a file with `st`."""
    if who.uid == 0:
        return True
    if st.st_uid == who.uid:
        return (st.st_mode >> 6) & bits == bits
    if st.st_gid in who.gids:
        return (st.st_mode >> 3) & bits == bits
    return st.st_mode & bits == bits


def problem(st: os.stat_result, who: Owner, *, last: bool, directory: bool) -> str | None:
    """Why a component with `st` is not to be read for `who` (None: it may be). `last` is the
    agent directory itself or one of its files; anything else is a parent directory."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if st.st_uid not in (who.uid, 0):
        return f"is owned by uid {st.st_uid}, neither the owner ({who.uid}) nor root"
    others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    sticky_parent = not last and st.st_mode & stat.S_ISVTX
    if others_write and not sticky_parent:
        return "is writable by others than its owner"
    if directory and not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not directory and not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    need = (os.R_OK | os.X_OK) if directory and last else (os.X_OK if directory else os.R_OK)
    if not may(st, who, need):
        return "is not readable by the workspace's owner"
    return None


def agent_problem(agent_ref: str, owner_uid: int) -> str | None:
    """One line saying why the agent at `agent_ref` is not read for `owner_uid`; None if it
    may be read."""
    who = Owner.of(owner_uid)
    home = Path(os.path.abspath(agent_ref))
    if home.name in CONFIG_NAMES:
        home = home.parent
    try:
        chain = [*reversed(home.parents), home]
        for i, part in enumerate(chain):
            why = problem(os.lstat(part), who, last=i == len(chain) - 1, directory=True)
            if why:
                return f"agent directory {home}: {part} {why}"
        for names in (CONFIG_NAMES, PROMPT_NAMES):
            found = [home / n for n in names if os.path.lexists(home / n)]
            for f in found[:1]:
                why = problem(os.lstat(f), who, last=True, directory=False)
                if why:
                    return f"agent directory {home}: {f} {why}"
    except OSError as e:
        return f"agent directory {home}: {e.strerror or e}"
    return None
