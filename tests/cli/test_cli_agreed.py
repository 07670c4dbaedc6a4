"""``verify-round``, ``history`` and ``resync`` on a real agreed session over three daemons."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedSession, put_gradient
from gradfed_ipfs.cid import make_cid, parse_cid
from gradfed_ipfs.cli.agreed import Deadline, agreed_history, check_agreed_round
from gradfed_ipfs.cli.common import console
from gradfed_ipfs.formats.agreed.roster import AgreedMessage, AgreedRecord, Roster, sign_message
from gradfed_ipfs.formats.statement import LocalSigner
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore
from gradfed_ipfs.tensor.deterministic import deterministic_update
from tests.cli.test_cli import run_cli
from tests.conftest import KuboNode
from tests.helpers import aclose_all

D = 300
ROUNDS = 3
TIMING = {
    "collect_timeout": 10.0,
    "takeover_timeout": 5.0,
    "round_timeout": 60.0,
    "announce_interval": 0.2,
    "max_announce_interval": 0.5,
    "fetch_timeout": 10.0,
}


def initial_model() -> np.ndarray:
    return np.random.default_rng(31).standard_normal(D).astype(np.float32)


def delta(peer: int, round_number: int) -> np.ndarray:
    return (0.1 * np.random.default_rng([peer, round_number, 31]).standard_normal(D)).astype(
        np.float32
    )


@dataclasses.dataclass
class Agreed:
    """A finished 3-round agreed session whose peers still announce their heads."""

    api: str
    genesis: str
    records: list[str]
    model: np.ndarray
    store: KuboBlockStore
    sessions: list[AgreedSession]
    pubsubs: list[KuboPubsub]


@pytest.fixture
async def agreed(kubo_swarm3: list[KuboNode]) -> AsyncIterator[Agreed]:
    session_name = "cli-agreed"
    stores = [KuboBlockStore(n.api_url, timeout=10.0) for n in kubo_swarm3]
    pubsubs = [KuboPubsub(n.api_url) for n in kubo_swarm3]
    members = tuple(n.peer_id for n in kubo_swarm3)
    genesis = await AgreedSession.commit_genesis(stores[0], initial_model())
    config = AgreedConfig(members=members, **TIMING)  # type: ignore[arg-type]
    sessions = [
        AgreedSession(s, p, session_name, genesis, config)
        for s, p in zip(stores, pubsubs, strict=True)
    ]
    try:
        for session in sessions:
            await session.start(initial_model())
        records = []
        for r in range(ROUNDS):
            results = await asyncio.gather(
                *(s.run_round(delta(i, r), weight=1 + i) for i, s in enumerate(sessions))
            )
            assert len({str(res.record) for res in results}) == 1
            assert all(len(res.roster.entries) == 3 for res in results)
            records.append(str(results[0].record))
        yield Agreed(
            kubo_swarm3[0].api_url,
            str(genesis),
            records,
            sessions[0].model,
            stores[0],
            sessions,
            pubsubs,
        )
    finally:
        await aclose_all(sessions, pubsubs, stores)


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI in a thread (it runs its own event loop) while the peers keep running."""
    return await asyncio.to_thread(run_cli, capsys, *argv)


async def tampered(agreed: Agreed, **changes: object) -> str:
    block = await agreed.store.get(agreed.records[-1])
    record = dataclasses.replace(AgreedRecord.from_block(block), **changes)  # type: ignore[arg-type]
    return str(await agreed.store.put(record.to_block()))


@pytest.mark.kubo
async def test_verify_round_and_history_reverify_agreed_records(
    agreed: Agreed, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ["--api", agreed.api]
    for r, record in enumerate(agreed.records):
        code, out, err = await cli(capsys, *api, "verify-round", record)
        assert code == 0, err
        assert "verified" in out
        assert f"│ {r} " in out  # the round column
        assert "3/3" in out  # roster size / expected

    code, out, err = await cli(capsys, *api, "history", agreed.records[-1])
    assert code == 0, err
    assert "3 rounds verified" in out
    assert out.count("verified") == 4  # 3 rows and the summary
    assert "cli-agreed" in out

    # A record claiming another result: re-aggregation disagrees, exit 1 (a failed check).
    genesis = AgreedRecord.from_block(await agreed.store.get(agreed.records[0])).base
    forged = await tampered(agreed, result=genesis)
    code, out, err = await cli(capsys, *api, "verify-round", forged)
    assert code == 1
    assert "mismatch" in out
    assert "re-aggregates to" in " ".join(err.split())
    code, out, _ = await cli(capsys, *api, "history", forged)
    assert code == 1
    assert "3 rounds, 1 failed" in out

    # A record that skips a round breaks the chain: history says so, exit 1.
    skipping = await tampered(
        agreed, prev=AgreedRecord.from_block(await agreed.store.get(agreed.records[1])).prev
    )  # round 2 claims to follow round 0
    code, _, err = await cli(capsys, *api, "history", skipping)
    assert code == 1
    assert "is broken" in err

    # A custom rule label cannot be recomputed here: said so, never a silent pass.
    custom = await tampered(agreed, rule="fedadam(eta=0.1)")
    code, out, err = await cli(capsys, *api, "verify-round", custom)
    assert code == 1
    assert "rule fedadam(eta=0.1): not re-computable here" in " ".join(err.split())

    # A gradient CID names something else: exit 2, one line.
    gradient = str(await put_gradient(agreed.store, np.ones(4, np.float32)))
    for command in ("verify-round", "history"):
        code, _, err = await cli(capsys, *api, command, gradient)
        assert code == 2
        assert "is not a round record" in err


@pytest.mark.kubo
async def test_resync_adopts_the_latest_head_from_the_peers_announcements(
    agreed: Agreed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ["--api", agreed.api]
    session = ["--session", "cli-agreed", "--genesis", agreed.genesis]
    out_path = tmp_path / "model.npy"
    code, out, err = await cli(capsys, *api, "resync", *session, "-o", str(out_path))
    assert code == 0, err
    assert f"round {ROUNDS - 1} (the next round is {ROUNDS})" in out
    assert f"record CID {agreed.records[-1]}" in out
    assert "records verified: 3 (links checked and every aggregate recomputed)" in out
    np.testing.assert_array_equal(np.load(out_path), agreed.model)

    # --head: no listening; a head of round 1 gives round 1's model, 2 records verified.
    code, out, err = await cli(
        capsys, *api, "resync", *session, "--head", agreed.records[1], "-o", str(out_path)
    )
    assert code == 0, err
    assert "records verified: 2" in out

    # A forged head is refused with a typed, one-line error; nothing is written.
    genesis = AgreedRecord.from_block(await agreed.store.get(agreed.records[0])).base
    forged = await tampered(agreed, result=genesis)
    bad_path = tmp_path / "bad.npy"
    argv = ["resync", *session, "--head", forged, "-o", str(bad_path)]
    code, _, err = await cli(capsys, *api, *argv)
    assert code == 7
    assert "RoundVerificationFailed" in err
    assert not bad_path.exists()

    # A member announcing a forged head of a later round: refused, the honest head adopted.
    liar = agreed.sessions[1]
    await liar.aclose()  # it stops announcing its honest head
    members = [arg for s in agreed.sessions for arg in ("--member", s.peer_id)]
    code, out, err = await lie_while_resyncing(
        agreed, capsys, 5, genesis, forged, members, out_path
    )
    assert code == 0, err
    assert f"head {forged} refused" in " ".join(err.split())
    assert f"record CID {agreed.records[-1]}" in out
    np.testing.assert_array_equal(np.load(out_path), agreed.model)

    # A round-3 head that verifies (the members' own signed contributions, the exact
    # aggregate) but that only the liar votes for: refused as the library's resync refuses it
    # (done votes from more than half of its roster), the head the others vote for adopted.
    lone = await verifiable_round_3(agreed, liar.peer_id)
    code, out, err = await lie_while_resyncing(
        agreed, capsys, 3, lone[0], lone[1], members, out_path
    )
    assert code == 0, err
    assert f"head {lone[1]} refused: done votes from 1 of its roster's 3 peers" in " ".join(
        err.split()
    )
    assert f"record CID {agreed.records[-1]}" in out
    # Named with --head, the same record is the user's choice: no votes are heard or counted.
    code, out, err = await cli(
        capsys, *api, "resync", *session, "--head", lone[1], "-o", str(out_path)
    )
    assert code == 0, err
    assert "records verified: 4" in out

    # Another session's genesis: no head is heard on its topic.
    other = str(await put_gradient(agreed.store, np.zeros(D, np.float32)))
    code, _, err = await cli(
        capsys, *api, "resync", "--session", "cli-agreed", "--genesis", other,
        "--listen", "1", "-o", str(bad_path),
    )  # fmt: skip
    assert code == 7
    assert "no `done` head" in err


async def lie_while_resyncing(
    agreed: Agreed,
    capsys: pytest.CaptureFixture[str],
    round_number: int,
    result: object,
    record: str,
    members: list[str],
    output: Path,
) -> tuple[int, str, str]:
    """Run ``resync`` while the closed member ``sessions[1]`` announces a ``done`` of its own."""
    liar = agreed.sessions[1]
    message = AgreedMessage(
        "done", "cli-agreed", parse_cid(agreed.genesis), round_number, liar.peer_id,
        parse_cid(result), record=parse_cid(record),  # type: ignore[arg-type]
    )  # fmt: skip
    signer = await agreed.pubsubs[1].signer()
    lie = (await sign_message(message, signer, agreed.pubsubs[1].keys)).block.data
    session = ["--session", "cli-agreed", "--genesis", agreed.genesis]
    argv = ["resync", *session, *members, "--listen", "30", "-o", str(output)]
    task = asyncio.ensure_future(cli(capsys, "--api", agreed.api, *argv))
    while not task.done():
        await agreed.pubsubs[1].publish(liar.topic, lie)
        await asyncio.wait({task}, timeout=0.2)  # re-announce, as peers do
    return task.result()


async def verifiable_round_3(agreed: Agreed, coordinator: str) -> tuple[str, str]:
    """Put a round 3 on the real head: every member's signed contribution, the exact
    aggregate, a complete roster naming ``coordinator``. Returns its result and record CIDs."""
    store, genesis = agreed.store, parse_cid(agreed.genesis)
    head = AgreedRecord.from_block(await store.get(agreed.records[-1]))
    grads = [delta(i, 3) for i in range(3)]
    lines = {}
    for i, (session, pubsub) in enumerate(zip(agreed.sessions, agreed.pubsubs, strict=True)):
        cid = await put_gradient(store, grads[i])
        contrib = AgreedMessage(
            "contrib", "cli-agreed", genesis, 3, session.peer_id, cid, head.result, 1 + i
        )
        signed = await sign_message(contrib, await pubsub.signer(), pubsub.keys)
        lines[session.peer_id] = (cid, 1 + i, signed.signature)
    members = tuple(s.peer_id for s in agreed.sessions)
    roster = Roster.new("cli-agreed", genesis, 3, head.result, coordinator, members, lines)
    model = deterministic_update(agreed.model, grads, [1, 2, 3], 1.0)
    result = await put_gradient(store, model)
    record = AgreedRecord(
        "cli-agreed", genesis, 3, parse_cid(agreed.records[-1]), head.result,
        await store.put(roster.to_block()), result, 1.0,
    )  # fmt: skip
    return str(result), str(await store.put(record.to_block()))


async def test_a_missing_input_is_unverifiable_and_a_wrong_result_a_mismatch() -> None:
    async with MemoryBlockStore() as store:
        model = initial_model()
        base = await put_gradient(store, model)
        held = await put_gradient(store, delta(0, 0))
        gone = make_cid(b"a contribution nobody serves")
        for contribution, expected in ((gone, "unverifiable: "), (held, "mismatch: ")):
            roster = Roster.new("s", base, 0, base, "p0", ["p0"], {"p0": (contribution, 1)})
            roster_cid = await store.put(roster.to_block())
            record = AgreedRecord("s", base, 0, None, base, roster_cid, base, 1.0)
            check = await check_agreed_round(store, await store.put(record.to_block()))
            assert check.status.startswith(expected), check.status
            assert not check.ok
            assert check.unverifiable == (contribution == gone)


async def test_a_round_that_re_aggregates_but_lists_unsigned_entries_is_a_mismatch() -> None:
    async with MemoryBlockStore() as store:
        model = initial_model()
        base = await put_gradient(store, model)
        held = await put_gradient(store, delta(0, 0))
        result = await put_gradient(store, deterministic_update(model, [delta(0, 0)], [1], 1.0))
        roster = Roster.new("s", base, 0, base, "p0", ["p0"], {"p0": (held, 1)})
        listed = await store.put(roster.to_block())
        record = AgreedRecord("s", base, 0, None, base, listed, result, 1.0)
        check = await check_agreed_round(store, await store.put(record.to_block()))
    assert check.status == "mismatch: roster entry of p0 is not signed"
    assert not check.ok


async def test_history_says_which_rounds_rest_on_an_unverifiable_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console, "width", 400)  # one table row a line
    async with MemoryBlockStore() as store:
        model = initial_model()
        genesis = await put_gradient(store, model)
        claimed = (model + 1).astype(np.float32)  # what a rule would have made: not recomputed
        claimed_cid = await put_gradient(store, claimed)
        rosters, signer = [], LocalSigner()  # a real identity: the CLI's keys are peer IDs
        p0 = signer.peer_id
        for r, base in enumerate((genesis, claimed_cid)):
            cid = await put_gradient(store, delta(0, r))
            contrib = AgreedMessage("contrib", "s", genesis, r, p0, cid, base, 1)
            entry = {p0: (cid, 1, (await sign_message(contrib, signer)).signature)}
            rosters.append(Roster.new("s", genesis, r, base, p0, [p0], entry))
        roster_cids = [await store.put(roster.to_block()) for roster in rosters]
        first = AgreedRecord(
            "s", genesis, 0, None, genesis, roster_cids[0], claimed_cid, 1.0, "fedadam(eta=0.1)"
        )
        prev = await store.put(first.to_block())
        result = await put_gradient(store, deterministic_update(claimed, [delta(0, 1)], [1], 1.0))
        second = AgreedRecord("s", genesis, 1, prev, claimed_cid, roster_cids[1], result, 1.0)
        head = await store.put(second.to_block())
        code = await agreed_history(store, head, Deadline(60.0))  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert code == 1
    assert "unverifiable: rule fedadam(eta=0.1): not re-computable here" in out
    assert "verified from round 0's unverified result" in out
    assert "2 rounds, 1 failed (1 unverifiable)" in out
