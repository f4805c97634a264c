"""A real one-node Slurm cluster for tests and benchmarks, private to one network namespace.

Slurm's daemons bind 0.0.0.0, so they run in a network namespace of their own that has only
loopback: nothing is reachable from outside it. Two things make Debian 12's Slurm 22.05 start
there: a second address on `lo` (slurmctld resolves its port with `AI_ADDRCONFIG`, which
returns nothing when no IPv4 address outside 127/8 exists) and `CgroupPlugin=cgroup/v1` (22.05's
slurmd always loads a cgroup plugin; with `proctrack/linuxproc` and `task/none` none is made).
munged runs with its own key and socket in the cluster's directory, so nothing system-wide is
touched. Whoever talks to the cluster (sbatch, the executor under test) must be in the
namespace: `Cluster.entered()` moves the calling thread there, and its subprocesses with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

NODE = "deltadnode"
PARTITION = "debug"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
_CLONE_NEWNET = 0x40000000

SLURM_CONF = """\
ClusterName=deltadtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=600
SchedulerParameters=batch_sched_delay=0
KillWait={kill_wait}
ReturnToService=2
MpiDefault=none
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
# `Cluster(slots=N)`: a node that runs N jobs side by side (one CPU each, the node said to have
# N whatever the host has), as a cluster with room would; the default node runs one at a time.
SLOTS_CONF = """\
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
"""
CGROUP_CONF = "CgroupPlugin=cgroup/v1\n"


class ClusterError(Exception):
    pass


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class Cluster:
    """munged + slurmctld + slurmd in a private network namespace; `stop()` ends them by pid."""

    def __init__(self, kill_wait: int = 3, slots: int | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="deltad-slurm-", dir="/tmp"))
        os.chmod(self.dir, 0o755)
        self.kill_wait = kill_wait
        self.slots = slots
        self.conf = self.dir / "slurm.conf"
        self.holder: subprocess.Popen[bytes] | None = None
        self.munged_pid: int | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs: the config file (and a PATH to find the commands)."""
        return {"SLURM_CONF": str(self.conf), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}

    def netns(self) -> str:
        assert self.holder is not None
        return f"/proc/{self.holder.pid}/ns/net"

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside the cluster's namespace with its config."""
        cmd = ["nsenter", f"--net={self.netns()}", "--", *argv]
        env = {**os.environ, **self.env}
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=check, timeout=60)

    def start(self, deadline: float = 120.0) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && "
             "ip addr add 10.254.77.1/32 dev lo && exec sleep infinity"],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self._wait(lambda: self._lo_ready(), deadline, "the namespace's loopback")
        self._start_munge()
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir()
        ctld_port, d_port = _free_ports()
        self.conf.write_text(
            SLURM_CONF.format(
                host=socket.gethostname().split(".")[0],
                dir=self.dir,
                ctld_port=ctld_port,
                d_port=d_port,
                node=NODE,
                partition=PARTITION,
                kill_wait=self.kill_wait,
                cpus=self.slots or 2,
            )
            + (SLOTS_CONF if self.slots else "")
        )
        (self.dir / "cgroup.conf").write_text(CGROUP_CONF)
        self.run(_which("slurmctld"), "-f", str(self.conf))
        self.run(_which("slurmd"), "-f", str(self.conf), "-N", NODE)
        self._wait(self._idle, deadline, f"node {NODE} idle in sinfo")

    def _lo_ready(self) -> bool:
        out = subprocess.run(
            ["nsenter", f"--net={self.netns()}", "ip", "-o", "addr", "show", "dev", "lo"],
            capture_output=True,
            text=True,
        )
        return "10.254.77.1" in out.stdout

    def _start_munge(self) -> None:
        mdir = self.dir / "munge"
        mdir.mkdir(mode=0o755)
        key = mdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        subprocess.run(["chown", "-R", "munge:munge", str(mdir)], check=True)
        subprocess.run(
            ["runuser", "-u", "munge", "--", _which("munged"), f"--key-file={key}",
             f"--socket={mdir}/munge.socket", f"--pid-file={mdir}/munged.pid",
             f"--log-file={mdir}/munged.log", f"--seed-file={mdir}/munged.seed"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.munged_pid = int((mdir / "munged.pid").read_text())

    def _idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return out.returncode == 0 and f"{NODE} idle" in out.stdout

    @staticmethod
    def _wait(ready: object, deadline: float, what: str) -> None:
        assert callable(ready)
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if ready():
                return
            time.sleep(0.05)
        raise ClusterError(f"timed out waiting for {what}")

    def log_tail(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            with contextlib.suppress(OSError):
                parts.append(name + ":\n" + (self.dir / name).read_text()[-3000:])
        return "\n".join(parts)

    def drain(self, reason: str = "test") -> None:
        self.run("scontrol", "update", f"nodename={NODE}", "state=drain", f"reason={reason}")

    def resume(self) -> None:
        self.run("scontrol", "update", f"nodename={NODE}", "state=resume")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """slurmctld hung (SIGSTOP) while the context is open: its port takes connections,
        nothing answers them; SIGCONT after."""
        pid = int((self.dir / "slurmctld.pid").read_text().strip())
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """slurmctld stopped (SIGTERM: it saves its state and exits; its port refuses
        connections) while the context is open; started again after, from its saved state."""
        pid = int((self.dir / "slurmctld.pid").read_text().strip())
        _kill(pid)
        try:
            yield
        finally:
            self.run(_which("slurmctld"), "-f", str(self.conf))

    def answers(self) -> bool:
        """Whether slurmctld answers a query now."""
        return "is UP" in self.run("scontrol", "ping", check=False).stdout

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Move this thread (and what it starts) into the cluster's network namespace."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(self.netns(), os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(target)
            os.close(home)

    def stop(self) -> None:
        if self.holder is not None and self.conf.exists():
            # Jobs' processes outlive slurmd (slurmstepd holds them): end them first.
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.run("scancel", "--full", "--signal=KILL", f"--partition={PARTITION}")
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            _kill_pidfile(self.dir / pidfile)
        if self.munged_pid is not None:
            _kill(self.munged_pid)
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _kill_pidfile(path: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        _kill(int(path.read_text().strip()))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _free_ports() -> tuple[int, int]:
    # Inside a fresh namespace every port is free; stay clear of the well-known ones.
    base = 20000 + os.getpid() % 20000
    return base, base + 1


@contextlib.contextmanager
def cluster(kill_wait: int = 3, slots: int | None = None) -> Iterator[Cluster]:
    c = Cluster(kill_wait=kill_wait, slots=slots)
    try:
        c.start()
        yield c
    except ClusterError as e:
        raise ClusterError(f"{e}\n{c.log_tail()}") from None
    finally:
        c.stop()
