"""The Slurm executor's pure parts, from tables: squeue parsing, exit meanings, argv, options."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from deltad.executors.remote import RemoteJob, Seen, events_of
from deltad.executors.seam import (
    Exit,
    Handle,
    Identity,
    JobSpec,
    JobState,
    RequestKey,
    Started,
    SubmitError,
)
from deltad.executors.slurm import (
    JobRow,
    SlurmConfigError,
    SlurmError,
    SlurmExecutor,
    SlurmOptions,
    batch_script,
    comment_for,
    foreign_reason,
    key_from_comment,
    parse_jobs,
    parse_options,
    parse_sacct,
    rc_from_status,
    sbatch_argv,
    seen_of,
    time_limit,
    verified_key,
)

KEY = RequestKey(Path(os.fsdecode(b"/srv/ws \xff|x")), "run-1", "q1", 2)
HANDLE = Handle(KEY, "slurm", KEY.name)
SECRET = b"k" * 32
NODE = "deltadnode"
UNAVAILABLE = "ReqNodeNotAvail, UnavailableNodes:deltadnode"

# Captured from Slurm 22.05's `squeue -h --states=all -O <SQUEUE_FORMAT>` on the test cluster.
SQUEUE = """\
2|deltad-bbb|PENDING|N/A|0|Resources||ann(1004)|(null)
1|deltad-aaa|RUNNING|2026-11-24T02:21:04|0|None|deltadnode|ann(1004)|deltad2:abc:xx|with|bars
3|wrap|FAILED|2026-11-24T02:20:49|768|NonZeroExitCode|deltadnode|bob(1005)|(null)
5|wrap|CANCELLED|2026-11-24T02:39:40|0|ReqNodeNotAvail, UnavailableNodes:deltadnode||0|(null)
slurm_load_jobs error: something odd
4|short|line
"""


def test_squeue_rows_are_parsed_and_odd_lines_skipped() -> None:
    assert parse_jobs(SQUEUE) == [
        JobRow("2", "deltad-bbb", "PENDING", None, 0, "Resources", "", 1004, "(null)"),
        JobRow(
            "1",
            "deltad-aaa",
            "RUNNING",
            1795486864.0,
            0,
            "None",
            NODE,
            1004,
            "deltad2:abc:xx|with|bars",
        ),
        JobRow("3", "wrap", "FAILED", 1795486849.0, 768, "NonZeroExitCode", NODE, 1005, "(null)"),
        # cancelled in the queue: Slurm gives it a StartTime (its end), but no node
        JobRow("5", "wrap", "CANCELLED", None, 0, UNAVAILABLE, "", 0, "(null)"),
    ]


@pytest.mark.parametrize(
    ("status", "rc"),
    [(0, 0), (3 << 8, 3), (143 << 8, 143), (15, -15), (9, -9), (101 << 8, 101)],
)
def test_a_wait_status_is_a_code_or_minus_the_signal(status: int, rc: int) -> None:
    assert rc_from_status(status) == rc


def row(state: str, status: int = 0, start: float | None = 100.0) -> JobRow:
    return JobRow("7", KEY.name, state, start, status, "Reason", NODE if start else "", 1004, "c")


@pytest.mark.parametrize(
    ("job", "was_started", "events"),
    [
        (row("PENDING", start=None), False, []),
        (row("RUNNING"), False, [Started(HANDLE, 100.0)]),
        (row("RUNNING"), True, []),
        (row("COMPLETING"), True, []),
        (row("COMPLETED"), True, [Exit(HANDLE, 0, detail="COMPLETED Reason")]),
        # ended between two polls: Started first, then the exit
        (
            row("FAILED", 3 << 8),
            False,
            [Started(HANDLE, 100.0), Exit(HANDLE, 3, detail="FAILED Reason")],
        ),
        (row("CANCELLED", 15), True, [Exit(HANDLE, -15, detail="CANCELLED Reason")]),
        (row("CANCELLED", start=None), False, [Exit(HANDLE, None, detail="CANCELLED Reason")]),
        (row("TIMEOUT", 143 << 8), True, [Exit(HANDLE, 143, True, "TIMEOUT Reason")]),
        (row("NODE_FAIL", 9), True, [Exit(HANDLE, None, detail="NODE_FAIL Reason")]),
        (row("PREEMPTED"), True, [Exit(HANDLE, None, detail="PREEMPTED Reason")]),
        (row("BOOT_FAIL", start=None), False, [Exit(HANDLE, None, detail="BOOT_FAIL Reason")]),
        (None, True, [Exit(HANDLE, None, detail="unknown to the engine")]),
    ],
)
def test_what_a_query_says_about_a_job(
    job: JobRow | None, was_started: bool, events: list[object]
) -> None:
    tracked = RemoteJob(HANDLE, None, "7", was_started)
    assert events_of(tracked, seen_of(KEY, job) if job is not None else None) == events


def test_the_comment_carries_the_key_signed_for_this_daemon_only() -> None:
    comment = comment_for(KEY, "host-a", 1004, SECRET)
    assert " " not in comment and comment.startswith("deltad2:host-a:1004:")
    assert key_from_comment(comment, "host-a") == KEY
    assert verified_key(comment, "host-a", SECRET) == (KEY, 1004)
    assert key_from_comment(comment, "host-b") is None
    assert verified_key(comment, "host-b", SECRET) is None
    assert verified_key(comment, "host-a", b"another daemon's secret") is None


def test_a_comment_altered_by_a_tenant_does_not_verify() -> None:
    prefix, daemon, uid, packed, signed = comment_for(KEY, "host-a", 1004, SECRET).split(":")
    other = comment_for(RequestKey(Path("/srv/theirs"), "r", "q"), "host-a", 1004, SECRET)
    assert (
        verified_key(":".join((prefix, daemon, "1005", packed, signed)), "host-a", SECRET) is None
    )
    forged = ":".join((prefix, daemon, uid, other.split(":")[3], signed))
    assert verified_key(forged, "host-a", SECRET) is None
    assert verified_key(":".join((prefix, daemon, uid, packed, "0" * 32)), "host-a", SECRET) is None


def test_a_job_is_this_daemons_only_with_a_valid_tag_and_the_signed_uid() -> None:
    mine = verified_key(comment_for(KEY, "host-a", 1004, SECRET), "host-a", SECRET)
    assert foreign_reason(row("RUNNING"), mine) is None
    theirs = JobRow("8", "deltad-host-a", "RUNNING", 1.0, 0, "", NODE, 1005, "")
    assert foreign_reason(theirs, mine) == "its tag names uid 1004, Slurm says uid 1005"
    assert foreign_reason(theirs, None) == "no valid tag of this daemon in its comment"


@pytest.mark.parametrize(
    "comment",
    ["(null)", "", "deltad2:host-a:", "deltad2:host-a:1:!!!:x", "deltad2:host-a:1:e30=:x", "o:x"],
)
def test_a_foreign_or_broken_comment_names_no_key(comment: str) -> None:
    assert key_from_comment(comment, "host-a") is None
    assert verified_key(comment, "host-a", SECRET) is None


def test_sacct_rows_give_state_and_wait_status() -> None:
    text = "12|COMPLETED|0:0\n13|FAILED|3:0\n14|CANCELLED by 0|0:15\nbad line\n"
    assert parse_sacct(text) == {
        "12": ("COMPLETED", 0),
        "13": ("FAILED", 3 << 8),
        "14": ("CANCELLED", 15),
    }
    assert seen_of(KEY, row("RUNNING")) == Seen(KEY, "7", JobState.RUNNING, 100.0)


@pytest.mark.parametrize(
    ("state", "reason", "parked"),
    [
        ("PENDING", "JobHeldUser", True),  # sbatch --hold: the daemon's own park
        ("PENDING", "JobHeldAdmin", False),  # an operator's `scontrol hold`: left alone
        ("PENDING", "Resources", False),
        ("PENDING", "None", False),
        ("CANCELLED", "JobHeldUser", False),  # cancelled while parked: ended, not parked
    ],
)
def test_only_the_daemons_own_hold_is_a_parked_job(state: str, reason: str, parked: bool) -> None:
    job = JobRow("7", KEY.name, state, None, 0, reason, "", 1004, "c")
    assert seen_of(KEY, job).parked is parked


@pytest.mark.parametrize(
    ("timeout", "margin", "minutes"),
    [(3600, 300, "65"), (1, 0, "1"), (0, 0, "1"), (61, 0, "2"), (600, 59, "11")],
)
def test_the_slurm_time_limit_is_the_timeout_plus_margin_in_whole_minutes(
    timeout: float, margin: float, minutes: str
) -> None:
    assert time_limit(timeout, margin) == minutes


def spec(**kw: Any) -> JobSpec:
    return JobSpec(
        key=KEY,
        argv=["delta", "run", "--work-dir", os.fsdecode(KEY.workspace)],
        identity=Identity(1004, 1005, user="ann"),
        env={"OPENAI_API_KEY": "sk-secret"},
        timeout=600,
        **kw,
    )


def test_sbatch_argv_runs_as_the_owner_in_the_workspace_without_env_values() -> None:
    opts = SlurmOptions(
        log_dir=Path("/shared/logs"),
        daemon_id="host-a",
        partition="hitl",
        account="lab",
        extra_args=("--qos=fast",),
        time_margin=60,
    )
    comment = comment_for(KEY, "host-a", 1004, SECRET)
    argv = sbatch_argv("/usr/bin/sbatch", spec(), opts, comment)
    assert argv == [
        "/usr/bin/sbatch",
        "--parsable",
        "--uid=1004",
        "--gid=1005",
        f"--chdir={os.fsdecode(KEY.workspace)}",
        "--job-name=deltad-host-a",
        f"--comment={comment}",
        "--export=ALL",
        f"--output=/shared/logs/1004/{KEY.name}.log",
        "--open-mode=append",
        "--no-requeue",
        "--hold",
        "--ntasks=1",
        "--time=11",
        "--partition=hitl",
        "--account=lab",
        "--qos=fast",
    ]
    assert not any("sk-secret" in a for a in argv)


def test_a_spec_log_path_is_used_as_given() -> None:
    options = SlurmOptions(log_dir=Path("/l"))
    argv = sbatch_argv("sbatch", spec(log=Path("/shared/x.log")), options, "c")
    assert "--output=/shared/x.log" in argv


def test_the_script_quotes_every_byte_and_reads_no_stdin() -> None:
    script = batch_script(["delta", "run", "--work-dir", os.fsdecode(b"/srv/it's \xff")])
    assert (
        script
        == b"#!/bin/sh\numask 077\nexec delta run --work-dir '/srv/it'\"'\"'s \xff' </dev/null\n"
    )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({}, "executors.slurm.log_dir: required"),
        ({"log_dir": "logs"}, "executors.slurm.log_dir: an absolute path"),
        ({"log_dir": "/l/%u"}, "executors.slurm.log_dir: '%' and '\\' are not allowed"),
        ({"log_dir": "/l", "bogus": 1}, "executors.slurm.bogus: unknown option"),
        (
            {"log_dir": "/l", "partiton": "p"},
            "executors.slurm.partiton: unknown option; did you mean 'partition'?",
        ),
        (
            {"log_dir": "/l", "daemon_id": "a b"},
            "executors.slurm.daemon_id: 1 to 64 of letters, digits, '.', '_' or '-'",
        ),
        ({"log_dir": "/l", "partition": "a b"}, "executors.slurm.partition: a name without spaces"),
        (
            {"log_dir": "/l", "extra_args": "--qos=x"},
            "executors.slurm.extra_args: Input should be a list",
        ),
        (
            {"log_dir": "/l", "poll_every": 0},
            "executors.slurm.poll_every: Input should be greater than or equal to 0.05",
        ),
        (
            {"log_dir": "/l", "poll_every": True},
            "executors.slurm.poll_every: Input should be a valid number",
        ),
        (
            {"log_dir": "/l", "slurm_conf": "etc/slurm.conf"},
            "executors.slurm.slurm_conf: an absolute path",
        ),
    ],
)
def test_bad_options_are_one_line_errors(options: dict[str, Any], error: str) -> None:
    with pytest.raises(SlurmConfigError) as e:
        parse_options(options)
    assert str(e.value) == error


def test_good_options() -> None:
    opts = parse_options(
        {
            "log_dir": "/shared/logs",
            "daemon_id": "host-a",
            "partition": "hitl",
            "extra_args": ["--qos=fast"],
            "poll_every": 1,
            "time_margin_seconds": 120,
            "slurm_conf": "/etc/slurm/slurm.conf",
        }
    )
    assert opts == SlurmOptions(
        log_dir=Path("/shared/logs"),
        daemon_id="host-a",
        partition="hitl",
        extra_args=("--qos=fast",),
        poll_every=1.0,
        time_margin=120.0,
        slurm_conf=Path("/etc/slurm/slurm.conf"),
    )


def test_the_owner_log_directory_is_made_0700_and_someone_elses_is_refused(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: chowns to another uid")
    ann = Identity(54321, 54322)
    mine = tmp_path / "logs" / "54321"
    SlurmExecutor._owner_dir(mine, ann)
    st = mine.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (54321, 54322, 0o700)
    SlurmExecutor._owner_dir(mine, ann)  # made once, then used as it is

    theirs = Path(os.fsdecode(os.fsencode(tmp_path) + b"/logs/\x1b[31m"))
    theirs.mkdir()
    with pytest.raises(SlurmError) as e:
        SlurmExecutor._owner_dir(theirs, ann)
    assert "\x1b" not in str(e.value)
    assert str(e.value).endswith("is not the owner's (uid 54321)")


@pytest.mark.spawns  # a stand-in sbatch: the fence is asked in its process, before exec
def test_a_daemon_frozen_after_its_fence_check_starts_no_sbatch_when_it_wakes(
    tmp_path: Path,
) -> None:
    ran = tmp_path / "ran"
    fake = tmp_path / "sbatch"
    fake.write_text(f"#!/bin/sh\ntouch '{ran}'\necho 42\n")
    fake.chmod(0o755)
    opts = SlurmOptions(log_dir=tmp_path / "logs", daemon_id="d", bin_dir=tmp_path)
    ex = SlurmExecutor(opts, SECRET)
    try:
        # True where the worker checked (this process), False in the forked child: the lease
        # was lost while the daemon stood frozen between its check and the fork.
        parent = os.getpid()
        with pytest.raises(SlurmError):
            ex._run([str(fake)], env={}, fence=lambda: os.getpid() == parent)
        assert not ran.exists()
        with pytest.raises(SubmitError, match="fenced"):  # lost for both: said as fenced
            ex._run([str(fake)], env={}, fence=lambda: False)
        assert not ran.exists()
        assert ex._run([str(fake)], env={}, fence=lambda: True).strip() == "42"
        assert ran.exists()
    finally:
        ex.close()
