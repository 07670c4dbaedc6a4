"""The CLI friction list of issue 17, each through the entry point."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gradfed_ipfs.cli import main
from gradfed_ipfs.cli.samples import load_samples
from gradfed_ipfs.formats import session_topic
from gradfed_ipfs.kubo import KuboPubsub
from tests.cli.test_cli import run_cli, save
from tests.conftest import KuboNode
from tests.polling import apoll_until

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = ["--api", "http://127.0.0.1:9"]  # files are refused before any daemon is asked


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The CLI's node dir (and its book of sample counts) per test, never the user's."""
    home = tmp_path / "home"
    monkeypatch.setenv("GRADFED_IPFS_HOME", str(home))
    return home


def test_a_text_file_named_npy_is_not_called_a_pickle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "g.npy").write_text("1 2 3\n")
    code, _, err = run_cli(capsys, *NOWHERE, "commit", str(tmp_path / "g.npy"))
    assert code == 4
    assert "is not a NumPy .npy file" in err.replace("\n", " ")
    assert "pickle" not in err


def test_values_too_large_for_float32_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(tmp_path / "big.npy", np.array([1.0, 1e300]))
    code, _, err = run_cli(capsys, *NOWHERE, "commit", str(path))
    assert code == 3
    assert "big.npy[1] = 1e+300 does not fit float32" in err.replace("\n", " ")


def test_an_oversized_compressed_commit_says_how_to_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grad = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)
    path = save(tmp_path / "g.npy", grad)
    code, _, err = run_cli(capsys, *NOWHERE, "commit", str(path), "--compress", "topk:1.0")
    assert code == 5
    flat = " ".join(err.split())
    assert "BlockTooLarge" in flat
    assert "lower the top-k ratio" in flat
    assert "chunked DAGs" in flat
    assert "without --compress" in flat


@pytest.mark.kubo
def test_conversions_are_announced_and_a_scalar_is_one_value(
    kubo_node: KuboNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ["--api", kubo_node.api_url]
    cases = [
        (np.array([1, 2, 3], np.int64), "int64; converted to float32, exactly"),
        (np.array([0.1, 2.0], np.float64), "float64; converted to float32, 1 values rounded"),
        (np.array([0.5, 1.5], np.float16), "float16; converted to float32, exactly"),
    ]
    for array, note in cases:
        code, out, err = run_cli(capsys, *api, "commit", str(save(tmp_path / "g.npy", array)))
        assert code == 0
        assert f"note: g.npy is {note}" in err
        assert out.strip().startswith("bafkrei")
    code, out, err = run_cli(capsys, *api, "commit", str(save(tmp_path / "s.npy", np.float32(2.5))))
    assert code == 0
    assert "committed scalar (1 value) as dense" in err
    assert "note:" not in err
    cid = out.strip()
    code, out, err = run_cli(capsys, *api, "fetch", cid, "-o", str(tmp_path / "back.npy"))
    assert code == 0
    assert f"fetched {cid} (dense, scalar (1 value), verified)" in out
    assert "still fetching" not in err  # a quick fetch adds no line
    back = np.load(tmp_path / "back.npy")
    assert back.shape == ()
    assert float(back) == 2.5


@pytest.mark.kubo
def test_a_long_single_block_fetch_is_not_silent(
    kubo_node: KuboNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    argv = ["--api", kubo_node.api_url, "--timeout", "4", "fetch", unknown]
    code, _, err = run_cli(capsys, *argv, "-o", str(tmp_path / "x.npy"))
    assert code == 5
    lines = err.strip().splitlines()
    assert lines[0] == f"still fetching {unknown} (one block, up to 4s)…"
    assert "BlockNotFound" in lines[1] or "BlockTimeout" in lines[1]


@pytest.mark.kubo
def test_announce_without_subscribers_says_nobody_received_it(
    kubo_node: KuboNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(save(tmp_path / "g.npy", np.ones(4, np.float32)))
    argv = ["--api", kubo_node.api_url, "commit", path, "--session", "lonely", "--announce"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0
    flat = " ".join(err.split())
    assert "but no peer is subscribed to gradfed/v1/lonely" in flat


@pytest.mark.kubo
def test_aggregate_weights_by_the_committed_samples_and_says_so(
    kubo_node: KuboNode, tmp_path: Path, capsys: pytest.CaptureFixture[str], own_home: Path
) -> None:
    api = ["--api", kubo_node.api_url]
    grads = np.random.default_rng(6).standard_normal((3, 20)).astype(np.float32)
    cids = []
    for i, (grad, samples) in enumerate(zip(grads[:2], (100, 300), strict=True)):
        path = str(save(tmp_path / f"{i}.npy", grad))
        code, out, _ = run_cli(capsys, *api, "commit", path, "--samples", str(samples))
        cids.append(out.strip())
    assert load_samples(own_home / "samples.json") == dict(zip(cids, (100, 300), strict=True))
    out_path = str(tmp_path / "agg.npy")
    code, out, _ = run_cli(capsys, *api, "aggregate", *cids, "-o", out_path)
    assert code == 0
    assert "weights: samples 100, 300 (as committed or announced)" in out
    expected = (100 * grads[0].astype(np.float64) + 300 * grads[1]) / 400
    np.testing.assert_allclose(np.load(out_path), expected, rtol=1e-6, atol=1e-7)

    # --samples takes space-separated counts (and still commas) and wins over the book
    code, out, _ = run_cli(capsys, *api, "aggregate", *cids, "--samples", "1", "3", "-o", out_path)
    assert code == 0
    assert "weights: samples 1, 3 (from --samples)" in out
    np.testing.assert_allclose(np.load(out_path), expected, rtol=1e-6, atol=1e-7)

    # a CID without a known count: equal weights, said out loud
    code, out, _ = run_cli(capsys, *api, "commit", str(save(tmp_path / "2.npy", grads[2])))
    unknown = out.strip()
    code, out, _ = run_cli(capsys, *api, "aggregate", cids[0], unknown, "-o", out_path)
    assert code == 0
    assert "weights: samples 100, ? (as committed or announced; ? weighs as the mean" in out
    code, out, _ = run_cli(
        capsys, "--node-dir", str(tmp_path / "empty"), *api, "aggregate", *cids, "-o", out_path
    )
    assert code == 0
    assert "weights: equal weights: no sample counts known" in out


@pytest.mark.kubo
def test_watch_records_announced_samples_for_aggregate(
    kubo_swarm3: list[KuboNode], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    watcher, sender = kubo_swarm3[0], kubo_swarm3[2]
    session = "cli-book"
    watch_dir, send_dir = tmp_path / "watcher", tmp_path / "sender"
    argv = ["--node-dir", str(watch_dir), "--api", watcher.api_url, "watch", "--session", session]
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(main([*argv, "--count", "1", "--duration", "30"]))
    )
    thread.start()
    topic = session_topic(session)

    async def watcher_subscribed() -> bool:
        pubsub = KuboPubsub(sender.api_url)
        try:
            return watcher.peer_id in await pubsub.peers(topic)
        finally:
            await pubsub.aclose()

    asyncio.run(apoll_until(watcher_subscribed, timeout=30, what="the watcher's subscription"))
    grad = str(save(tmp_path / "g.npy", np.ones(8, np.float32)))
    announce = ["--node-dir", str(send_dir), "--api", sender.api_url, "commit", grad]
    announce += ["--session", session, "--samples", "42", "--announce"]
    for _ in range(10):  # pubsub may lose one publication; each wait is bounded
        assert main(announce) == 0
        thread.join(timeout=3)
        if not thread.is_alive():
            break
    assert codes == [0]
    book = load_samples(watch_dir / "samples.json")
    assert list(book.values()) == [42]
    assert "to 1 subscribed peer" in capsys.readouterr().err


@pytest.mark.kubo
def test_ctrl_c_on_watch_prints_the_drop_table_and_exits_130(
    kubo_swarm3: list[KuboNode], tmp_path: Path
) -> None:
    watcher, other = kubo_swarm3[0], kubo_swarm3[1]
    session = "cli-interrupt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), GRADFED_IPFS_HOME=str(tmp_path / "home"))
    code = "import sys; from gradfed_ipfs.cli import main; sys.exit(main())"
    argv = [sys.executable, "-c", code, "--api", watcher.api_url, "watch", "--session", session]
    process = subprocess.Popen(
        [*argv, "--duration", "120"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        topic = session_topic(session)

        async def subscribed() -> bool:
            pubsub = KuboPubsub(other.api_url)
            try:
                return watcher.peer_id in await pubsub.peers(topic)
            finally:
                await pubsub.aclose()

        asyncio.run(apoll_until(subscribed, timeout=60, what="the watcher's subscription"))

        assert process.poll() is None  # still watching: only the signal ends it
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err
    text = out.decode()
    assert f"announcements on {topic}" in text
    assert "accepted" in text
    assert "interrupted" in err.decode()
    assert "Traceback" not in err.decode()
