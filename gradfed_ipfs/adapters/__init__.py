"""Framework adapters: a model's tensors ⇄ one flat float32 vector and a :class:`Layout`.

:mod:`gradfed_ipfs.adapters.numpy` works on lists and dicts of NumPy arrays;
:mod:`gradfed_ipfs.adapters.torch` on PyTorch ``state_dict``s (the ``torch`` extra, imported
lazily). Both return the same :class:`Layout`, plain data that can be stored by CID. Adapters
import only :mod:`gradfed_ipfs.tensor`-level code (NumPy, the errors, the CID helpers).
"""

from __future__ import annotations

from .layout import BufferSpec, Layout, TensorSpec

__all__ = ["BufferSpec", "Layout", "TensorSpec"]
