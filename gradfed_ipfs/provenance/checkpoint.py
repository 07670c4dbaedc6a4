"""Training checkpoints: a JSON file saved atomically, and a content-addressed IPLD record.

:class:`GradientCheckpoint` holds what the seed's checkpoint holds (seed-api §10): the
computation graph, the step, the loss CID, opaque optimizer-state blobs keyed by parameter name,
and a Unix timestamp. It adds model ``parameters`` (name → float32 array), which the seed left
out, and error-feedback ``residuals`` (stream id → float32 array, e.g. from
:meth:`~gradfed_ipfs.tensor.codecs.ErrorFeedback.residual`), so that a run can resume from
the checkpoint alone. DP accountant state, where present, goes into ``optimizer_state`` as a blob.

Two ways to persist it:

- :meth:`GradientCheckpoint.save` / :meth:`GradientCheckpoint.load`: the seed's pretty JSON
  (byte blobs as arrays of integers), written to a temporary file in the same directory,
  fsynced, renamed over the target, and the directory fsynced, so a crash leaves either the old
  or the new file.
- :meth:`GradientCheckpoint.save_to_store` / :meth:`GradientCheckpoint.load_from_store`
  (aliases ``commit`` / ``restore``): a dag-cbor record linking the graph root, each optimizer
  blob as a raw block and each parameter as an Arrow gradient block (raw). Every block is
  verified against its CID on the way back, so restoring from a CID gives exactly the state
  that was committed. Record::

      {"type": "gradfed/checkpoint", "version": 1, "step": int, "timestamp": int,
       "loss": link|str|null, "graph": link,
       "optimizer_state": {name: link | b""}, "parameters": {name: link},
       "residuals": {name: link}}

  Empty optimizer blobs are stored inline (a block cannot be empty). A parameter or residual
  whose encoding exceeds 1 MiB is stored as a chunked DAG (:mod:`gradfed_ipfs.storage.dag`); an
  optimizer blob over the 2 MiB block limit raises :class:`~gradfed_ipfs.errors.BlockTooLarge`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from multiformats import CID

from .._types import CIDLike, FloatArray, GradientLike
from ..cid import RAW, parse_cid
from ..errors import GraphIoError, GraphSerializationError, MalformedManifest
from ..formats.arrow import decode_gradient, store_gradient_as_arrow
from ..formats.records import decode_record, encode_record, from_link, require, to_link
from ..storage.base import Block, BlockStore, fetch_all
from ..storage.dag import DEFAULT_CHUNK_BYTES, fetch_gradient, put_gradient
from .graph import ComputationGraphStore

__all__ = ["CHECKPOINT_RECORD_TYPE", "GradientCheckpoint"]

CHECKPOINT_RECORD_TYPE: Final = "gradfed/checkpoint"
"""``type`` field of a checkpoint record."""
_VERSION: Final = 1


@dataclass(eq=False)
class GradientCheckpoint:
    """A resumable snapshot of training state.

    Attributes
    ----------
    graph
        The computation graph.
    step
        The training step.
    loss_cid
        CID of the loss tensor, if any.
    optimizer_state
        Opaque optimizer blobs keyed by parameter name.
    timestamp
        Unix seconds at creation.
    parameters
        Model parameters by name (float32 arrays of any shape); not in the seed.
    residuals
        Error-feedback residuals by stream id (float32 arrays); not in the seed.
    """

    graph: ComputationGraphStore
    step: int
    loss_cid: str | None = None
    optimizer_state: dict[str, bytes] = field(default_factory=dict)
    timestamp: int = field(default_factory=lambda: int(time.time()))
    parameters: dict[str, FloatArray] = field(default_factory=dict)
    residuals: dict[str, FloatArray] = field(default_factory=dict)

    @classmethod
    def new(cls, graph: ComputationGraphStore, step: int) -> GradientCheckpoint:
        """Build a checkpoint stamped now, with no loss CID and no optimizer state."""
        return cls(graph, step)

    def with_loss_cid(self, cid: str) -> GradientCheckpoint:
        """Set the loss CID and return ``self`` (builder)."""
        self.loss_cid = str(cid)
        return self

    def set_optimizer_state(self, param: str, state: bytes) -> None:
        """Insert or replace the optimizer blob for ``param``."""
        self.optimizer_state[param] = bytes(state)

    def set_parameter(self, name: str, values: GradientLike) -> None:
        """Insert or replace a model parameter (copied as float32, shape kept)."""
        self.parameters[name] = np.array(values, dtype=np.float32, copy=True)

    def set_residual(self, stream_id: str, values: GradientLike) -> None:
        """Insert or replace an error-feedback residual (copied as float32, shape kept)."""
        self.residuals[stream_id] = np.array(values, dtype=np.float32, copy=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GradientCheckpoint):
            return NotImplemented
        return (
            self.graph == other.graph
            and self.step == other.step
            and self.loss_cid == other.loss_cid
            and self.optimizer_state == other.optimizer_state
            and self.timestamp == other.timestamp
            and _arrays_equal(self.parameters, other.parameters)
            and _arrays_equal(self.residuals, other.residuals)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    # ---------------------------------------------------------------- JSON file

    def to_dict(self) -> dict[str, Any]:
        """Return the seed's JSON form (plus ``parameters``)."""
        return {
            "graph": self.graph.to_dict(),
            "step": self.step,
            "loss_cid": self.loss_cid,
            "optimizer_state": {k: list(v) for k, v in self.optimizer_state.items()},
            "timestamp": self.timestamp,
            "parameters": _arrays_to_json(self.parameters),
            "residuals": _arrays_to_json(self.residuals),
        }

    @classmethod
    def from_dict(cls, data: Any) -> GradientCheckpoint:
        """Parse :meth:`to_dict` output (or the seed's, without parameters).

        Raises
        ------
        GraphSerializationError
            If ``data`` is not a checkpoint.
        """
        if not isinstance(data, Mapping):
            raise GraphSerializationError("Checkpoint deserialization: expected an object")
        try:
            step, timestamp, loss = data["step"], data["timestamp"], data.get("loss_cid")
            blobs = {
                str(k): bytes(_int_list(v))
                for k, v in dict(data.get("optimizer_state") or {}).items()
            }
            params = _arrays_from_json(data.get("parameters"))
            residuals = _arrays_from_json(data.get("residuals"))
        except (KeyError, TypeError, ValueError) as exc:
            raise GraphSerializationError(f"Checkpoint deserialization: {exc}") from exc
        if not _is_uint(step) or not _is_uint(timestamp):
            raise GraphSerializationError("Checkpoint deserialization: step/timestamp not ints")
        if loss is not None and not isinstance(loss, str):
            raise GraphSerializationError("Checkpoint deserialization: loss_cid not a string")
        graph = ComputationGraphStore.from_dict(data.get("graph"))
        return cls(graph, step, loss, blobs, timestamp, params, residuals)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write pretty JSON atomically: temp file in the same directory, fsync, rename.

        Raises
        ------
        GraphIoError
            If writing fails; the target is then untouched and the temp file removed.
        """
        target = Path(path)
        tmp = target.parent / f".ckpt_tmp_{uuid.uuid4().hex}.json"
        data = json.dumps(self.to_dict(), indent=2).encode("utf-8")
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise GraphIoError(f"Checkpoint save to {target}: {exc}") from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> GradientCheckpoint:
        """Read a checkpoint written by :meth:`save` (or by the seed).

        Raises
        ------
        GraphIoError
            If the file cannot be read.
        GraphSerializationError
            If it is not a checkpoint.
        """
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise GraphIoError(f"Checkpoint load from {path}: {exc}") from exc
        try:
            parsed = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise GraphSerializationError(f"Checkpoint deserialization: {exc}") from exc
        return cls.from_dict(parsed)

    # ---------------------------------------------------------------- IPLD

    async def save_to_store(self, store: BlockStore, *, pin: bool = True) -> CID:
        """Store the checkpoint as a dag-cbor record and its parts as blocks; return its CID.

        Only the record is pinned (a recursive pin on Kubo covers what it links).

        Raises
        ------
        CircularDependency
            If the graph has a cycle.
        BlockTooLarge
            If a blob, a parameter or a record exceeds the 2 MiB block limit.
        """
        graph_cid = await self.graph.save_to_store(store, pin=False)
        blobs: dict[str, CID | bytes] = {}
        for name in sorted(self.optimizer_state):
            blob = self.optimizer_state[name]
            blobs[name] = await store.put(Block.new(blob, "raw"), pin=False) if blob else b""
        record: dict[str, Any] = {
            "type": CHECKPOINT_RECORD_TYPE,
            "version": _VERSION,
            "step": self.step,
            "timestamp": self.timestamp,
            "loss": None if self.loss_cid is None else to_link(self.loss_cid),
            "graph": graph_cid,
            "optimizer_state": blobs,
            "parameters": await _put_arrays(store, self.parameters),
            "residuals": await _put_arrays(store, self.residuals),
        }
        return await store.put(encode_record(record), pin=pin)

    commit = save_to_store

    @classmethod
    async def load_from_store(cls, cid: CIDLike, store: BlockStore) -> GradientCheckpoint:
        """Restore a checkpoint from its record CID; every block is verified.

        Raises
        ------
        MalformedManifest
            If a record or parameter block is not of the expected form.
        BlockNotFound, BlockCorrupt
            If a block is missing or does not match its CID.
        """
        parsed = parse_cid(cid)
        record = decode_record(await store.get(parsed), CHECKPOINT_RECORD_TYPE, _VERSION)
        where = f"checkpoint {parsed}"
        step = require(record, "step", int, where)
        timestamp = require(record, "timestamp", int, where)
        graph_link = require(record, "graph", CID, where)
        blob_links = require(record, "optimizer_state", dict, where)
        param_links = require(record, "parameters", dict, where)
        residual_links = require(record, "residuals", dict, where)
        loss = record.get("loss")
        if not all(isinstance(v, CID | bytes) for v in blob_links.values()):
            raise MalformedManifest(f"{where}: optimizer_state must hold links")
        graph = await ComputationGraphStore.load_from_store(graph_link, store)
        blob_blocks = await fetch_all(store, [v for v in blob_links.values() if isinstance(v, CID)])
        fetched = iter(blob_blocks)
        blobs = {
            k: next(fetched).data if isinstance(v, CID) else bytes(v) for k, v in blob_links.items()
        }
        params = await _get_arrays(store, param_links, f"{where}: parameter")
        residuals = await _get_arrays(store, residual_links, f"{where}: residual")
        loss_cid = None if loss is None else from_link(loss, "loss")
        return cls(graph, step, loss_cid, blobs, timestamp, params, residuals)

    restore = load_from_store


def _int_list(value: object) -> list[int]:
    """Return ``value`` if it is a list of ints (a JSON byte blob), else raise ``TypeError``."""
    if not isinstance(value, list) or not all(isinstance(b, int) for b in value):
        raise TypeError("optimizer_state blobs must be lists of byte values")
    return value


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _arrays_equal(a: Mapping[str, FloatArray], b: Mapping[str, FloatArray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and np.array_equal(a[k], b[k], equal_nan=True) for k in a
    )


def _arrays_to_json(arrays: Mapping[str, FloatArray]) -> dict[str, Any]:
    return {
        k: {"shape": list(v.shape), "values": v.reshape(-1).tolist()} for k, v in arrays.items()
    }


def _arrays_from_json(data: Any) -> dict[str, FloatArray]:
    return {
        str(k): np.array(v["values"], dtype=np.float32).reshape(v["shape"])
        for k, v in dict(data or {}).items()
    }


async def _put_arrays(store: BlockStore, arrays: Mapping[str, FloatArray]) -> dict[str, CID]:
    """Store each array as a dense Arrow block named by its key, or a chunked DAG when large."""
    links: dict[str, CID] = {}
    for name in sorted(arrays):
        value = arrays[name]
        data = store_gradient_as_arrow(value, shape=value.shape, layer=name)
        if len(data) <= DEFAULT_CHUNK_BYTES:
            links[name] = await store.put(Block.new(data, "raw"), pin=False)
        else:
            links[name] = await put_gradient(store, value, pin=False)
    return links


async def _get_arrays(
    store: BlockStore, links: Mapping[str, Any], what: str
) -> dict[str, FloatArray]:
    """Fetch and decode :func:`_put_arrays` blocks; each must be dense and carry its name."""
    if not all(isinstance(v, CID) for v in links.values()):
        raise MalformedManifest(f"{what}s must be links")
    arrays: dict[str, FloatArray] = {}
    raw = {k: v for k, v in links.items() if v.codec.code == RAW}
    for name, block in zip(raw, await fetch_all(store, raw.values()), strict=True):
        decoded = decode_gradient(block.data)
        if decoded.encoding != "dense" or decoded.layer != name:
            raise MalformedManifest(f"{what} block {block.cid} is not {name!r}")
        arrays[name] = np.array(decoded.tensor(), dtype=np.float32, copy=True)
    for name, link in links.items():
        if name not in raw:  # a chunked DAG (dag-cbor manifest)
            arrays[name] = np.array(await fetch_gradient(store, link), dtype=np.float32)
    return {name: arrays[name] for name in links}


def _fsync_dir(directory: Path) -> None:
    """Fsync a directory so a rename inside it is durable (a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
