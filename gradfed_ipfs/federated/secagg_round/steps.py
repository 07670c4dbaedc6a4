"""The fetch-and-decode steps of a SecAgg round over IPFS (see :mod:`.secagg`).

Each step waits on a party's :class:`~gradfed_ipfs.federated.secagg.wire.SecAggChannel` for
some announcements, fetches their blocks through the party's store and decodes them. Where the
protocol allows, a block that is missing, malformed or does not decrypt leaves its sender out
(noted in ``rejected``) instead of failing the round; timeouts are seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection, Mapping
from typing import TypeVar

from multiformats import CID

from ...errors import BlockStoreError, DecodeError, SecAggPeerRejected, SecureAggregationError
from ..secagg.blocks import decode_masked_block
from ..secagg.codec import (
    answer_from_json,
    bundle_from_json,
    keys_from_json,
    server_key_from_json,
    unpack_masked,
    view_from_json,
)
from ..secagg.protocol import (
    AdvertisedKeys,
    EncryptedShare,
    SecAggServer,
    SignedView,
    UnmaskingShares,
)
from ..secagg.wire import SecAggChannel

__all__ = [
    "collect_answers",
    "collect_masked",
    "fetch_bundles",
    "fetch_roster",
    "fetch_server_key",
    "fetch_views",
    "gather_all",
    "replay_masked",
    "require_all",
]

logger = logging.getLogger("gradfed_ipfs.federated")

_T = TypeVar("_T")


async def gather_all(jobs: Mapping[str, Awaitable[_T]]) -> dict[str, _T | BaseException]:
    """Await every job; return name → result or the exception it raised."""
    results = await asyncio.gather(*jobs.values(), return_exceptions=True)
    return dict(zip(jobs, results, strict=True))


async def require_all(
    ch: SecAggChannel, clients: Collection[str], kind: str, timeout: float
) -> dict[str, bytes]:
    """Wait for ``kind`` from every client and fetch each block (any gap fails the round)."""
    wanted = set(clients)
    if not await ch.wait(lambda: wanted <= ch.senders(kind), timeout):
        missing = sorted(wanted - ch.senders(kind))
        raise SecureAggregationError(f"no {kind!r} message from {missing} in time")
    fetched = await gather_all({c: ch.fetch(kind, c) for c in sorted(wanted)})
    out = {}
    for c, data in fetched.items():
        if isinstance(data, BaseException):
            raise SecureAggregationError(f"{kind!r} block of {c} unavailable: {data}")
        out[c] = data
    return out


async def fetch_roster(
    ch: SecAggChannel, clients: Collection[str], timeout: float
) -> dict[str, AdvertisedKeys]:
    """Fetch every client's ``keys``; a malformed one fails the round, naming the client."""
    roster = {}
    for c, data in (await require_all(ch, clients, "keys", timeout)).items():
        try:
            roster[c] = keys_from_json(data, c)
        except DecodeError as exc:
            raise SecAggPeerRejected(c, f"keys malformed: {exc}") from exc
    return roster


async def fetch_bundles(
    ch: SecAggChannel, clients: Collection[str], timeout: float
) -> tuple[list[EncryptedShare], set[str], dict[str, str]]:
    """Fetch every share bundle: (ciphertexts, sharers, malformed sender → reason).

    A bundle that does not decode, or lacks a ciphertext for some other client of the round
    (incomplete), is the same bytes for every party, so every party leaves its sender out of
    the sharers (a dropout before masking: no pairwise masks with it, nothing to unmask).
    """
    out: list[EncryptedShare] = []
    sharers, bad = set(), {}
    for c, data in (await require_all(ch, clients, "shares", timeout)).items():
        try:
            bundle = bundle_from_json(data, c)
            missing = set(clients) - {c} - {m.recipient for m in bundle}
            if missing:
                raise DecodeError(f"no share for {sorted(missing)[:3]} ({len(missing)} clients)")
            out += bundle
            sharers.add(c)
        except DecodeError as exc:
            bad[c] = f"share bundle malformed: {exc}"
            logger.info("secagg: share bundle of %s rejected: %s", c, exc)
    return out, sharers, bad


async def fetch_server_key(ch: SecAggChannel, aggregator: str, timeout: float) -> bytes:
    """Fetch the aggregator's X25519 ``server-key`` (32 raw bytes)."""
    if not await ch.wait(lambda: ("server-key", aggregator) in ch.inbox, timeout):
        raise SecureAggregationError("no server key from the aggregator in time")
    try:
        return server_key_from_json(await ch.fetch("server-key", aggregator))
    except (DecodeError, BlockStoreError) as exc:
        raise SecureAggregationError(f"server key unusable: {exc}") from exc


async def fetch_views(
    ch: SecAggChannel, clients: Collection[str], survivors: Collection[str], timeout: float
) -> list[SignedView]:
    """Wait for every survivor's ``view``; return every client's view that decodes."""
    alive = set(survivors)
    await ch.wait(lambda: alive <= ch.senders("view"), timeout)
    posted = sorted(ch.senders("view") & set(clients))
    views = []
    for c, data in (await gather_all({c: ch.fetch("view", c) for c in posted})).items():
        try:
            if isinstance(data, BaseException):
                raise DecodeError(str(data))
            views.append(view_from_json(data, c))
        except DecodeError as exc:
            logger.info("secagg: view of %s unusable: %s", c, exc)
    return views


async def collect_masked(
    ch: SecAggChannel,
    server: SecAggServer,
    *,
    ring_bits: int,
    length: int,
    timeout: float,
    rejected: dict[str, str],
) -> dict[str, CID]:
    """Fetch, unseal and add every sharer's masked vector; return client → its block's CID.

    A block that is missing, does not unseal or decode drops its client; so does a client
    another client reported (:meth:`SecAggServer.unmask_request` leaves it out).
    """
    sharers = server.sharers
    await ch.wait(lambda: sharers <= ch.senders("masked"), timeout)
    announced = sorted(ch.senders("masked") & sharers)
    cids = {}
    for c, data in (await gather_all({c: ch.fetch("masked", c) for c in announced})).items():
        try:
            if isinstance(data, BaseException):
                raise DecodeError(f"unavailable: {data}")
            reported, block = unpack_masked(server.open_from(c, "masked", data))
            vector = decode_masked_block(block, ring_bits=ring_bits, expected_length=length)
        except (DecodeError, SecAggPeerRejected) as exc:
            rejected[c] = f"masked vector: {exc}"
            logger.info("secagg: masked block of %s rejected: %s", c, exc)
            continue
        server.receive_masked(c, vector, reported)
        cids[c] = ch.inbox[("masked", c)]
    for c, accused in server.complaints.items():
        for u in sorted(accused):
            rejected.setdefault(u, f"its shares for {c} were unusable")
    return cids


async def replay_masked(
    ch: SecAggChannel,
    server: SecAggServer,
    survivors: Collection[str],
    *,
    ring_bits: int,
    length: int,
    timeout: float,
) -> None:
    """Add every survivor's masked vector to ``server`` (a client re-running the aggregator).

    The blocks are the ones the survivors themselves announced to this peer, so an aggregator
    cannot substitute one. All or nothing: a survivor's block that is missing or does not unseal
    or decode raises :class:`~gradfed_ipfs.errors.SecureAggregationError`.
    """
    alive = set(survivors)
    if not await ch.wait(lambda: alive <= ch.senders("masked"), timeout):
        raise SecureAggregationError(f"no masked block of {sorted(alive - ch.senders('masked'))}")
    fetched = await gather_all({c: ch.fetch("masked", c) for c in sorted(alive)})
    for c, data in fetched.items():
        try:
            if isinstance(data, BaseException):
                raise DecodeError(f"unavailable: {data}")
            reported, block = unpack_masked(server.open_from(c, "masked", data))
            vector = decode_masked_block(block, ring_bits=ring_bits, expected_length=length)
        except (DecodeError, SecAggPeerRejected) as exc:
            raise SecureAggregationError(f"masked block of {c} unusable: {exc}") from exc
        server.receive_masked(c, vector, reported)


async def collect_answers(
    ch: SecAggChannel,
    server: SecAggServer,
    survivors: Collection[str],
    *,
    timeout: float,
    rejected: dict[str, str],
) -> list[UnmaskingShares]:
    """Fetch and unseal the survivors' unmasking answers; a bad one is left out."""
    alive = set(survivors)
    await ch.wait(lambda: alive <= ch.senders("unmask-response"), timeout)
    responders = sorted(ch.senders("unmask-response") & alive)
    answers = []
    fetched = await gather_all({c: ch.fetch("unmask-response", c) for c in responders})
    for c, data in fetched.items():
        try:
            if isinstance(data, BaseException):
                raise DecodeError(f"unavailable: {data}")
            answers.append(answer_from_json(server.open_from(c, "unmask-response", data), c))
        except (DecodeError, SecAggPeerRejected) as exc:
            rejected[c] = f"unmasking answer: {exc}"
            logger.info("secagg: unmasking answer of %s rejected: %s", c, exc)
    return answers
