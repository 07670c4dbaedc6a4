"""PyTorch interop: a model's ``.grad`` tensors as a :class:`GradientDelta`, and back.

``torch`` is optional (it is not a dependency of gradfed-ipfs): the conversion core works on
``(name, ndarray)`` pairs and needs only NumPy; :func:`delta_from_module` and
:func:`load_grads_into_module` adapt it to ``torch.nn.Module`` parameters.

Run ``python examples/torch_interop.py`` (needs ``torch``; add ``--api URL`` to go through a
Kubo daemon instead of the in-memory store). It backpropagates a small MLP, stores its
gradients as a delta (one Arrow block per layer, linked by a dag-cbor record), loads the delta
by CID, writes the gradients into a fresh copy of the model and checks that both copies take
the same optimizer step.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gradfed_ipfs.storage import Block, KuboBlockStore, MemoryBlockStore
from gradfed_ipfs.storage.base import BlockStore
from gradfed_ipfs.storage.delta_store import load_delta, store_delta
from gradfed_ipfs.tensor.codecs import Codec
from gradfed_ipfs.tensor.delta import GradientDelta
from gradfed_ipfs.tensor.types import DenseGradient

__all__ = [
    "delta_from_arrays",
    "delta_from_module",
    "grads_from_delta",
    "load_grads_into_module",
]


def delta_from_arrays(
    named_grads: Iterable[tuple[str, NDArray[Any]]],
    base_model: str,
    *,
    codec: Codec | None = None,
    timestamp: int | None = None,
) -> GradientDelta:
    """Build a delta with one layer per ``(name, gradient)``, keeping each gradient's shape.

    Parameters
    ----------
    named_grads
        Layer name and gradient (any float dtype; stored as float32).
    base_model
        CID of the model the gradients belong to.
    codec
        Encode every layer with this codec (e.g. ``TopKInt8(0.01)``); dense when ``None``.
    timestamp
        Unix seconds; defaults to now.
    """
    delta = GradientDelta(base_model, timestamp=timestamp)
    for name, grad in named_grads:
        values = np.asarray(grad, dtype=np.float32)
        shape = list(values.shape)
        layer = (
            DenseGradient(values.reshape(-1), shape)
            if codec is None
            else codec.encode(values.reshape(-1), shape)
        )
        delta.add_layer(name, layer)
    return delta


def grads_from_delta(delta: GradientDelta) -> dict[str, NDArray[np.float32]]:
    """Return every layer of ``delta`` densified in its shape (checksum verified first)."""
    delta.verify_checksum()
    return {name: delta.dense_layer(name) for name in sorted(delta.layer_gradients)}


# --------------------------------------------------------------------------- torch adapters


def delta_from_module(module: Any, base_model: str, *, codec: Codec | None = None) -> GradientDelta:
    """Collect ``module.named_parameters()`` gradients (parameters without one are skipped)."""
    pairs = (
        (name, param.grad.detach().to("cpu").float().numpy())
        for name, param in module.named_parameters()
        if param.grad is not None
    )
    return delta_from_arrays(pairs, base_model, codec=codec)


def load_grads_into_module(module: Any, grads: Mapping[str, NDArray[np.float32]]) -> list[str]:
    """Set each named parameter's ``.grad`` from ``grads``; return the names set.

    Raises
    ------
    ValueError
        If a layer is missing from the module or has another shape.
    """
    import torch  # type: ignore[import-not-found,unused-ignore]

    params = dict(module.named_parameters())
    for name, values in grads.items():
        if name not in params:
            raise ValueError(f"the module has no parameter {name!r}")
        param = params[name]
        if tuple(param.shape) != tuple(values.shape):
            raise ValueError(f"{name}: shape {tuple(values.shape)} != {tuple(param.shape)}")
        param.grad = torch.from_numpy(np.array(values)).to(param.device, param.dtype)
    return sorted(grads)


# --------------------------------------------------------------------------- demo


async def round_trip(store: BlockStore, seed: int = 0) -> float:
    """Backprop an MLP, ship its grads through ``store`` by CID, step two copies; max |Δw|."""
    import torch  # type: ignore[import-not-found,unused-ignore]

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    replica = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    replica.load_state_dict(model.state_dict())
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    torch.nn.functional.cross_entropy(model(x), y).backward()

    base = Block.new(b"model v0 weights (a real run would store the checkpoint)").cid
    cid = await store_delta(delta_from_module(model, str(base)), store)
    print(f"stored {len(list(model.parameters()))} gradient tensors as delta {cid}")
    loaded = await load_delta(cid, store)
    names = load_grads_into_module(replica, grads_from_delta(loaded))
    print(f"loaded grads of {names} into the replica")
    for net in (model, replica):
        torch.optim.SGD(net.parameters(), lr=0.1).step()
    return max(
        float((a - b).abs().max())
        for a, b in zip(model.parameters(), replica.parameters(), strict=True)
    )


async def _main(api: str | None) -> float:
    if api:
        async with KuboBlockStore(api, timeout=30.0) as kubo:
            return await round_trip(kubo)
    async with MemoryBlockStore() as memory:
        return await round_trip(memory)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the round trip; exit 0 when both model copies took the identical step."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", help="Kubo RPC URL (default: an in-memory block store)")
    args = parser.parse_args(argv)
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        print("this example needs PyTorch: pip install torch", file=sys.stderr)
        return 1
    difference = asyncio.run(_main(args.api))
    print(f"max |w_model - w_replica| after one SGD step: {difference:.3g}")
    return 0 if difference == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())
