"""A throwaway Redis Cluster on loopback, for the dedup index's tests and benchmarks.

N `redis-server --cluster-enabled yes` processes on free loopback ports (client and cluster-bus
ports both chosen at run time), each with its working directory (its nodes.conf, its log) under
the given folder, joined by `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`.
No persistence: a node killed and started again keeps its slots (nodes.conf) and loses its keys,
as a production node without persistence would. Every process is started and stopped by its pid;
every wait is bounded.

    with LocalCluster(tmp_path / "cluster", nodes=3) as cluster:
        evalm data dedup ... --redis-url cluster.url
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

WAIT_S = 30.0


def free_ports(count: int) -> list[int]:
    """Distinct ports nobody listens on now (held open together, so no two are the same)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def binaries() -> tuple[str, str] | None:
    """(redis-server, redis-cli), or None when either is missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    return (server, cli) if server and cli else None


class LocalCluster:
    """A Redis Cluster of `nodes` masters whose processes this object owns."""

    def __init__(self, root: Path, nodes: int = 3, node_timeout_ms: int = 1000):
        found = binaries()
        if found is None:
            raise RuntimeError("redis-server and redis-cli are needed (apt-get install redis-server)")
        self.server, self.cli = found
        self.root, self.node_timeout_ms = Path(root), node_timeout_ms
        ports = free_ports(2 * nodes)
        self.ports, self.bus_ports = ports[:nodes], ports[nodes:]
        self.procs: list[subprocess.Popen | None] = [None] * nodes
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def __enter__(self) -> LocalCluster:
        try:
            for i in range(len(self.ports)):
                self.start_node(i)
            subprocess.run([self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                            "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True,
                           timeout=WAIT_S)
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self, i: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.ports[i], socket_timeout=5)

    def start_node(self, i: int) -> None:
        """Start node i (again): same ports, same folder, so it rejoins with its slots and no keys."""
        folder = self.root / f"node-{self.ports[i]}"
        folder.mkdir(parents=True, exist_ok=True)
        log = open(folder / "redis.log", "ab")
        self.procs[i] = subprocess.Popen(
            [self.server, "--port", str(self.ports[i]), "--cluster-port", str(self.bus_ports[i]),
             "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(self.node_timeout_ms), "--save", "", "--appendonly", "no",
             "--dir", str(folder)], stdout=log, stderr=subprocess.STDOUT, cwd=folder)
        log.close()
        self._wait(lambda: self.client(i).ping(), f"node {self.ports[i]} to answer PING")

    def kill_node(self, i: int) -> None:
        """SIGKILL node i (its keys are lost, as in a crash)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=WAIT_S)
        self.procs[i] = None

    def restart_node(self, i: int) -> None:
        self.kill_node(i)
        self.start_node(i)
        self.wait_ok()

    def wait_ok(self) -> None:
        """Until every node says cluster_state:ok (a restarted master's FAIL flag is cleared after
        about two node timeouts, Redis Cluster's FAIL_UNDO rule)."""
        def ok() -> bool:
            return all(b"cluster_state:ok" in self.client(i).execute_command("CLUSTER", "INFO", NEVER_DECODE=True)
                       for i in range(len(self.ports)))
        self._wait(ok, "the cluster to report cluster_state:ok")

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill_node(i)

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except (redis.RedisError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"timed out after {WAIT_S:.0f} s waiting for {what} (logs under {self.root})")
