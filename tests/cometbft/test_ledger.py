"""The ABCI app without CometBFT: the ledger's verdicts, its app hash, ABCI requests, framing."""

from __future__ import annotations

import asyncio

import dag_cbor
import pytest

from gradfed_ipfs.cometbft.abci import (
    MAX_FRAME_BYTES,
    LedgerApp,
    StatementLedger,
    TxCode,
    encode_frame,
    read_frame,
)
from gradfed_ipfs.cometbft.abci.pb.cometbft.abci.v1 import types_pb2 as abci
from gradfed_ipfs.errors import DecodeError
from gradfed_ipfs.formats.statement import LocalSigner, Statement, sign_statement

ALICE = LocalSigner.from_seed(bytes([1]) * 32)
BOB = LocalSigner.from_seed(bytes([2]) * 32)


async def _statement(signer: LocalSigner, kind: str, body: bytes) -> Statement:
    return await sign_statement(signer, kind, dag_cbor.encode({"say": body}))


def _forged(statement: Statement) -> bytes:
    """The statement with BOB's name on ALICE's signature (well-formed, signature wrong)."""
    record = dag_cbor.decode(statement.block.data)
    assert isinstance(record, dict)
    record["author"] = BOB.peer_id
    return dag_cbor.encode(record)


async def test_a_signed_statement_is_logged_by_kind_in_commit_order() -> None:
    first = await _statement(ALICE, "agreed/contribution", b"1")
    second = await _statement(BOB, "agreed/contribution", b"2")
    other = await _statement(ALICE, "agreed/result", b"r")
    ledger = StatementLedger()
    verdicts, app_hash = ledger.finalize(1, [first.block.data, other.block.data])
    assert [v.code for v in verdicts] == [TxCode.OK, TxCode.OK]
    assert ledger.size("agreed/contribution") == 0  # finalized, not committed
    ledger.commit()
    ledger.finalize(2, [second.block.data])
    ledger.commit()
    assert (ledger.height, ledger.kinds()) == (2, ["agreed/contribution", "agreed/result"])
    assert ledger.entry("agreed/contribution", 0) == first.block.data
    assert ledger.entry("agreed/contribution", 1) == second.block.data
    assert ledger.entry("agreed/contribution", 2) is None
    assert ledger.statement(str(other.block.cid)) == other.block.data
    assert app_hash != ledger.app_hash


async def test_invalid_transactions_are_refused_and_change_nothing() -> None:
    good = await _statement(ALICE, "agreed/contribution", b"1")
    ledger = StatementLedger()
    empty_hash = ledger.app_hash
    txs = [_forged(good), b"\xa1junk", b"", b"\x00" * (256 * 1024 + 1)]
    verdicts, app_hash = ledger.finalize(1, txs)
    codes = [v.code for v in verdicts]
    assert codes == [TxCode.BAD_SIGNATURE, TxCode.MALFORMED, TxCode.MALFORMED, TxCode.TOO_LARGE]
    assert "does not verify" in verdicts[0].log
    assert app_hash == empty_hash
    ledger.commit()
    assert (ledger.kinds(), ledger.app_hash) == ([], empty_hash)


async def test_a_statement_is_logged_once() -> None:
    good = await _statement(ALICE, "agreed/contribution", b"1")
    ledger = StatementLedger()
    verdicts, _ = ledger.finalize(1, [good.block.data, good.block.data])
    assert [v.code for v in verdicts] == [TxCode.OK, TxCode.DUPLICATE]
    ledger.commit()
    assert ledger.check(good.block.data).code == TxCode.DUPLICATE
    assert ledger.size("agreed/contribution") == 1


async def test_the_app_hash_is_a_function_of_the_ordered_logs() -> None:
    a = (await _statement(ALICE, "k", b"a")).block.data
    b = (await _statement(BOB, "k", b"b")).block.data

    def run(blocks: list[list[bytes]]) -> bytes:
        ledger = StatementLedger()
        for height, txs in enumerate(blocks, 1):
            ledger.finalize(height, txs)
            ledger.commit()
        return ledger.app_hash

    # Same order, split into blocks differently (and with empty blocks): the same state.
    assert run([[a, b]]) == run([[a], [], [b]])
    assert run([[a, b]]) != run([[b, a]])
    assert run([[a]]) != run([[b]]) != run([])


async def test_abci_requests_drive_the_ledger() -> None:
    good = await _statement(ALICE, "agreed/contribution", b"1")
    app = LedgerApp()
    info = app.handle(abci.Request(info=abci.InfoRequest())).info
    assert (info.last_block_height, info.last_block_app_hash) == (0, b"")
    init = app.handle(abci.Request(init_chain=abci.InitChainRequest(chain_id="c"))).init_chain
    assert init.app_hash == app.ledger.app_hash
    check = app.handle(abci.Request(check_tx=abci.CheckTxRequest(tx=_forged(good)))).check_tx
    assert check.code == TxCode.BAD_SIGNATURE
    proposal = abci.PrepareProposalRequest(txs=[_forged(good), good.block.data, good.block.data])
    prepared = app.handle(abci.Request(prepare_proposal=proposal)).prepare_proposal
    assert list(prepared.txs) == [good.block.data]  # only what would be accepted
    block = abci.FinalizeBlockRequest(height=1, txs=[good.block.data, _forged(good)])
    finalized = app.handle(abci.Request(finalize_block=block)).finalize_block
    assert [r.code for r in finalized.tx_results] == [TxCode.OK, TxCode.BAD_SIGNATURE]
    query = abci.QueryRequest(path="/entry", data=b"agreed/contribution/0")
    assert app.handle(abci.Request(query=query)).query.code != 0  # not committed yet
    app.handle(abci.Request(commit=abci.CommitRequest()))
    answer = app.handle(abci.Request(query=query)).query
    assert (answer.code, answer.value, answer.height) == (0, good.block.data, 1)
    info = app.handle(abci.Request(info=abci.InfoRequest())).info
    assert (info.last_block_height, info.last_block_app_hash) == (1, finalized.app_hash)


@pytest.mark.parametrize(
    ("path", "data", "code"),
    [
        ("/size", b"agreed/contribution", 0),
        ("/entry", b"agreed/contribution/5", 1),
        ("/entry", b"no-index", 2),
        ("/statement", b"bafy-not-there", 1),
        ("/nope", b"", 2),
        ("/size", b"\xff", 2),
    ],
)
def test_queries_answer_or_say_why_not(path: str, data: bytes, code: int) -> None:
    answer = LedgerApp().handle(abci.Request(query=abci.QueryRequest(path=path, data=data))).query
    assert answer.code == code
    assert answer.value == (b"0" if code == 0 else b"")


def test_a_request_without_a_method_is_refused() -> None:
    with pytest.raises(DecodeError, match="unknown type"):
        LedgerApp().handle(abci.Request())


async def _frames(data: bytes, limit: int = MAX_FRAME_BYTES) -> list[bytes]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    frames = []
    while (frame := await read_frame(reader, limit)) is not None:
        frames.append(frame)
    return frames


async def test_frames_round_trip() -> None:
    messages = [b"", b"x", b"y" * 300, b"z" * 70_000]
    assert await _frames(b"".join(encode_frame(m) for m in messages)) == messages
    assert encode_frame(b"y" * 300)[:2] == bytes([0xAC, 0x02])  # 300 as a LEB128 varint


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (encode_frame(b"a" * 100)[:50], "ended after"),
        (bytes([0x80]), "inside a frame length"),
        (bytes([0xFF] * 11), "at most 10 bytes"),
        (encode_frame(b"a" * 101), "> 100"),
    ],
)
async def test_bad_frames_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        await _frames(data, limit=100)
