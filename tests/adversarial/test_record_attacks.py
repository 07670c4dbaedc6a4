"""Issue 15, records that cannot be forged: duplicate peers, unaggregated gradients, DP claims.

Also ``verify_round`` on a record whose contribution is a 70 KB manifest linking one 2 MiB
chunk N times: it reports, and a child with ``RLIMIT_AS`` shows it allocates no GBs.
"""

from __future__ import annotations

import dag_cbor
import numpy as np
import pytest

from gradfed_ipfs import put_gradient
from gradfed_ipfs.errors import MalformedManifest
from gradfed_ipfs.provenance.round_dp import dp_privacy_claim
from gradfed_ipfs.provenance.round_record import (
    ROUND_RECORD_TYPE,
    ContributionRef,
    RoundRecord,
    verify_round,
)
from gradfed_ipfs.storage import Block, MemoryBlockStore
from gradfed_ipfs.tensor import Mean, SampleWeightedMean, clip_to_norm

from .child import run_limited

D = 4096
CLIP = 1.0


def record_ipld(contributions: list[tuple[str, object]], aggregate: object) -> dict[str, object]:
    return {
        "type": ROUND_RECORD_TYPE,
        "version": 1,
        "session": "s",
        "round": 0,
        "contributions": [{"peer": p, "gradient": c, "weight": 1} for p, c in contributions],
        "aggregation": {"method": "FedAvg", "params": {}},
        "compression": {},
        "privacy": {},
        "aggregate": aggregate,
        "previous": None,
        "timestamp_ms": 0,
    }


# --------------------------------------------------------------------------- duplicate peers


async def test_record_listing_a_peer_twice_is_refused_and_reported() -> None:
    store = MemoryBlockStore()
    honest = await put_gradient(store, np.full(8, 1.0, np.float32))
    attacker = await put_gradient(store, np.full(8, 9.0, np.float32))
    # The aggregate is the attacker's alone, but the record also lists the honest gradient
    # under the attacker's name: keyed by peer, verification used to see one input and agree.
    raw = record_ipld([("mallory", honest), ("mallory", attacker)], attacker)
    with pytest.raises(MalformedManifest, match="appears twice"):
        RoundRecord.from_ipld(raw)
    cid = await store.put(Block.new(dag_cbor.encode(raw), "dag-cbor"))
    result = await verify_round(cid, store)
    assert not result.ok
    assert "appears twice" in result.status


async def test_record_listing_an_unaggregated_gradient_does_not_verify() -> None:
    store = MemoryBlockStore()
    a = await put_gradient(store, np.full(8, 1.0, np.float32))
    b = await put_gradient(store, np.full(8, 3.0, np.float32))
    only_b = await put_gradient(store, np.full(8, 3.0, np.float32))
    record = RoundRecord(
        "s",
        0,
        [ContributionRef("a", str(a), 1), ContributionRef("b", str(b), 1)],
        SampleWeightedMean(),
        str(only_b),
    )
    result = await verify_round(await record.commit(store), store)
    assert not result.ok
    assert result.status.startswith("mismatch")


# --------------------------------------------------------------------------- DP claims


async def dp_round(
    noise: np.ndarray, privacy: dict[str, object] | None = None
) -> tuple[MemoryBlockStore, RoundRecord]:
    """Two contributions (norms above CLIP), the recorded aggregate = clipped mean + ``noise``."""
    rng = np.random.default_rng(15)
    grads = [rng.standard_normal(D).astype(np.float32) for _ in range(2)]
    store = MemoryBlockStore()
    refs = [
        ContributionRef(p, str(await put_gradient(store, g)), 1)
        for p, g in zip("ab", grads, strict=True)
    ]
    clipped_mean = np.mean([clip_to_norm(g, CLIP) for g in grads], axis=0, dtype=np.float32)
    aggregate = (clipped_mean + noise).astype(np.float32)
    claim = privacy if privacy is not None else dp_claim(0.01)
    record = RoundRecord(
        "s", 0, refs, Mean(), str(await put_gradient(store, aggregate)), privacy=claim
    )
    return store, record


def dp_claim(noise_std: float) -> dict[str, object]:
    return dp_privacy_claim(
        clip=CLIP,
        noise_multiplier=noise_std * 2 / CLIP,
        noise_std=noise_std,
        epsilon_spent=1.5,
        delta=1e-5,
        accountant_event={"type": "gaussian", "noise_multiplier": noise_std * 2 / CLIP},
    )


async def test_bare_dp_claim_is_unverifiable_not_verified() -> None:
    store, record = await dp_round(np.full(D, 1e6, np.float32), {"noise": True})
    result = await verify_round(await record.commit(store), store)
    assert not result.ok
    assert result.unverifiable is not None
    assert result.status.startswith("unverifiable: the record claims DP noise but clip")


async def test_dp_claim_refuted_by_its_residual_is_a_mismatch() -> None:
    store, record = await dp_round(np.full(D, 1e6, np.float32))
    result = await verify_round(await record.commit(store), store)
    assert not result.ok
    assert result.unverifiable is None
    assert "more than the claimed N(0, 0.01²) noise explains" in result.status


async def test_dp_claim_without_the_noise_is_a_mismatch() -> None:
    store, record = await dp_round(np.zeros(D, np.float32))  # claims noise, added none
    result = await verify_round(await record.commit(store), store)
    assert result.status.startswith("mismatch")


async def test_honest_dp_round_is_unverifiable_but_consistent() -> None:
    noise = np.random.default_rng(16).normal(0, 0.01, D).astype(np.float32)
    store, record = await dp_round(noise)
    result = await verify_round(await record.commit(store), store)
    assert not result.ok
    assert result.unverifiable is not None
    assert "consistent with the claimed N(0, 0.01²)" in result.unverifiable


async def test_secagg_dp_claim_is_bounded_by_the_pre_noise_commitment() -> None:
    store = MemoryBlockStore()
    pre_noise = np.random.default_rng(17).standard_normal(D).astype(np.float32)
    pre_cid = await put_gradient(store, pre_noise)
    noise = np.random.default_rng(18).normal(0, 0.5, D).astype(np.float32)
    claim = dp_claim(0.5)
    claim["pre_noise"] = pre_cid
    for released, verdict in ((pre_noise + noise, "unverifiable"), (pre_noise + 40, "mismatch")):
        aggregate = await put_gradient(store, released.astype(np.float32))
        masked = await put_gradient(store, np.zeros(3, np.float32))  # contributions stay hidden
        record = RoundRecord(
            "s", 0, [ContributionRef("a", str(masked), 1)], Mean(), str(aggregate), privacy=claim
        )
        result = await verify_round(await record.commit(store), store)
        assert result.status.startswith(verdict), result.status


# --------------------------------------------------------------------------- decode bombs


def test_verify_round_on_a_manifest_naming_one_chunk_n_times_reports_without_allocating() -> None:
    setup = """
        import asyncio
        import dag_cbor, numpy as np
        from gradfed_ipfs.provenance.round_record import RoundRecord, ContributionRef, verify_round
        from gradfed_ipfs.storage import Block, MemoryBlockStore
        from gradfed_ipfs.storage.dag import MANIFEST_FORMAT, values_per_chunk
        from gradfed_ipfs.formats.arrow import store_gradient_as_arrow
        from gradfed_ipfs.tensor.aggregation import SampleWeightedMean

        per = values_per_chunk(2 * 1024 * 1024)
        store = MemoryBlockStore()
        chunk = asyncio.run(store.put(Block.new(store_gradient_as_arrow(np.ones(per, np.float32)))))
        n = 1000
        manifest = dag_cbor.encode({
            "format": MANIFEST_FORMAT, "version": 1, "dtype": "float32",
            "shape": [per * n], "length": per * n,
            "chunks": [{"cid": chunk, "offset": i * per, "length": per} for i in range(n)],
        })
        assert len(manifest) < 72_000, len(manifest)
        bomb = asyncio.run(store.put(Block.new(manifest, "dag-cbor")))
        record = RoundRecord(
            "s", 0, [ContributionRef("mallory", str(bomb), 1)], SampleWeightedMean(), str(chunk)
        )
        cid = asyncio.run(record.commit(store))
    """
    attack = """
        result = asyncio.run(verify_round(cid, store))
        assert not result.ok and "more than once" in result.status, result
    """
    report = run_limited(setup, attack, budget_mb=256)
    assert report.outcome == "ok", report.outcome
    assert report.pa_peak < 4 * 2**20
