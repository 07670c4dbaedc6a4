"""A peer joins a running agreed session over four real Kubo daemons (issue 33 item 3).

The join, the roster's member set and the record are signed and fetched through the daemons
(pubsub and bitswap); the joiner resyncs by CID from the members' daemons, contributes from the
round after its admission, and re-verifies the changing chain from its own daemon.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gradfed_ipfs import AgreedConfig, AgreedRoundResult, AgreedSession, verify_agreed_history
from gradfed_ipfs.federated.agreed import Admission
from gradfed_ipfs.formats.agreed.membership import MemberSet
from gradfed_ipfs.formats.agreed.roster import AgreedRecord
from gradfed_ipfs.kubo import KuboPubsub
from gradfed_ipfs.storage import KuboBlockStore
from tests.helpers import aclose_all
from tests.polling import apoll_until

D = 2_000
SETTINGS = {
    "collect_timeout": 5.0,
    "takeover_timeout": 3.0,
    "round_timeout": 60.0,
    "announce_interval": 0.1,
    "fetch_timeout": 20.0,
}


async def run(sessions: list[AgreedSession]) -> list[AgreedRoundResult]:
    rng = np.random.default_rng
    return list(
        await asyncio.gather(
            *(
                s.run_round(0.01 * rng([i, s.round]).standard_normal(D).astype(np.float32))
                for i, s in enumerate(sessions)
            )
        )
    )


@pytest.mark.kubo
async def test_a_fourth_daemon_joins_three_members_and_every_record_agrees(
    kubo_provider: str, kubo_pool: Any
) -> None:
    nodes = kubo_pool.get(kubo_provider, 4)
    members = tuple(n.peer_id for n in nodes[:3])
    newcomer = nodes[3].peer_id
    admission = Admission("allow-list", allow=(newcomer,))
    config = AgreedConfig(members=members, admission=admission, **SETTINGS)  # type: ignore[arg-type]
    stores = [KuboBlockStore(n.api_url, timeout=30.0) for n in nodes]
    pubsubs = [KuboPubsub(n.api_url) for n in nodes]
    model = np.random.default_rng(7).standard_normal(D).astype(np.float32)
    sessions: list[AgreedSession] = []
    try:
        genesis = await AgreedSession.commit_genesis(stores[0], model)
        sessions = [
            AgreedSession(s, p, "join-kubo", genesis, config)
            for s, p in zip(stores, pubsubs, strict=True)
        ]
        for session in sessions[:3]:
            await session.start(model)
        await run(sessions[:3])
        joining = asyncio.create_task(sessions[3].join(model, timeout=60.0))

        async def heard() -> bool:
            return all(
                s.board.requests is not None and newcomer in s.board.requests.joins
                for s in sessions[:3]
            )

        await apoll_until(heard, timeout=30.0, what="the newcomer's join")
        admitted = await run(sessions[:3])
        assert len({bytes(r.record) for r in admitted}) == 1
        await joining
        assert sessions[3].round == 2
        after = await run(sessions)
        assert len({bytes(r.record) for r in after}) == 1
        assert set(after[0].roster.peers) == {*members, newcomer}
        record = AgreedRecord.from_block(await stores[3].get(admitted[0].record))
        assert record.members is not None
        named = MemberSet.from_block(await stores[3].get(record.members))
        assert named.members == tuple(sorted([*members, newcomer]))
        verified = await verify_agreed_history(
            stores[3], after[0].record, session="join-kubo", genesis=genesis,
            admission=admission, members=members,
        )  # fmt: skip
        assert [r.round for r in verified] == [0, 1, 2]
    finally:
        await aclose_all(sessions, pubsubs, stores)
