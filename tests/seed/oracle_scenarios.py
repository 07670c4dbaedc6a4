"""Check cases for the crate oracle: stateful objects driven through scripted operations.

Each case sends a list of operations to one crate object (step and pass coordinators, graph,
rounds, detectors, budgets…) and replays the same operations on ours; every operation's result
is compared. Also here: Arrow and GARW byte interop, where one side decodes the other's bytes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gradfed_ipfs import MemoryPubsubBus
from gradfed_ipfs.federated.privacy import AccountingMode
from gradfed_ipfs.kubo import MemoryPubsub
from tests.seed.crate_oracle import Case, Ok, Tol, attempt
from tests.seed.oracle_cases import MODEL_CID, Gen, api, f32, f64, sum_tol, vec

# --------------------------------------------------------------------------- backward_pass.rs


def _method(spec: Any) -> Any:
    if spec == "Sum":
        return api.AggregationMethod.Sum()
    if spec == "Mean":
        return api.AggregationMethod.Mean()
    if spec == "FedAvg":
        return api.AggregationMethod.FedAvg()
    return api.AggregationMethod.WeightedMean([float(w) for w in spec["WeightedMean"]])


def _config(args: dict[str, Any]) -> Any:
    clipping = args.get("clipping")
    return api.BackwardPassConfig(
        aggregation=_method(args.get("method", "FedAvg")),
        gradient_clipping=None if clipping is None else float(clipping),
    )


def _run_step_coordinator(args: dict[str, Any]) -> list[Any]:
    coord = api.LegacyBackwardPassCoordinator(_config(args))
    if "lr" in args:
        coord.with_learning_rate(float(args["lr"]))
    out: list[Any] = []
    for op in args["ops"]:
        kind = op["op"]
        if kind == "schedule":
            out.append(
                attempt(
                    lambda op=op: (coord.schedule_step(op["node"], op["name"], op["peers"]), None)[
                        1
                    ]
                )
            )
        elif kind == "receive":
            out.append(
                attempt(
                    lambda op=op: (coord.receive_gradient(op["node"], op["peer"], op["cid"]), None)[
                        1
                    ]
                )
            )
        elif kind == "aggregate":
            out.append(attempt(lambda op=op: coord.aggregate_gradients(op["node"], op["data"])))
        elif kind == "apply":
            out.append(attempt(lambda op=op: coord.apply_gradient(op["params"].copy(), op["grad"])))
        elif kind == "clip":
            out.append(attempt(lambda op=op: coord.clip_gradients(op["grad"].copy())))
        elif kind == "next_ready":
            step = coord.next_ready_step()
            out.append(Ok(None if step is None else step.node_id))
        elif kind == "stats":
            out.append(Ok(dataclasses.asdict(coord.stats())))
    return out


def step_coordinator_cases(g: Gen) -> Iterator[Case]:
    methods: list[Any] = ["Sum", "Mean", "FedAvg", "FedAvg", "Mean"]
    for i in range(16):
        n = int(g.rng.integers(1, 6))
        peers = sorted(f"peer-{j}" for j in range(int(g.rng.integers(1, 4))))
        method = methods[i % len(methods)]
        if i % 4 == 3:
            method = {"WeightedMean": vec(g.rng.uniform(0.1, 3, len(peers)))}
        grads = [g.vector(n) for _ in peers]
        clipping = f32(abs(g.rng.normal(0, 3))) if i % 3 == 0 else None
        ops: list[dict[str, Any]] = [
            {"op": "schedule", "node": "layer-1", "name": "matmul", "peers": peers},
            {"op": "schedule", "node": "layer-2", "name": "relu", "peers": peers[:1]},
            {"op": "stats"},
            {"op": "next_ready"},
            {"op": "receive", "node": "layer-9", "peer": peers[0], "cid": "cid-x"},
            {"op": "receive", "node": "layer-1", "peer": "stranger", "cid": "cid-x"},
        ]
        ops += [{"op": "receive", "node": "layer-1", "peer": p, "cid": f"cid-{p}"} for p in peers]
        ops += [
            {"op": "next_ready"},
            {"op": "aggregate", "node": "layer-1", "data": list(zip(peers, grads, strict=True))},
            {"op": "aggregate", "node": "layer-1", "data": []},
            {"op": "stats"},
            {"op": "apply", "params": g.vector(n), "grad": g.vector(n)},
            {"op": "apply", "params": g.vector(n), "grad": g.vector(n + 1)},
            {"op": "clip", "grad": g.vector(n)},
        ]
        if len(peers) > 1:
            bad = [(peers[0], grads[0]), (peers[1], g.vector(n + 1))]
            ops.append({"op": "aggregate", "node": "layer-1", "data": bad})
        args = {"method": method, "clipping": clipping, "ops": ops}
        if i % 2:
            args["lr"] = f32(g.rng.uniform(0.001, 1))
        tol = Tol(rtol=16 * len(peers) * n * 1.2e-7, atol=sum_tol(*grads).atol * 4)
        yield Case(
            "step_coordinator",
            "step_coordinator",
            args,
            lambda _, a=args: _run_step_coordinator(a),
            tol,
        )
    peers = ["b", "a"]
    args = {
        "method": {"WeightedMean": vec([1.0, 3.0])},
        "ops": [{"op": "aggregate", "node": "n", "data": [("b", vec([0.0])), ("a", vec([4.0]))]}],
    }
    yield Case(
        "step_coordinator",
        "step_coordinator",
        args,
        lambda _, a=args: _run_step_coordinator(a),
        deliberate="backward_pass module docstring: positional WeightedMean weights follow "
        "sorted peer IDs, not list order",
    )
    del peers


def _run_backward_step(args: dict[str, Any]) -> list[Any]:
    step = api.BackwardPassStep.new("node", "op")
    out = []
    for op in args["ops"]:
        if op["op"] == "add":
            step.add_peer(op["peer"])
        elif op["op"] == "received":
            step.record_gradient_received(op["peer"], op["cid"])
        else:
            step.record_gradient_failed(op["peer"], op["reason"])
        out.append(
            {
                "is_complete": step.is_complete(),
                "ready_to_aggregate": step.ready_to_aggregate(),
                "received_count": step.received_count(),
                "failed_count": step.failed_count(),
            }
        )
    return out


def backward_step_cases(g: Gen) -> Iterator[Case]:
    for _ in range(10):
        ops = []
        for _ in range(int(g.rng.integers(1, 9))):
            peer = f"p{int(g.rng.integers(0, 3))}"
            kind = ["add", "received", "failed"][int(g.rng.integers(0, 3))]
            ops.append({"op": kind, "peer": peer, "cid": f"c-{peer}", "reason": "gone"})
        yield Case(
            "backward_step",
            "backward_step",
            {"ops": ops},
            lambda _, a={"ops": ops}: _run_backward_step(a),
        )


# --------------------------------------------------------------------------- federated.rs


def _run_budget(args: dict[str, Any]) -> list[Any]:
    budget = api.PrivacyBudget(float(args["epsilon"]), float(args["delta"]))
    out = []
    for used in args["consume"]:
        result = attempt(lambda u=used: budget.consume(float(u)))
        out.append(
            {
                "result": result,
                "remaining": f64(budget.remaining_epsilon),
                "exhausted": budget.is_exhausted(),
                "fraction": f64(budget.remaining_fraction()),
            }
        )
    return out


def privacy_cases(g: Gen) -> Iterator[Case]:
    for _ in range(10):
        eps = f64(g.rng.uniform(0.1, 10))
        shares = g.rng.dirichlet(np.ones(int(g.rng.integers(2, 7))))[:-1] * 0.95
        uses = [f64(float(eps) * float(s)) for s in shares]  # never reaches the budget
        args = {"epsilon": eps, "delta": f64(1e-5), "consume": uses}
        yield Case(
            "privacy_budget",
            "privacy_budget",
            args,
            lambda _, a=args: _run_budget(a),
            Tol(rtol=1e-12, atol=1e-12),
        )
    refused = {"epsilon": f64(1.0), "delta": f64(1e-5), "consume": [f64(0.5), f64(0.75)]}
    yield Case(
        "privacy_budget",
        "privacy_budget",
        refused,
        lambda _, a=refused: _run_budget(a),
        deliberate="PrivacyBudget.consume docstring: a refused charge raises "
        "PrivacyBudgetExhausted, a FederatedError (the seed: InvalidGradient)",
    )
    drift = {"epsilon": f64(0.7), "delta": f64(1e-5), "consume": [f64(0.7 / 4)] * 4}
    yield Case(
        "privacy_budget",
        "privacy_budget",
        drift,
        lambda _, a=drift: _run_budget(a),
        deliberate="PrivacyBudget.consume docstring: exactly the remainder is allowed "
        "(the seed's float subtraction refused it)",
    )
    for _ in range(15):
        eps = f64(g.rng.uniform(0.05, 20))
        delta, sens = f64(10.0 ** g.rng.uniform(-9, -1)), f64(g.rng.uniform(0.1, 5))
        yield Case(
            "noise_multiplier",
            "noise_multiplier",
            {"epsilon": eps, "delta": delta, "sensitivity": sens},
            lambda _, e=eps, d=delta, s=sens: f64(
                api.DifferentialPrivacy.calculate_noise_multiplier(float(e), float(d), float(s))
            ),
            Tol(rtol=4e-16),
        )
    for eps in (1.0, 0.5, 3.0):
        for mechanism in ("Gaussian", "Laplacian"):
            args = {
                "epsilon": f64(eps),
                "delta": f64(1e-5),
                "sensitivity": f64(1.0),
                "mechanism": mechanism,
                "ops": _dp_ops(g),
            }
            yield Case("dp", "dp", args, lambda _, a=args: _run_dp(a), Tol(rtol=1e-6, atol=1e-12))


def _dp_ops(g: Gen) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = [{"op": "params"}, {"op": "state"}]
    for rounds in (0, 1, 50, 99, 100, 101, 250):
        ops.append({"op": "remaining_after", "rounds": rounds})
    for _ in range(3):
        grad = g.vector(int(g.rng.integers(0, 6)))
        ops.append({"op": "clip_l2", "grad": grad, "max_norm": f32(abs(g.rng.normal(0, 2)))})
    ops += [{"op": "gaussian_empty"}, {"op": "laplacian_empty"}, {"op": "state"}]
    return ops


def _run_dp(args: dict[str, Any]) -> list[Any]:
    mech = (
        api.DPMechanism.GAUSSIAN if args["mechanism"] == "Gaussian" else api.DPMechanism.LAPLACIAN
    )
    dp = api.DifferentialPrivacy(
        float(args["epsilon"]),
        float(args["delta"]),
        float(args["sensitivity"]),
        mech,
        accounting=AccountingMode.LEGACY,
        rng=0,
    )
    out: list[Any] = []
    for op in args["ops"]:
        kind = op["op"]
        if kind == "params":
            e, d = dp.get_privacy_params()
            out.append(Ok([f64(e), f64(d)]))
        elif kind == "state":
            out.append(Ok([f64(dp.remaining_budget()), dp.is_budget_exhausted()]))
        elif kind == "remaining_after":
            rounds = op["rounds"]
            out.append(Ok([f32(dp.remaining_budget_after(rounds)), dp.is_exhausted_after(rounds)]))
        elif kind == "clip_l2":
            grad = op["grad"].copy()
            dp.clip_l2(grad, float(op["max_norm"]))
            out.append(Ok(grad))
        elif kind == "gaussian_empty":
            out.append(attempt(lambda: dp.add_gaussian_noise(np.empty(0, np.float32))))
        elif kind == "laplacian_empty":
            out.append(attempt(lambda: dp.add_laplacian_noise(np.empty(0, np.float32))))
    return out


def secure_aggregation_cases(g: Gen) -> Iterator[Case]:
    for minimum, participants, count in [(2, 3, 3), (3, 2, 2), (1, 1, 1), (2, 2, 2), (4, 5, 5)]:
        n = int(g.rng.integers(1, 5))
        grads = [vec(g.rng.uniform(-4, 4, n)) for _ in range(count)]

        def ours(_: Any, m: int = minimum, p: int = participants, gs: Any = grads) -> Any:
            sa = api.SecureAggregation(m)
            for _ in range(p):
                sa.add_participant()
            can, count = sa.can_aggregate(), sa.participant_count()
            result = attempt(lambda: sa.aggregate_secure(gs))
            sa.reset()
            return {
                "can": can,
                "count": count,
                "result": result,
                "after_reset": sa.participant_count(),
            }

        deliberate = None
        if participants < minimum or count < 2:
            deliberate = (
                "SecureAggregation.aggregate_secure docstring: SecureAggregationError, a "
                "FederatedError, where the seed raised InvalidGradient; a single gradient is "
                "refused (threshold below 2; the seed returned it in the clear)"
            )
        yield Case(
            "secure_aggregation",
            "secure_aggregation",
            {"min": minimum, "participants": participants, "gradients": grads},
            ours,
            Tol(atol=1e-4),
            deliberate=deliberate,
        )


def federated_round_cases(g: Gen) -> Iterator[Case]:
    for _ in range(10):
        clients = sorted(f"client-{j}" for j in range(int(g.rng.integers(1, 5))))
        n = int(g.rng.integers(1, 5))
        present = [c for c in clients if g.rng.integers(0, 3)]
        contributions = [(c, g.vector(n)) for c in present]
        if present and g.rng.integers(0, 4) == 0:
            contributions.append((present[0], g.vector(n + 1)))  # re-sent with another length
        round_id = int(g.rng.integers(0, 100))

        def ours(_: Any, rid: int = round_id, cl: Any = clients, co: Any = contributions) -> Any:
            rnd = api.FederatedRound.start(rid, cl)
            for client, grad in co:
                rnd.record_contribution(client, grad)
            stats = rnd.stats()
            return {
                "is_complete": rnd.is_complete(),
                "aggregate": attempt(rnd.aggregate),
                "participants": stats.participants,
                "missing": stats.missing_clients,
                "round_id": stats.round_id,
                "converged": stats.converged,
            }

        grads = [v for _, v in contributions]
        yield Case(
            "federated_round",
            "federated_round",
            {"round_id": round_id, "clients": clients, "contributions": contributions},
            ours,
            sum_tol(*grads),
        )
    for round_num, client_count, completed in [(0, 3, 4), (5, 0, 1), (2, 2, 1)]:

        def legacy(_: Any, r: int = round_num, c: int = client_count, k: int = completed) -> Any:
            rnd = api.FederatedRound(r, MODEL_CID, c)
            states = []
            for _ in range(k):
                states.append(rnd.is_complete())
                rnd.mark_client_completed()
            states.append(rnd.is_complete())
            return {
                "states": states,
                "round_id": rnd.round_id,
                "completed_count": rnd.completed_count,
            }

        yield Case(
            "federated_round",
            "federated_round",
            {"round_num": round_num, "client_count": client_count, "completed": completed},
            legacy,
        )
    args = {"round_id": 1, "clients": ["zed", "amy"], "contributions": []}
    yield Case(
        "federated_round",
        "federated_round",
        args,
        lambda _: {"missing": api.FederatedRound.start(1, ["zed", "amy"]).missing_clients()},
        deliberate="FederatedRound.missing_clients docstring: sorted (the seed kept the "
        "expected order)",
    )


def _run_convergence(args: dict[str, Any]) -> list[Any]:
    config = args.get("config")
    if config is not None:
        detector = api.ConvergenceDetector.with_config(
            api.ConvergenceConfig(
                threshold=float(config["threshold"]),
                window_size=config["window_size"],
                smoothing=float(config["smoothing"]),
                patience=config["patience"],
            )
        )
    else:
        detector = api.ConvergenceDetector(args["window"], float(args["threshold"]))
    out: list[Any] = []
    for loss in args.get("ema_losses", []):
        converged = detector.update(float(loss))
        out.append(
            {
                "converged": converged,
                "smoothed": f32(detector.smoothed_loss()),
                "norm": f32(detector.gradient_norm()),
                "plateau": detector.plateau_rounds(),
            }
        )
    for loss in args.get("losses", []):
        detector.add_loss(float(loss))
        latest = detector.latest_loss()
        out.append(
            {
                "converged": detector.has_converged(),
                "latest": None if latest is None else f64(latest),
                "history": np.array(detector.history(), dtype=np.float64),
            }
        )
    return out


def convergence_cases(g: Gen) -> Iterator[Case]:
    listed = {"threshold": f32(0.1), "window_size": 3, "smoothing": f32(0.9), "patience": 2}
    args = {"config": listed, "ema_losses": vec([0.06, 0.0, 0.14])}
    yield Case(
        "convergence_ema",
        "convergence",
        args,
        lambda _, a=args: _run_convergence(a),
        label="issue 12: float32 window mean",
    )
    for i in range(24):
        config = {
            "threshold": f32(10.0 ** g.rng.uniform(-3, 0)),
            "window_size": int(g.rng.integers(1, 6)),
            "smoothing": f32(g.rng.uniform(0, 1)),
            "patience": int(g.rng.integers(1, 4)),
        }
        start = g.rng.uniform(0.1, 5)
        losses = vec(
            start * np.exp(-g.rng.uniform(0, 1) * np.arange(12))
            + g.rng.normal(0, float(config["threshold"]) / 2, 12)
        )
        if i % 4 == 0:
            losses = vec(np.round(losses, 2))  # decimal steps: float32 sums land on the threshold
        args = {
            "config": config if i % 6 else None,
            "ema_losses": losses,
            "window": 10,
            "threshold": f64(1e-4),
        }
        yield Case("convergence_ema", "convergence", args, lambda _, a=args: _run_convergence(a))
    for _ in range(15):
        window = int(g.rng.integers(1, 6))
        losses = np.asarray(g.rng.uniform(0.5, 1, 10) * (1 + g.rng.normal(0, 0.01, 10)), np.float64)
        if g.rng.integers(0, 3) == 0:
            losses = np.full(10, g.rng.uniform(-1, 1) * 1e-11)
        args = {"window": window, "threshold": f64(10.0 ** g.rng.uniform(-3, -1)), "losses": losses}
        yield Case(
            "convergence_legacy",
            "convergence",
            args,
            lambda _, a=args: _run_convergence(a),
            Tol(rtol=1e-15),
        )


def _run_model_sync(args: dict[str, Any]) -> list[Any]:
    sync = api.ModelSyncProtocol(
        args["max_rounds"], args["min_clients"], args["window"], float(args["threshold"])
    )
    out: list[Any] = []
    for op in args["ops"]:
        if op["op"] == "start":
            out.append(attempt(lambda op=op: sync.start_round(MODEL_CID, op["clients"])))
        elif op["op"] == "complete":
            out.append(
                attempt(
                    lambda op=op: sync.complete_round(op["round"], op["grad"], float(op["loss"]))
                )
            )
        elif op["op"] == "state":
            latest = sync.latest_loss()
            out.append(
                Ok(
                    {
                        "should_continue": sync.should_continue(),
                        "has_converged": sync.has_converged(),
                        "current_round": sync.current_round(),
                        "total_rounds": sync.total_rounds(),
                        "latest_loss": None if latest is None else f64(latest),
                        "max_rounds": sync.max_rounds(),
                    }
                )
            )
        else:
            rnd = sync.get_round(op["round"])
            out.append(
                Ok(
                    None
                    if rnd is None
                    else {
                        "round_num": rnd.round_num,
                        "client_count": rnd.client_count,
                        "completed_count": rnd.completed_count,
                        "aggregated": rnd.aggregated_gradient,
                        "is_complete": rnd.is_complete(),
                    }
                )
            )
    return out


def model_sync_cases(g: Gen) -> Iterator[Case]:
    for _ in range(10):
        max_rounds, min_clients = int(g.rng.integers(1, 5)), int(g.rng.integers(0, 4))
        ops: list[dict[str, Any]] = [{"op": "state"}, {"op": "get_round", "round": 0}]
        started = 0
        done: set[int] = set()
        for _ in range(int(g.rng.integers(2, 8))):
            if g.rng.integers(0, 2):
                ops.append({"op": "start", "clients": int(g.rng.integers(0, 5))})
                started += 1
            else:
                number = int(g.rng.integers(0, started + 2))
                if number in done:
                    continue  # we refuse a second completion (documented)
                done.add(number)
                ops.append(
                    {
                        "op": "complete",
                        "round": number,
                        "grad": g.vector(3),
                        "loss": f64(g.rng.uniform(0.9, 1.0)),
                    }
                )
            ops += [{"op": "state"}, {"op": "get_round", "round": max(started - 1, 0)}]
        args = {
            "max_rounds": max_rounds,
            "min_clients": min_clients,
            "window": int(g.rng.integers(1, 3)),
            "threshold": f64(0.1),
            "ops": ops,
        }
        yield Case("model_sync", "model_sync", args, lambda _, a=args: _run_model_sync(a))
    twice = [{"op": "start", "clients": 1}] + [
        {"op": "complete", "round": 0, "grad": vec([1.0]), "loss": f64(0.5)}
    ] * 2
    args = {"max_rounds": 3, "min_clients": 1, "window": 2, "threshold": f64(0.1), "ops": twice}
    yield Case(
        "model_sync",
        "model_sync",
        args,
        lambda _, a=args: _run_model_sync(a),
        deliberate="sync module docstring: completing a round twice is refused",
    )


def _verify(peer: str, cid: str) -> bool:
    sync = api.GossipModelSync("verifier", MemoryPubsub(MemoryPubsubBus(), "verifier"))
    return sync.verify_update(api.ModelUpdate.new(peer, cid, 0))


def verify_update_cases(g: Gen) -> Iterator[Case]:
    good = [
        MODEL_CID,
        "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG",
        "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi",
    ]
    for peer, cid in [("alice", c) for c in good] + [
        ("", MODEL_CID),
        ("  ", MODEL_CID),
        ("bob", ""),
        ("bob", "   "),
    ]:
        yield Case(
            "verify_update",
            "verify_update",
            {"peer": peer, "cid": cid},
            lambda _, p=peer, c=cid: _verify(p, c),
        )
    for cid in ["abcd", "not-a-cid-at-all", "Qm123"]:
        yield Case(
            "verify_update",
            "verify_update",
            {"peer": "bob", "cid": cid},
            lambda _, c=cid: _verify("bob", c),
            deliberate="GossipModelSync.verify_update docstring: the CID must parse "
            "(the seed accepted any 4+ character string)",
        )


def accumulator_cases(g: Gen) -> Iterator[Case]:
    for i in range(15):
        n = int(g.rng.integers(0 if i == 0 else 1, 6))
        peers = [(f"peer-{j}", g.vector(n)) for j in range(int(g.rng.integers(0, 4)))]
        method: Any = ["Sum", "Mean", "FedAvg"][i % 3]
        if i % 5 == 4:
            peers = peers[:1]
            method = {"WeightedMean": vec(g.rng.uniform(0.1, 2, len(peers) + 1))}
        if i % 7 == 6 and peers:
            peers[-1] = (peers[-1][0], g.vector(n + 1))
        local = g.vector(n)
        args = {
            "method": method,
            "local": local,
            "peers": peers,
            "min_peers": int(g.rng.integers(0, 4)),
        }

        def ours(_: Any, a: dict[str, Any] = args) -> Any:
            acc = api.DistributedGradientAccumulator("session", _config(a))
            acc.local_gradient = a["local"]
            acc.peer_gradients = dict(a["peers"])
            return {
                "aggregate": attempt(acc.aggregate),
                "ready": acc.is_ready(a["min_peers"]),
                "peer_count": acc.peer_count,
                "session_id": acc.session_id,
            }

        yield Case("accumulator", "accumulator", args, ours, sum_tol(local, *[v for _, v in peers]))


# --------------------------------------------------------------------------- arrow_ipc.rs


def arrow_cases(g: Gen) -> Iterator[Case]:
    for i in range(15):
        values = g.vector(int(g.rng.integers(0, 40)) if i else 0, special=i % 4 == 1)
        data = api.store_gradient_as_arrow(values)
        yield Case("arrow_crate_reads_ours", "arrow_load", {"bytes": data}, lambda _, v=values: v)

        def ours(raw: Any, v: np.ndarray = values) -> Any:
            decoded = api.load_gradient_from_arrow(bytes.fromhex(raw)).reshape(-1)
            same = decoded.tobytes() == v.tobytes()
            return raw if same else f"we decode {decoded!r}"

        yield Case("arrow_ours_reads_crate", "arrow_store", {"values": values}, ours)
    yield Case(
        "arrow_crate_reads_ours",
        "arrow_load",
        {"bytes": b"not arrow"},
        lambda _: api.load_gradient_from_arrow(b"not arrow"),
    )


# --------------------------------------------------------------------------- computation_graph.rs


def _run_graph(args: dict[str, Any]) -> list[Any]:
    graph = api.ComputationGraphStore()
    out: list[Any] = []
    for op in args["ops"]:
        kind = op["op"]
        if kind == "add":
            node = api.ComputationNode(op["id"], op["name"], list(op["inputs"]), op.get("output"))
            graph.add_node(node)
            out.append(Ok(None))
        elif kind == "output":
            out.append(attempt(lambda op=op: graph.record_output(op["id"], op["cid"])))
        elif kind == "gradient":
            out.append(attempt(lambda op=op: graph.record_gradient(op["id"], op["cid"])))
        elif kind == "topo":
            out.append(attempt(graph.topological_order))
        elif kind == "provenance":
            out.append(Ok([n.id for n in graph.provenance_chain(op["cid"])]))
        elif kind == "consumers":
            out.append(Ok(sorted(n.id for n in graph.find_consumers(op["cid"]))))
        elif kind == "counts":
            out.append(Ok([graph.node_count(), graph.edge_count()]))
        elif kind == "checkpoint":
            out.append(Ok(json.loads(graph.checkpoint())))
    return out


def _sorted_edges(answer: list[Any]) -> list[Any]:
    """Checkpoint edges in sorted order (the crate pushes them in hash-map order)."""
    for entry in answer:
        ok = entry.get("ok") if isinstance(entry, dict) else None
        if isinstance(ok, dict) and "edges" in ok:
            ok["edges"] = sorted(ok["edges"])
    return answer


def _graph_case(ops: list[dict[str, Any]], deliberate: str | None = None, label: str = "") -> Case:
    def ours(raw: Any) -> Any:
        mine = _run_graph({"ops": ops})
        if isinstance(raw, list):
            _sorted_edges(raw)
        for entry in mine:
            if isinstance(entry, Ok) and isinstance(entry.value, dict) and "edges" in entry.value:
                entry.value["edges"] = sorted(entry.value["edges"])
        return mine

    return Case("graph", "graph", {"ops": ops}, ours, deliberate=deliberate, label=label)


def graph_cases(g: Gen) -> Iterator[Case]:
    diamond = [
        {"op": "add", "id": "A", "name": "input", "inputs": [], "output": "a"},
        {"op": "add", "id": "B", "name": "left", "inputs": ["a"], "output": "b"},
        {"op": "add", "id": "C", "name": "right", "inputs": ["a"], "output": "c"},
        {"op": "add", "id": "D", "name": "join", "inputs": ["b", "c"], "output": "d"},
        {"op": "provenance", "cid": "d"},
        {"op": "topo"},
        {"op": "counts"},
        {"op": "checkpoint"},
    ]
    yield _graph_case(diamond, label="issue 12: provenance_chain on a diamond")
    linear = [
        {"op": "add", "id": "n1", "name": "input", "inputs": [], "output": "cid_a"},
        {"op": "add", "id": "n2", "name": "matmul", "inputs": ["cid_a"], "output": "cid_b"},
        {"op": "add", "id": "n3", "name": "relu", "inputs": ["cid_b"]},
        {"op": "output", "id": "n3", "cid": "cid_c"},
        {"op": "gradient", "id": "n2", "cid": "grad_b"},
        {"op": "provenance", "cid": "cid_c"},
        {"op": "provenance", "cid": "unknown"},
        {"op": "consumers", "cid": "cid_a"},
        {"op": "topo"},
        {"op": "counts"},
        {"op": "checkpoint"},
    ]
    yield _graph_case(linear)
    for op in ("output", "gradient"):
        yield _graph_case(
            [{"op": op, "id": "missing", "cid": "cid_z"}],
            deliberate="computation_graph module docstring: a missing node raises "
            "GraphNodeNotFound (the seed: InvalidGradient)",
        )
    for _ in range(14):
        count = int(g.rng.integers(1, 8))
        ops: list[dict[str, Any]] = []
        for k in range(count):
            inputs = sorted({f"t{int(j)}" for j in g.rng.integers(0, count, g.rng.integers(0, 3))})
            ops.append(
                {
                    "op": "add",
                    "id": f"node-{int(g.rng.integers(0, 10**6)):06d}",
                    "name": "op",
                    "inputs": inputs,
                    "output": f"t{k}",
                }
            )
        ops += [
            {"op": "provenance", "cid": f"t{count - 1}"},
            {"op": "counts"},
            {"op": "consumers", "cid": "t0"},
            {"op": "checkpoint"},
        ]
        acyclic = all(
            int(c[1:]) < int(o["output"][1:]) for o in ops if o["op"] == "add" for c in o["inputs"]
        )
        if acyclic:
            ops.append({"op": "topo"})
        yield _graph_case(ops)
    cycle = [
        {"op": "add", "id": "X", "name": "f", "inputs": ["y"], "output": "x"},
        {"op": "add", "id": "Y", "name": "g", "inputs": ["x"], "output": "y"},
        {"op": "output", "id": "Y", "cid": "y"},
        {"op": "counts"},
        {"op": "topo"},
    ]
    yield _graph_case(
        cycle,
        deliberate="computation_graph module docstring: topological_order "
        "raises CircularDependency (the seed dropped the nodes)",
    )
    for i in range(10):
        shape = [int(d) for d in g.rng.integers(1, 4, int(g.rng.integers(1, 4)))]
        values = g.vector(int(np.prod(shape)))
        expected = shape if i % 3 else ([] if i % 2 else [*shape[::-1], 1])
        data = api.ComputationGraphStore.encode_gradient_arrow(values, shape)
        yield Case(
            "arrow_crate_reads_ours",
            "arrow_load",
            {"bytes": data},
            lambda _, v=values: v,
            label="the crate's standalone loader reads our graph gradient block",
        )
        yield Case(
            "graph_crate_reads_ours",
            "graph_load_arrow",
            {"bytes": data, "expected_shape": expected},
            lambda _, d=data, e=expected: api.ComputationGraphStore.load_gradient_from_arrow(d, e),
            label="issue 12: the crate reads our graph gradient block",
            deliberate="provenance.graph module docstring: our graph gradient block is our one "
            "block format ('value' column), which the crate's graph loader cannot read",
        )

        def ours(raw: Any, v: np.ndarray = values, s: list[int] = shape) -> Any:
            decoded = api.ComputationGraphStore.load_gradient_from_arrow(
                bytes.fromhex(raw["bytes"]), s
            )
            return raw if decoded.tobytes() == v.tobytes() else f"we decode {decoded!r}"

        yield Case(
            "graph_ours_reads_crate", "graph_arrow_bytes", {"values": values, "shape": shape}, ours
        )


# --------------------------------------------------------------------------- coordination.rs


def _status(status: Any) -> Any:
    if status is None:
        return None
    name = status.name
    if name == "CollectingGradients":
        return {name: [status.received, status.expected]}
    if name == "Complete":
        return {name: status.aggregated_cid}
    if name == "Failed":
        return {name: status.reason}
    return {name: None}


def _run_pass_coordinator(args: dict[str, Any]) -> list[Any]:
    coord = api.PassCoordinator(args["expected"], 60_000)
    out: list[Any] = []
    for op in args["ops"]:
        pid = api.BackwardPassId(op["round"], op["peer"]) if "round" in op else None
        kind = op["op"]
        if kind == "start":
            out.append(Ok(coord.start_pass(pid)))
        elif kind == "submit":
            contribution = api.GradientContribution(
                pid, op["from"], op["cid"], op["layer"], op["samples"], 0
            )
            out.append(attempt(lambda c=contribution: _status(coord.submit_contribution(c))))
        elif kind == "ready":
            out.append(Ok(coord.is_ready_to_aggregate(pid)))
        elif kind == "complete":
            out.append(Ok(coord.mark_complete(pid, op["cid"])))
        elif kind == "fail":
            out.append(Ok(coord.mark_failed(pid, op["reason"])))
        elif kind == "status":
            out.append(Ok(_status(coord.status(pid))))
        elif kind == "contributions":
            out.append(Ok([c.peer_id for c in coord.contributions(pid)]))
        elif kind == "active":
            out.append(Ok(coord.active_count()))
        elif kind == "gc":
            out.append(Ok(coord.gc_before_round(op["before"])))
    return out


def pass_coordinator_cases(g: Gen) -> Iterator[Case]:
    for round_, peer in [(0, "a"), (7, "peer-x"), (2**40, "z-y"), (3, "")]:
        yield Case(
            "pass_key",
            "pass_key",
            {"round": round_, "peer": peer},
            lambda _, r=round_, p=peer: api.BackwardPassId(r, p).as_key(),
        )
    for _ in range(12):
        expected = int(g.rng.integers(1, 4))
        ops: list[dict[str, Any]] = []
        seen: dict[tuple[int, str], set[str]] = {}
        terminal: set[tuple[int, str]] = set()
        for _ in range(int(g.rng.integers(4, 14))):
            key = (int(g.rng.integers(0, 4)), f"init-{int(g.rng.integers(0, 2))}")
            base = {"round": key[0], "peer": key[1]}
            kind = [
                "start",
                "start",
                "submit",
                "submit",
                "submit",
                "ready",
                "complete",
                "fail",
                "status",
                "contributions",
                "active",
                "gc",
            ][int(g.rng.integers(0, 12))]
            if kind == "submit":
                sender = f"p{int(g.rng.integers(0, 4))}"
                if sender in seen.get(key, set()):
                    sender = f"q{len(ops)}"  # one contribution per peer: we count peers once
                seen.setdefault(key, set()).add(sender)
                ops.append(
                    {
                        "op": "submit",
                        **base,
                        "from": sender,
                        "cid": f"c{len(ops)}",
                        "layer": "l",
                        "samples": 10,
                    }
                )
            elif kind in ("complete", "fail"):
                if key in terminal:
                    continue  # we refuse to overwrite a terminal pass (documented)
                terminal.add(key)
                ops.append({"op": kind, **base, "cid": f"agg{len(ops)}", "reason": "boom"})
            elif kind == "gc":
                ops.append({"op": "gc", "before": int(g.rng.integers(0, 5))})
            elif kind == "active":
                ops.append({"op": "active"})
            elif kind == "ready" and key in terminal:
                continue  # we answer False for a finished pass (documented)
            else:
                ops.append({"op": kind, **base})
        args = {"expected": expected, "ops": ops}
        yield Case(
            "pass_coordinator", "pass_coordinator", args, lambda _, a=args: _run_pass_coordinator(a)
        )


# --------------------------------------------------------------------------- GARW blocks


def garw_cases(g: Gen) -> Iterator[Case]:
    for i in range(15):
        values = g.vector(special=i % 5 == 0)
        shape = [values.size] if i % 3 else [int(d) for d in g.rng.integers(0, 4, 2)]
        samples = int(g.rng.integers(0, 2**32))
        block = {"layer": f"layer{i}", "shape": shape, "values": values, "samples": samples}

        def to_bytes(_: Any, s: list[int] = shape, v: np.ndarray = values, n: int = samples) -> Any:
            return api.GradientArrowBlock("", "layer", s, v, n).to_arrow_bytes().hex()

        yield Case("garw_bytes", "garw_bytes", block, to_bytes)
        yield Case(
            "garw_cid",
            "garw_cid",
            block,
            lambda _, v=values, n=samples, i=i: api.GradientArrowBlock.compute_cid(
                f"layer{i}", v, n
            ),
        )
        data = api.GradientArrowBlock("", "l", shape, values, samples).to_arrow_bytes()
        cut = data[: int(g.rng.integers(0, len(data) + 1))] if i % 2 else data + b"tail"
        if i % 7 == 3:
            cut = b"GARX" + data[4:]
        yield Case("garw_parse", "garw_parse", {"bytes": cut}, lambda _, d=cut: _garw_parsed(d))
    for i in range(15):
        count, n = int(g.rng.integers(0 if i == 0 else 1, 5)), int(g.rng.integers(0, 6))
        blocks = [
            {
                "shape": [n],
                "values": g.vector(n),
                "samples": int(g.rng.integers(0, 1000)) if i % 4 else 0,
            }
            for _ in range(count)
        ]
        if i % 6 == 5 and count > 1:
            blocks[-1] = {"shape": [n + 1], "values": g.vector(n + 1), "samples": 3}

        def fedavg(_: Any, bs: list[dict[str, Any]] = blocks) -> Any:
            return api.GradientArrowBlock.fedavg(
                [api.GradientArrowBlock("", "l", b["shape"], b["values"], b["samples"]) for b in bs]
            )

        yield Case(
            "garw_fedavg",
            "garw_fedavg",
            {"blocks": blocks},
            fedavg,
            sum_tol(*[b["values"] for b in blocks]),
        )


def _garw_parsed(data: bytes) -> dict[str, Any]:
    block = api.GradientArrowBlock.from_arrow_bytes("cid", "layer", data)
    return {"shape": block.shape, "values": block.values, "samples": block.num_samples}


FAMILIES: list[Callable[[Gen], Iterator[Case]]] = [
    step_coordinator_cases,
    backward_step_cases,
    privacy_cases,
    secure_aggregation_cases,
    federated_round_cases,
    convergence_cases,
    model_sync_cases,
    verify_update_cases,
    accumulator_cases,
    arrow_cases,
    graph_cases,
    pass_coordinator_cases,
    garw_cases,
]
