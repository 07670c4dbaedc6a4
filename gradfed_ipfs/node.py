"""``Node``: one daemon's RPC client, block store and pubsub, wired once.

A user meets this object first: an agreed session, whose rounds end every honest peer on the
same model CID::

    from gradfed_ipfs import AgreedConfig, Node

    async def main(peer_ids, initial_model, gradient, num_samples) -> None:
        async with Node("http://127.0.0.1:5001") as node:
            session = await node.session("demo", initial_model, AgreedConfig(members=peer_ids))
            result = await session.run_round(gradient, weight=num_samples)
            print(result.model)  # the agreed model CID, equal on every honest peer

The node also stores and fetches gradients and dials other nodes::

    import numpy as np

    async with Node("http://127.0.0.1:5001") as node:
        cid = await node.put_gradient(np.ones(1000, dtype=np.float32))
        again = await node.fetch_gradient(cid)
        await node.connect("http://127.0.0.1:5002")  # another node's API, or a multiaddr
        print(await node.peer_id(), await node.peers())

:meth:`Node.runner` gives the best-effort building block (a
:class:`~gradfed_ipfs.federated.besteffort.RoundRunner`: each peer aggregates what it heard,
so peers may end a round on different models). ``Node.memory(peer_id, bus=..., store=...)``
gives the same object offline: an in-memory store and pubsub bus shared by the nodes of one
test or notebook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Self

import numpy as np
from multiformats import CID

from ._types import CIDLike, FloatArray, GradientLike
from .errors import ConfigError, KuboRpcError
from .federated.agreed.config import AgreedConfig
from .federated.agreed.session import AgreedSession
from .federated.besteffort.config import RoundConfig
from .federated.besteffort.gossip import GossipModelSync
from .federated.besteffort.runner import RoundRunner
from .formats.statement import LocalSigner, Signer
from .kubo.pubsub import KuboPubsub, MemoryPubsubBus, PubsubTransport
from .kubo.rpc import KuboRpc, Transport
from .storage.base import UNSET, AsyncClosing, BlockStore, Unset
from .storage.dag import fetch_gradient, put_gradient
from .storage.kubo import KuboBlockStore
from .storage.memory import MemoryBlockStore

__all__ = ["Node", "pick_dial_address"]

_LOOPBACK: Final = ("/ip4/127.0.0.1/", "/ip6/::1/")


def pick_dial_address(addresses: list[str], peer_id: str) -> str:
    """Choose the address to ``swarm/connect`` to among a peer's ``id`` addresses.

    Loopback TCP first (test swarms live there), then any TCP address; relayed (``p2p-circuit``)
    addresses never. The result ends in ``/p2p/<peer_id>``.

    Raises
    ------
    KuboRpcError
        If the peer lists no usable address.
    """
    usable = [a for a in addresses if "/tcp/" in a and "p2p-circuit" not in a]
    usable.sort(key=lambda a: (not a.startswith(_LOOPBACK), "/ws" in a))
    if not usable:
        raise KuboRpcError(f"peer {peer_id} lists no TCP address to dial: {addresses}")
    address = usable[0]
    return address if "/p2p/" in address else f"{address}/p2p/{peer_id}"


class Node(AsyncClosing):
    """One IPFS node for gradient exchange: a Kubo daemon's RPC client, store and pubsub.

    Parameters
    ----------
    api_url
        The daemon's RPC base URL, e.g. ``http://127.0.0.1:5001``.
    timeout
        Seconds a block fetch may wait (Kubo's ``timeout=``) and the deadline of other calls.
    transport
        An ``httpx`` transport to use instead of the network (tests).

    Attributes
    ----------
    store
        The block store (:class:`~gradfed_ipfs.KuboBlockStore`, or a memory store).
    pubsub
        The pubsub transport (:class:`~gradfed_ipfs.kubo.KuboPubsub`, or a memory endpoint).
    rpc
        The daemon's RPC client; ``None`` for an in-memory node.
    """

    def __init__(
        self, api_url: str, *, timeout: float = 30.0, transport: Transport | None = None
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.rpc: KuboRpc | None = KuboRpc(self.api_url, timeout=timeout, transport=transport)
        self.store: BlockStore = KuboBlockStore(self.api_url, timeout=timeout, rpc=self.rpc)
        self.pubsub: PubsubTransport = KuboPubsub(self.api_url, timeout=timeout, rpc=self.rpc)
        self._peer_id: str | None = None
        self._signer: Signer | None = None
        self._closers: list[Callable[[], Any]] = []

    @classmethod
    def memory(
        cls,
        peer_id: str | None = None,
        *,
        bus: MemoryPubsubBus | None = None,
        store: MemoryBlockStore | None = None,
        signer: LocalSigner | None = None,
    ) -> Node:
        """Return an offline node on an in-memory bus and block store.

        Parameters
        ----------
        peer_id
            The node's peer ID on the bus (default: the signer's).
        bus
            The pubsub bus it shares with other memory nodes (a new one when ``None``).
        store
            The block store it shares with them (a new one when ``None``); memory nodes have
            no bitswap, so nodes that exchange gradients must share one.
        signer
            The node's identity key for signed statements (:meth:`signer`); its peer ID is
            the node's.

        Returns
        -------
        Node
            A node whose :meth:`connect` does nothing and whose :meth:`peers` is empty.
        """
        if signer is not None and peer_id not in (None, signer.peer_id):
            raise ConfigError(f"peer_id {peer_id} is not the signer's ({signer.peer_id})")
        if signer is not None:
            peer_id = signer.peer_id
        if peer_id is None:
            raise ConfigError("Node.memory needs a peer_id or a signer")
        node = cls.__new__(cls)
        node._signer = signer
        node.api_url = f"memory://{peer_id}"
        node.rpc = None
        node.store = store if store is not None else MemoryBlockStore()
        node.pubsub = (bus if bus is not None else MemoryPubsubBus()).endpoint(
            peer_id, signer=signer
        )
        node._peer_id = peer_id
        node._closers = []
        return node

    async def __aenter__(self) -> Self:
        await self.peer_id()  # checks the daemon answers; runner() needs the ID
        return self

    async def aclose(self) -> None:
        """Close the runners and gossip endpoints made here, then pubsub, store and RPC."""
        closers, self._closers = self._closers, []
        for close in reversed(closers):
            await close()
        await self.pubsub.aclose()
        await self.store.aclose()
        if self.rpc is not None:
            await self.rpc.aclose()

    # ------------------------------------------------------------------ identity and swarm

    async def peer_id(self) -> str:
        """Return the daemon's peer ID (``id``; cached)."""
        if self._peer_id is None:
            answer = await self.rpc.post_json("id") if self.rpc is not None else None
            self._peer_id = str((answer or {}).get("ID", ""))
            if not self._peer_id:
                raise KuboRpcError(f"id: no peer ID in the answer {answer!r:.200}")
        return self._peer_id

    async def signer(self) -> Signer:
        """Return the signer of this node's statements: its pubsub identity (cached).

        A daemon's identity key (``key/sign``); on the in-memory bus the node's ``signer``, or
        one derived from its name (:class:`~gradfed_ipfs.kubo.MemoryPubsubBus`).

        Raises
        ------
        BadSignature
            If the daemon's identity is not an Ed25519 key.
        """
        if self._signer is None:
            self._signer = await self.pubsub.signer()
        return self._signer

    async def addresses(self) -> list[str]:
        """Return the daemon's swarm multiaddrs (``id``); empty for an in-memory node."""
        if self.rpc is None:
            return []
        answer = await self.rpc.post_json("id")
        return [str(a) for a in (answer or {}).get("Addresses") or []]

    async def connect(self, target: str | Node) -> str:
        """``swarm/connect`` to another node: a multiaddr, another daemon's API URL, or a Node.

        Returns
        -------
        str
            The multiaddr dialled ('' for an in-memory node, which needs no connection).

        Raises
        ------
        KuboRpcError
            If the other node cannot be asked for its addresses or the dial fails.
        """
        if self.rpc is None:
            return ""
        if isinstance(target, Node):
            address = pick_dial_address(await target.addresses(), await target.peer_id())
        elif target.startswith(("http://", "https://")):
            async with KuboRpc(target, timeout=self.rpc.timeout) as other:
                info = await other.post_json("id") or {}
            addresses = [str(a) for a in info.get("Addresses") or []]
            address = pick_dial_address(addresses, str(info.get("ID", "")))
        else:
            address = target
        await self.rpc.post_json("swarm/connect", {"arg": address})
        return address

    async def peers(self) -> list[str]:
        """Return the peer IDs of the daemon's current swarm connections (sorted)."""
        if self.rpc is None:
            return []
        answer = await self.rpc.post_json("swarm/peers") or {}
        return sorted({str(p.get("Peer")) for p in answer.get("Peers") or []})

    # ------------------------------------------------------------------ gradients and rounds

    async def put_gradient(self, gradient: GradientLike, **options: Any) -> CID:
        """Store a gradient (one block, or a chunked DAG when large) and pin it; return its CID.

        ``options`` go to :func:`gradfed_ipfs.storage.put_gradient` (``chunk_bytes``, ...).
        """
        return await put_gradient(self.store, gradient, **options)

    async def fetch_gradient(
        self, cid: CIDLike, *, timeout: float | Unset = UNSET, **options: Any
    ) -> FloatArray:
        """Fetch a gradient by CID (from peers over bitswap when needed), verified, as float32.

        ``options`` go to :func:`gradfed_ipfs.storage.fetch_gradient`.
        """
        return await fetch_gradient(self.store, cid, timeout=timeout, **options)

    def runner(
        self, session_id: str, *, config: RoundConfig | None = None, **options: Any
    ) -> RoundRunner:
        """Return a best-effort round runner for ``session_id`` over this node's store and pubsub.

        The runner is the best-effort building block: each peer aggregates the contributions it
        heard, so peers may end a round on different models; :meth:`session` gives agreed
        rounds. The runner and its gossip endpoint are closed with the node. ``options`` go to
        the runner (``accumulator_factory=``, ``randbytes=``). Use the node as ``async with``
        first (the runner needs the node's peer ID).

        Raises
        ------
        KuboRpcError
            If the node's peer ID is not known yet.
        """
        peer_id = self._entered("runner()")
        gossip = GossipModelSync(peer_id, self.pubsub, session_id=session_id)
        runner = RoundRunner(self.store, gossip, config, **options)
        self._closers += [gossip.aclose, runner.aclose]
        return runner

    async def session(
        self,
        name: str,
        initial_model: GradientLike,
        config: AgreedConfig,
        **options: Any,
    ) -> AgreedSession:
        """Join the agreed session ``name`` from ``initial_model``; return it, started.

        Commits the genesis (the initial model; its CID names the session with ``name``),
        subscribes and starts announcing. Each :meth:`AgreedSession.run_round` then ends every
        honest member on the same model CID. The session is closed with the node.

        Parameters
        ----------
        name
            Session name, the same on every member.
        initial_model
            The session's initial model, identical on every member: any shape, flattened to
            float32 ``(d,)``; each round's gradient has the same ``d`` values.
        config
            Members (peer IDs, this node's included) and timing (seconds).
        **options
            Go to :class:`~gradfed_ipfs.AgreedSession` (``retention=``).

        Returns
        -------
        AgreedSession
            Started at round 0, on the genesis model.

        Raises
        ------
        KuboRpcError
            If the node was not entered (``async with``) first.
        GenesisMismatch
            If this node's peer ID is not one of ``config.members``.
        """
        self._entered("session()")
        model = np.asarray(initial_model, np.float32).reshape(-1)
        genesis = await AgreedSession.commit_genesis(self.store, model)
        session = AgreedSession(self.store, self.pubsub, name, genesis, config, **options)
        try:
            await session.start(model)
        except BaseException:
            await session.aclose()
            raise
        self._closers.append(session.aclose)
        return session

    def _entered(self, what: str) -> str:
        """Return the peer ID :meth:`__aenter__` (or :meth:`memory`) learnt; raise without it."""
        if self._peer_id is None:
            raise KuboRpcError(f"use the node as `async with Node(...)` before {what}")
        return self._peer_id
