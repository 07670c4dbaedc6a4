from __future__ import annotations

import hashlib

import cid as pycid  # py-cid: an independent implementation
import httpx
import multihash as pymultihash  # installed with py-cid
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradfed_ipfs.cid import (
    DAG_CBOR,
    RAW,
    cid_digest,
    cid_to_str,
    is_dag_cbor,
    make_cid,
    parse_cid,
    verify_cid,
)
from gradfed_ipfs.errors import BlockCorrupt, DecodeError


def pycid_of(data: bytes, codec: str) -> str:
    digest = pymultihash.digest(data, "sha2-256").encode()
    return str(pycid.make_cid(1, codec, digest).encode("base32").decode())


def test_raw_and_dag_cbor_prefixes() -> None:
    assert str(make_cid(b"hello")).startswith("bafkrei")
    assert str(make_cid(b"hello", "dag-cbor")).startswith("bafyrei")
    assert make_cid(b"x", RAW).codec.code == RAW
    assert is_dag_cbor(make_cid(b"x", DAG_CBOR))


def test_known_vector() -> None:
    # sha2-256("hello") as a raw CIDv1, as Kubo prints it for `echo -n hello | ipfs block put`.
    assert str(make_cid(b"hello")) == "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"
    assert cid_digest(make_cid(b"hello")) == hashlib.sha256(b"hello").digest()


@given(st.binary(max_size=4096), st.sampled_from(["raw", "dag-cbor"]))
def test_matches_py_cid(data: bytes, codec: str) -> None:
    ours = make_cid(data, codec)  # type: ignore[arg-type]
    assert str(ours) == pycid_of(data, codec)
    assert parse_cid(str(ours)) == ours
    assert parse_cid(bytes(ours)) == ours


def test_parse_normalises_to_base32() -> None:
    cid = make_cid(b"abc")
    as_b58 = cid.set(base="base58btc")
    assert str(parse_cid(as_b58)) == str(cid)
    assert cid_to_str(str(as_b58)) == str(cid)


@pytest.mark.parametrize("bad", ["", "not-a-cid", "bafkreinope", "Qm123"])
def test_parse_rejects_garbage(bad: str) -> None:
    with pytest.raises(DecodeError):
        parse_cid(bad)


def test_verify_detects_tampering() -> None:
    cid = make_cid(b"payload")
    assert verify_cid(cid, b"payload") == cid
    with pytest.raises(BlockCorrupt):
        verify_cid(cid, b"pay1oad")


@pytest.mark.kubo
@pytest.mark.docker
def test_matches_kubo_key(kubo_node: object) -> None:
    import random

    rng = random.Random(7)
    api = kubo_node.api_url  # type: ignore[attr-defined]
    for size in [1, 2, 100, 1000, 65_536, 262_144]:
        for codec in ("raw", "dag-cbor"):
            if codec == "dag-cbor":
                # Kubo validates dag-cbor input, so hash a real dag-cbor value.
                import dag_cbor

                data = dag_cbor.encode({"n": size, "payload": rng.randbytes(size)})
            else:
                data = rng.randbytes(size)
            answer = httpx.post(
                f"{api}/api/v0/block/put",
                params={"cid-codec": codec, "mhtype": "sha2-256", "pin": "false"},
                files={"file": ("b", data)},
                timeout=30,
            ).json()
            assert answer["Key"] == str(make_cid(data, codec)) == pycid_of(data, codec)
