"""gradfed_ipfs.adapters.numpy and the Layout: round trips, views, checks, hostile layouts."""

from __future__ import annotations

import json

import dag_cbor
import numpy as np
import pytest

from gradfed_ipfs.adapters import Layout
from gradfed_ipfs.adapters.numpy import (
    as_float32,
    check_arrays,
    flatten,
    layout_of,
    load_into,
    unflatten,
    unflatten_list,
)
from gradfed_ipfs.errors import (
    IncompatibleDtype,
    InvalidGradient,
    MalformedManifest,
    ShapeMismatch,
)


def model() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "conv.weight": rng.standard_normal((4, 3, 3, 3), dtype=np.float32),
        "conv.bias": rng.standard_normal(4, dtype=np.float32),
        "scale": np.array(0.5, np.float32),  # 0-d
        "bn.num_batches_tracked": np.array(12, np.int64),
        "fc.weight": rng.standard_normal((10, 36), dtype=np.float32),
        "empty": np.zeros((0, 5), np.float32),
    }


def test_dict_round_trip_is_bit_exact_with_views_of_the_flat_vector() -> None:
    arrays = model()
    flat, layout = flatten(arrays)
    assert flat.dtype == np.float32
    assert flat.shape == (4 * 27 + 4 + 1 + 360,)
    assert layout.size == flat.size
    assert [t.name for t in layout.tensors] == [
        "conv.weight",
        "conv.bias",
        "scale",
        "fc.weight",
        "empty",
    ]
    assert [b.name for b in layout.buffers] == ["bn.num_batches_tracked"]
    back = unflatten(flat, layout)
    assert sorted(back) == sorted(arrays)
    for name, array in arrays.items():
        assert back[name].shape == array.shape
        assert back[name].dtype == array.dtype
        np.testing.assert_array_equal(back[name], array)
        if array.dtype == np.float32:
            assert np.shares_memory(back[name], flat) or array.size == 0
    # bit-exact, not only equal: compare the raw bytes (signed zeros, NaN payloads)
    assert back["fc.weight"].tobytes() == arrays["fc.weight"].tobytes()
    assert back["scale"].shape == ()
    assert int(back["bn.num_batches_tracked"]) == 12


def test_special_values_survive_bit_for_bit() -> None:
    values = np.array([-0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38], np.float32)
    flat, layout = flatten([values])
    np.testing.assert_array_equal(
        unflatten_list(flat, layout)[0].view(np.uint32), values.view(np.uint32)
    )


def test_list_round_trip_keeps_order_and_shapes() -> None:
    arrays = [np.ones((2, 2), np.float32), np.arange(3, dtype=np.float32), np.float32(7.0)]
    flat, layout = flatten(arrays)
    np.testing.assert_array_equal(flat, [1, 1, 1, 1, 0, 1, 2, 7])
    back = unflatten_list(flat, layout)
    assert [a.shape for a in back] == [(2, 2), (3,), ()]
    with pytest.raises(InvalidGradient, match="named arrays"):
        unflatten_list(*flatten({"a": np.ones(1, np.float32)}))


def test_flatten_fills_a_given_buffer_without_allocating() -> None:
    out = np.full(6, -1.0, np.float32)
    flat, _ = flatten({"a": np.ones((2, 3), np.float32)}, out=out)
    assert flat is out
    np.testing.assert_array_equal(out, np.ones(6))
    with pytest.raises(ShapeMismatch):
        flatten({"a": np.ones((2, 3), np.float32)}, out=np.empty(5, np.float32))
    with pytest.raises(IncompatibleDtype):
        flatten({"a": np.ones((2, 3), np.float32)}, out=np.empty(6, np.float64))


def test_float16_and_float64_pass_through_float32_and_come_back_in_their_dtype() -> None:
    arrays = {"h": np.array([1.5, -2.0], np.float16), "d": np.array([0.1, 1e-3], np.float64)}
    flat, layout = flatten(arrays)
    assert [t.dtype for t in layout.tensors] == ["float16", "float64"]
    back = unflatten(flat, layout)
    assert back["h"].dtype == np.float16
    assert back["d"].dtype == np.float64
    np.testing.assert_array_equal(back["h"], arrays["h"])
    np.testing.assert_array_equal(back["d"], arrays["d"].astype(np.float32).astype(np.float64))
    assert not np.shares_memory(back["d"], flat)


def test_float64_too_large_for_float32_is_refused() -> None:
    with pytest.raises(InvalidGradient, match=r"big\[1\] = 1e\+300"):
        flatten({"big": np.array([1.0, 1e300])})
    with pytest.raises(InvalidGradient):
        as_float32(np.array([-1e39]))
    # infinities that were already infinite are values, not overflow
    np.testing.assert_array_equal(as_float32(np.array([np.inf])), [np.inf])


def test_unsupported_dtypes_are_refused() -> None:
    with pytest.raises(IncompatibleDtype, match="complex128"):
        flatten({"z": np.ones(2, np.complex128)})
    with pytest.raises(IncompatibleDtype):
        flatten([np.array(["a"])])
    with pytest.raises(InvalidGradient, match="not one array"):
        flatten(np.ones(3, np.float32))  # type: ignore[arg-type]


def test_unflatten_refuses_a_wrong_vector() -> None:
    flat, layout = flatten(model())
    with pytest.raises(ShapeMismatch):
        unflatten(flat[:-1], layout)
    with pytest.raises(ShapeMismatch):
        unflatten(flat.reshape(1, -1), layout)
    with pytest.raises(IncompatibleDtype, match="float64"):
        unflatten(flat.astype(np.float64), layout)


def test_load_into_checks_names_shapes_and_dtypes_before_writing() -> None:
    arrays = model()
    flat, layout = flatten(arrays)
    targets = {name: np.zeros_like(a) for name, a in arrays.items()}
    load_into(flat, layout, targets)
    for name in arrays:
        np.testing.assert_array_equal(targets[name], arrays[name])

    wrong_shape = dict(targets, **{"conv.bias": np.zeros(5, np.float32)})
    with pytest.raises(ShapeMismatch, match=r"conv\.bias"):
        load_into(flat, layout, wrong_shape)
    wrong_dtype = dict(targets, **{"conv.bias": np.zeros(4, np.float64)})
    with pytest.raises(IncompatibleDtype, match=r"float64 for 'conv\.bias'"):
        load_into(flat, layout, wrong_dtype)
    missing = {k: v for k, v in targets.items() if k != "scale"}
    with pytest.raises(ShapeMismatch, match=r"missing \['scale'\]"):
        check_arrays(missing, layout)
    extra = dict(targets, extra=np.zeros(1, np.float32))
    with pytest.raises(ShapeMismatch, match=r"unexpected \['extra'\]"):
        check_arrays(extra, layout)
    fresh = {name: np.zeros_like(a) for name, a in arrays.items()}
    with pytest.raises(ShapeMismatch):
        load_into(flat, layout, dict(fresh, **{"conv.bias": np.zeros(5, np.float32)}))
    assert not fresh["conv.weight"].any()  # nothing written on a mismatch


def test_layout_is_plain_data_and_content_addressed() -> None:
    layout = layout_of(model())
    as_dict = layout.to_dict()
    assert Layout.from_dict(json.loads(json.dumps(as_dict))) == layout
    assert Layout.from_dict(dag_cbor.decode(dag_cbor.encode(as_dict))) == layout
    assert Layout.from_json(layout.to_json()) == layout
    assert layout.cid() == layout_of(model()).cid()
    assert str(layout.cid()).startswith("bafyrei")
    other = dict(model(), scale=np.array([0.5], np.float32))  # shape () -> (1,)
    assert layout_of(other).cid() != layout.cid()


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update(format="other"), "not a layout"),
        (lambda d: d.update(size=1), "size"),
        (lambda d: d["tensors"][1].update(offset=0), "offset"),
        (lambda d: d["tensors"][0].update(dtype="int32"), "int32"),
        (lambda d: d["tensors"][0].update(shape=[-1, 3]), "invalid shape"),
        (lambda d: d["tensors"][0].update(shape=[2**40, 2**40]), "over"),
        (lambda d: d["tensors"][0].update(shape="4x3"), "integers"),
        (lambda d: d["tensors"][0].update(offset=True), "offset"),
        (lambda d: d["tensors"][0].update(name=3), "name"),
        (lambda d: d["tensors"].append(dict(d["tensors"][1])), "offset|twice"),
        (lambda d: d["buffers"][0].update(values=[1, 2]), "fill its shape"),
        (lambda d: d["buffers"][0].update(dtype="int8", values=[1000]), "outside int8"),
        (lambda d: d["buffers"][0].update(values=list(range(70_000)), shape=[70_000]), "at most"),
        (lambda d: d.update(tensors={"a": 1}), "list"),
        (lambda d: d.update(tensors=[1]), "maps"),
    ],
)
def test_hostile_layouts_are_refused_as_malformed(mutate, match) -> None:  # type: ignore[no-untyped-def]
    data = layout_of(model()).to_dict()
    mutate(data)
    with pytest.raises(MalformedManifest, match=match):
        Layout.from_dict(data)


def test_layout_from_bad_json_is_malformed() -> None:
    with pytest.raises(MalformedManifest, match="not JSON"):
        Layout.from_json(b"{")
    with pytest.raises(MalformedManifest):
        Layout.from_json("[1, 2]")
