"""`deltad serve | check | status`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import click
import structlog

from deltad import __version__, logs, platform
from deltad.core.config import ConfigError, DaemonConfig, load_config
from deltad.core.followup import unsent
from deltad.core.shared_roots import shared_root_warnings
from deltad.core.status import daemon_running, read_standbys, read_status
from deltad.protocol import utcnow
from deltad.protocol.printable import show, show_path
from deltad.watch.choice import inotify_watches_in_use
from deltad.watch.discovery import walk

EXIT_CONFIG = 2
EXIT_NOT_RUNNING = 3

config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="DELTAD_CONFIG",
    help="YAML configuration file (env DELTAD_CONFIG).",
)
root_option = click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(file_okay=False),
    help="A directory to watch (added to the config's roots; repeatable).",
)


def _load(config_path: Path | None, roots: tuple[str, ...]) -> DaemonConfig:
    try:
        return load_config(config_path, roots)
    except ConfigError as e:
        _refuse(e)


def _refuse(e: ConfigError) -> NoReturn:
    for problem in e.problems:
        click.echo(f"deltad: error: {problem}", err=True)
    sys.exit(EXIT_CONFIG)


def _preflight(config: DaemonConfig, config_path: Path | None) -> None:
    """What serve would refuse on this host (preflight.py): one line each, exit 2."""
    from deltad.core import preflight

    if problems := preflight.problems(config, _source(config_path)):
        _refuse(ConfigError(*problems))


def _source(config_path: Path | None) -> str:
    return str(config_path) if config_path else "configuration"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="deltad")
def main() -> None:
    """deltad: resume paused Delta runs when their answer arrives."""


@main.command()
@config_option
@root_option
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="Serve the inbox (HTTP API and web page) here, e.g. 127.0.0.1:8470 "
    "(overrides http.listen; port 0 picks a free port).",
)
def serve(config_path: Path | None, roots: tuple[str, ...], listen: str | None) -> None:
    """Run the daemon in the foreground (systemd Type=notify; no self-daemonizing)."""
    from deltad.core.service import Service

    config = _load(config_path, roots)
    if listen is not None:
        config = _with_listen(config, listen)
    _need_a_root(config)
    _preflight(config, config_path)
    logs.configure(config.log_level, config.log_format)
    for warning in shared_root_warnings([r.path for r in config.roots]):
        structlog.get_logger("deltad.cli").warning("shared_root", problem=warning)
    try:  # what only starting finds (the port taken, the executor's engine): one line too
        sys.exit(Service(config, config_path, roots).run())
    except ConfigError as e:  # found only now: what it says names the key, not the file
        _refuse(ConfigError(*(f"{_source(config_path)}: {p}" for p in e.problems)))


def _with_listen(config: DaemonConfig, listen: str) -> DaemonConfig:
    from pydantic import ValidationError

    from deltad.inbox.config import HttpConfig

    base = config.http.model_dump() if config.http else {}
    try:
        config.http = HttpConfig.model_validate({**base, "listen": listen})
    except ValidationError as e:
        msg = e.errors()[0]["msg"].removeprefix("Value error, ")
        click.echo(f"deltad: error: --listen: {msg}", err=True)
        sys.exit(EXIT_CONFIG)
    return config


def _need_a_root(config: DaemonConfig) -> None:
    """Ready while watching nothing would be a lie: at least one root must exist (a missing
    one among others is watched for once it appears, at the next rescan)."""
    if not any(r.path.is_dir() for r in config.roots):
        names = ", ".join(str(r.path) for r in config.roots)
        click.echo(f"deltad: error: no root directory exists ({names}); nothing to watch", err=True)
        sys.exit(EXIT_CONFIG)


@main.command()
@config_option
@root_option
def check(config_path: Path | None, roots: tuple[str, ...]) -> None:
    """Validate the configuration and print what would be watched."""
    config = _load(config_path, roots)
    _need_a_root(config)
    _preflight(config, config_path)
    click.echo(f"configuration OK ({config_path or 'defaults'})")
    for key, value in config.model_dump(mode="json", exclude={"roots"}).items():
        click.echo(f"  {key}: {value}")
    for note in config.notes():
        click.echo(f"  note: {note}")
    followups = unsent(config)  # reminders nothing would carry: a warning, never a refusal
    if followups is not None:
        click.echo(f"{'  ' if followups[0] == 'note' else ''}{followups[0]}: {followups[1]}")
    kind = _executor_kind(config)
    click.echo(f"resumes start with the {kind} executor ({_executor_where(kind)})")
    total_watches = 0
    for root in config.roots:
        layout = walk(root.path, config.discovery_depth)
        watches = root_watches(root.backend, len(layout.dirs), len(layout.workspaces))
        if root.backend == "inotify" or (root.backend == "watchdog" and _linux()):
            total_watches += watches  # both spend the kernel's inotify watches
        click.echo(
            f"root {show_path(root.path)} ({root.backend}): {len(layout.workspaces)} workspaces, "
            f"{len(layout.dirs)} directories watched for new ones, ~{watches} watches"
            + _BACKEND_NOTES.get(root.backend, "")
        )
        if root.why != "configured":
            click.echo(f"  backend: auto: {show(root.why)}")
        for ws in sorted(layout.workspaces):
            click.echo(f"  workspace {show_path(ws)}")
        if not root.path.is_dir():
            click.echo("  warning: this directory does not exist (yet)")
        for path, problem in layout.problems:
            click.echo(f"  warning: {show_path(path)}: {show(problem)}")
    _report_watch_budget(total_watches, config.max_inotify_watches)
    for warning in shared_root_warnings([r.path for r in config.roots]):
        click.echo(f"warning: {warning}")


_BACKEND_NOTES = {
    "fanotify": " (fanotify: one filesystem mark, no inotify watch)",
    "inotify": " (inotify: one per directory above workspaces and one per workspace)",
    "watchdog": " (watchdog: one thread each)",
}


def root_watches(backend: str, dirs: int, workspaces: int) -> int:
    """The inotify watches (or watchdog schedules) a root needs: one per directory above its
    workspaces and one per workspace; none with fanotify or polling."""
    return 0 if backend in ("fanotify", "polling") else dirs + workspaces


def _linux() -> bool:
    return platform.LINUX


def _report_watch_budget(needed: int, own_cap: int | None) -> None:
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    except (OSError, ValueError):
        return
    in_use = inotify_watches_in_use(os.geteuid())  # a running deltad's own too
    click.echo(
        f"inotify watches needed: ~{needed} (in use by this user now: {in_use}, a running "
        f"deltad's own included; fs.inotify.max_user_watches = {limit}"
        + (f", max_inotify_watches = {own_cap}" if own_cap else "")
        + ")"
    )
    if over_watch_budget(needed, in_use, limit, own_cap):
        click.echo(
            "  warning: over the limit; the rest will be polled (fanotify, as root, needs none)"
        )


def over_watch_budget(needed: int, in_use: int, limit: int, own_cap: int | None) -> bool:
    """The kernel's limit is per user (what others use counts); deltad's own cap is its own."""
    return needed + in_use > limit or (own_cap is not None and needed > own_cap)


@main.command()
@config_option
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The daemon's state directory (default: from the config).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw status JSON.")
def status(config_path: Path | None, state_dir: Path | None, as_json: bool) -> None:
    """Show what a running daemon is doing (exit 3 if none is running)."""
    if state_dir is None:
        state_dir = (_load(config_path, ()) if config_path else DaemonConfig()).state_dir
    snap = read_status(state_dir)
    standbys = read_standbys(state_dir)
    if not daemon_running(state_dir) or snap is None:
        if standbys:  # only standbys here: the active daemon (if any) uses another state dir
            _print_standbys(standbys, as_json)
            return
        click.echo(f"deltad is not running (state dir {state_dir})", err=True)
        sys.exit(EXIT_NOT_RUNNING)
    if as_json:
        click.echo(json.dumps(snap | ({"standbys": standbys} if standbys else {}), indent=2))
        return
    _print_status(snap)
    _print_standbys(standbys, False)


def _print_standbys(standbys: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"role": "standby", "standbys": standbys}, indent=2))
        return
    for doc in standbys:
        click.echo(
            f"standby: deltad pid {doc.get('pid')} on {doc.get('host')} since "
            f"{doc.get('started_at')}, waiting for the lease {doc.get('lease')}"
        )


def _print_status(snap: dict[str, Any]) -> None:
    c = snap["counts"]
    click.echo(
        f"deltad pid {snap['pid']}, up since {snap['started_at']}, "
        f"ready: {'yes' if snap['ready'] else 'no'}, status at {snap['updated_at']}"
    )
    if (h := snap.get("health")) is not None:
        click.echo(f"health: {_health_line(h, snap['updated_at'])}")
    if lease := snap.get("lease"):
        click.echo(
            f"role: {snap.get('role')}, holding the lease {lease['path']} "
            f"(host {lease['host']}, since {lease['since']}, epoch {lease.get('epoch')})"
        )
    if snap.get("http"):
        click.echo(f"inbox: {snap['http']}")
    click.echo("watches: " + ", ".join(f"{k} {v}" for k, v in snap["watches"].items()))
    for uid, n in (snap.get("watch_capped_owners") or {}).items():
        click.echo(
            f"  uid {uid}: at max_watches_per_owner ({n['watches']} watches); "
            f"{n['polled']} more of its directories polled"
        )
    click.echo(
        f"workspaces: {c['workspaces']}  waiting: {c['waiting']}  pending: {c['pending']}  "
        f"resuming: {c['resuming']}  running: {c['running']}  "
        f"interrupted: {c['interrupted']}  problems: {c['problem']}"
    )
    for item in snap["resuming"]:
        run = show(str(item["run_id"]))
        job = f"pid {item['pid']}" if "pid" in item else f"job {show(str(item.get('job')))}"
        click.echo(f"  resuming     {item['workspace']} (run {run}, {job})")
    for label in ("pending", "waiting", "interrupted"):
        for ws in snap[label]:
            click.echo(f"  {label:<12} {ws}")
    for item in snap["problems"]:
        click.echo(f"  problem      {item['workspace']}: {item['problem']}")  # shown at the source


def _health_line(h: dict[str, Any], updated_at: str) -> str:
    """The /readyz checks as the daemon last wrote them, and /livez's fact from the file's age
    (the loop rewrites it at least every few seconds)."""
    failing = [f"{c['name']}: {c['detail']}" for c in h.get("checks", []) if not c.get("ok")]
    ready = "ready" if h.get("ready") else "not ready (" + "; ".join(failing) + ")"
    try:
        age = (utcnow() - datetime.fromisoformat(updated_at.replace("Z", "+00:00"))).total_seconds()
    except (TypeError, ValueError):
        return ready
    live = age <= float(h.get("live_within_seconds", 15))
    return f"{ready}, {'live' if live else f'not live (status {age:.0f}s old)'}"


# -- tokens ---------------------------------------------------------------------------------------
def _state_dir(config_path: Path | None, state_dir: Path | None) -> Path:
    """The state dir the daemon started with this config uses (`--state-dir` wins)."""
    if state_dir is not None:
        return state_dir
    config = _load(config_path, ()) if config_path else DaemonConfig()
    if "state_dir" not in config.model_fields_set and not os.environ.get("STATE_DIRECTORY"):
        # Under the shipped unit the daemon's default is StateDirectory= (/var/lib/deltad),
        # which a command run from a shell cannot see: say which directory this is.
        click.echo(
            f"deltad: note: {config_path or 'no config'} sets no state_dir, so this is "
            f"{config.state_dir}; a daemon under systemd (StateDirectory=deltad) uses "
            "/var/lib/deltad: set state_dir in the config or pass --state-dir",
            err=True,
        )
    return config.state_dir


state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The daemon's state directory (default: from the config).",
)


def _tokens_dir(config_path: Path | None, state_dir: Path | None) -> Path:
    """The inbox's directory in the state dir, where tokens.json lives (docs/inbox.md)."""
    from deltad.privsep.core import tokens_dir

    return tokens_dir(_state_dir(config_path, state_dir))


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.pass_context
def inbox(ctx: click.Context) -> None:
    """The HTTP inbox process on its own (deltad-inbox.service, a pod's inbox container):
    --connect SOCKET [--wait SECONDS]."""
    from deltad.http.child import main as inbox_main

    sys.exit(inbox_main(list(ctx.args)))


@main.group()
def token() -> None:
    """Bearer tokens for the inbox's HTTP API and web page (only hashes are stored)."""


@token.command("add")
@click.argument("name")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="GLOB",
    help="Workspace paths (repeatable; default all).",
)
@click.option(
    "--role",
    type=click.Choice(["reader", "answerer", "admin", "metrics"]),
    default="answerer",
    show_default=True,
)
@click.option(
    "--group",
    "groups",
    multiple=True,
    metavar="NAME",
    help="A group the token is in, for questions naming group:NAME respondents (repeatable).",
)
@click.option(
    "--person",
    metavar="NAME",
    help="Who holds the token (default: its name): a question needing several approvals "
    "counts one vote per person, however many tokens they hold.",
)
@config_option
@state_dir_option
def token_add(
    name: str,
    scopes: tuple[str, ...],
    role: str,
    groups: tuple[str, ...],
    person: str | None,
    config_path: Path | None,
    state_dir: Path | None,
) -> None:
    """Make a token; it is printed once, as the last line."""
    from deltad.inbox.tokens import TokenError, TokenStore

    store = TokenStore(_tokens_dir(config_path, state_dir), owner=os.geteuid())
    try:
        value = store.add(name, list(scopes), role, groups, person)  # type: ignore[arg-type]
    except TokenError as e:
        click.echo(f"deltad: error: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(
        f"token {name} ({role}; scopes: {', '.join(scopes) or 'all workspaces'}) written to "
        f"{store.path}; it is shown only now:"
    )
    click.echo(value)


@token.command("list")
@config_option
@state_dir_option
@click.option("--json", "as_json", is_flag=True)
def token_list(config_path: Path | None, state_dir: Path | None, as_json: bool) -> None:
    """Names, roles, scopes, persons and groups (never the tokens)."""
    from deltad.inbox.tokens import TokenError, TokenStore

    store = TokenStore(_tokens_dir(config_path, state_dir), owner=os.geteuid())
    try:
        items = store.list()
    except TokenError as e:
        click.echo(f"deltad: error: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(f"tokens in {store.path}", err=True)  # stderr: stdout stays the list
    if as_json:
        click.echo(json.dumps(items, indent=2))
        return
    for t in items:
        # The person a token votes as, when it is not its own name (four eyes counts people).
        person = [f"person:{t['person']}"] if t["person"] != t["name"] else []
        tags = " ".join([*person, *(f"group:{g}" for g in t["groups"])])
        click.echo(f"{t['name']}\t{t['role']}\t{' '.join(t['scopes'])}\t{t['created_at']}\t{tags}")


@token.command("revoke")
@click.argument("name")
@config_option
@state_dir_option
def token_revoke(name: str, config_path: Path | None, state_dir: Path | None) -> None:
    """Revoke a token now (a running daemon notices at once)."""
    from deltad.inbox.tokens import TokenError, TokenStore

    store = TokenStore(_tokens_dir(config_path, state_dir), owner=os.geteuid())
    try:
        store.revoke(name)
    except TokenError as e:
        click.echo(f"deltad: error: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(f"token {name} revoked in {store.path}")


def _executor_where(kind: str) -> str:
    from deltad.executors import registry

    return registry.where(kind) or "unknown"


def _executor_kind(config: DaemonConfig) -> str:
    return config.executor_kind()


# -- audit ----------------------------------------------------------------------------------------
@main.group()
def audit() -> None:
    """The receipts of decisions: a hash-chained log (docs/inbox.md, "Receipts")."""


def _audit_file(config_path: Path | None, state_dir: Path | None, file: Path | None) -> Path:
    from deltad.inbox.audit import AUDIT_FILE, audit_path

    if file is not None:
        return file
    if state_dir is not None:
        return state_dir / AUDIT_FILE
    config = _load(config_path, ()) if config_path else DaemonConfig()
    return audit_path(config) if config.audit.path else _state_dir(config_path, None) / AUDIT_FILE


audit_file_option = click.option(
    "--file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The log to read (default: audit.path from the config, else STATE_DIR/audit.jsonl).",
)


@audit.command("export")
@click.option(
    "--since",
    metavar="TIME",
    help="Only entries recorded at or after TIME (ISO 8601, e.g. 2026-11-26T20:00:00Z).",
)
@config_option
@state_dir_option
@audit_file_option
def audit_export(
    since: str | None, config_path: Path | None, state_dir: Path | None, file: Path | None
) -> None:
    """Write the log's entries to stdout as JSON Lines, as recorded (check them with
    `deltad audit verify -`), the files it was rotated into first. With `--since`, from the
    first entry recorded at or after TIME to the end: a piece of the chain, whose first entry
    verify takes as its anchor."""
    from deltad.inbox.audit import AuditError, chain_lines, read_lines

    cut = _since(since) if since is not None else None
    path = _audit_file(config_path, state_dir, file)
    out = sys.stdout.buffer
    try:
        for line in read_lines(path) if file is not None else chain_lines(path):
            if cut is not None and not _at_or_after(line, cut):
                continue
            cut = None  # every entry after it too: a chain without holes (clocks may step back)
            out.write(line if line.endswith(b"\n") else line + b"\n")
    except AuditError as e:
        click.echo(f"deltad: error: audit: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    out.flush()


def _since(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        click.echo(f"deltad: error: --since: {text!r} is not an ISO 8601 time", err=True)
        sys.exit(EXIT_CONFIG)
    return when if when.tzinfo is not None else when.astimezone()


def _at_or_after(line: bytes, cut: datetime) -> bool:
    """An entry recorded at or after `cut` (a line that does not read is kept: verify says)."""
    try:
        return datetime.fromisoformat(json.loads(line)["at"]) >= cut
    except (ValueError, KeyError, TypeError):
        return True


def _retention_cut(aside: list[Path]) -> bool:
    """Whether the oldest file kept does not begin the chain (`keep_files` removed those
    before it): the chain is then checked from its first entry."""
    from deltad.inbox.audit import read_lines

    first = next(iter(read_lines(aside[0])), b"") if aside else b""
    try:
        return bool(first) and json.loads(first).get("seq") != 1
    except ValueError:
        return False  # unreadable: verify says so


@audit.command("verify")
@click.argument("log", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--partial",
    is_flag=True,
    help="The daemon's own log may start mid-chain: its first entry anchors the chain (a LOG "
    "given, an export, always may).",
)
@click.option(
    "--head",
    metavar="HASH",
    help="The head hash recorded earlier: entries dropped off the end "
    "show as a head that is not this one or does not follow it.",
)
@click.option(
    "--anchors",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The anchor file the daemon kept (audit.anchor_file), or the lines its "
    "anchor_command filed: each must still name an entry of the chain as it was.",
)
@config_option
@state_dir_option
def audit_verify(
    log: Path | None,
    partial: bool,
    head: str | None,
    anchors: Path | None,
    config_path: Path | None,
    state_dir: Path | None,
) -> None:
    """Recompute the chain of LOG (`-`: stdin, e.g. an export; default: the daemon's log).
    Exit 0 and print the entry count and the head hash (record it elsewhere to anchor the
    log); exit 2 naming the first entry that does not verify and what it found (edited,
    dropped, repeated, moved, inserted, rewritten). The daemon's own log must
    start at seq 1, read across the files it was rotated into (unless `keep_files` removed the
    oldest: then it starts where the first kept file does); a LOG given may start later (an
    export --since): its first entry is the anchor, and the entries before it are said to be
    unchecked."""
    from deltad.inbox.audit import (
        AuditError,
        Broken,
        chain_lines,
        check_anchors,
        read_anchor,
        read_lines,
        rotated,
        verify,
    )

    path = Path("-") if log == Path("-") else _audit_file(config_path, state_dir, log)
    kept_only = False  # keep_files removed the oldest files
    try:
        if str(path) == "-":
            lines: Iterable[bytes] = sys.stdin.buffer
        elif log is not None:
            lines = read_lines(path)
        else:  # the daemon's own log: its rotated files, then itself
            lines = chain_lines(path)
            kept_only = _retention_cut(rotated(path))
        if anchors is not None:  # the lines are read twice: keep them (stdin reads once)
            lines = list(lines)
        result = verify(lines, from_start=not (partial or kept_only) and log is None, head=head)
    except (Broken, AuditError) as e:
        click.echo(f"deltad: error: audit: {show_path(path)}: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    anchored = ""
    if anchors is not None:
        try:
            marks = [read_anchor(raw, n) for n, raw in enumerate(read_lines(anchors), 1)]
            done = check_anchors(lines, marks)
        except (Broken, AuditError) as e:
            click.echo(f"deltad: error: audit: {show_path(anchors)}: {e}", err=True)
            sys.exit(EXIT_CONFIG)
        anchored = f"; {done.checked} anchors hold" + (
            f" ({done.before} older than the first entry, not checked)" if done.before else ""
        )
    first = result.first_seq
    span = "" if first is None else f" (seq {first}..{first + result.entries - 1})"
    if first is not None and first > 1:  # a piece of the chain: say what was not checked
        before = (
            "the entry before it is" if first == 2 else f"the {first - 1} entries before it are"
        )
        why = "older files removed by keep_files" if kept_only else "an export --since"
        click.echo(
            f"audit: ok, partial: it starts at seq {first} ({why}): {before} "
            f"not checked; {result.entries} entries{span}, head {result.head}{anchored}"
        )
        return
    click.echo(f"audit: ok: {result.entries} entries{span}, head {result.head}{anchored}")
