"""A real SLURM cluster on loopback for tests and local trials (needs root and the Debian packages).

munge + MariaDB + slurmdbd + slurmctld + two slurmd (``n1``, ``n2``) emulated on this host, all
state under one scratch directory. ``python -m tests.slurm.localcluster up|down|status``;
clients find the cluster through ``SLURM_CONF`` (``up`` prints the export line).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fairseq_tying.common import atomic

DEFAULT_ROOT = Path(os.environ.get("FAIRSEQ_TYING_CLUSTER_DIR", "/tmp/fairseq_tying_slurm"))
NODES = ("n1", "n2")
CLUSTER = "fstying"
DEFAULT_PORT_BASE = 16800  # slurmctld +17, slurmdbd +19, MariaDB +6, slurmd n1/n2 +1001/+1002
DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db",
           "sacctmgr")
DB_PASSWORD = "fstying-slurm"


class ClusterError(RuntimeError):
    pass


def missing_requirements() -> str | None:
    """Why this machine cannot run the cluster (None when it can)."""
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (daemons run as root/munge/mysql)"
    for tool in DAEMONS:
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed: run `bash scripts/install_system_packages.sh` as root"
    return None


def _exe(name: str) -> str:
    found = shutil.which(name) or str(Path("/usr/sbin", name))
    return found


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _wait(check, what: str, timeout: float = 60.0, interval: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(interval)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int) -> bool:
    try:  # reap it first if it is our own child (MariaDB), else it lingers as a zombie
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(pids: list[int], grace: float = 20.0) -> None:
    """SIGTERM to each live pid, then SIGKILL to those still alive after ``grace`` seconds."""
    for pid in pids:
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@dataclass
class LocalCluster:
    root: Path = DEFAULT_ROOT
    port_base: int = DEFAULT_PORT_BASE

    @property
    def ports(self) -> dict[str, int]:
        b = self.port_base
        return {"ctld": b + 17, "dbd": b + 19, "mysql": b + 6, "n1": b + 1001, "n2": b + 1002}

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _state(self) -> dict:
        path = self.root / "cluster.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _save_state(self, state: dict) -> None:
        atomic.write_json(self.root / "cluster.json", state, indent=1, ensure_ascii=True)

    def _record(self, key: str, pid: int) -> None:
        state = self._state()
        state[key] = pid
        self._save_state(state)

    # -- bring-up ---------------------------------------------------------------------------
    def up(self) -> None:
        reason = missing_requirements()
        if reason:
            raise ClusterError(reason)
        if self._state():
            self.down()
        shutil.rmtree(self.root, ignore_errors=True)
        for sub in ("etc", "log", "state", "run", *(f"spool/{n}" for n in NODES)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self._save_state({"root": str(self.root)})
        try:
            self._start_munge()
            self._start_mariadb()
            self._write_configs()
            self._start_slurmdbd()
            _run(["sacctmgr", "-i", "add", "cluster", CLUSTER], env=self.env)
            self._start_slurm()
        except BaseException:
            self.down()
            raise

    def _start_munge(self) -> None:
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
            return  # a munged is already serving this host: share it, never stop it
        _run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"])
        _run(["runuser", "-u", "munge", "--", _exe("munged")])
        _wait(lambda: Path("/run/munge/munged.pid").exists(), "munged")
        self._record("munged", int(Path("/run/munge/munged.pid").read_text().strip()))
        _wait(lambda: subprocess.run("munge -n | unmunge", shell=True,
                                     capture_output=True).returncode == 0, "munge credentials")

    def _start_mariadb(self) -> None:
        data, sock = self.root / "mysql", self.root / "run" / "mysqld.sock"
        data.mkdir()
        shutil.chown(data, "mysql", "mysql")
        shutil.chown(self.root / "run", "mysql", "mysql")
        _run([_exe("mariadb-install-db"), "--user=mysql", f"--datadir={data}",
              "--auth-root-authentication-method=socket", "--skip-test-db"])
        log = open(self.root / "log" / "mariadb.log", "ab")  # noqa: SIM115 (daemon keeps it)
        proc = subprocess.Popen(
            [_exe("mariadbd"), "--no-defaults", "--user=mysql", f"--datadir={data}",
             f"--socket={sock}", f"--port={self.ports['mysql']}",
             "--bind-address=127.0.0.1",
             f"--pid-file={self.root / 'run' / 'mysqld.pid'}", "--skip-log-bin"],
            stdout=log, stderr=log, start_new_session=True)
        self._record("mariadbd", proc.pid)
        _wait(lambda: _port_open(self.ports["mysql"]) and sock.exists(), "MariaDB")
        sql = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}';"
               f"CREATE USER 'slurm'@'localhost' IDENTIFIED BY '{DB_PASSWORD}';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';")
        _run(["mariadb", f"--socket={sock}", "-u", "root", "-e", sql])

    def _write_configs(self) -> None:
        host = socket.gethostname().split(".")[0]
        mem = min(2048, int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 / 4))
        r, n1, n2 = self.root, self.ports["n1"], self.ports["n2"]
        conf = f"""# generated by tests.slurm.localcluster
ClusterName={CLUSTER}
SlurmctldHost={host}
SlurmctldPort={self.ports['ctld']}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SlurmUser=root
SlurmdUser=root
MailProg=/bin/true
ReturnToService=2
KillWait=5
MinJobAge=3600
MpiDefault=none
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.%n.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={self.ports['dbd']}
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
NodeName=n[1-2] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{n1}-{n2}] \
CPUs=2 RealMemory={mem} State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
"""
        dbd = f"""AuthType=auth/munge
DbdHost=localhost
DbdPort={self.ports['dbd']}
SlurmUser=root
PidFile={r}/run/slurmdbd.pid
LogFile={r}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.ports['mysql']}
StorageUser=slurm
StoragePass={DB_PASSWORD}
StorageLoc=slurm_acct_db
"""
        self.conf.write_text(conf)
        dbd_path = self.conf.parent / "slurmdbd.conf"
        dbd_path.write_text(dbd)
        os.chmod(dbd_path, 0o600)

    def _pidfile(self, name: str) -> int:
        """The pid a daemon wrote (waits until the file is complete)."""
        path = self.root / "run" / name
        _wait(lambda: path.exists() and path.read_text().strip().isdigit(), f"{name}")
        return int(path.read_text().strip())

    def _start_slurmdbd(self) -> None:
        _run([_exe("slurmdbd")], env=self.env)
        self._record("slurmdbd", self._pidfile("slurmdbd.pid"))
        _wait(lambda: _port_open(self.ports["dbd"]), "slurmdbd to listen", timeout=60)

    def _start_slurm(self) -> None:
        _run([_exe("slurmctld"), "-c", "-i"], env=self.env)
        self._record("slurmctld", self._pidfile("slurmctld.pid"))
        _wait(lambda: _port_open(self.ports["ctld"]), "slurmctld to listen")
        for node in NODES:
            _run([_exe("slurmd"), "-N", node], env=self.env)
            self._record(f"slurmd.{node}", self._pidfile(f"slurmd.{node}.pid"))

        def idle() -> bool:
            out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env).stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            return all(states.get(n) == "idle" for n in NODES)

        _wait(idle, "nodes n1 and n2 to be idle")
        _wait(lambda: _run(["sacct", "-n", "-X"], env=self.env).returncode == 0, "accounting")

    # -- queries ----------------------------------------------------------------------------
    def jobs(self) -> list[str]:
        out = _run(["squeue", "-h", "-o", "%i"], env=self.env).stdout
        return [j for j in out.split() if j]

    # -- tear-down --------------------------------------------------------------------------
    def down(self, timeout: float = 60.0) -> None:
        state = self._state()
        if not state:
            return
        env = self.env
        if state.get("slurmctld") and _pid_alive(state["slurmctld"]):
            subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True)
            try:
                _wait(lambda: not self.jobs(), "jobs to end", timeout=timeout)
            except ClusterError as err:
                print(f"warning: {err}", file=sys.stderr)
            subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        # slurmctld and the slurmd stop on `scontrol shutdown`; the rest is stopped by pid
        groups = [["slurmctld", *(f"slurmd.{n}" for n in NODES)], ["slurmdbd"], ["mariadbd"],
                  ["munged"]]
        for group in groups:
            _stop([state[k] for k in group if state.get(k)])
        self._save_state({})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slurm.localcluster",
                                     description=__doc__)
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="scratch directory")
    parser.add_argument("--port-base", type=int, default=DEFAULT_PORT_BASE,
                        help="ports used: base+6 (MariaDB), +17, +19, +1001, +1002")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.root, args.port_base)
    try:
        if args.action == "up":
            start = time.monotonic()
            cluster.up()
            print(f"cluster up in {time.monotonic() - start:.0f}s; run:\n"
                  f"export SLURM_CONF={cluster.conf}")
        elif args.action == "down":
            cluster.down()
            print("cluster down")
        else:
            print(json.dumps(cluster._state(), indent=1))
            subprocess.run(["sinfo"], env=cluster.env)
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
