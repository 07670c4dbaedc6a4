"""PyTorch ``state_dict`` ⇄ one flat float32 vector and its :class:`Layout` (the ``torch`` extra).

Floating tensors (float32, float16, bfloat16, float64; parameters and float buffers such as
BatchNorm's running statistics) are copied once into one preallocated float32 vector, from any
device. Integer and bool buffers (BatchNorm's ``num_batches_tracked``) are carried by value in
the layout, so aggregating the vector never averages a counter; on the way back they are
restored as they were flattened. float32 round-trips bit-exactly; float64 passes through
float32 (precision lost, overflow refused). ``torch`` is imported on first use, with an install
hint when it is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray
from ..errors import IncompatibleDtype, InvalidGradient, ShapeMismatch
from .layout import BUFFER_DTYPES, FLOAT_DTYPES, BufferSpec, Layout, TensorSpec

__all__ = ["check_state_dict", "flatten_state_dict", "load_flat", "unflatten_state_dict"]

INSTALL_HINT = "gradfed_ipfs.adapters.torch needs PyTorch: pip install 'gradfed-ipfs[torch]'"


def _torch() -> ModuleType:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return torch  # type: ignore[no-any-return,unused-ignore]


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _layout(state_dict: Mapping[str, Any]) -> Layout:
    torch = _torch()
    tensors: list[TensorSpec] = []
    buffers: list[BufferSpec] = []
    offset = 0
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise IncompatibleDtype(f"{type(tensor).__name__} ({name!r} is not a tensor)")
        dtype, shape = _dtype_name(tensor), tuple(int(d) for d in tensor.shape)
        if dtype in FLOAT_DTYPES:
            tensors.append(TensorSpec(name, shape, dtype, offset))
            offset += tensors[-1].size
        elif dtype in BUFFER_DTYPES:
            values = tuple(int(v) for v in tensor.detach().cpu().reshape(-1).tolist())
            buffers.append(BufferSpec(name, shape, dtype, values))
        else:
            raise IncompatibleDtype(f"{dtype} (tensor {name!r})")
    return Layout(tuple(tensors), tuple(buffers))


def flatten_state_dict(
    state_dict: Mapping[str, Any], *, out: FloatArray | None = None
) -> tuple[FloatArray, Layout]:
    """Copy a ``state_dict``'s floating tensors into one float32 vector; return it and its layout.

    Parameters
    ----------
    state_dict
        ``module.state_dict()`` (any device); its key order is the vector order.
    out
        A writable float32 vector of the layout's size to fill (else a new one).

    Returns
    -------
    tuple
        ``(flat, layout)``; integer/bool buffers are in ``layout.buffers``, not in ``flat``.

    Raises
    ------
    IncompatibleDtype
        A value that is not a tensor, a complex/quantized tensor, or a bad ``out``.
    ShapeMismatch
        ``out`` has the wrong length.
    InvalidGradient
        A float64 value too large for float32.
    """
    torch = _torch()
    layout = _layout(state_dict)
    flat = np.empty(layout.size, np.float32) if out is None else out
    if flat.dtype != np.float32 or not flat.flags.writeable:
        raise IncompatibleDtype(f"{flat.dtype} (out must be a writable float32 vector)")
    if flat.shape != (layout.size,):
        raise ShapeMismatch([layout.size], list(flat.shape))
    target = torch.from_numpy(flat)
    with torch.no_grad():
        for spec in layout.tensors:
            source = state_dict[spec.name].detach()
            if spec.dtype == "float64" and bool(
                (torch.isfinite(source) & (source.abs() > np.finfo(np.float32).max)).any()
            ):
                raise InvalidGradient(f"{spec.name!r} holds float64 values too large for float32")
            target[spec.offset : spec.offset + spec.size].view(spec.shape).copy_(source)
    return flat, layout


def _writable(flat: NDArray[Any], layout: Layout) -> FloatArray:
    vector = np.asarray(flat)
    if vector.dtype != np.float32:
        raise IncompatibleDtype(f"{vector.dtype} (the flat vector must be float32)")
    if vector.shape != (layout.size,):
        raise ShapeMismatch([layout.size], list(vector.shape))
    # torch.from_numpy on a read-only array (e.g. decoded zero-copy from an Arrow block) warns
    # that tensors cannot be read-only; one copy avoids that and any write through the views.
    return vector if vector.flags.writeable else vector.copy()


def unflatten_state_dict(flat: NDArray[Any], layout: Layout) -> dict[str, Any]:
    """Return a ``state_dict`` (CPU tensors) from a flat vector and its layout.

    float32 tensors share memory with ``flat`` (copied once first if ``flat`` is read-only);
    others are converted to their layout dtype; buffers are new tensors of their dtype.

    Raises
    ------
    IncompatibleDtype
        ``flat`` is not float32.
    ShapeMismatch
        ``flat`` is not a vector of ``layout.size`` values.
    """
    torch = _torch()
    vector = torch.from_numpy(_writable(flat, layout))
    result: dict[str, Any] = {}
    for spec in layout.tensors:
        view = vector[spec.offset : spec.offset + spec.size].view(spec.shape)
        result[spec.name] = view if spec.dtype == "float32" else view.to(getattr(torch, spec.dtype))
    for buffer in layout.buffers:
        result[buffer.name] = torch.from_numpy(buffer.array())
    return result


def check_state_dict(state_dict: Mapping[str, Any], layout: Layout) -> None:
    """Check that ``state_dict`` has exactly the layout's names, shapes and dtypes.

    Raises
    ------
    ShapeMismatch
        A key missing or extra (named in the message), or a shape that differs.
    IncompatibleDtype
        A dtype that differs from the layout's.
    """
    layout.check({name: (tuple(t.shape), _dtype_name(t)) for name, t in state_dict.items()})


def load_flat(module: Any, flat: NDArray[Any], layout: Layout) -> None:
    """Load a flat vector (and the layout's buffers) into ``module``'s parameters and buffers.

    The module's ``state_dict`` is checked against the layout first (nothing is written on a
    mismatch); values are copied onto each tensor's own device and dtype.

    Raises
    ------
    ShapeMismatch, IncompatibleDtype
        As :func:`check_state_dict` and :func:`unflatten_state_dict`.
    """
    check_state_dict(module.state_dict(), layout)
    module.load_state_dict(unflatten_state_dict(flat, layout), strict=True)
