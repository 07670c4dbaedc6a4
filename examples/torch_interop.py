"""PyTorch: three peers train copies of a small CNN and average them as flat vectors by CID.

Run ``python examples/torch_interop.py`` (needs ``pip install 'gradfed-ipfs[torch]'``; add
``--api URL`` to go through a Kubo daemon instead of the in-memory block store).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import numpy as np

from gradfed_ipfs.adapters.torch import flatten_state_dict, load_flat
from gradfed_ipfs.storage import KuboBlockStore, MemoryBlockStore, fetch_gradient, put_gradient
from gradfed_ipfs.storage.base import BlockStore
from gradfed_ipfs.tensor.aggregation import Contribution, fedavg


async def federated_step(store: BlockStore, peers: int = 3) -> bool:
    """One FedAvg round of a CNN over ``store``; True when the model loads the average exactly."""
    import torch  # type: ignore[import-not-found,unused-ignore]

    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(144, 10))
    start, layout = flatten_state_dict(model.state_dict())
    print(f"model: {layout.size} floats, integer buffers {[b.name for b in layout.buffers]}")
    contributions = {}
    for peer in range(peers):
        load_flat(model, start, layout)  # every peer starts from the same global model
        x, y = torch.randn(32 * (peer + 1), 1, 8, 8), torch.randint(0, 10, (32 * (peer + 1),))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        flat, peer_layout = flatten_state_dict(model.state_dict())  # counters stay in it
        cid = await put_gradient(store, flat)
        print(f"peer-{peer}: loss {loss.item():.3f}, {len(x)} samples, model {cid}")
        contributions[f"peer-{peer}"] = Contribution(await fetch_gradient(store, cid), len(x))
    average = fedavg(contributions)  # sample-weighted; num_batches_tracked is not averaged
    load_flat(model, average, peer_layout)  # the last peer's counters: not averaged
    exact = bool(np.array_equal(flatten_state_dict(model.state_dict())[0], average))
    print(f"global model = FedAvg of {peers} peers, loaded bit-exactly: {exact}")
    return exact


async def _main(api: str | None) -> bool:
    async with KuboBlockStore(api, timeout=30.0) if api else MemoryBlockStore() as store:
        return await federated_step(store)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", help="Kubo RPC URL (default: an in-memory block store)")
    api = parser.parse_args().api
    try:
        sys.exit(0 if asyncio.run(_main(api)) else 1)
    except ImportError as exc:
        sys.exit(f"{exc}: this example needs pip install 'gradfed-ipfs[torch]'")
