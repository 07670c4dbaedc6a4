"""Start a session's round chain on one machine: validators bound to their members, launched.

For labs, tests and benchmarks whose members' validators all run here (:class:`CometNetwork`);
members on separate machines run the same steps each on its own validator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from ..formats.statement import Signer
from .abci import RoundsGenesis, validator_binding
from .validator import CometNetwork

__all__ = ["launch_session_chain"]


async def launch_session_chain(
    network: CometNetwork,
    chain: RoundsGenesis,
    signers: Sequence[Signer],
    *,
    timeout: float = 30.0,
) -> CometNetwork:
    """Bind validator ``i`` of ``network`` to ``signers[i]``'s member; launch; wait for a block.

    ``chain`` is the session's chain genesis (e.g.
    :func:`~gradfed_ipfs.federated.agreed.rounds_genesis`); each member signs a round-0
    ``comet/validator`` statement for its validator's key, and the genesis carries them. The
    network is prepared here; on any failure it is stopped (every home removed).

    Raises
    ------
    ValueError
        If there is not one signer per validator.
    CometStartError
        If a validator does not start, or no block is committed within ``timeout`` seconds.
    """
    if len(signers) != network.n:
        raise ValueError(f"{network.n} validators need {network.n} signers, got {len(signers)}")
    entries = await asyncio.to_thread(network.prepare)
    try:
        bindings = [
            await validator_binding(signer, chain.session, network.chain_id, entry.key_bytes, 0)
            for signer, entry in zip(signers, entries, strict=True)
        ]
        bound = replace(chain, bindings=tuple(bindings))
        await asyncio.to_thread(network.launch, bound.to_dict())
        await asyncio.to_thread(network.wait_for_height, 1, timeout=timeout)
    except BaseException:
        await asyncio.to_thread(network.stop)
        raise
    return network
