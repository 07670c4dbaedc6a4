"""Issue 15, CLI: hostile blocks end in one line and the decode family's exit code (4).

Non-finite results are never written; ``verify-round`` says "unverifiable" (exit 1) for a DP
claim and "not a round record" (exit 2, usage) for a gradient CID. Real Kubo daemon.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs import DecodeError, put_gradient
from gradfed_ipfs.cli import main
from gradfed_ipfs.formats import store_gradient_as_arrow, store_layer_as_arrow
from gradfed_ipfs.provenance import ContributionRef, RoundRecord
from gradfed_ipfs.storage import Block, KuboBlockStore
from gradfed_ipfs.tensor import Mean, QuantizedGradient
from tests.conftest import KuboNode

from .hostile import compressed_block, nested_shape_block

pytestmark = pytest.mark.kubo
DECODE_EXIT = DecodeError.exit_code


def put_raw(node: KuboNode, data: bytes) -> str:
    async def put() -> str:
        async with KuboBlockStore(node.api_url, timeout=10.0) as store:
            return str(await store.put(Block.new(data)))

    return asyncio.run(put())


def cli(capsys: pytest.CaptureFixture[str], node: KuboNode, *argv: str) -> tuple[int, str, str]:
    code = main(["--api", node.api_url, "--timeout", "10", *argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.out, captured.err


def test_int8_block_dequantizing_to_inf_is_refused(
    kubo_node: KuboNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    q = np.full(16, 127, np.int8)
    cid = put_raw(kubo_node, store_layer_as_arrow(QuantizedGradient(q, 3e38, 0.0, [16], 8)))
    out = tmp_path / "g.npy"
    code, _, err = cli(capsys, kubo_node, "fetch", cid, "-o", str(out))
    assert code == DECODE_EXIT
    assert "beyond float32" in err
    assert not out.exists()
    code, _, err = cli(capsys, kubo_node, "aggregate", cid, cid, "-o", str(out))
    assert code == DECODE_EXIT
    assert not out.exists()


def test_non_finite_values_and_aggregates_are_never_written(
    kubo_node: KuboNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "g.npy"
    inf = put_raw(kubo_node, store_gradient_as_arrow(np.array([1.0, np.inf, 2.0], np.float32)))
    code, _, err = cli(capsys, kubo_node, "fetch", inf, "-o", str(out))
    assert (code, out.exists()) == (DECODE_EXIT, False)
    assert "1 non-finite values of 3" in err
    big = put_raw(kubo_node, store_gradient_as_arrow(np.full(3, 3e38, np.float32)))
    code, _, err = cli(capsys, kubo_node, "aggregate", big, big, "--method", "sum", "-o", str(out))
    assert (code, out.exists()) == (DECODE_EXIT, False)
    assert "aggregate has 3 non-finite values" in err


@pytest.mark.parametrize("attack", ["zstd bomb", "nested shape"])
def test_decode_attacks_end_in_one_line(
    attack: str, kubo_node: KuboNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = compressed_block(2**22) if attack == "zstd bomb" else nested_shape_block()
    cid = put_raw(kubo_node, data)
    code, _, err = cli(capsys, kubo_node, "fetch", cid, "-o", str(tmp_path / "g.npy"))
    assert code == DECODE_EXIT
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error (MalformedArrow)")


def test_verify_round_says_unverifiable_and_not_a_round_record(
    kubo_node: KuboNode, capsys: pytest.CaptureFixture[str]
) -> None:
    async def commit() -> tuple[str, str]:
        async with KuboBlockStore(kubo_node.api_url, timeout=10.0) as store:
            grad = await put_gradient(store, np.ones(8, np.float32))
            forged = await put_gradient(store, np.full(8, 1e6, np.float32))
            record = RoundRecord(
                "s",
                0,
                [ContributionRef("a", str(grad), 1)],
                Mean(),
                str(forged),
                privacy={"noise": True},
            )
            return str(await record.commit(store)), str(grad)

    record_cid, gradient_cid = asyncio.run(commit())
    code, out, err = cli(capsys, kubo_node, "verify-round", record_cid)
    assert code == 1
    assert "unverifiable" in out + err
    assert "verified" not in out.replace("unverifiable", "")
    code, _, err = cli(capsys, kubo_node, "verify-round", gradient_cid)
    assert code == 2
    assert "is not a round record" in err
    assert len(err.strip().splitlines()) == 1
