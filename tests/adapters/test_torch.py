"""gradfed_ipfs.adapters.torch: state_dict round trips (torch comes with the test extra)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gradfed_ipfs.adapters import Layout
from gradfed_ipfs.adapters.torch import (
    check_state_dict,
    flatten_state_dict,
    load_flat,
    unflatten_state_dict,
)
from gradfed_ipfs.errors import IncompatibleDtype, ShapeMismatch
from tests.required import import_area

torch = import_area("torch", "torch")


def small_cnn(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 10),
    )


def test_state_dict_round_trips_bit_exactly_with_int_buffers_in_the_layout() -> None:
    model = small_cnn(0)
    model(torch.randn(8, 1, 8, 8))  # BatchNorm statistics and num_batches_tracked = 1
    state = model.state_dict()
    flat, layout = flatten_state_dict(state)
    assert [b.name for b in layout.buffers] == ["1.num_batches_tracked"]
    assert layout.buffers[0].values == (1,)
    floats = [k for k, v in state.items() if v.is_floating_point()]
    assert flat.size == sum(state[k].numel() for k in floats)
    back = unflatten_state_dict(flat, layout)
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype
        assert back[name].shape == tensor.shape
        assert torch.equal(back[name], tensor)
    assert Layout.from_dict(layout.to_dict()) == layout

    other = small_cnn(1)
    load_flat(other, flat, layout)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, state[name])


def test_read_only_vectors_load_without_warnings() -> None:
    flat, layout = flatten_state_dict(small_cnn(0).state_dict())
    flat.setflags(write=False)  # as decoded zero-copy from an Arrow block
    back = unflatten_state_dict(flat, layout)  # warnings are errors in this suite
    assert not np.shares_memory(back["0.weight"].numpy(), flat)


def test_mismatched_models_are_refused() -> None:
    flat, layout = flatten_state_dict(small_cnn(0).state_dict())
    wider = torch.nn.Sequential(torch.nn.Conv2d(1, 5, 3))
    with pytest.raises(ShapeMismatch):
        load_flat(wider, flat, layout)
    half = small_cnn(0).half()
    with pytest.raises(IncompatibleDtype):
        check_state_dict(half.state_dict(), layout)
    with pytest.raises(ShapeMismatch):
        unflatten_state_dict(flat[:-1], layout)
    with pytest.raises(IncompatibleDtype):
        flatten_state_dict({"z": torch.zeros(2, dtype=torch.complex64)})


def test_a_small_cnn_trained_over_three_peers_improves() -> None:
    # Prepare: a learnable task (which quadrant of an 8x8 image is bright), split over 3 peers.
    import asyncio

    from gradfed_ipfs.adapters.torch import flatten_state_dict, load_flat
    from gradfed_ipfs.storage import MemoryBlockStore, fetch_gradient, put_gradient
    from gradfed_ipfs.tensor import Contribution, fedavg

    torch.manual_seed(3)

    def batch(n: int) -> tuple[Any, Any]:
        y = torch.randint(0, 4, (n,))
        x = torch.randn(n, 1, 8, 8) * 0.5
        for i, label in enumerate(y.tolist()):
            r, c = divmod(label, 2)
            x[i, 0, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] += 2.0
        return x, y

    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 4)
    )
    test_x, test_y = batch(400)

    def accuracy() -> float:
        with torch.no_grad():
            return float((model(test_x).argmax(1) == test_y).float().mean())

    data = [batch(64) for _ in range(3)]
    global_flat, layout = flatten_state_dict(model.state_dict())
    before = accuracy()

    async def rounds(store: MemoryBlockStore) -> Any:
        flat = global_flat
        for _ in range(5):
            contributions = {}
            for peer, (x, y) in enumerate(data):
                load_flat(model, flat, layout)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for _ in range(5):
                    optimizer.zero_grad()
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    optimizer.step()
                cid = await put_gradient(store, flatten_state_dict(model.state_dict())[0])
                contributions[f"p{peer}"] = Contribution(await fetch_gradient(store, cid), len(x))
            flat = fedavg(contributions)
        return flat

    # Execute: 5 FedAvg rounds through the block store.
    load_flat(model, asyncio.run(rounds(MemoryBlockStore())), layout)
    # Assert: from chance (~25 %) to a model that has learnt the task.
    assert before < 0.5
    assert accuracy() > 0.8
