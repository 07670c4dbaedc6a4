"""Reduce-scatter planning, without I/O: slice ranges, reducer ranking, projection checks.

* :func:`plan_slices` cuts ``d`` values into ``n`` contiguous slices whose boundaries fall on
  the chunk grid of :func:`~gradfed_ipfs.storage.dag.plan_chunks` when there are at least ``n``
  chunks (a reducer then fetches only its own chunks), else evenly.
* :func:`reducer_ranking` orders the roster's peers for slice ``k`` from a hash of
  ``(roster CID, peer)``, rotated by ``k``: rank 0 reduces the slice, rank 1 takes over after
  a timeout..., and every peer is rank 0 of exactly one slice.
* :func:`chain_groups` / :func:`chain_senders` / :func:`chain_sum`: a chained round's ``G``
  groups of consecutive roster peers and its partial sums (:mod:`.reduce_chain`).
* :func:`reduce_values` is the slice aggregate. For ``fedavg`` it is
  :func:`~gradfed_ipfs.tensor.deterministic.deterministic_update` on the slice, which is
  coordinate-wise, so the concatenated slices are bit-identical to the whole-vector update;
  ``median`` and ``trimmed_mean:<beta>`` (:func:`~gradfed_ipfs.tensor.robust.trimmed_mean`)
  are coordinate-wise too.
* :func:`projection_vector` / :func:`projection` / :func:`projection_tolerance`: the cheap
  check of a ``fedavg`` slice result ``R_k`` against every input's published projection
  ``⟨z_k, g_i[k]⟩``.

Rules that cannot be sliced: Krum, Multi-Krum and Bulyan score whole vectors (pairwise
distances over all ``d`` coordinates), so a slice of them is not a slice of the whole result;
:func:`can_slice` is ``False`` for them and the round falls back to all-to-all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from ..._types import FloatArray
from ...errors import InvalidGradient
from ...formats.sliced.slices import split_slice_rule
from ...storage.dag import plan_chunks
from ...tensor.deterministic import deterministic_update, partial_update
from ...tensor.robust import coordinate_median, trimmed_mean
from .config import Rotation

__all__ = [
    "MIN_SLICE_VALUES",
    "UNSLICEABLE_RULES",
    "can_slice",
    "chain_groups",
    "chain_senders",
    "chain_sum",
    "plan_slices",
    "projection",
    "projection_seed",
    "projection_tolerance",
    "projection_vector",
    "reduce_values",
    "reducer_ranking",
    "reducer_rankings",
    "slice_refusal",
]

MIN_SLICE_VALUES: Final = 4096
"""Smallest slice worth a reducer (16 KiB): below ``n ·`` this, rounds go all-to-all."""
UNSLICEABLE_RULES: Final = frozenset({"krum", "multikrum", "multi_krum", "bulyan"})
"""Rules that need whole vectors (pairwise distances over every coordinate)."""


def can_slice(rule: str, d: int, n: int) -> bool:
    """Return whether a round of ``n`` peers on ``d`` values with ``rule`` runs reduce-scatter."""
    return slice_refusal(rule, d, n) is None


def slice_refusal(rule: str, d: int, n: int) -> str | None:
    """Return why :func:`can_slice` is ``False`` (``None`` when it is ``True``)."""
    if split_slice_rule(rule) is None:
        name = rule.partition(":")[0].partition("(")[0].strip().lower()
        if name in UNSLICEABLE_RULES:
            return f"rule {rule!r:.60} needs whole vectors (pairwise distances)"
        return f"rule {rule!r:.60} is not a coordinate-wise slice rule"
    if n < 2:
        return f"{n} peer(s): nothing to scatter"
    if d < n * MIN_SLICE_VALUES:
        return f"d = {d} < {n} peers x {MIN_SLICE_VALUES} values: too small to slice"
    return None


def plan_slices(d: int, n: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """Return ``n`` contiguous ``(offset, length)`` slices covering ``0 … d``.

    Parameters
    ----------
    d
        Values of the gradient.
    n
        Slices (roster size), ``1 ≤ n ≤ d``.
    chunk_bytes
        The contributions' chunk size; boundaries follow its grid when it has ``≥ n`` chunks.

    Raises
    ------
    InvalidGradient
        If ``n`` is not in ``1 … d``.
    """
    if not 1 <= n <= d:
        raise InvalidGradient(f"cannot cut {d} values into {n} slices")
    chunks = plan_chunks(d, chunk_bytes)
    if len(chunks) >= n:
        # Chunk j goes to slice floor(j·n/C): contiguous groups of ⌊C/n⌋ or ⌈C/n⌉ chunks.
        bounds = [0] * (n + 1)
        for j, (offset, _) in enumerate(chunks):
            s = j * n // len(chunks)
            if j == 0 or s != (j - 1) * n // len(chunks):
                bounds[s] = offset
        bounds[n] = d
        return [(bounds[s], bounds[s + 1] - bounds[s]) for s in range(n)]
    edges = [s * d // n for s in range(n + 1)]
    return [(edges[s], edges[s + 1] - edges[s]) for s in range(n)]


def reducer_ranking(roster: bytes, k: int, peers: Sequence[str]) -> list[str]:
    """Return the reducers of slice ``k``, best first: a rotation of one hashed peer order.

    Peers are ordered by ``sha256(roster ‖ peer)`` (``roster`` is the roster CID's bytes), and
    slice ``k`` ranks them from position ``k mod N`` on. Every peer computes the same order, the
    roster CID makes it unpredictable before the roster exists, and each peer is rank ``r`` of
    exactly one slice — per-slice rendezvous scores would give some peers two or three slices
    (each ``(N−1)/N·d`` more to download) and others none.
    """
    order = _reducer_order(roster, peers)
    start = k % len(order) if order else 0
    return order[start:] + order[:start]


def reducer_rankings(roster: bytes, n: int, peers: Sequence[str]) -> list[Rotation]:
    """Return :func:`reducer_ranking` of slices ``0 … n−1``, hashing each peer once, not n times.

    Each is a :class:`~.config.Rotation` of one shared order (O(1) each, not O(N)).
    """
    order = tuple(_reducer_order(roster, peers))
    positions = {peer: i for i, peer in enumerate(order)}
    return [Rotation(order, positions, k) for k in range(n)]


def _reducer_order(roster: bytes, peers: Sequence[str]) -> list[str]:
    def score(peer: str) -> bytes:
        return hashlib.sha256(b"gradfed/reducer\0" + roster + peer.encode()).digest()

    return sorted(peers, key=score)


def chain_groups(n: int) -> int:
    """Return the default ``G`` of a chained round of ``n`` peers (1: no chain, one level).

    The largest power of two ``≤ √n`` that leaves ``S = ⌈n/G⌉ ≥ 5`` slices: ``S·G ≥ n``
    steps, about one per peer, and a peer downloads about ``d + 2·d/S + d ≤ 2.4·d`` values
    (the partial sum is float64). Powers of two keep ``S·G = n`` for rosters of 2^m peers:
    G = 2 from 10 peers, 4 from 32, 8 from 64, 16 from 256.
    """
    groups = 1
    while (2 * groups) ** 2 <= n and n >= 5 * 2 * groups:
        groups *= 2
    return groups


def chain_senders(peers: Sequence[str], groups: int) -> list[frozenset[str]]:
    """Return the ``groups`` runs of consecutive roster peers a chained slice adds in turn."""
    n = len(peers)
    return [frozenset(peers[j * n // groups : (j + 1) * n // groups]) for j in range(groups)]


def chain_sum(
    prev: np.ndarray | None,
    rows: Sequence[FloatArray],
    weights: Sequence[int],
    weight_sum: int,
    length: int,
) -> np.ndarray:
    """Return ``prev + Σ (w_i / weight_sum) · float64(row_i)`` in order (float64, ``length``).

    ``prev`` ``None`` starts at +0.0, as :func:`deterministic_update` does; a step whose
    senders are all missing passes ``prev`` on.
    """
    if prev is None and not rows:
        return np.zeros(length, np.float64)
    if prev is not None and not rows:
        return prev
    return partial_update(prev, rows, [int(w) / weight_sum for w in weights])


def reduce_values(
    rule: str,
    base: FloatArray,
    rows: Sequence[FloatArray],
    weights: Sequence[int],
    learning_rate: float,
) -> FloatArray:
    """Return the slice result ``float32(base + lr · rule(rows))``, bit-reproducible.

    ``fedavg`` is the weighted mean (:func:`deterministic_update`); ``median`` and
    ``trimmed_mean:<beta>`` the unweighted coordinate-wise
    :func:`~gradfed_ipfs.tensor.robust.coordinate_median` and
    :func:`~gradfed_ipfs.tensor.robust.trimmed_mean` (float32, the package's one formula each),
    widened to float64 for the update. Each is coordinate-wise: slices of the result are the
    results of the slices, bit for bit.

    Raises
    ------
    InvalidGradient
        If ``rule`` is unknown.
    """
    parsed = split_slice_rule(rule)
    if parsed is None:
        raise InvalidGradient(f"rule {rule!r:.60} cannot be reduced per slice")
    name, beta = parsed
    if name == "fedavg":
        return deterministic_update(base, rows, weights, learning_rate)
    if name == "median":
        middle = coordinate_median(rows).astype(np.float64)
    else:
        middle = trimmed_mean(rows, beta).astype(np.float64)
    return np.asarray(base.astype(np.float64) + float(learning_rate) * middle, np.float32)


def projection_seed(record_cids: Sequence[bytes]) -> bytes:
    """Return the projection seed: sha256 over every slice-record CID, in slice order.

    It is fixed only once every reducer has committed, so no reducer can aim a lie at it.
    """
    digest = hashlib.sha256(b"gradfed/projection\0")
    for cid in record_cids:
        digest.update(len(cid).to_bytes(2, "big") + cid)
    return digest.digest()


def projection_vector(seed: bytes, k: int, length: int) -> NDArray[np.float64]:
    """Return ``z_k``: ``length`` float64 values uniform on [-1, 1) from ``(seed, k)``.

    Any continuous distribution catches a lie ``e ≠ 0`` the liar could not aim at ``z``:
    ``⟨z, e⟩`` has a density, so it falls inside the honest tolerance with probability
    ~tolerance / ‖e‖. Uniform values cost 2.7 ms per million against 12.6 for standard-normal
    ones, and every peer draws ``d`` of them per round (``bench_load.py``: ~10 % of a sliced
    round's CPU with normals).
    """
    rng = np.random.default_rng(
        int.from_bytes(hashlib.sha256(seed + k.to_bytes(8, "big")).digest())
    )
    z: NDArray[np.float64] = rng.random(length)
    z *= 2.0
    z -= 1.0
    return z


def projection(z: NDArray[np.float64], values: FloatArray) -> float:
    """Return ``⟨z, values⟩`` in float64 (``values`` of z's length, any float dtype).

    Not BLAS: a peer takes ~3N dot products of ``d/N`` values per round, and a multi-threaded
    BLAS wakes its threads for each, which then spin on a busy machine (``bench_load.py`` at
    N = 64: holding OpenBLAS to one thread cut the process's CPU from 30.6 to 21.3 s).
    ``einsum`` runs on the calling thread.
    """
    return float(np.einsum("i,i->", z, values.astype(np.float64, copy=False)))


def projection_tolerance(z: NDArray[np.float64], result: FloatArray, base: FloatArray) -> float:
    """Return the largest honest ``|⟨z, R⟩ − expected|``: float32 rounding plus float64 slack.

    Each value of ``R`` is rounded once to float32 (relative error ≤ 2⁻²⁴); the bound doubles
    that and adds a float64 term for the sums.
    """
    magnitude = np.abs(result.astype(np.float64)) + np.abs(base.astype(np.float64))
    return 2.0**-22 * projection(np.abs(z), magnitude) + 1e-9
