from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import dag_cbor
import numpy as np
import pytest

from gradfed_ipfs import Median, put_gradient
from gradfed_ipfs.cli import main
from gradfed_ipfs.formats import session_topic
from gradfed_ipfs.kubo import KuboDaemon, KuboPubsub
from gradfed_ipfs.provenance import ContributionRef, RoundRecord, commit_round
from gradfed_ipfs.storage import KuboBlockStore
from gradfed_ipfs.tensor import TopKInt8
from tests.conftest import KuboNode
from tests.polling import apoll_until


@pytest.mark.kubo
def test_best_effort_demo_runs_a_real_round(
    capsys: pytest.CaptureFixture[str], kubo_binary: object
) -> None:
    assert main(["demo", "--best-effort", "--peers", "3", "--dim", "5000", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "OK: every peer's aggregate equals the NumPy reference" in out
    assert out.count("committed 5000 floats as bafkrei") == 3


def test_user_error_exits_with_code_and_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--peers", "1"]) == 1
    err = capsys.readouterr().err
    assert "at least 2 peers" in err
    assert "Traceback" not in err


def test_help_lists_demo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "demo" in capsys.readouterr().out


# --------------------------------------------------------------------------- shared helpers


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's node dir (and its book of sample counts) per test, never the user's."""
    monkeypatch.setenv("GRADFED_IPFS_HOME", str(tmp_path / "cli-home"))


@pytest.fixture
def no_env_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRADFED_IPFS_API", raising=False)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def save(path: Path, array: np.ndarray) -> Path:
    np.save(path, array, allow_pickle=False)
    return path


SUBCOMMANDS = [
    "demo",
    "node",
    "commit",
    "fetch",
    "aggregate",
    "verify-round",
    "history",
    "watch",
    "round",
    "resync",
    "comet-export",
]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert f"gradfed-ipfs {command}" in out
    assert len(out.splitlines()) > 4


def test_top_level_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in SUBCOMMANDS:
        assert command in out
    assert "--api" in out
    assert "GRADFED_IPFS_API" in out


# --------------------------------------------------------------------------- commit / fetch


@pytest.mark.kubo
def test_commit_then_fetch_npy_and_arrow(
    kubo_node: KuboNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grad = np.random.default_rng(1).standard_normal((3, 40)).astype(np.float32)
    code, out, err = run_cli(
        capsys, "--api", kubo_node.api_url, "commit", str(save(tmp_path / "g.npy", grad))
    )
    assert code == 0
    cid = out.strip()
    assert cid.startswith("bafkrei")
    assert "3x40" in err
    for name in ("back.npy", "back.arrow"):
        code, out, _ = run_cli(
            capsys, "--api", kubo_node.api_url, "fetch", cid, "-o", str(tmp_path / name)
        )
        assert code == 0
        assert "verified" in out
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy", allow_pickle=False), grad)
    # the .arrow written by fetch commits to the same CID
    code, out, _ = run_cli(
        capsys, "--api", kubo_node.api_url, "commit", str(tmp_path / "back.arrow")
    )
    assert (code, out.strip()) == (0, cid)


@pytest.mark.kubo
def test_chunked_commit_and_fetch_through_env_api(
    kubo_node: KuboNode,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRADFED_IPFS_API", kubo_node.api_url)
    grad = np.random.default_rng(2).standard_normal(400_000).astype(np.float32)  # 1.6 MB
    code, out, err = run_cli(capsys, "commit", str(save(tmp_path / "big.npy", grad)))
    assert code == 0
    assert out.strip().startswith("bafyrei")  # a manifest: the gradient was chunked
    assert "chunked" in err
    code, out, _ = run_cli(capsys, "fetch", out.strip(), "-o", str(tmp_path / "big-back.npy"))
    assert code == 0
    np.testing.assert_array_equal(np.load(tmp_path / "big-back.npy"), grad)


@pytest.mark.kubo
def test_compressed_commit_round_trips_within_the_codec_bound(
    kubo_node: KuboNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grad = np.random.default_rng(3).standard_normal(10_000).astype(np.float32)
    path = save(tmp_path / "g.npy", grad)
    code, out, err = run_cli(
        capsys, "--api", kubo_node.api_url, "commit", str(path), "--compress", "topk:0.1,int8"
    )
    assert code == 0
    assert "topk-int8" in err
    code, _, _ = run_cli(
        capsys, "--api", kubo_node.api_url, "fetch", out.strip(), "-o", str(tmp_path / "c.npy")
    )
    assert code == 0
    back = np.load(tmp_path / "c.npy")
    assert np.count_nonzero(back) == 1000
    assert np.abs(back - grad).max() <= TopKInt8(ratio=0.1).error_bound(grad)


# --------------------------------------------------------------------------- aggregate


@pytest.mark.kubo
@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("fedavg", lambda g: (1 * g[0] + 2 * g[1] + 1 * g[2]) / 4),
        ("median", lambda g: np.median(g, axis=0)),
        ("trimmed:0.34", lambda g: np.median(g, axis=0)),
        ("krum:0", None),
    ],
)
def test_aggregate_by_cid(
    method: str,
    expected: object,
    kubo_node: KuboNode,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    grads = np.random.default_rng(4).standard_normal((3, 50)).astype(np.float32)
    cids = []
    for i, grad in enumerate(grads):
        code, out, _ = run_cli(
            capsys, "--api", kubo_node.api_url, "commit", str(save(tmp_path / f"{i}.npy", grad))
        )
        cids.append(out.strip())
    out_path = tmp_path / "agg.npy"
    code, out, _ = run_cli(
        capsys,
        "--api",
        kubo_node.api_url,
        "aggregate",
        *cids,
        "--method",
        method,
        "--samples",
        "1,2,1",
        "-o",
        str(out_path),
        "--commit",
    )
    assert code == 0
    result = np.load(out_path)
    if callable(expected):
        np.testing.assert_allclose(result, expected(grads), rtol=1e-5, atol=1e-6)
    else:  # Krum returns one of the inputs
        assert any(np.array_equal(result, g) for g in grads)
    assert out.strip().splitlines()[-1].startswith("bafkrei")


# --------------------------------------------------------------------------- errors


@pytest.mark.kubo
def test_unknown_cid_fails_after_the_timeout(
    kubo_node: KuboNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    for command in (["fetch", unknown, "-o", str(tmp_path / "x.npy")], ["history", unknown]):
        code, _, err = run_cli(capsys, "--api", kubo_node.api_url, "--timeout", "0.5", *command)
        assert code == 5
        assert "BlockTimeout" in err
        assert unknown in err.replace("\n", "")
        if command[0] == "fetch":  # the session daemon has no peers: the error says so
            assert "this node has 0 peers" in err.replace("\n", " ")
            assert "gradfed-ipfs node connect" in err.replace("\n", " ")
    assert not (tmp_path / "x.npy").exists()


@pytest.mark.kubo
def test_unknown_cid_on_a_connected_node_has_no_peer_hint(
    kubo_swarm3: list[KuboNode], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    api = ["--api", kubo_swarm3[0].api_url, "--timeout", "0.5"]
    code, _, err = run_cli(capsys, *api, "fetch", unknown, "-o", str(tmp_path / "x.npy"))
    assert code == 5
    assert "BlockTimeout" in err
    assert "0 peers" not in err


def test_unreachable_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(tmp_path / "g.npy", np.ones(4, np.float32))
    code, _, err = run_cli(capsys, "--api", "http://127.0.0.1:9", "commit", str(path))
    assert code == 5
    assert "StoreUnavailable" in err
    assert "127.0.0.1:9" in err.replace("\n", "")


@pytest.mark.parametrize(
    ("content", "name"),
    [
        (b"\x93NUMPY garbage that is not an npy header", "bad.npy"),
        (b"ARROW1 but not really", "bad.arrow"),
    ],
)
def test_malformed_file_is_a_decode_error(
    content: bytes, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    code, _, err = run_cli(capsys, "--api", "http://127.0.0.1:9", "commit", str(path))
    assert code == 4
    assert "Malformed" in err or "DecodeError" in err


def test_object_arrays_are_never_unpickled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "obj.npy"
    np.save(path, np.array([{"payload": 1}], dtype=object), allow_pickle=True)
    code, _, err = run_cli(capsys, "--api", "http://127.0.0.1:9", "commit", str(path))
    assert code == 4
    assert "allow_pickle=False" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["commit", "missing.npy"], "cannot read"),
        (["commit", "gradient.txt"], ".npy or .arrow"),
        (["fetch", "not-a-cid", "-o", "x.npy"], "is not a CID"),
        (
            ["fetch", "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy", "-o", "x.csv"],
            ".npy or .arrow",
        ),
        (
            [
                "aggregate",
                "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
                "--method",
                "mode",
                "-o",
                "x.npy",
            ],
            "unknown --method",
        ),
        (["commit", "g.npy", "--compress", "zstd"], "unknown codec"),
        (["commit", "g.npy", "--announce"], "--announce needs --session"),
    ],
)
def test_usage_mistakes_exit_1_with_a_message(
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    save(tmp_path / "g.npy", np.ones(3, np.float32))
    (tmp_path / "gradient.txt").write_text("1 2 3")
    code, _, err = run_cli(capsys, "--api", "http://127.0.0.1:9", *argv)
    assert code == 1
    assert message in err.replace("\n", " ")


def test_no_daemon_selected(
    no_env_api: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys,
        "--node-dir",
        str(tmp_path / "node"),
        "fetch",
        "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
        "-o",
        "x.npy",
    )
    assert code == 1
    assert "node start" in err


def test_bad_global_option_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--timeout", "-1", "node", "status"])
    assert info.value.code == 2
    assert "must be > 0" in capsys.readouterr().err


# --------------------------------------------------------------------------- node


@pytest.mark.kubo
def test_node_start_status_use_stop(
    no_env_api: None, kubo_binary: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = ["--node-dir", str(tmp_path / "node")]
    code, out, _ = run_cli(capsys, *node, "node", "status")
    assert code == 1
    assert "stopped" in out
    try:
        code, out, _ = run_cli(capsys, *node, "node", "start")
        assert code == 0
        assert "node started" in out
        assert run_cli(capsys, *node, "node", "start")[1].startswith("node already running")
        code, out, _ = run_cli(capsys, *node, "node", "status")
        assert code == 0
        assert "running" in out
        assert "kubo/0.43.1" in out
        # with neither --api nor the environment variable, commands use the managed node
        grad = save(tmp_path / "g.npy", np.arange(5, dtype=np.float32))
        code, out, _ = run_cli(capsys, *node, "commit", str(grad))
        assert code == 0
        assert out.strip().startswith("bafkrei")
    finally:
        code, out, _ = run_cli(capsys, *node, "node", "stop")
    assert code == 0
    assert "node stopped" in out
    assert run_cli(capsys, *node, "node", "status")[0] == 1
    assert (tmp_path / "node" / "repo" / "config").exists()  # the repo persists
    assert run_cli(capsys, *node, "node", "stop")[1].startswith("node is not running")


# --------------------------------------------------------------------------- round records


async def _commit_rounds(api_url: str, rounds: int) -> list[str]:
    rng = np.random.default_rng(5)
    cids: list[str] = []
    async with KuboBlockStore(api_url, timeout=10.0) as store:
        previous = None
        for r in range(rounds):
            refs = {}
            for i, peer in enumerate(["peer-a", "peer-b", "peer-c"]):
                grad = rng.standard_normal(32).astype(np.float32)
                refs[peer] = ContributionRef(peer, str(await put_gradient(store, grad)), 10 + i)
            previous, _ = await commit_round(
                store,
                session="cli-history",
                round=r,
                contributions=refs,
                aggregation=Median(),
                previous=previous,
                privacy={"epsilon_spent": 0.5 * (r + 1), "delta": 1e-5},
            )
            cids.append(str(previous))
        # a forged record: round 3 claims round 2's aggregate
        forged = RoundRecord.from_ipld(dag_cbor.decode((await store.get(cids[-1])).data), "test")
        forged.round, forged.previous = rounds, cids[-1]
        first = await RoundRecord.load(cids[0], store)
        forged.aggregate_cid = first.aggregate_cid
        cids.append(str(await forged.commit(store)))
    return cids


@pytest.mark.kubo
def test_verify_round_and_history_tables(
    kubo_node: KuboNode, capsys: pytest.CaptureFixture[str]
) -> None:
    cids = asyncio.run(_commit_rounds(kubo_node.api_url, 3))
    api = ["--api", kubo_node.api_url]
    code, out, _ = run_cli(capsys, *api, "verify-round", cids[1])
    assert code == 0
    assert "verified" in out
    assert "Median()" in out
    code, out, _ = run_cli(capsys, *api, "history", cids[2])
    assert code == 0
    assert "3 rounds verified" in out
    assert "1.5" in out  # ε spent of round 2
    code, out, _ = run_cli(capsys, *api, "verify-round", cids[3])
    assert code == 1
    assert "mismatch" in out
    code, out, _ = run_cli(capsys, *api, "history", cids[3])
    assert code == 1
    assert "4 rounds, 1 failed" in out


# --------------------------------------------------------------------------- watch


@pytest.mark.kubo
def test_watch_prints_announcements_and_drop_counts(
    kubo_swarm3: list[KuboNode], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    watcher, sender = kubo_swarm3[0], kubo_swarm3[1]
    session = "cli-watch"
    topic = session_topic(session)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(
            main(
                [
                    "--api",
                    watcher.api_url,
                    "watch",
                    "--session",
                    session,
                    "--count",
                    "1",
                    "--duration",
                    "30",
                ]
            )
        )
    )
    thread.start()

    async def publish_when_subscribed() -> None:
        pubsub = KuboPubsub(sender.api_url)
        try:

            async def subscribed() -> bool:
                return watcher.peer_id in await pubsub.peers(topic)

            await apoll_until(subscribed, timeout=30, what="the watcher's subscription")
            await pubsub.publish(topic, b"{not json")
        finally:
            await pubsub.aclose()

    asyncio.run(publish_when_subscribed())
    grad = save(tmp_path / "g.npy", np.ones(8, np.float32))
    announce = ["--api", sender.api_url, "commit", str(grad), "--session", session]
    announce += ["--round", "2", "--samples", "7", "--announce"]
    # `commit --announce` publishes once and pubsub may lose a message: announce again until
    # the watcher has one (it drops the repeats as duplicates); each wait is bounded.
    for _ in range(10):
        assert main(announce) == 0
        thread.join(timeout=3)
        if not thread.is_alive():
            break
    assert not thread.is_alive()
    assert codes == [0]
    out = capsys.readouterr().out
    assert f"round 2 peer {sender.peer_id} cid bafkrei" in out
    assert "samples 7 length 8" in out
    assert "dropped: malformed" in out


@pytest.mark.kubo
def test_aggregate_of_different_lengths_and_fetch_of_a_non_gradient(
    kubo_node: KuboNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ["--api", kubo_node.api_url]
    cids = []
    for n in (4, 5):
        code, out, _ = run_cli(capsys, *api, "commit", str(save(tmp_path / f"{n}.npy", np.ones(n))))
        cids.append(out.strip())
    code, _, err = run_cli(capsys, *api, "aggregate", *cids, "-o", str(tmp_path / "a.npy"))
    assert code == 3  # the gradient family
    assert "DimensionMismatch" in err
    record = asyncio.run(_commit_rounds(kubo_node.api_url, 1))[0]  # a dag-cbor round record
    code, _, err = run_cli(capsys, *api, "fetch", record, "-o", str(tmp_path / "r.npy"))
    assert code == 4
    assert "MalformedManifest" in err


def test_node_connect_needs_a_target(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--api", "http://127.0.0.1:9", "node", "connect")
    assert code == 1
    assert "needs a target" in err
    code, _, err = run_cli(capsys, "--node-dir", "/nonexistent", "node", "status", "extra")
    assert code == 1
    assert "takes no target" in err


@pytest.mark.kubo
def test_node_connect_by_api_url_then_by_multiaddr(
    fresh_daemon: KuboDaemon, kubo_binary: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = KuboDaemon(binary=kubo_binary).start()
    try:
        api = ["--api", fresh_daemon.api_url]
        assert other.peer_id not in fresh_daemon.connected_peers()
        code, out, _ = run_cli(capsys, *api, "node", "connect", other.api_url)
        assert code == 0, out
        assert f"/p2p/{other.peer_id}" in out
        assert "this node now has 1 peer" in out
        assert other.peer_id in fresh_daemon.connected_peers()
        # A multiaddr naming a peer ID nobody listens as: Kubo refuses, the CLI says so.
        wrong = other.multiaddrs[0].split("/p2p/")[0] + f"/p2p/{fresh_daemon.peer_id}"
        code, _, err = run_cli(capsys, *api, "--timeout", "5", "node", "connect", wrong)
        assert code == 6
        assert "KuboRpcError" in err
        assert "swarm/connect" in err
    finally:
        other.stop()
