"""Emulated nodes on one machine: network namespaces on a bridge, each link shaped with tc tbf."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

SUBNET = "10.213.0"
INTERFACE = "eth0"


@dataclass(frozen=True)
class Node:
    """One emulated node: its namespace, its address and the interface Gloo must use."""

    namespace: str
    address: str
    interface: str = INTERFACE

    def gloo_env(self) -> dict[str, str]:
        """Environment that makes Gloo use this node's link."""
        return {"GLOO_SOCKET_IFNAME": self.interface}

    def mpi_env(self) -> dict[str, str]:
        """Environment that makes MPICH (UCX) use this node's link: the namespaces share one
        host, so without it ranks would meet through shared memory and never touch the link."""
        return {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": self.interface}

    def env(self, backend: str) -> dict[str, str]:
        """The environment a rank of ``backend`` ("gloo" or "mpi") needs on this node."""
        return self.gloo_env() if backend == "gloo" else self.mpi_env()

    def prefix(self) -> list[str]:
        """The command prefix that runs a program inside this node."""
        return ["ip", "netns", "exec", self.namespace]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _in(namespace: str, *args: str) -> None:
    subprocess.run(["ip", "netns", "exec", namespace, *args], check=True, capture_output=True, text=True)


def why_unavailable() -> str | None:
    """None if namespaces can be made here, else the reason (not root, no iproute2, ...)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces and shaping links needs root (run as root or under sudo)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found: install iproute2"
    probe = f"ccprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"'ip netns add' failed ({exc.stderr.strip()}): this sandbox forbids network namespaces"
    _ip("netns", "delete", probe)
    return None


_RATE_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9: a tc rate in bits per second."""
    for unit, scale in _RATE_UNITS.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"rate {rate!r} must end in one of {', '.join(_RATE_UNITS)}")


def _shape(namespace: str, device: str, rate: str) -> None:
    """Limit ``device``'s egress to ``rate`` with a token bucket whose bursts last 100 us at that
    rate (at least 64 KiB), so that small messages see the link rate too, as on a real wire."""
    burst = max(64 << 10, int(rate_bits(rate) / 8 / 10000))
    _in(namespace, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", rate,
        "burst", str(burst), "latency", "50ms")


@contextmanager
def emulated_nodes(count: int, rate: str | None = "1gbit") -> Iterator[list[Node]]:
    """``count`` namespaces joined through a bridge, every link limited to ``rate`` each way.

    1. A hub namespace holds a bridge; node i gets a veth pair, ``eth0`` inside node i
       (address SUBNET.(i+1)/24) and ``p<i>`` on the bridge.
    2. With a rate, both ends of every veth get a tbf qdisc, so traffic between two nodes
       crosses two links of that rate (node egress, switch-port egress), as through a
       switch; traffic inside a node goes over its loopback, unshaped.
    3. On exit, even after an error or a SIGTERM (turned into SystemExit while inside),
       all the namespaces (and with them the links) are deleted.

    Yields the nodes. Raises RuntimeError with the reason when namespaces cannot be made.
    """
    reason = why_unavailable()
    if reason:
        raise RuntimeError(reason)
    tag = f"cc{os.getpid()}"
    hub = f"{tag}hub"
    nodes = [Node(f"{tag}n{i}", f"{SUBNET}.{i + 1}") for i in range(count)]
    made = []
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        _ip("netns", "add", hub)
        made.append(hub)
        _in(hub, "ip", "link", "add", "br0", "type", "bridge")
        _in(hub, "ip", "link", "set", "br0", "up")
        for i, node in enumerate(nodes):
            _ip("netns", "add", node.namespace)
            made.append(node.namespace)
            port = f"p{i}"
            _ip("link", "add", f"{tag}a{i}", "netns", node.namespace, "type", "veth", "peer", "name", port,
                "netns", hub)
            _in(node.namespace, "ip", "link", "set", f"{tag}a{i}", "name", node.interface)
            _in(node.namespace, "ip", "addr", "add", f"{node.address}/24", "dev", node.interface)
            _in(node.namespace, "ip", "link", "set", node.interface, "up")
            _in(node.namespace, "ip", "link", "set", "lo", "up")
            _in(hub, "ip", "link", "set", port, "master", "br0")
            _in(hub, "ip", "link", "set", port, "up")
            if rate:
                _shape(node.namespace, node.interface, rate)
                _shape(hub, port, rate)
        yield nodes
    finally:
        for namespace in reversed(made):
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
        signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def link_rate_gbit(sender: Node, receiver: Node, megabytes: int = 64) -> float:
    """Measured TCP goodput from ``sender`` to ``receiver`` in Gbit/s (one stream, ``megabytes`` MiB).

    1. A receiver in ``receiver``'s namespace accepts one connection and reads until EOF.
    2. A sender in ``sender``'s namespace writes the bytes; the receiver reports the rate
       from its first to its last byte.
    """
    port = 29517
    receive = (
        "import socket, time\n"
        f"s = socket.create_server(('{receiver.address}', {port}))\n"
        "c, _ = s.accept(); n = 0; start = None\n"
        "while True:\n"
        "    b = c.recv(1 << 20)\n"
        "    if not b: break\n"
        "    start = start or time.perf_counter(); n += len(b)\n"
        "print(n * 8 / (time.perf_counter() - start) / 1e9)\n"
    )
    send = (
        "import socket, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        f"        c = socket.create_connection(('{receiver.address}', {port})); break\n"
        "    except OSError: time.sleep(0.05)\n"
        f"c.sendall(bytes({megabytes} << 20)); c.close()\n"
    )
    server = subprocess.Popen([*receiver.prefix(), sys.executable, "-c", receive], stdout=subprocess.PIPE, text=True)
    try:
        subprocess.run([*sender.prefix(), sys.executable, "-c", send], check=True, timeout=120)
        output, _ = server.communicate(timeout=120)
    finally:
        server.kill()
    return float(output.strip())
