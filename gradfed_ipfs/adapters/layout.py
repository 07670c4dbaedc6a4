"""The layout manifest of a flattened model: where each named tensor sits in one float32 vector.

A :class:`Layout` lists, in order, every floating tensor's name, shape, original dtype and
offset into the flat vector, plus small integer/bool buffers (e.g. BatchNorm's
``num_batches_tracked``) whose values travel *in the layout*, outside the vector, so they are
never averaged. It is plain data: :meth:`Layout.to_dict` is JSON- and dag-cbor-able and
:meth:`Layout.cid` content-addresses it, so peers can check they flatten the same model.
:meth:`Layout.from_dict` treats its input as hostile (a peer's record) and checks every field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import dag_cbor
import numpy as np
from multiformats import CID

from ..cid import make_cid
from ..errors import IncompatibleDtype, InvalidGradient, MalformedManifest, ShapeMismatch

__all__ = [
    "BUFFER_DTYPES",
    "FLOAT_DTYPES",
    "LAYOUT_FORMAT",
    "BufferSpec",
    "Layout",
    "TensorSpec",
]

LAYOUT_FORMAT: Final = "gradfed/layout/v1"
"""The ``format`` field of a layout's dict form."""
FLOAT_DTYPES: Final = ("bfloat16", "float16", "float32", "float64")
"""Dtypes stored in the flat vector (as float32; float64 loses precision, see the adapters)."""
BUFFER_DTYPES: Final = ("bool", "int8", "int16", "int32", "int64", "uint8")
"""Dtypes carried as values in the layout instead of the vector (never averaged)."""
MAX_ENTRIES: Final = 1_000_000
"""Most tensors plus buffers a layout may list (a budget for hostile dicts)."""
MAX_BUFFER_VALUES: Final = 65_536
"""Most integer values all buffers together may carry."""
MAX_NDIM: Final = 32
"""Most dimensions a tensor may declare."""
MAX_SIZE: Final = 2**48
"""Most values a layout may describe (its vector would be 1 PiB; keeps hostile sizes finite)."""


@dataclass(frozen=True)
class TensorSpec:
    """One floating tensor: ``size`` float32 values at ``offset`` of the flat vector.

    Parameters
    ----------
    name
        The tensor's name (a ``state_dict`` key, a dict key, or its list index).
    shape
        Its shape; ``()`` for a 0-d array (1 value).
    dtype
        Its original dtype name, one of :data:`FLOAT_DTYPES`.
    offset
        Index of its first value in the flat vector.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int

    @property
    def size(self) -> int:
        """Number of values (product of the shape; 1 for 0-d)."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class BufferSpec:
    """One integer or bool tensor carried by value in the layout (not in the vector).

    Parameters
    ----------
    name, shape
        As in :class:`TensorSpec`.
    dtype
        One of :data:`BUFFER_DTYPES`.
    values
        Its values, flattened row-major (bools as 0/1).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    values: tuple[int, ...]

    def array(self) -> np.ndarray[Any, Any]:
        """Return the buffer as a new NumPy array of its dtype and shape."""
        return np.array(self.values, dtype=self.dtype).reshape(self.shape)


@dataclass(frozen=True)
class Layout:
    """Where each named tensor of a model sits in one flat float32 vector.

    Parameters
    ----------
    tensors
        Floating tensors in vector order; offsets must be contiguous from 0.
    buffers
        Integer/bool tensors carried by value (see the module docstring).

    Raises
    ------
    InvalidGradient
        Offsets not contiguous, a name repeated, a negative dimension.
    IncompatibleDtype
        A dtype outside :data:`FLOAT_DTYPES` / :data:`BUFFER_DTYPES`.
    """

    tensors: tuple[TensorSpec, ...]
    buffers: tuple[BufferSpec, ...] = ()

    def __post_init__(self) -> None:
        offset = 0
        for spec in self.tensors:
            _check_shape(spec.name, spec.shape)
            if spec.dtype not in FLOAT_DTYPES:
                raise IncompatibleDtype(f"{spec.dtype} (tensor {spec.name!r})")
            if spec.offset != offset:
                raise InvalidGradient(f"{spec.name!r} at offset {spec.offset}, expected {offset}")
            offset += spec.size
            if offset > MAX_SIZE:
                raise InvalidGradient(f"the layout describes over {MAX_SIZE} values")
        for buffer in self.buffers:
            _check_shape(buffer.name, buffer.shape)
            if buffer.dtype not in BUFFER_DTYPES:
                raise IncompatibleDtype(f"{buffer.dtype} (buffer {buffer.name!r})")
            if len(buffer.values) != math.prod(buffer.shape):
                raise InvalidGradient(f"buffer {buffer.name!r}: values do not fill its shape")
            low, high = (0, 1) if buffer.dtype == "bool" else _int_range(buffer.dtype)
            if buffer.values and not low <= min(buffer.values) <= max(buffer.values) <= high:
                raise InvalidGradient(f"buffer {buffer.name!r}: values outside {buffer.dtype}")
        names = self.names
        if len(set(names)) != len(names):
            raise InvalidGradient("a tensor name appears twice in the layout")

    @property
    def size(self) -> int:
        """Length of the flat float32 vector."""
        return self.tensors[-1].offset + self.tensors[-1].size if self.tensors else 0

    @property
    def names(self) -> list[str]:
        """Every name, tensors (in vector order) then buffers."""
        return [t.name for t in self.tensors] + [b.name for b in self.buffers]

    def check(self, found: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
        """Check tensors found in a model, ``{name: (shape, dtype name)}``, against the layout.

        Raises
        ------
        ShapeMismatch
            A name missing or extra (named in the message), or a shape that differs.
        IncompatibleDtype
            A dtype that differs from the layout's.
        """
        specs = [(t.name, t.shape, t.dtype) for t in self.tensors]
        specs += [(b.name, b.shape, b.dtype) for b in self.buffers]
        missing = [name for name, _, _ in specs if name not in found]
        extra = sorted(set(found) - {name for name, _, _ in specs})
        if missing or extra:
            error = ShapeMismatch([len(specs)], [len(found)])
            error.args = (f"{error.args[0]} tensors: missing {missing}, unexpected {extra}",)
            raise error
        for name, shape, dtype in specs:
            found_shape, found_dtype = found[name]
            if tuple(found_shape) != shape:
                error = ShapeMismatch(shape, found_shape)
                error.args = (f"{name}: {error.args[0]}",)
                raise error
            if found_dtype != dtype:
                raise IncompatibleDtype(f"{found_dtype} for {name!r}, the layout says {dtype}")

    def to_dict(self) -> dict[str, Any]:
        """Return the layout as plain data (str/int/list/dict: JSON- and dag-cbor-able)."""
        return {
            "format": LAYOUT_FORMAT,
            "size": self.size,
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "offset": t.offset}
                for t in self.tensors
            ],
            "buffers": [
                {"name": b.name, "shape": list(b.shape), "dtype": b.dtype, "values": list(b.values)}
                for b in self.buffers
            ],
        }

    @classmethod
    def from_dict(cls, data: object) -> Layout:
        """Parse :meth:`to_dict`'s form, checking every field (the dict may come from a peer).

        Raises
        ------
        MalformedManifest
            Anything that is not a valid layout: wrong types, sizes, offsets or dtypes.
        """
        try:
            return _parse(data)
        except (InvalidGradient, IncompatibleDtype) as exc:
            raise MalformedManifest(f"not a valid layout: {exc}") from exc

    def to_json(self) -> str:
        """Return the dict form as compact JSON with sorted keys (stable bytes)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Layout:
        """Parse :meth:`to_json`'s form (``MalformedManifest`` on bad JSON or a bad layout)."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise MalformedManifest(f"layout is not JSON: {exc}") from exc
        return cls.from_dict(data)

    def cid(self) -> CID:
        """Return the CID (dag-cbor, sha2-256) of the dict form: equal layouts, equal CIDs."""
        return make_cid(dag_cbor.encode(self.to_dict()), "dag-cbor")


def _int_range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _check_shape(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) > MAX_NDIM or any(dim < 0 for dim in shape):
        raise InvalidGradient(f"{name!r} has an invalid shape {list(shape)}")


def _field(entry: Mapping[str, Any], key: str, kind: type) -> Any:
    value = entry.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedManifest(f"layout field {key!r} must be {kind.__name__}")
    return value


def _ints(value: object, what: str, limit: int) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > limit:
        raise MalformedManifest(f"layout {what} must be a list of at most {limit} integers")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise MalformedManifest(f"layout {what} must hold integers")
    return tuple(value)


def _entries(data: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    entries = data.get(key, [])
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise MalformedManifest(f"layout {key!r} must be a list of at most {MAX_ENTRIES}")
    if not all(isinstance(entry, Mapping) for entry in entries):
        raise MalformedManifest(f"layout {key!r} entries must be maps")
    return entries


def _parse(data: object) -> Layout:
    if not isinstance(data, Mapping) or data.get("format") != LAYOUT_FORMAT:
        raise MalformedManifest(f"not a layout (expected format {LAYOUT_FORMAT!r})")
    tensors = tuple(
        TensorSpec(
            _field(entry, "name", str),
            _ints(entry.get("shape"), "shape", MAX_NDIM),
            _field(entry, "dtype", str),
            _field(entry, "offset", int),
        )
        for entry in _entries(data, "tensors")
    )
    budget = MAX_BUFFER_VALUES
    buffers = []
    for entry in _entries(data, "buffers"):
        values = _ints(entry.get("values"), "buffer values", budget)
        budget -= len(values)
        shape = _ints(entry.get("shape"), "shape", MAX_NDIM)
        buffers.append(
            BufferSpec(_field(entry, "name", str), shape, _field(entry, "dtype", str), values)
        )
    layout = Layout(tensors, tuple(buffers))
    if _field(data, "size", int) != layout.size:
        raise MalformedManifest(f"layout size {data['size']} != {layout.size} (sum of its tensors)")
    return layout
