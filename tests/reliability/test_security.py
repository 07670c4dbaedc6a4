"""Issue 8, scenario 7: security checks.

* No code path unpickles or evaluates data: an AST walk over the package source.
* The daemons we start listen on loopback only: their config, their ``id`` addresses, and
  the sockets the daemon process really has open (``/proc``).
* Secure aggregation never writes an individual's unmasked vector to the store: a SecAgg round
  whose masked vectors (and aggregate) go through a recording store, every stored byte scanned.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest
from multiformats import CID

import gradfed_ipfs
from gradfed_ipfs import put_gradient
from gradfed_ipfs._types import CIDLike
from gradfed_ipfs.federated import SecAggClient, SecAggServer
from gradfed_ipfs.federated.secagg import FixedPoint
from gradfed_ipfs.formats import store_gradient_as_arrow
from gradfed_ipfs.kubo import KuboDaemon
from gradfed_ipfs.storage import UNSET, Block, KuboBlockStore, Unset

PACKAGE = Path(gradfed_ipfs.__file__).parent

BANNED_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}
BANNED_CALLS = {"eval", "exec", "__import__"}
BANNED_ATTRIBUTES = {"read_pickle", "loads_pickle", "unsafe_load"}

# --------------------------------------------------------------------------- no unpickling


def unsafe_uses(source: str, filename: str = "<source>") -> list[str]:
    """Lines of ``source`` that import a deserialiser that runs code, or evaluate text."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names if _banned(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and _banned(node.module):
            found.append(f"{where} from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else None
            attr = func.attr if isinstance(func, ast.Attribute) else None
            if name in BANNED_CALLS or attr in BANNED_CALLS | BANNED_ATTRIBUTES:
                found.append(f"{where} call {name or attr}")
            if attr == "load" and any(
                k.arg == "allow_pickle"
                and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                for k in node.keywords
            ):
                found.append(f"{where} load(..., allow_pickle=...)")
            if attr == "load" and _is_yaml(func) and not node.keywords:
                found.append(f"{where} yaml.load without a safe Loader")
        elif isinstance(node, ast.Name) and node.id in {"eval", "exec"}:
            found.append(f"{where} reference to {node.id}")
    return sorted(set(found))


def _banned(module: str) -> bool:
    return module.split(".")[0] in BANNED_MODULES


def _is_yaml(func: ast.Attribute) -> bool:
    return isinstance(func.value, ast.Name) and func.value.id == "yaml"


def test_package_never_unpickles_or_evals_data() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 20
    found = [u for path in sources for u in unsafe_uses(path.read_text(), str(path))]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "import pickle",
        "import marshal as m",
        "from shelve import open",
        "from pickle import loads",
        "eval(text)",
        "exec(code)",
        "builtins.eval(text)",
        "f = eval",
        "np.load(path, allow_pickle=True)",
        "numpy.load(path, allow_pickle=flag)",
        "pd.read_pickle(path)",
        "yaml.load(text)",
        "__import__('pickle')",
    ],
)
def test_unsafe_use_checker_finds_each_offender(source: str) -> None:
    assert unsafe_uses(source) != []


@pytest.mark.parametrize(
    "source",
    ["np.load(path)", "np.load(path, allow_pickle=False)", "json.loads(text)", "x.evaluate()"],
)
def test_unsafe_use_checker_allows_safe_code(source: str) -> None:
    assert unsafe_uses(source) == []


# --------------------------------------------------------------------------- loopback only

LOOPBACK_HEX = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1


def listening_addresses(pid: int) -> list[tuple[str, str]]:
    """``(proto, local address hex)`` of every listening TCP / bound UDP socket of ``pid``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        table = Path(f"/proc/{pid}/net/{proto}")
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            listening = state == "0A" if proto.startswith("tcp") else True
            if inode in inodes and listening:
                found.append((proto, local.split(":")[0]))
    return found


def _is_loopback_multiaddr(addr: str) -> bool:
    return addr.startswith(("/ip4/127.0.0.1/", "/ip6/::1/"))


@pytest.mark.kubo
def test_daemons_we_start_listen_on_loopback_only(fresh_daemon: KuboDaemon) -> None:
    config = fresh_daemon.rpc("config/show")
    addresses = config["Addresses"]
    configured = [addresses["API"], addresses["Gateway"], *addresses["Swarm"]]
    configured = [a for group in configured for a in ([group] if isinstance(group, str) else group)]
    assert configured
    assert all(_is_loopback_multiaddr(a) for a in configured), configured
    assert addresses.get("Announce") in ([], None)
    assert config["Bootstrap"] in ([], None)
    assert config["Discovery"]["MDNS"]["Enabled"] is False

    announced = fresh_daemon.rpc("id")["Addresses"]
    assert announced
    assert all(_is_loopback_multiaddr(a) for a in announced), announced

    assert fresh_daemon.pid is not None
    sockets = listening_addresses(fresh_daemon.pid)
    assert any(proto.startswith("tcp") for proto, _ in sockets)
    assert all(address in LOOPBACK_HEX for _, address in sockets), sockets


# --------------------------------------------------------------------------- SecAgg


class RecordingStore:
    """A block store wrapper that keeps a copy of every block it is given."""

    def __init__(self, inner: KuboBlockStore) -> None:
        self.inner = inner
        self.received: list[Block] = []

    async def put(self, block: Block, *, pin: bool = True) -> CID:
        self.received.append(block)
        return await self.inner.put(block, pin=pin)

    async def get(self, cid: CIDLike, *, timeout: float | Unset = UNSET) -> Block:
        return await self.inner.get(cid, timeout=timeout)

    async def has(self, cid: CIDLike) -> bool:
        return await self.inner.has(cid)

    async def delete(self, cid: CIDLike) -> None:
        await self.inner.delete(cid)

    async def pin(self, cid: CIDLike) -> None:
        await self.inner.pin(cid)

    async def unpin(self, cid: CIDLike) -> None:
        await self.inner.unpin(cid)

    async def list_cids(self) -> list[CID]:
        return await self.inner.list_cids()

    async def aclose(self) -> None:
        await self.inner.aclose()


def raw_encodings(vector: np.ndarray, codec: FixedPoint) -> dict[str, bytes]:
    """Every way an unmasked individual vector could appear in a block."""
    return {
        "float32": vector.astype("<f4").tobytes(),
        "float64": vector.astype("<f8").tobytes(),
        "arrow": store_gradient_as_arrow(vector),
        "fixed-point": codec.encode(vector).tobytes(),
    }


@pytest.mark.kubo
async def test_secagg_round_never_stores_an_unmasked_vector(kubo_node: object) -> None:
    rng = np.random.default_rng(87)
    d, threshold = 2048, 3
    inputs = {f"client-{i}": rng.uniform(-2, 2, d).astype(np.float32) for i in range(5)}
    dropped_out = "client-4"  # shares keys, then vanishes before masking
    context = b"reliability-round"
    clients = {cid: SecAggClient(cid, threshold, context=context) for cid in sorted(inputs)}
    server = SecAggServer(threshold, context=context)
    roster = server.register(c.advertise_keys() for c in clients.values())
    routed = server.route_shares(m for c in clients.values() for m in c.share_keys(roster))
    for cid, client in clients.items():
        client.receive_shares(routed.get(cid, []))

    api = kubo_node.api_url  # type: ignore[attr-defined]
    store = RecordingStore(KuboBlockStore(api, timeout=10.0))
    try:
        # Each client stores its masked vector; the server fetches it by CID.
        posted = {}
        for cid, client in clients.items():
            if cid != dropped_out:
                masked = client.masked_input(inputs[cid])
                posted[cid] = await store.put(Block.new(masked.tobytes()))
        for cid, block_cid in posted.items():
            data = (await store.get(block_cid)).data
            server.receive_masked(cid, np.frombuffer(data, dtype=server.codec.dtype).copy())
        survivors, dropped = server.unmask_request()
        assert dropped == [dropped_out]
        total = server.finalize(clients[v].unmask(survivors, dropped) for v in survivors)
        mean = total / len(survivors)
        aggregate_cid = await put_gradient(store, mean)
    finally:
        for block in store.received:
            await store.unpin(block.cid)
        await store.aclose()

    expected = sum(inputs[v].astype(np.float64) for v in survivors)
    np.testing.assert_allclose(total, expected, atol=1e-3)
    assert aggregate_cid in {b.cid for b in store.received}
    assert len(store.received) == len(survivors) + 1

    codec = server.codec
    assert find_leaks(store.received, inputs, codec) == []
    # Control: the scan does see an unmasked vector in any of its encodings.
    for name, encoding in raw_encodings(inputs["client-1"], codec).items():
        assert find_leaks([Block.new(b"x" + encoding)], inputs, codec) != [], name


def find_leaks(blocks: list[Block], inputs: dict[str, np.ndarray], codec: FixedPoint) -> list[str]:
    """Every block that holds a participant's raw vector, whole or in part (32-byte windows
    from the start, middle and end of each encoding; the middle only for Arrow framing)."""
    leaks = []
    for owner, vector in inputs.items():
        for name, encoding in raw_encodings(vector, codec).items():
            windows = [encoding[i : i + 32] for i in (0, len(encoding) // 2, len(encoding) - 32)]
            if name == "arrow":
                windows = [encoding[len(encoding) // 2 : len(encoding) // 2 + 32]]
            leaks += [
                f"{owner}'s {name} encoding in {block.cid}"
                for block in blocks
                if any(w in block.data for w in windows)
            ]
    return leaks
