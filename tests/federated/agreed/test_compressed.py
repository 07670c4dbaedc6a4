"""Compressed contributions in agreed rounds: every encoding, both aggregations, one model CID."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.block import Block
from gradfed_ipfs.errors import ConfigError, QuorumNotReached, RoundVerificationFailed
from gradfed_ipfs.federated.agreed.finished import check_finished_round
from gradfed_ipfs.federated.exchange import encode_gradient
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, AgreedRecord
from gradfed_ipfs.formats.manifest import ChunkManifest
from gradfed_ipfs.formats.packed import PACKED_HEADER_BYTES
from gradfed_ipfs.kubo import MemoryPubsubBus
from gradfed_ipfs.storage import MemoryBlockStore, fetch_gradient
from gradfed_ipfs.tensor import (
    Codec,
    Dense,
    Int2,
    Int4,
    Int8,
    RandomK,
    TopK,
    TopKInt2,
    TopKInt8,
)
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.helpers import MEMORY_KEYS, signed

PEERS = ("peer-a", "peer-b", "peer-c", "peer-d")
CHUNK = 65_536
D = 40_000  # 3 chunks of 64 KiB (16 320 values each): chunk-aligned slices
FAST = {
    "collect_timeout": 1.0,
    "takeover_timeout": 0.5,
    "round_timeout": 15.0,
    "done_timeout": 1.0,
    "announce_interval": 0.02,
    "fetch_timeout": 2.0,
    "reducer_timeout": 0.3,
    "chunk_bytes": CHUNK,
    "learning_rate": 0.5,
}
CODECS: list[Codec] = [
    Int8(),
    Int8(clip_sigmas=3.0, block=256),
    Int4(block=512),
    Int2(block=128),
    TopK(ratio=0.05),
    TopKInt8(ratio=0.05),
    TopKInt2(ratio=0.02, block=64),
]


def initial_model(d: int = D) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(d).astype(np.float32)


def gradient(peer: int, round_number: int, d: int = D) -> np.ndarray:
    return (0.1 * np.random.default_rng([peer, round_number]).standard_normal(d)).astype(np.float32)


async def run_session(
    store: MemoryBlockStore,
    peers: Sequence[str],
    rounds: int,
    d: int = D,
    **settings: object,
) -> tuple[list[list[AgreedRoundResult]], list[AgreedSession], object]:
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model(d))
    config = AgreedConfig(members=tuple(peers), **{**FAST, **settings})  # type: ignore[arg-type]
    sessions = [AgreedSession(store, bus.endpoint(p), "c", genesis, config) for p in peers]  # type: ignore[arg-type]
    for session in sessions:
        await session.start(initial_model(d))
    results = []
    try:
        for r in range(rounds):
            results.append(
                list(
                    await asyncio.gather(
                        *(
                            s.run_round(gradient(i, r, d), weight=1 + i)
                            for i, s in enumerate(sessions)
                        )
                    )
                )
            )
    finally:
        for session in sessions:
            await session.aclose()
    return results, sessions, genesis


@pytest.mark.parametrize("aggregation", ["all-to-all", "reduce-scatter"])
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.packing().label)
async def test_every_encoding_ends_on_one_model_cid(codec: Codec, aggregation: str) -> None:
    async with MemoryBlockStore() as store:
        results, sessions, genesis = await run_session(
            store, PEERS, 2, compression=codec, aggregation=aggregation
        )
        for r, round_results in enumerate(results):
            assert {res.aggregation for res in round_results} == {aggregation}
            assert len({res.model for res in round_results}) == 1, r
            assert len({res.record for res in round_results}) == 1, r
            assert all(res.roster.peers == PEERS for res in round_results)
        record = AgreedRecord.from_block(await store.get(results[-1][0].record))
        assert record.encoding == codec.packing().label
        records = await verify_agreed_history(
            store,
            results[-1][0].record,
            keys=MEMORY_KEYS,
            session="c",
            genesis=genesis,  # type: ignore[arg-type]
        )
        assert [rec.round for rec in records] == [0, 1]
        assert len({bytes(s.model.tobytes()) for s in sessions}) == 1


async def test_chained_reduce_scatter_with_top_k_int2_equals_all_to_all() -> None:
    codec = TopKInt2(ratio=0.05)
    models = {}
    for mode, extra in (("all-to-all", {}), ("chained", {"chained": True, "chain_groups": 2})):
        aggregation = "all-to-all" if mode == "all-to-all" else "reduce-scatter"
        async with MemoryBlockStore() as store:
            results, _, genesis = await run_session(
                store, PEERS, 2, compression=codec, aggregation=aggregation, **extra
            )
            assert all(len({res.model for res in rr}) == 1 for rr in results)
            await verify_agreed_history(
                store,
                results[-1][0].record,
                keys=MEMORY_KEYS,
                session="c",
                genesis=genesis,  # type: ignore[arg-type]
            )
        models[mode] = [rr[0].model for rr in results]
    assert models["chained"] == models["all-to-all"]  # the same bits either way


@pytest.mark.parametrize("aggregation", ["all-to-all", "reduce-scatter"])
async def test_the_model_is_the_update_of_the_decoded_contributions(aggregation: str) -> None:
    codec = Int4()
    async with MemoryBlockStore() as store:
        results, sessions, _ = await run_session(
            store, PEERS, 1, compression=codec, aggregation=aggregation
        )
        entries = results[0][0].roster.entries
        decoded = [
            await fetch_gradient(store, e.contribution, expected_length=D, packing=codec.packing())
            for e in entries
        ]
        want = deterministic_update(
            initial_model(), decoded, [e.weight for e in entries], FAST["learning_rate"]
        )
        assert sessions[0].model.tobytes() == want.tobytes()
        # The contributions are 4-bit: about d/2 bytes each, plus scales, framing and manifest.
        sent = [res.sent_bytes for res in results[0]]
        assert all(D // 2 < s < D // 2 + 4 * (D // 1024 + 1) + 3 * 200 + 400 for s in sent)


async def test_dense_sessions_keep_their_records_and_report_sent_bytes() -> None:
    async with MemoryBlockStore() as store:
        results, _, _ = await run_session(store, PEERS, 1)
        record = AgreedRecord.from_block(await store.get(results[0][0].record))
        assert record.encoding is None
        assert b"encoding" not in (await store.get(results[0][0].record)).data
        assert all(4 * D < res.sent_bytes < 4 * D + 3 * 4096 + 400 for res in results[0])


def test_config_takes_only_codecs_with_a_packed_form() -> None:
    for codec in (Dense(), RandomK()):
        with pytest.raises(ConfigError, match="no packed form"):
            AgreedConfig(PEERS, compression=codec)
    with pytest.raises(Exception, match="error_decay"):
        AgreedConfig(PEERS, compression=Int8(), error_decay=1.5)
    config = AgreedConfig(PEERS, compression=Int8(block=256), exact_tail=3)
    assert config.packing is not None
    assert config.packing.label == "int8/256+3"
    assert AgreedConfig(PEERS).packing is None


@pytest.mark.parametrize("aggregation", ["all-to-all", "reduce-scatter"])
async def test_error_feedback_sent_plus_residual_is_the_sum_of_updates(aggregation: str) -> None:
    # Σ_t sent_t + r_R = Σ_t g_t exactly but for float32 rounding: each round rounds
    # corrected = g + r and r' = corrected - sent once each, so the gap is at most
    # Σ_t ulp/2·(|corrected_t| + |r_t|) element-wise (checked with that bound, eps·x/2).
    rounds, codec = 4, TopKInt2(ratio=0.02)
    eps = float(np.finfo(np.float32).eps)
    async with MemoryBlockStore() as store:
        bus = MemoryPubsubBus()
        genesis = await AgreedSession.commit_genesis(store, initial_model())
        config = AgreedConfig(  # type: ignore[arg-type]
            members=PEERS, compression=codec, aggregation=aggregation, **FAST
        )
        sessions = [AgreedSession(store, bus.endpoint(p), "c", genesis, config) for p in PEERS]
        for session in sessions:
            await session.start(initial_model())
        sent = np.zeros((len(PEERS), D))
        updates = np.zeros((len(PEERS), D))
        bound = np.zeros((len(PEERS), D))
        try:
            for r in range(rounds):
                residuals = [s.residual for s in sessions]
                results = await asyncio.gather(
                    *(s.run_round(gradient(i, r)) for i, s in enumerate(sessions))
                )
                for i, (res, before) in enumerate(zip(results, residuals, strict=True)):
                    g = gradient(i, r)
                    corrected = g if before is None else g + before
                    (entry,) = [e for e in res.roster.entries if e.peer == PEERS[i]]
                    values = await fetch_gradient(
                        store, entry.contribution, expected_length=D, packing=codec.packing()
                    )
                    sent[i] += values
                    updates[i] += g
                    after = sessions[i].residual
                    assert after is not None
                    bound[i] += eps / 2 * (np.abs(corrected) + np.abs(after))
                assert len({res.model for res in results}) == 1
        finally:
            for session in sessions:
                await session.aclose()
        for i, session in enumerate(sessions):
            residual = session.residual
            assert residual is not None
            gap = np.abs(sent[i] + residual - updates[i])
            assert (gap <= bound[i]).all()
            assert np.abs(residual).max() > 0.1  # top-2 % with 2 bits leaves a lot unsent


async def test_error_feedback_off_sends_the_update_alone() -> None:
    async with MemoryBlockStore() as store:
        _, sessions, _ = await run_session(
            store, PEERS[:2], 2, compression=Int8(), error_feedback=False
        )
        assert all(s.residual is None for s in sessions)


async def test_a_contribution_of_another_encoding_is_refused_like_a_corrupt_one() -> None:
    # A member whose config differs (Int4 in an Int8 session): the others refuse its blocks
    # and agree without it; it cannot verify theirs either and adopts no roster.
    async with MemoryBlockStore() as store:
        bus = MemoryPubsubBus()
        genesis = await AgreedSession.commit_genesis(store, initial_model())
        common = {**FAST, "min_peers": 2}
        configs = {p: AgreedConfig(PEERS[:3], compression=Int8(), **common) for p in PEERS[:2]}  # type: ignore[arg-type]
        odd = {**common, "round_timeout": 3.0}
        configs[PEERS[2]] = AgreedConfig(PEERS[:3], compression=Int4(), **odd)  # type: ignore[arg-type]
        sessions = [
            AgreedSession(store, bus.endpoint(p), "c", genesis, configs[p]) for p in PEERS[:3]
        ]
        for session in sessions:
            await session.start(initial_model())
        try:
            results = await asyncio.gather(
                *(s.run_round(gradient(i, 0)) for i, s in enumerate(sessions)),
                return_exceptions=True,
            )
        finally:
            for session in sessions:
                await session.aclose()
        honest = [res for res in results[:2] if isinstance(res, AgreedRoundResult)]
        assert len(honest) == 2
        assert honest[0].model == honest[1].model
        for res in honest:
            assert res.roster.peers == PEERS[:2]
            assert "int4/1024" in res.rejected[PEERS[2]]
        assert isinstance(results[2], QuorumNotReached)
        assert sessions[2].residual is None  # a failed round changes nothing


async def test_a_round_that_leaves_a_peer_out_carries_all_of_its_update() -> None:
    # Two peers close round 0 without the third, which contributes late and adopts their
    # roster: nothing of its update was applied, so its residual is all of it.
    async with MemoryBlockStore() as store:
        bus = MemoryPubsubBus()
        genesis = await AgreedSession.commit_genesis(store, initial_model())
        config = AgreedConfig(PEERS[:3], compression=Int8(), **{**FAST, "min_peers": 2})  # type: ignore[arg-type]
        sessions = [AgreedSession(store, bus.endpoint(p), "c", genesis, config) for p in PEERS[:3]]
        for session in sessions:
            await session.start(initial_model())
        try:
            early = await asyncio.gather(
                *(s.run_round(gradient(i, 0)) for i, s in enumerate(sessions[:2]))
            )
            late = await sessions[2].run_round(gradient(2, 0))
        finally:
            for session in sessions:
                await session.aclose()
        assert late.record == early[0].record
        assert not late.included
        residual = sessions[2].residual
        assert residual is not None
        assert residual.tobytes() == gradient(2, 0).tobytes()
        included = sessions[0].residual
        assert included is not None
        assert 0 < np.abs(included).max() < 0.01


def nan_scale(data: bytes) -> bytes:
    """A packed int8 block whose first scale is NaN (header and size still right)."""
    at = PACKED_HEADER_BYTES
    return data[:at] + struct.pack("<f", float("nan")) + data[at + 4 :]


def too_many_entries(data: bytes) -> bytes:
    """A packed sparse block claiming one entry more than its chunk has values."""
    fields = list(struct.unpack_from("<4sBBHIQQQQQ", data))
    fields[7] = fields[6] + 1  # stored = length + 1
    return struct.pack("<4sBBHIQQQQQ", *fields) + data[PACKED_HEADER_BYTES:]


def repeated_index(data: bytes) -> bytes:
    """A packed sparse block whose second index delta is 0 (a repeated index)."""
    at = PACKED_HEADER_BYTES
    first = next(i for i in range(at, len(data)) if data[i] < 0x80)  # end of the first varint
    return data[: first + 1] + b"\0" + data[first + 2 :]


async def hostile_round(
    codec: Codec, corrupt: Callable[[bytes], bytes], aggregation: str, d: int
) -> tuple[list[AgreedRoundResult], MemoryBlockStore, object]:
    """Three honest peers and one that announces a contribution with one corrupted block."""
    store = MemoryBlockStore()
    bus = MemoryPubsubBus()
    genesis = await AgreedSession.commit_genesis(store, initial_model(d))
    config = AgreedConfig(  # type: ignore[arg-type]
        PEERS, compression=codec, aggregation=aggregation, **{**FAST, "min_peers": 3}
    )
    honest = [AgreedSession(store, bus.endpoint(p), "c", genesis, config) for p in PEERS[:3]]
    for session in honest:
        await session.start(initial_model(d))
    encoded = await encode_gradient(gradient(3, 0, d), chunk_bytes=CHUNK, compression=codec)
    *chunks, (root, _) = encoded.blocks
    if chunks:  # corrupt the first chunk and re-link it from the manifest
        bad = Block.new(corrupt(chunks[0][0].data))
        manifest = ChunkManifest.decode(root.data)
        first = dataclasses.replace(manifest.chunks[0], cid=bad.cid)
        root = dataclasses.replace(manifest, chunks=(first, *manifest.chunks[1:])).to_block()
        for block, _ in chunks[1:]:
            await store.put(block)
        await store.put(bad)
    else:
        root = Block.new(corrupt(root.data))
    await store.put(root)
    message = AgreedMessage("contrib", "c", genesis, 0, PEERS[3], root.cid, base=genesis, weight=1)  # type: ignore[arg-type]
    await bus.endpoint(PEERS[3]).publish(honest[0].topic, await signed(message, bus))
    try:
        results = await asyncio.gather(
            *(s.run_round(gradient(i, 0, d)) for i, s in enumerate(honest))
        )
    finally:
        for session in honest:
            await session.aclose()
    return list(results), store, genesis


@pytest.mark.parametrize(
    ("codec", "corrupt", "reason"),
    [
        (Int8(), nan_scale, "a scale is not a finite value"),
        (TopK(ratio=0.05), too_many_entries, "claims 1001 stored"),
        (TopK(ratio=0.05), repeated_index, "indices are repeated"),
    ],
    ids=["int8-nan-scale", "topk-more-entries-than-values", "topk-repeated-index"],
)
async def test_a_malformed_block_rejects_that_peer_not_the_round(
    codec: Codec, corrupt: Callable[[bytes], bytes], reason: str
) -> None:
    results, store, genesis = await hostile_round(codec, corrupt, "all-to-all", 1000)
    async with store:
        assert len({res.model for res in results}) == 1
        for res in results:
            assert res.roster.peers == PEERS[:3]
            assert reason in res.rejected[PEERS[3]]
        await verify_agreed_history(
            store, results[0].record, keys=MEMORY_KEYS, session="c", genesis=genesis
        )  # type: ignore[arg-type]


async def test_a_malformed_chunk_in_reduce_scatter_makes_its_sender_missing() -> None:
    results, store, genesis = await hostile_round(Int8(), nan_scale, "reduce-scatter", D)
    async with store:
        assert len({res.model for res in results}) == 1
        for res in results:
            assert res.aggregation == "reduce-scatter"
            # Listed (its root is a manifest of d values), then missing from every slice.
            assert PEERS[3] in res.roster.peers
            assert res.missing == (PEERS[3],)
        await verify_agreed_history(
            store, results[0].record, keys=MEMORY_KEYS, session="c", genesis=genesis
        )  # type: ignore[arg-type]


async def test_a_finished_sliced_record_of_another_encoding_is_not_adopted() -> None:
    codec = Int8()
    async with MemoryBlockStore() as store:
        results, _, _ = await run_session(
            store, PEERS, 1, compression=codec, aggregation="reduce-scatter"
        )
        first = results[0][0]
        check = partial(check_finished_round, store, first.record, first.roster, first.roster_cid)
        finished = await check(prev=None, encoding=codec.packing().label)
        assert finished.records == first.slices
        for other in (None, "int4/1024"):  # a peer of a dense or an int4 session refuses it
            with pytest.raises(RoundVerificationFailed, match="not a sliced record"):
                await check(prev=None, encoding=other)
