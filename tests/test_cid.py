from __future__ import annotations

import hashlib

import cid as pycid  # py-cid: an independent implementation
import dag_cbor
import httpx
import multihash as pymultihash  # installed with py-cid
import pytest
from hypothesis import given
from hypothesis import strategies as st
from multiformats import CID, multihash, varint

from gradfed_ipfs import BlockCorrupt, DecodeError
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


@given(st.binary(max_size=256), st.sampled_from(["raw", "dag-cbor"]))
def test_fast_paths_build_what_multiformats_builds(data: bytes, codec: str) -> None:
    digest = hashlib.sha256(data).digest()
    reference = CID("base32", 1, codec, multihash.wrap(digest, "sha2-256"))
    ours = make_cid(data, codec)  # type: ignore[arg-type]
    assert ours == reference
    assert ours.base == reference.base
    assert cid_to_str(ours) == str(reference)
    text = str(reference)
    assert parse_cid(text) == CID.decode(text)
    assert str(parse_cid(text)) == text
    from_bytes = parse_cid(bytes(reference))
    assert from_bytes == CID.decode(bytes(reference))
    assert str(from_bytes) == text
    assert cid_digest(text) == digest
    # dag-cbor links decode through the fast path to the CIDs multiformats would give
    decoded = dag_cbor.decode(dag_cbor.encode({"link": reference, "links": [reference]}))
    assert isinstance(decoded, dict)
    link = decoded["link"]
    assert isinstance(link, CID)
    assert type(link) is CID
    assert link == CID.decode(bytes(reference))
    assert link.base.name == "base58btc"


@pytest.mark.parametrize(
    "cid",
    [
        make_cid(b"x"),
        make_cid(b"x", "dag-cbor"),
        CID("base32", 1, "dag-json", multihash.digest(b"x", "sha2-256")),  # code 0x0129: 2 bytes
        CID("base58btc", 1, "raw", multihash.digest(b"x", "sha2-512")),
        CID.decode("QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG"),  # v0: the multihash
    ],
)
def test_cid_bytes_fast_path_gives_multiformats_bytes(cid: CID) -> None:
    version, codec = varint.encode(cid.version), varint.encode(cid.codec.code)
    expected = cid.digest if cid.version == 0 else version + codec + cid.digest
    assert bytes(cid) == expected
    assert CID.decode(bytes(cid)) == cid


def test_cid_hash_follows_equality() -> None:
    """Equal CIDs (any base, any path that built them) hash alike; different ones are unequal."""
    cid = make_cid(b"x", "dag-cbor")
    other_base = CID.decode(cid.encode("base58btc"))
    assert other_base == cid
    assert hash(other_base) == hash(cid)
    assert {cid: 1}[parse_cid(str(cid))] == 1
    assert make_cid(b"x", "raw") != cid  # same digest, other codec


def test_other_cids_still_parse_through_multiformats() -> None:
    v0 = "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG"
    assert parse_cid(v0) == CID.decode(v0)
    assert cid_to_str(v0) == v0
    sha512 = CID("base32", 1, "raw", multihash.digest(b"x", "sha2-512"))
    assert parse_cid(str(sha512)) == sha512
    with pytest.raises(DecodeError, match="only sha2-256"):
        cid_digest(sha512)
    upper = str(make_cid(b"x")).upper()  # another spelling of base32: multiformats decides
    assert parse_cid(upper) == make_cid(b"x")
    linked = dag_cbor.decode(dag_cbor.encode([sha512]))
    assert linked == [sha512]


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
