"""NumPy arrays (a list or a dict) ⇄ one flat float32 vector and its :class:`Layout`.

:func:`flatten` writes every floating array into one preallocated float32 vector (one copy,
no intermediates) and returns the vector with the layout; integer and bool arrays are carried
by value in the layout (never averaged). :func:`unflatten` returns *views* of the flat vector
for float32 tensors (no copy; writing to them writes the vector) and converted copies for
tensors that were float16/float64. float64 values pass through float32: they lose precision,
and values too large for float32 are refused. :func:`load_into` copies a vector into existing
arrays after checking their shapes and dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from ..errors import IncompatibleDtype, InvalidGradient, ShapeMismatch
from .layout import BUFFER_DTYPES, FLOAT_DTYPES, BufferSpec, Layout, TensorSpec

__all__ = [
    "Arrays",
    "as_float32",
    "check_arrays",
    "flatten",
    "layout_of",
    "load_into",
    "unflatten",
    "unflatten_list",
]

Arrays: TypeAlias = Sequence[ArrayLike] | Mapping[str, ArrayLike]
"""Named arrays (dict order kept) or a list (named ``"0"``, ``"1"``, …)."""


def as_float32(values: ArrayLike, name: str = "values") -> FloatArray:
    """Return ``values`` as float32 (no copy when already float32), refusing overflow.

    Raises
    ------
    IncompatibleDtype
        Not a real number dtype (complex, object, strings).
    InvalidGradient
        A finite value too large for float32 (it would become ±inf).
    """
    array = np.asarray(values)
    if array.dtype == np.float32:
        return array
    if array.dtype.kind not in "fiub":
        raise IncompatibleDtype(f"{array.dtype} ({name})")
    out = np.empty(array.shape, np.float32)
    _copy_float32(out, array, name)
    return out


def _copy_float32(out: FloatArray, array: NDArray[Any], name: str) -> None:
    """Copy ``array`` into ``out`` as float32; refuse finite values that overflow."""
    with np.errstate(over="ignore"):
        np.copyto(out, array, casting="unsafe")
    if array.dtype.kind == "f" and array.dtype.itemsize > 4:
        overflow = ~np.isfinite(out) & np.isfinite(array)
        if overflow.any():
            index = int(np.flatnonzero(overflow.reshape(-1))[0])
            value = array.reshape(-1)[index]
            raise InvalidGradient(f"{name}[{index}] = {value} does not fit float32")


def _named(arrays: Arrays) -> list[tuple[str, NDArray[Any]]]:
    if isinstance(arrays, np.ndarray | str | bytes):
        raise InvalidGradient("pass a list or a dict of arrays, not one array")
    items = arrays.items() if isinstance(arrays, Mapping) else enumerate(arrays)
    named = [(str(name), np.asarray(value)) for name, value in items]
    for name, array in named:
        if array.dtype.name not in FLOAT_DTYPES and array.dtype.name not in BUFFER_DTYPES:
            raise IncompatibleDtype(f"{array.dtype} (array {name!r})")
    return named


def layout_of(arrays: Arrays) -> Layout:
    """Return the layout :func:`flatten` would produce, without copying any float values."""
    return _layout(_named(arrays))


def _layout(named: list[tuple[str, NDArray[Any]]]) -> Layout:
    tensors: list[TensorSpec] = []
    buffers: list[BufferSpec] = []
    offset = 0
    for name, array in named:
        if array.dtype.kind == "f":
            tensors.append(TensorSpec(name, array.shape, array.dtype.name, offset))
            offset += array.size
        else:
            values = tuple(int(v) for v in array.reshape(-1).tolist())
            buffers.append(BufferSpec(name, array.shape, array.dtype.name, values))
    return Layout(tuple(tensors), tuple(buffers))


def flatten(arrays: Arrays, *, out: FloatArray | None = None) -> tuple[FloatArray, Layout]:
    """Write the floating arrays into one float32 vector; return it and its layout.

    Parameters
    ----------
    arrays
        A dict (names and order kept) or a list of arrays; 0-d arrays are one value each.
    out
        A writable float32 vector of exactly the layout's size to fill (else a new one).

    Returns
    -------
    tuple
        ``(flat, layout)``: the float32 vector of length ``layout.size`` and the layout.

    Raises
    ------
    IncompatibleDtype
        An array that is neither floating nor integer/bool, or an ``out`` that is not float32.
    ShapeMismatch
        ``out`` has the wrong length.
    InvalidGradient
        A float64 value too large for float32.
    """
    named = _named(arrays)
    layout = _layout(named)
    flat = np.empty(layout.size, np.float32) if out is None else out
    if flat.dtype != np.float32 or not flat.flags.writeable:
        raise IncompatibleDtype(f"{flat.dtype} (out must be a writable float32 vector)")
    if flat.shape != (layout.size,):
        raise ShapeMismatch([layout.size], list(flat.shape))
    values = dict(named)
    for spec in layout.tensors:
        target = flat[spec.offset : spec.offset + spec.size].reshape(spec.shape)
        _copy_float32(target, values[spec.name], spec.name)
    return flat, layout


def _check_flat(flat: NDArray[Any], layout: Layout) -> FloatArray:
    vector = np.asarray(flat)
    if vector.dtype != np.float32:
        raise IncompatibleDtype(f"{vector.dtype} (the flat vector must be float32)")
    if vector.shape != (layout.size,):
        raise ShapeMismatch([layout.size], list(vector.shape))
    return vector


def unflatten(flat: NDArray[Any], layout: Layout) -> dict[str, NDArray[Any]]:
    """Return every tensor of ``layout`` by name, in layout order, buffers last.

    float32 tensors are views of ``flat`` (no copy); float16/float64 ones are converted copies;
    buffers are new arrays of their dtype.

    Raises
    ------
    IncompatibleDtype
        ``flat`` is not float32.
    ShapeMismatch
        ``flat`` is not a vector of ``layout.size`` values.
    """
    vector = _check_flat(flat, layout)
    result: dict[str, NDArray[Any]] = {}
    for spec in layout.tensors:
        view = vector[spec.offset : spec.offset + spec.size].reshape(spec.shape)
        result[spec.name] = view if spec.dtype == "float32" else view.astype(spec.dtype)
    for buffer in layout.buffers:
        result[buffer.name] = buffer.array()
    return result


def unflatten_list(flat: NDArray[Any], layout: Layout) -> list[NDArray[Any]]:
    """Return :func:`unflatten`'s arrays as a list in the original order of a flattened list.

    Raises
    ------
    InvalidGradient
        The layout's names are not ``"0"`` … ``"n-1"`` (it came from a dict).
    """
    arrays = unflatten(flat, layout)
    if sorted(arrays) != sorted(str(i) for i in range(len(arrays))):
        raise InvalidGradient("the layout is of named arrays, not of a list")
    return [arrays[str(i)] for i in range(len(arrays))]


def check_arrays(arrays: Arrays, layout: Layout) -> None:
    """Check that ``arrays`` have exactly the layout's names, shapes and dtypes.

    Raises
    ------
    ShapeMismatch
        A name is missing or extra (the message names it), or a shape differs.
    IncompatibleDtype
        A dtype differs from the layout's.
    """
    layout.check({name: (array.shape, array.dtype.name) for name, array in _named(arrays)})


def load_into(
    flat: NDArray[Any], layout: Layout, arrays: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]]
) -> None:
    """Copy the flat vector (and the buffers) into existing arrays, in place.

    Raises
    ------
    ShapeMismatch, IncompatibleDtype
        As :func:`check_arrays` and :func:`unflatten`; nothing is written then.
    """
    check_arrays(arrays, layout)
    vector = _check_flat(flat, layout)
    targets = (
        dict(arrays) if isinstance(arrays, Mapping) else {str(i): a for i, a in enumerate(arrays)}
    )
    for spec in layout.tensors:
        source = vector[spec.offset : spec.offset + spec.size].reshape(spec.shape)
        np.copyto(targets[spec.name], source, casting="unsafe")
    for buffer in layout.buffers:
        np.copyto(targets[buffer.name], buffer.array())
