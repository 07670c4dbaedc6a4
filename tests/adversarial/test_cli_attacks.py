"""Issue 15, CLI: hostile blocks end in one line and the decode family's exit code (4).

Non-finite results are never written; ``verify-round`` says "unverifiable" (exit 1) for a DP
claim and "not a round record" (exit 2, usage) for a gradient CID. Issue 32, item 9: a forged
agreed record with a custom ``rule`` label is "unverifiable" for ``resync`` too (exit 7,
nothing written unless ``--unverified``), and a long forged chain stops at ``--deadline``.
Real Kubo daemon.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs import DecodeError, FederatedError, put_gradient
from gradfed_ipfs.cli import main
from gradfed_ipfs.formats import store_gradient_as_arrow, store_layer_as_arrow
from gradfed_ipfs.formats.agreed.roster import AgreedRecord, Roster
from gradfed_ipfs.provenance import ContributionRef, RoundRecord
from gradfed_ipfs.storage import Block, KuboBlockStore
from gradfed_ipfs.tensor import Mean, QuantizedGradient
from tests.conftest import KuboNode

from .hostile import compressed_block, nested_shape_block

pytestmark = pytest.mark.kubo
DECODE_EXIT = DecodeError.exit_code
FEDERATED_EXIT = FederatedError.exit_code


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


def forge_rule_head(node: KuboNode, rule: str) -> tuple[str, str, np.ndarray]:
    """A one-round agreed chain whose record claims ``rule`` and an arbitrary result model."""
    forged = np.full(8, 1e3, np.float32)

    async def forge() -> tuple[str, str]:
        async with KuboBlockStore(node.api_url, timeout=10.0) as store:
            genesis = await put_gradient(store, np.zeros(8, np.float32))
            result = await put_gradient(store, forged)
            contribution = await put_gradient(store, np.ones(8, np.float32))
            roster = Roster.new("s", genesis, 0, genesis, "p0", ["p0"], {"p0": (contribution, 1)})
            roster_cid = await store.put(roster.to_block())
            record = AgreedRecord("s", genesis, 0, None, genesis, roster_cid, result, 1.0, rule)
            return str(genesis), str(await store.put(record.to_block()))

    genesis, head = asyncio.run(forge())
    return genesis, head, forged


def test_resync_writes_no_model_it_cannot_recompute(
    kubo_node: KuboNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    genesis, head, forged = forge_rule_head(kubo_node, "fedadam(eta=0.1)")
    out = tmp_path / "model.npy"
    argv = ["resync", "--session", "s", "--genesis", genesis, "--head", head, "-o", str(out)]
    code, stdout, err = cli(capsys, kubo_node, *argv)
    assert code == FEDERATED_EXIT
    assert not out.exists()
    assert len(err.strip().splitlines()) == 1
    assert "unverifiable" in err
    assert "rule 'fedadam(eta=0.1)'" in err
    assert "--unverified" in err
    assert "verified" not in stdout
    # --links-only recomputes nothing either: alone, it is a usage error, no way around.
    code, _, err = cli(capsys, kubo_node, *argv, "--links-only")
    assert (code, out.exists()) == (1, False)
    assert "pass --unverified" in err

    # An explicit opt-in adopts it, says it is unverified, and never says "verified".
    code, stdout, err = cli(capsys, kubo_node, *argv, "--unverified")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(out), forged)
    assert "NOT verified" in " ".join(err.split())
    assert "verified" not in stdout.replace("unverified", "").replace("unverifiable", "")

    # verify-round and history say the same: unverifiable, exit 1.
    for command in ("verify-round", "history"):
        code, stdout, err = cli(capsys, kubo_node, command, head)
        assert code == 1
        assert "unverifiable" in stdout + err
        assert "verified" not in (stdout + err).replace("unverifiable", "")


def forge_long_chain(node: KuboNode, rounds: int) -> tuple[str, str]:
    """A linked chain of ``rounds`` records, put concurrently (their CIDs are computed locally)."""

    async def forge() -> tuple[str, str]:
        async with KuboBlockStore(node.api_url, timeout=30.0) as store:
            genesis = await put_gradient(store, np.zeros(8, np.float32))
            empty = Roster.new("s", genesis, 0, genesis, "p", ["p"], {})
            roster = await store.put(empty.to_block())
            blocks, prev = [], None
            for r in range(rounds):
                block = AgreedRecord("s", genesis, r, prev, genesis, roster, genesis, 1.0)
                blocks.append(block.to_block())
                prev = blocks[-1].cid
            for start in range(0, rounds, 64):
                await asyncio.gather(*(store.put(b) for b in blocks[start : start + 64]))
            return str(genesis), str(prev)

    return asyncio.run(forge())


def test_a_long_forged_chain_stops_at_the_deadline(
    kubo_node: KuboNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    genesis, head = forge_long_chain(kubo_node, 1_500)  # ~1 ms a record: far over 0.05 s
    out = tmp_path / "model.npy"
    for argv in (
        ["history", head, "--deadline", "0.05"],
        ["resync", "--session", "s", "--genesis", genesis, "--head", head, "--deadline", "0.05",
         "-o", str(out)],
    ):  # fmt: skip
        code, stdout, err = cli(capsys, kubo_node, *argv)
        assert code == FEDERATED_EXIT, err
        assert len(err.strip().splitlines()) == 1
        assert err.startswith("error (ChainDeadlineExceeded)")
        assert "0.05s deadline" in err
        assert "records" in err
        assert "verified" not in stdout
    assert not out.exists()
