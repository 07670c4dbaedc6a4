"""examples/federated_digits.py in a reduced configuration, over a real 4-daemon Kubo swarm.

The ``--processes`` mode's peer processes run in ``tests/training/test_digits.py``.
"""

# ruff: noqa: E402 (the examples import after the sklearn check and the sys.path entry)
from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradfed_ipfs import InvalidGradient, Krum, MultiKrum, TrimmedMean
from gradfed_ipfs.errors import ConfigError
from gradfed_ipfs.federated.privacy.accountant import RdpPrivacyAccountant, gaussian_event
from gradfed_ipfs.kubo import KuboDaemon, KuboSwarm
from gradfed_ipfs.provenance import verify_history
from gradfed_ipfs.storage import KuboBlockStore
from gradfed_ipfs.tensor import Int2, TopKInt2, TopKInt8
from tests.required import import_area

import_area("sklearn", "sklearn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import federated_digits as fd
from digits_model import parse_codec, parse_method
from digits_processes import PeerRun
from digits_training import Task, simulate

ROUNDS = 6  # reduced configuration (the example's default is 20)


@pytest.fixture(scope="module")
def swarm4(kubo_binary: Path) -> Iterator[list[KuboDaemon]]:
    with KuboSwarm(4, binary=kubo_binary) as swarm:
        yield list(swarm)


def train(swarm: list[KuboDaemon], name: str, **settings: object) -> fd.Result:
    # A session of its own per run: no announcement of an earlier run can be taken for this one.
    settings = {"rounds": ROUNDS, "session": f"test-{name}", **settings}
    options = fd.Options(**settings)  # type: ignore[arg-type]
    return asyncio.run(fd.run_federated(options, swarm, log=lambda _: None))


@pytest.fixture(scope="module")
def fedavg(swarm4: list[KuboDaemon]) -> fd.Result:
    return train(swarm4, "fedavg")


@pytest.mark.kubo
def test_fedavg_within_2_points_of_centralized(fedavg: fd.Result) -> None:
    assert len(fedavg.accuracy) == len(fedavg.centralized) == ROUNDS
    assert fedavg.centralized_accuracy > 0.9
    assert abs(fedavg.gap) <= 0.02
    assert fedavg.consistent  # every honest peer aggregated the same bits, same record CIDs
    assert len(set(fedavg.peer_ids)) == 4


@pytest.mark.kubo
def test_round_records_verify_from_another_daemon(
    fedavg: fd.Result, swarm4: list[KuboDaemon]
) -> None:
    async def check() -> list[bool]:
        async with KuboBlockStore(swarm4[3].api_url, timeout=10.0) as store:
            return [v.ok for v in await verify_history(fedavg.record_cids[-1], store)]

    assert asyncio.run(check()) == [True] * ROUNDS
    assert fedavg.verified == [True] * ROUNDS  # the example checked it before its daemons stopped


@pytest.mark.kubo
def test_run_is_deterministic(fedavg: fd.Result, swarm4: list[KuboDaemon]) -> None:
    again = train(swarm4, "fedavg-again")
    assert again.accuracy == fedavg.accuracy


@pytest.mark.kubo
def test_byzantine_peer_breaks_fedavg_but_not_multikrum(swarm4: list[KuboDaemon]) -> None:
    attacked = train(swarm4, "byz-fedavg", byzantine=1)
    robust = train(swarm4, "byz-krum", byzantine=1, method="multikrum:1")
    assert attacked.gap > 0.20  # visibly degraded
    assert robust.gap <= 0.03
    assert robust.consistent


@pytest.mark.kubo
def test_dp_noise_reports_epsilon(swarm4: list[KuboDaemon]) -> None:
    result = train(swarm4, "dp", dp_noise=1.5, rounds=3)
    accountant = RdpPrivacyAccountant()
    accountant.compose(gaussian_event(1.5), 3)
    assert result.epsilon == pytest.approx(accountant.epsilon(1e-5), rel=1e-6)
    assert 0 < result.epsilon < 100


@pytest.mark.kubo
def test_secagg_matches_plain_fedavg(fedavg: fd.Result, swarm4: list[KuboDaemon]) -> None:
    secure = train(swarm4, "secagg", secagg=True)
    assert abs(secure.final_accuracy - fedavg.final_accuracy) <= 0.005
    assert secure.consistent
    assert not secure.record_cids  # only the sum exists: no per-contribution record


@pytest.mark.kubo
def test_compressed_deltas_move_fewer_bytes(fedavg: fd.Result, swarm4: list[KuboDaemon]) -> None:
    compressed = train(swarm4, "topk", compress="topk:0.1,int8")
    assert compressed.bytes_committed < fedavg.bytes_committed / 1.5  # Arrow framing dominates
    assert abs(compressed.gap) <= 0.03


def test_plot_writes_a_png(tmp_path: Path) -> None:
    import_area("sklearn", "matplotlib")
    result = fd.Result(fd.Options(rounds=3), [0.5, 0.8, 0.9], [0.6, 0.85, 0.9], [], [])
    path = fd.plot(result, tmp_path / "digits.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_option_parsing() -> None:
    assert parse_method("trimmed:0.25", 4) == TrimmedMean(beta=0.25)
    assert parse_method("krum:1", 4) == Krum(f=1)
    assert parse_method("multikrum:1", 4) == MultiKrum(f=1, m=3)
    assert parse_codec("topk:0.1,int8") == TopKInt8(ratio=0.1)
    assert parse_codec("topk:0.02,int2") == TopKInt2(ratio=0.02)
    assert parse_codec("int2") == Int2()
    assert parse_codec(None) is None
    for bad in ("mean", "krum:x", "trimmed:0.7"):
        with pytest.raises(InvalidGradient):
            parse_method(bad, 4)
    with pytest.raises(InvalidGradient):
        parse_codec("zstd")


def test_contradictory_options_are_refused() -> None:
    with pytest.raises(InvalidGradient, match="secagg"):
        fd.check_options(fd.Options(secagg=True, method="median"), 4)
    with pytest.raises(InvalidGradient, match="byzantine"):
        fd.check_options(fd.Options(byzantine=4), 4)


# --------------------------------------------------------------------------- --processes


def test_processes_mode_refuses_what_only_the_one_process_mode_does() -> None:
    with pytest.raises(ConfigError, match="--secagg, --byzantine"):
        fd.task_of(fd.Options(secagg=True, byzantine=1))
    with pytest.raises(ConfigError, match="--keep"):
        fd.task_of(fd.Options(), keep=True)
    with pytest.raises(InvalidGradient, match="aggregation method"):
        fd.task_of(fd.Options(method="mean"))
    assert fd.task_of(fd.Options(peers=3, rounds=2, method="median")) == Task(
        peers=3, rounds=2, method="median"
    )
    assert fd.main(["--diloco", "5"]) == ConfigError.exit_code  # the training API's only
    with pytest.raises(ConfigError, match="--diloco H needs"):
        fd.task_of(fd.Options(method="median"), diloco=5)
    with pytest.raises(InvalidGradient, match="codec"):
        fd.task_of(fd.Options(compress="zstd"))
    assert fd.task_of(fd.Options(rounds=2, compress="int8"), diloco=7) == Task(
        rounds=2, local_steps=7, diloco=True, compress="int8"
    )


def test_processes_report_prints_every_peer_beside_the_in_process_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    task = Task(peers=2, rounds=2)
    history = simulate(task, session="report")[0]
    centralized = [0.5, 0.9]
    run = fd.ProcessesRun(
        task,
        [PeerRun(i, 100 + i, f"http://api-{i}", history) for i in range(2)],
        history,
        centralized,
    )
    assert fd.report_processes(fd.Options(), run) == 0
    out = capsys.readouterr().out
    cid = history.entries[-1].model
    assert out.count(f"model {cid}") == 3  # two peer processes and the in-process run
    assert "peer 1 (pid 101, http://api-1)" in out
    assert "2 peer processes on one model CID: True; the in-process run's CID: True" in out
    other = simulate(Task(peers=2, rounds=1), session="other")[0]  # a peer that diverged
    run.peers[1] = PeerRun(1, 101, "http://api-1", other)
    assert fd.report_processes(fd.Options(), run) == 1
    assert "on one model CID: False" in capsys.readouterr().out
