"""Alpha-beta model of plain, flat 1-bit and hierarchical 1-bit allreduce, and where compression stops paying."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MODEL_METHODS = ("plain", "1bit", "hier")
COLLECTIVES = {"plain": 1, "1bit": 3, "hier": 5}


@dataclass(frozen=True)
class Cluster:
    """A network and the compute beside it, as the model sees them.

    Attributes:
        nodes: N, nodes joined by the inter-node network.
        ranks_per_node: k, ranks in each node.
        inter_gbit: goodput of one node's link, each direction (Gbit/s).
        latency_us: alpha, the fixed cost of one collective (a 4-byte allreduce).
        intra_gbyte: bandwidth of one rank's traffic inside a node (GB/s).
        kernel_gbyte: per method, bytes of float32 input one rank's compression kernels
            process per second (GB/s); plain's entry is the rate its reduction sums at.
    """

    nodes: int
    ranks_per_node: int
    inter_gbit: float
    latency_us: float
    intra_gbyte: float
    kernel_gbyte: dict[str, float] = field(default_factory=dict)

    @property
    def ranks(self) -> int:
        """All ranks: nodes x ranks per node."""
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class Prediction:
    """Predicted time of one allreduce and where it goes (seconds), and the pieces its kernels and wire overlap in."""

    latency: float
    kernels: float
    intra: float
    inter: float
    pieces: int = 1

    @property
    def wire(self) -> float:
        """Time on the wire: inside the node and between nodes."""
        return self.intra + self.inter

    @property
    def total(self) -> float:
        """latency + kernels + wire, less what the pieces overlap.

        In one piece the phases run one after another, so the parts add up. In P pieces a
        piece's kernels (K / P) run while another piece is on the wire (W / P): a two-stage
        pipeline of P items takes max(K, W) + min(K, W) / P.
        """
        if self.pieces <= 1:
            return self.latency + self.kernels + self.wire
        return self.latency + max(self.kernels, self.wire) + min(self.kernels, self.wire) / self.pieces


def link_bytes(method: str, nodes: int, ranks_per_node: int) -> tuple[float, float]:
    """(inter, intra): bytes per byte of input that one node's link and one rank's intra-node
    path carry, each direction.

    1. plain, a ring over all p = N k ranks ordered by node: every rank sends 2 (p - 1) / p
       of the tensor; one ring edge leaves each node, so the node's link carries that much
       (N > 1), and otherwise the intra-node path does.
    2. 1bit, the flat gather-scatter: every rank sends a 1/32-size chunk to each of the
       others, twice; the k ranks of a node send 2 (p - k) / p of them off the node.
    3. hier: intra-node all-to-all and all-gather of 1-bit shards, 2 (k - 1) / k / 32; between
       nodes the local ranks j exchange 1/k of the tensor: per node link 2 (N - 1) / N / 32.
    Scales and metadata (a few bytes per row) are left out.
    """
    p, k, n = nodes * ranks_per_node, ranks_per_node, nodes
    if method == "plain":
        ring = 2 * (p - 1) / p
        return (ring, 0.0) if n > 1 else (0.0, ring)
    if method == "1bit":
        return k * 2 * (p - k) / p / 32, 2 * (k - 1) / p / 32
    if method == "hier":
        return 2 * (n - 1) / n / 32, 2 * (k - 1) / k / 32
    raise ValueError(f"the model knows {', '.join(MODEL_METHODS)}, not {method!r}")


def kernel_work(method: str, nodes: int, ranks_per_node: int) -> float:
    """The share of a 1-rank call's kernel work that one rank does in a call on N x k ranks.

    Kernel rates are calibrated on one rank, where every stage runs on the whole tensor;
    on p = N k ranks some stages run on a slice. Counting passes over the tensor, each as
    one unit:
    1. plain: the reduction adds (p - 1) / p of the tensor.
    2. 1bit (6 passes on one rank: sum of squares and encode of the worker, the server's
       sign accumulation, its sum of squares and encode, the final decode): the server's
       sum of squares and encode cover 1/p, so (4 + 2 / p) / 6.
    3. hier (6 passes on one rank: encode and decode at the node, inter-node and server
       stages): the inter-node stage covers 1/k of the tensor and the server's encode 1/p,
       so (3 + 2 / k + 1 / p) / 6.
    """
    p = nodes * ranks_per_node
    if method == "plain":
        return (p - 1) / p
    if method == "1bit":
        return (4 + 2 / p) / 6
    if method == "hier":
        return (3 + 2 / ranks_per_node + 1 / p) / 6
    raise ValueError(f"the model knows {', '.join(MODEL_METHODS)}, not {method!r}")


def predict(cluster: Cluster, size: int, method: str, pieces: int = 1) -> Prediction:
    """Time of one allreduce of ``size`` bytes of float32 with ``method`` on ``cluster``.

    1. Latency: alpha times the collectives the method runs (plain 1; 1bit 3: agreement,
       all-to-all, all-gather; hier 5: agreement, two all-to-alls, two all-gathers).
    2. Kernels: ``kernel_work`` times size / the method's kernel rate (a missing rate
       costs nothing).
    3. Wire: ``link_bytes`` times size, over the node's link goodput and the intra-node
       bandwidth.
    4. ``pieces`` (1bit only: ``compressed_allreduce(pieces=P)``): kernels and wire
       overlap (``Prediction.total``).
    """
    if pieces > 1 and method != "1bit":
        raise ValueError(f"only 1bit runs in pieces in the model, not {method!r}")
    inter, intra = link_bytes(method, cluster.nodes, cluster.ranks_per_node)
    if cluster.ranks == 1:
        inter = intra = 0.0
    rate = cluster.kernel_gbyte.get(method)
    work = size * kernel_work(method, cluster.nodes, cluster.ranks_per_node)
    return Prediction(
        latency=COLLECTIVES[method] * cluster.latency_us * 1e-6 if cluster.ranks > 1 else 0.0,
        kernels=work / (rate * 1e9) if rate else 0.0,
        intra=size * intra / (cluster.intra_gbyte * 1e9),
        inter=size * inter * 8 / (cluster.inter_gbit * 1e9),
        pieces=pieces,
    )


def break_even_gbit(cluster: Cluster, size: int, method: str) -> float:
    """Link goodput (Gbit/s) above which plain allreduce of ``size`` bytes beats ``method`` (in one piece).

    Both times are fixed + inter-node bytes / rate, so they cross at
    (plain's bytes - method's bytes) * 8 / (method's fixed - plain's fixed). Returns inf
    when ``method`` wins at any rate and 0 when it never does.
    """
    plain, other = predict(cluster, size, "plain"), predict(cluster, size, method)
    saved_bits = (plain.inter - other.inter) * cluster.inter_gbit * 1e9
    extra = (other.total - other.inter) - (plain.total - plain.inter)
    if saved_bits <= 0:
        return 0.0
    return math.inf if extra <= 0 else saved_bits / extra / 1e9


def break_even_size(cluster: Cluster, method: str) -> float:
    """Smallest size (bytes) from which ``method`` (in one piece) beats plain allreduce: both times are
    a + b * size, so they cross at (a_method - a_plain) / (b_plain - b_method); inf if
    ``method`` never wins, 0 if it always does."""
    unit = 1 << 30
    plain, other = predict(cluster, unit, "plain"), predict(cluster, unit, method)
    slope = (plain.total - plain.latency - (other.total - other.latency)) / unit
    offset = other.latency - plain.latency
    if slope <= 0:
        return math.inf
    return max(0.0, offset / slope)
