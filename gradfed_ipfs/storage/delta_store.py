"""Store a :class:`GradientDelta` as one IPLD object in a block store, and load it back.

Layout: each layer is its own raw-codec Arrow block (see :func:`~gradfed_ipfs.formats.arrow.
store_layer_as_arrow`, any representation: dense, sparse, quantized), and one dag-cbor record
links them by CID::

    {
      "type": "gradfed/gradient-delta",
      "version": 1,
      "base": CID(base model),
      "checksum": "<sha-256 hex>",
      "timestamp": <unix seconds>,
      "layers": {"<layer name>": CID(layer block), ...}
    }

The record's CID (``bafyrei…``) names the whole delta; pinning it pins every layer. Loading
re-hashes every block against its CID (the store does), checks the record's form and each
layer's name, and verifies the delta checksum over the decoded layers.

This is the one module under ``tensor/`` that performs I/O; it only hashes, never computes.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Final

import dag_cbor
from dag_cbor.ipld import IPLDKind
from multiformats import CID

from .._types import CIDLike
from ..cid import DAG_CBOR, RAW, parse_cid
from ..errors import MalformedManifest
from ..formats import arrow as _arrow
from ..tensor.types import GradientDelta
from .base import Block, BlockStore

__all__ = ["DELTA_RECORD_TYPE", "DELTA_RECORD_VERSION", "load_delta", "store_delta"]

DELTA_RECORD_TYPE: Final = "gradfed/gradient-delta"
"""The ``type`` field of a delta record."""
DELTA_RECORD_VERSION: Final = 1
"""The ``version`` field of the record layout this module writes."""

_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_MAX_LAYERS: Final = 100_000


async def store_delta(delta: GradientDelta, store: BlockStore, *, pin: bool = True) -> CID:
    """Write every layer block and the linking dag-cbor record; return the record's CID.

    Parameters
    ----------
    delta
        The delta; its checksum is written as it is (call ``verify_checksum`` first if unsure).
    store
        Any :class:`~gradfed_ipfs.storage.BlockStore`.
    pin
        Pin the blocks (default).

    Returns
    -------
    CID
        The dag-cbor CID of the record.

    Raises
    ------
    BlockTooLarge
        If a layer's encoding exceeds the block size limit (chunk such layers with ``dag``).
    MalformedArrow
        If a layer is internally inconsistent.
    """
    names = sorted(delta.layer_gradients)
    blocks = [
        Block.new(_arrow.store_layer_as_arrow(delta.layer_gradients[name], name)) for name in names
    ]
    cids = await asyncio.gather(*(store.put(block, pin=pin) for block in blocks))
    record: dict[str, IPLDKind] = {
        "type": DELTA_RECORD_TYPE,
        "version": DELTA_RECORD_VERSION,
        "base": delta.base_model,
        "checksum": delta.checksum,
        "timestamp": delta.timestamp,
        "layers": {name: link for name, link in zip(names, cids, strict=True)},
    }
    root = Block.new(bytes(dag_cbor.encode(record)), codec="dag-cbor")
    return await store.put(root, pin=pin)


async def load_delta(
    cid: CIDLike, store: BlockStore, *, max_elements: int = _arrow.MAX_DECODED_ELEMENTS
) -> GradientDelta:
    """Fetch a delta record and its layers, check them, and rebuild the :class:`GradientDelta`.

    Parameters
    ----------
    cid
        The record's dag-cbor CID.
    store
        The block store to read from (it verifies every block's hash).
    max_elements
        Cap on any one decoded layer's element count.

    Raises
    ------
    MalformedManifest
        If the CID is not dag-cbor or the record is not a delta record of this layout, or a
        layer block names another layer.
    MalformedArrow
        If a layer block does not decode.
    ChecksumFailed
        If the decoded layers do not match the record's checksum.
    BlockNotFound, BlockCorrupt, StoreUnavailable
        From the store.

    Notes
    -----
    Dense layers are read-only views on the fetched block bytes (no copy); copy a layer's
    values before modifying them.
    """
    parsed = parse_cid(cid)
    if parsed.codec.code != DAG_CBOR:
        raise MalformedManifest(f"{parsed} is not a dag-cbor delta record")
    block = await store.get(parsed)
    try:
        record = dag_cbor.decode(bytes(block.data))
    except Exception as exc:  # dag_cbor raises several unrelated types on garbage input
        raise MalformedManifest(f"{parsed}: not dag-cbor: {exc}") from exc
    base, checksum, timestamp, layers = _check_record(record, parsed)
    fetched = await asyncio.gather(*(store.get(layers[name]) for name in layers))
    delta = GradientDelta(base, timestamp)
    for name, layer_block in zip(layers, fetched, strict=True):
        layer, stored_name = _arrow.load_layer_from_arrow(
            layer_block.data, max_elements=max_elements
        )
        if stored_name != name:
            raise MalformedManifest(
                f"{parsed}: block {layer_block.cid} holds layer {stored_name!r}, not {name!r}"
            )
        delta.layer_gradients[name] = layer
    delta.checksum = checksum
    delta.verify_checksum()
    return delta


def _check_record(record: Any, cid: CID) -> tuple[CID, str, int, dict[str, CID]]:
    if not isinstance(record, dict):
        raise MalformedManifest(f"{cid}: a delta record must be a map")
    if record.get("type") != DELTA_RECORD_TYPE or record.get("version") != DELTA_RECORD_VERSION:
        raise MalformedManifest(
            f"{cid}: not a {DELTA_RECORD_TYPE} v{DELTA_RECORD_VERSION} record "
            f"(type={record.get('type')!r:.40}, version={record.get('version')!r:.10})"
        )
    base, checksum, timestamp = record.get("base"), record.get("checksum"), record.get("timestamp")
    layers = record.get("layers")
    if not isinstance(base, CID):
        raise MalformedManifest(f"{cid}: 'base' must be a CID link")
    if not isinstance(checksum, str) or not _HEX64.fullmatch(checksum):
        raise MalformedManifest(f"{cid}: 'checksum' must be 64 lower-case hex digits")
    if not isinstance(timestamp, int) or isinstance(timestamp, bool):
        raise MalformedManifest(f"{cid}: 'timestamp' must be an integer")
    if not isinstance(layers, dict) or len(layers) > _MAX_LAYERS:
        raise MalformedManifest(f"{cid}: 'layers' must be a map of at most {_MAX_LAYERS}")
    for name, link in layers.items():
        if not isinstance(name, str) or not isinstance(link, CID) or link.codec.code != RAW:
            raise MalformedManifest(f"{cid}: layer {name!r:.40} must link a raw block by CID")
    # A block holds one named layer, so a link repeated under two names is forged (and would
    # be fetched once per name).
    if len({bytes(link) for link in layers.values()}) != len(layers):
        raise MalformedManifest(f"{cid}: two layers link the same block")
    return parse_cid(base), checksum, timestamp, layers
