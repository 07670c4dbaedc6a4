from __future__ import annotations

import copy

import dag_cbor
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multiformats import CID

from gradfed_ipfs import Block, MemoryBlockStore, fetch_gradient, put_gradient
from gradfed_ipfs.cid import make_cid
from gradfed_ipfs.errors import GraphSerializationError, InvalidGradient, MalformedManifest
from gradfed_ipfs.formats import store_gradient_as_arrow
from gradfed_ipfs.provenance.round_record import (
    ContributionRef,
    RoundRecord,
    commit_round,
    strategy_from_ipld,
    strategy_to_ipld,
    verify_history,
    verify_round,
)
from gradfed_ipfs.tensor import AggregationMethod, AggregationStrategy, SampleWeightedMean


async def run_rounds(store: MemoryBlockStore, rounds: int = 5, strategy=None):
    """Simulate `rounds` rounds of three peers; return the record CIDs and aggregates."""
    strategy = strategy or SampleWeightedMean()
    rng = np.random.default_rng(7)
    previous: CID | None = None
    cids, aggregates = [], []
    for r in range(rounds):
        refs = {}
        for i, peer in enumerate(["peer-c", "peer-a", "peer-b"]):
            grad = rng.standard_normal(64).astype(np.float32)
            refs[peer] = ContributionRef(peer, str(await put_gradient(store, grad)), 10 * (i + 1))
        previous, aggregate = await commit_round(
            store,
            session="s1",
            round=r,
            contributions=refs,
            aggregation=strategy,
            previous=previous,
            privacy={"epsilon_spent": 0.1 * (r + 1), "delta": 1e-5},
            compression={"codec": "dense"},
            timestamp_ms=1_700_000_000_000 + r,
        )
        cids.append(previous)
        aggregates.append(aggregate)
    return cids, aggregates


async def rewrite(store: MemoryBlockStore, cid: CID, edit) -> CID:
    record = dag_cbor.decode((await store.get(cid)).data)
    edit(record)
    return await store.put(Block.new(dag_cbor.encode(record), "dag-cbor"))


@pytest.mark.parametrize(
    "strategy",
    [
        AggregationMethod.FedAvg(),
        AggregationMethod.Sum(),
        AggregationMethod.Mean(),
        AggregationMethod.WeightedMean(weights={"a": 1.0, "b": 2.5}),
        AggregationMethod.WeightedMean(weights=[1.0, 2.0]),
        AggregationMethod.Median(),
        AggregationMethod.TrimmedMean(beta=0.25),
        AggregationMethod.Krum(f=1),
        AggregationMethod.MultiKrum(f=1, m=2),
        AggregationMethod.NormBounded(inner=AggregationMethod.Median(), max_norm=2.0),
    ],
)
def test_strategy_ipld_round_trip(strategy: AggregationStrategy) -> None:
    data = strategy_to_ipld(strategy)
    assert dag_cbor.decode(dag_cbor.encode(data)) == data
    rebuilt = strategy_from_ipld(dag_cbor.decode(dag_cbor.encode(data)))
    assert strategy_to_ipld(rebuilt) == data
    assert type(rebuilt) is type(strategy)


def test_strategy_errors() -> None:
    class Custom(AggregationStrategy):
        def aggregate(self, contributions):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    with pytest.raises(InvalidGradient):
        strategy_to_ipld(Custom())
    with pytest.raises(MalformedManifest):
        strategy_from_ipld({"method": "Nope", "params": {}})
    with pytest.raises(MalformedManifest):
        strategy_from_ipld({"method": "TrimmedMean", "params": {"beta": 0.9}})
    with pytest.raises(MalformedManifest):
        strategy_from_ipld({"method": "FedAvg", "params": {"bogus": 1}})
    with pytest.raises(MalformedManifest, match="weights"):
        strategy_from_ipld({"method": "WeightedMean", "params": {"weights": None}})
    with pytest.raises(MalformedManifest):
        strategy_from_ipld({"method": "MultiKrum", "params": {"f": 1.5}})
    with pytest.raises(MalformedManifest):
        strategy_from_ipld({"method": "Krum", "params": {"m": 3}})
    deep: dict = {"method": "FedAvg", "params": {}}
    for _ in range(20):
        deep = {"method": "NormBounded", "params": {"inner": deep}}
    with pytest.raises(MalformedManifest, match="nested"):
        strategy_from_ipld(deep)


async def test_commit_round_links_everything() -> None:
    store = MemoryBlockStore()
    cids, aggregates = await run_rounds(store, rounds=2)
    record = dag_cbor.decode((await store.get(cids[1])).data)
    assert record["type"] == "gradfed/round"
    assert record["round"] == 1
    assert [c["peer"] for c in record["contributions"]] == ["peer-a", "peer-b", "peer-c"]
    assert all(isinstance(c["gradient"], CID) for c in record["contributions"])
    assert record["previous"] == cids[0]
    assert record["aggregation"] == {"method": "FedAvg", "params": {}}
    assert record["privacy"]["epsilon_spent"] == pytest.approx(0.2)
    stored = await fetch_gradient(store, record["aggregate"])
    np.testing.assert_array_equal(stored, aggregates[1])
    loaded = await RoundRecord.load(cids[1], store)
    assert loaded.previous == str(cids[0])
    assert loaded.to_ipld() == dag_cbor.decode((await store.get(cids[1])).data)


async def test_verify_round_and_history_ok() -> None:
    store = MemoryBlockStore()
    cids, _ = await run_rounds(store)
    result = await verify_round(cids[-1], store)
    assert result.ok
    assert result.status == "verified"
    history = await verify_history(cids[-1], store)
    assert [r.round for r in history] == [4, 3, 2, 1, 0]
    assert all(r.ok for r in history)


async def test_verify_detects_contribution_pointing_at_other_block() -> None:
    store = MemoryBlockStore()
    cids, _ = await run_rounds(store, rounds=2)
    other = await put_gradient(store, np.full(64, 9.0, np.float32))

    def swap(record) -> None:  # type: ignore[no-untyped-def]
        record["contributions"][1]["gradient"] = other

    forged = await rewrite(store, cids[1], swap)
    result = await verify_round(forged, store)
    assert not result.ok
    assert "differs from the recomputed FedAvg" in (result.mismatch or "")
    assert "peer-b" in (result.mismatch or "")
    history = await verify_history(forged, store)
    assert [r.ok for r in history] == [False, True]


async def test_verify_detects_missing_and_corrupt_contribution() -> None:
    store = MemoryBlockStore()
    cids, _ = await run_rounds(store, rounds=1)
    record = dag_cbor.decode((await store.get(cids[0])).data)
    victim = record["contributions"][2]["gradient"]
    cid_obj, data = store.blocks[bytes(victim)]
    store.blocks[bytes(victim)] = (cid_obj, data[:-8] + b"\x00" * 8)
    result = await verify_round(cids[0], store)
    assert not result.ok
    assert "contribution of peer peer-c" in (result.mismatch or "")
    await store.delete(victim)
    assert "peer-c" in ((await verify_round(cids[0], store)).mismatch or "")


async def test_verify_detects_wrong_weight_and_wrong_method() -> None:
    store = MemoryBlockStore()
    cids, _ = await run_rounds(store, rounds=1)

    def reweigh(record) -> None:  # type: ignore[no-untyped-def]
        record["contributions"][0]["weight"] = 1000

    assert not (await verify_round(await rewrite(store, cids[0], reweigh), store)).ok

    def remethod(record) -> None:  # type: ignore[no-untyped-def]
        record["aggregation"] = {"method": "Median", "params": {}}

    result = await verify_round(await rewrite(store, cids[0], remethod), store)
    assert "Median" in (result.mismatch or "")


async def test_contribution_without_weight_field_is_malformed() -> None:
    store = MemoryBlockStore()
    cids, _ = await run_rounds(store, rounds=1)

    def drop_weight(record) -> None:  # type: ignore[no-untyped-def]
        del record["contributions"][0]["weight"]

    forged = await rewrite(store, cids[0], drop_weight)
    with pytest.raises(MalformedManifest, match="bad contribution"):
        await RoundRecord.load(forged, store)
    result = await verify_round(forged, store)
    assert not result.ok
    assert result.round == -1


async def test_verify_history_detects_chain_break_and_early_end() -> None:
    store = MemoryBlockStore()
    cids, _ = await run_rounds(store, rounds=3)

    def skip(record) -> None:  # type: ignore[no-untyped-def]
        record["previous"] = cids[0]

    history = await verify_history(await rewrite(store, cids[2], skip), store)
    assert "chain break" in (history[1].mismatch or "")

    def orphan(record) -> None:  # type: ignore[no-untyped-def]
        record["previous"] = None

    history = await verify_history(await rewrite(store, cids[2], orphan), store)
    assert history[-1].mismatch == "history ends before round 0"


async def test_unencodable_parameters_raise_serialization_error() -> None:
    store = MemoryBlockStore()
    grad = await put_gradient(store, np.ones(2, np.float32))
    with pytest.raises(GraphSerializationError, match="Infinity"):
        await commit_round(
            store,
            session="s",
            round=0,
            contributions={"a": grad},
            aggregation=SampleWeightedMean(),
            privacy={"epsilon_spent": float("inf")},
        )


async def test_verify_unreadable_record() -> None:
    store = MemoryBlockStore()
    junk = await store.put(Block.new(dag_cbor.encode({"type": "other", "version": 1}), 0x71))
    result = await verify_round(junk, store)
    assert not result.ok
    assert result.round == -1
    assert len(await verify_history(junk, store)) == 1


async def test_noised_round_is_unverifiable_not_verified() -> None:
    store = MemoryBlockStore()
    grads = {p: await put_gradient(store, np.ones(4, np.float32) * i) for i, p in enumerate("ab")}
    noised = np.array([0.3, 0.6, 0.2, 0.5], np.float32)
    record = RoundRecord(
        "s",
        0,
        [ContributionRef(p, str(c), 1) for p, c in grads.items()],
        SampleWeightedMean(),
        str(await put_gradient(store, noised)),
        privacy={"noise": True, "epsilon_spent": 1.0},
    )
    result = await verify_round(await record.commit(store), store)
    assert not result.ok
    assert not result.recomputed
    assert result.status.startswith("unverifiable: the record claims DP noise but clip")


def test_record_refuses_duplicate_peer() -> None:
    cid = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    record = RoundRecord(
        "s", 0, [ContributionRef("a", cid), ContributionRef("a", cid)], SampleWeightedMean(), cid
    )
    with pytest.raises(InvalidGradient):
        record.to_ipld()


# ----------------------------------------------------------------------- real Kubo swarm


@pytest.mark.kubo
@pytest.mark.docker
async def test_history_verified_by_outsider_over_bitswap(kubo_swarm3) -> None:  # type: ignore[no-untyped-def]
    from gradfed_ipfs.provenance.checkpoint import GradientCheckpoint
    from gradfed_ipfs.provenance.graph import ComputationGraphStore
    from gradfed_ipfs.storage import KuboBlockStore

    node_a, node_b, node_c = kubo_swarm3
    rng = np.random.default_rng(11)
    grads = [
        {p: rng.standard_normal(32).astype(np.float32) for p in ("peer-a", "peer-b")}
        for _ in range(5)
    ]
    async with (
        KuboBlockStore(node_a.api_url, timeout=20.0) as a,
        KuboBlockStore(node_b.api_url, timeout=20.0) as b,
        KuboBlockStore(node_c.api_url, timeout=20.0) as c,
    ):

        async def run_round(store, r, previous):  # type: ignore[no-untyped-def]
            # peer-a's gradient lives on A, peer-b's on B: A fetches it over bitswap.
            cid_a = await put_gradient(a, grads[r]["peer-a"])
            cid_b = await put_gradient(b, grads[r]["peer-b"])
            refs = {
                "peer-a": ContributionRef("peer-a", str(cid_a), 10),
                "peer-b": ContributionRef("peer-b", str(cid_b), 30),
            }
            return await commit_round(
                store, session="swarm", round=r, contributions=refs,
                aggregation=SampleWeightedMean(), previous=previous,
            )  # fmt: skip

        params = np.zeros(32, np.float32)
        previous = None
        aggregates = []
        checkpoint_cid = None
        for r in range(5):
            previous, aggregate = await run_round(a, r, previous)
            aggregates.append(aggregate)
            params = params - np.float32(0.1) * aggregate
            if r == 3:
                ckpt = GradientCheckpoint.new(ComputationGraphStore(), r)
                ckpt.set_parameter("w", params)
                ckpt.set_optimizer_state("lr", b"0.1")
                checkpoint_cid = await ckpt.commit(a)
        assert previous is not None
        # C took no part: it verifies everything from the last CID, fetching over bitswap.
        history = await verify_history(previous, c)
        assert [h.round for h in history] == [4, 3, 2, 1, 0]
        assert all(h.ok for h in history), [h.status for h in history]

        # Tampering: a record pointing peer-b's contribution at a different block.
        other = await put_gradient(a, np.ones(32, np.float32))
        record = dag_cbor.decode((await a.get(previous)).data)
        record["contributions"][1]["gradient"] = other
        forged = await a.put(Block.new(dag_cbor.encode(record), "dag-cbor"))
        result = await verify_round(forged, c)
        assert not result.ok
        assert "differs from the recomputed FedAvg" in (result.mismatch or "")

        # The round-3 checkpoint restored on C gives the same state and next aggregate.
        assert checkpoint_cid is not None
        restored = await GradientCheckpoint.restore(checkpoint_cid, c)
        assert restored.step == 3
        assert restored.optimizer_state == {"lr": b"0.1"}
        resumed = restored.parameters["w"]
        round4 = await RoundRecord.load(previous, c)
        _, again = await commit_round(
            c, session="swarm", round=4,
            contributions={ref.peer_id: ref for ref in round4.contributions},
            aggregation=SampleWeightedMean(), previous=round4.previous,
        )  # fmt: skip
        np.testing.assert_array_equal(again, aggregates[4])
        final = resumed - np.float32(0.1) * again
        assert final.tobytes() == params.tobytes()


# ----------------------------------------------------------------------- untrusted records


_GRADIENTS = [
    Block.new(store_gradient_as_arrow(np.array(v, np.float32)))
    for v in ([1.0, 2.0], [3.0, 4.0], [2.0, 3.0])
]
_FUZZ_RECORD = {
    "type": "gradfed/round",
    "version": 1,
    "session": "s",
    "round": 0,
    "contributions": [
        {"peer": "a", "gradient": _GRADIENTS[0].cid, "weight": 3},
        {"peer": "b", "gradient": _GRADIENTS[1].cid, "weight": None},
    ],
    "aggregation": {
        "method": "NormBounded",
        "params": {
            "inner": {"method": "WeightedMean", "params": {"weights": [1.0]}},
            "max_norm": 1.0,
        },
    },
    "compression": {},
    "privacy": {},
    "aggregate": _GRADIENTS[2].cid,
    "previous": None,
    "timestamp_ms": 5,
}

_ipld_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
    | st.binary(max_size=4)
    | st.just(make_cid(b"x")),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    key=st.sampled_from(sorted(_FUZZ_RECORD)) | st.just("aggregation.params.weights"),
    value=_ipld_values,
)
async def test_verify_round_never_raises_on_malformed_records(key: str, value: object) -> None:
    store = MemoryBlockStore()
    for block in _GRADIENTS:
        await store.put(block)
    record = copy.deepcopy(_FUZZ_RECORD)
    if key == "aggregation.params.weights":
        record["aggregation"]["params"]["inner"]["params"]["weights"] = value  # type: ignore[index]
    else:
        record[key] = value
    cid = await store.put(Block.new(dag_cbor.encode(record), "dag-cbor"))
    result = await verify_round(cid, store)
    if not result.ok:
        assert result.mismatch
    assert len(await verify_history(cid, store)) >= 1
