//! Oracle for `tests/seed/test_crate_oracle.py`: runs check cases through the real crate
//! `ipfrs-tensorlogic` 0.2.0 (`gradient` module) and prints what it answers.
//!
//! stdin: a JSON list of cases `{"id": str, "fn": str, "args": {...}}`.
//! stdout: a JSON list `{"id": str, "ok": value}` | `{"id", "err": {type, msg, data}}` |
//! `{"id", "panic": msg}`, in input order.
//!
//! Floats travel as their IEEE bit patterns (f32 as u32, f64 as u64) so NaN, ±inf, -0.0 and
//! every last bit survive JSON; byte strings travel as lowercase hex.

use std::io::Read;

use ipfrs_core::Cid;
use ipfrs_tensorlogic::arrow::{ArrowTensor, ArrowTensorStore};
use ipfrs_tensorlogic::gradient::federated::{
    ConvergenceConfig, ConvergenceDetector, DPMechanism, DifferentialPrivacy,
    DistributedGradientAccumulator, FederatedError, FederatedRound, GossipModelSync,
    ModelSyncProtocol, ModelUpdate, PrivacyBudget, SecureAggregation,
};
use ipfrs_tensorlogic::gradient::{
    clip_gradient_norm, federated_average, load_gradient_from_arrow, store_gradient_as_arrow,
    AggregationMethod, ArrowBlockError, BackwardPassConfig, BackwardPassCoordinator,
    BackwardPassId, BackwardPassStep, ComputationGraphError, ComputationGraphStore,
    ComputationNode, CoordinationError, CoordinationStatus, GradientAggregator,
    GradientArrowBlock, GradientCompressor, GradientContribution, GradientError,
    GradientVerifier, LayerGradient, LegacyBackwardPassCoordinator, QuantizedGradient,
    SparseGradient,
};
use serde_json::{json, Value};

type Res = Result<Value, Value>;

// ------------------------------------------------------------------ argument decoding

fn arg<'a>(a: &'a Value, key: &str) -> &'a Value {
    a.get(key).unwrap_or_else(|| panic!("missing argument {key}"))
}

fn f32_of(v: &Value) -> f32 {
    f32::from_bits(v.as_u64().expect("f32 bits") as u32)
}

fn f64_of(v: &Value) -> f64 {
    f64::from_bits(v.as_u64().expect("f64 bits"))
}

fn f32s_of(v: &Value) -> Vec<f32> {
    v.as_array().expect("f32 list").iter().map(f32_of).collect()
}

fn usize_of(v: &Value) -> usize {
    v.as_u64().expect("unsigned integer") as usize
}

fn usizes_of(v: &Value) -> Vec<usize> {
    v.as_array().expect("usize list").iter().map(usize_of).collect()
}

fn str_of(v: &Value) -> String {
    v.as_str().expect("string").to_string()
}

fn strs_of(v: &Value) -> Vec<String> {
    v.as_array().expect("string list").iter().map(str_of).collect()
}

fn grads_of(v: &Value) -> Vec<Vec<f32>> {
    v.as_array().expect("list of gradients").iter().map(f32s_of).collect()
}

fn f32_arg(a: &Value, key: &str) -> f32 {
    f32_of(arg(a, key))
}

fn f64_arg(a: &Value, key: &str) -> f64 {
    f64_of(arg(a, key))
}

fn f32s_arg(a: &Value, key: &str) -> Vec<f32> {
    f32s_of(arg(a, key))
}

fn usize_arg(a: &Value, key: &str) -> usize {
    usize_of(arg(a, key))
}

fn str_arg(a: &Value, key: &str) -> String {
    str_of(arg(a, key))
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

// ------------------------------------------------------------------ result encoding

fn bits(v: f32) -> Value {
    json!(v.to_bits())
}

fn bits64(v: f64) -> Value {
    json!(v.to_bits())
}

fn bits_vec(v: &[f32]) -> Value {
    Value::Array(v.iter().map(|x| bits(*x)).collect())
}

fn hex_encode(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn gerr(e: &GradientError) -> Value {
    let (kind, data) = match e {
        GradientError::ShapeMismatch { expected, actual } => {
            ("ShapeMismatch", json!({"expected": expected, "actual": actual}))
        }
        GradientError::ChecksumFailed => ("ChecksumFailed", Value::Null),
        GradientError::InvalidCompressionRatio(r) => {
            ("InvalidCompressionRatio", json!({"ratio": bits(*r)}))
        }
        GradientError::EmptyGradientSet => ("EmptyGradientSet", Value::Null),
        GradientError::IncompatibleDtype(d) => ("IncompatibleDtype", json!(format!("{d:?}"))),
        GradientError::OutlierDetected { index, value } => (
            "OutlierDetected",
            json!({"index": index, "value": bits(*value)}),
        ),
        GradientError::InvalidGradient(s) => ("InvalidGradient", json!(s)),
        GradientError::EmptyGradients => ("EmptyGradients", Value::Null),
        GradientError::DimensionMismatch => ("DimensionMismatch", Value::Null),
        GradientError::NodeNotFound(s) => ("NodeNotFound", json!(s)),
        GradientError::PeerNotFound(s) => ("PeerNotFound", json!(s)),
    };
    json!({"type": kind, "msg": e.to_string(), "data": data})
}

fn ferr(e: &FederatedError) -> Value {
    let kind = match e {
        FederatedError::NoContributions => "NoContributions",
        FederatedError::DimensionMismatch => "FederatedDimensionMismatch",
        FederatedError::ClientNotFound(_) => "ClientNotFound",
        FederatedError::NotStarted => "NotStarted",
    };
    json!({"type": kind, "msg": e.to_string(), "data": Value::Null})
}

fn cerr(e: &CoordinationError) -> Value {
    let kind = match e {
        CoordinationError::PassNotFound { .. } => "PassNotFound",
        CoordinationError::PassAlreadyTerminal { .. } => "PassAlreadyTerminal",
    };
    json!({"type": kind, "msg": e.to_string(), "data": Value::Null})
}

fn aerr(e: &ArrowBlockError) -> Value {
    let kind = match e {
        ArrowBlockError::EmptyInput => "EmptyInput",
        ArrowBlockError::ShapeMismatch { .. } => "ArrowBlockShapeMismatch",
        ArrowBlockError::InvalidMagic => "InvalidMagic",
        ArrowBlockError::TruncatedData => "TruncatedData",
    };
    json!({"type": kind, "msg": e.to_string(), "data": Value::Null})
}

fn anyerr(e: &anyhow::Error) -> Value {
    json!({"type": "anyhow", "msg": e.to_string(), "data": Value::Null})
}

fn wrap<T, E>(r: Result<T, E>, ok: impl FnOnce(T) -> Value, err: impl FnOnce(&E) -> Value) -> Value {
    match r {
        Ok(v) => json!({"ok": ok(v)}),
        Err(e) => json!({"err": err(&e)}),
    }
}

fn sparse_json(s: &SparseGradient) -> Value {
    json!({"indices": s.indices, "values": bits_vec(&s.values), "shape": s.shape})
}

fn method_of(v: &Value) -> AggregationMethod {
    match v {
        Value::String(s) if s == "Sum" => AggregationMethod::Sum,
        Value::String(s) if s == "Mean" => AggregationMethod::Mean,
        Value::String(s) if s == "FedAvg" => AggregationMethod::FedAvg,
        Value::Object(o) if o.contains_key("WeightedMean") => AggregationMethod::WeightedMean {
            weights: f32s_of(&o["WeightedMean"]),
        },
        other => panic!("unknown aggregation method {other}"),
    }
}

fn config_of(a: &Value) -> BackwardPassConfig {
    let mut config = BackwardPassConfig::default();
    if let Some(m) = a.get("method") {
        config.aggregation = method_of(m);
    }
    if let Some(c) = a.get("clipping") {
        if !c.is_null() {
            config.gradient_clipping = Some(f32_of(c));
        }
    }
    config
}

fn status_json(s: &CoordinationStatus) -> Value {
    match s {
        CoordinationStatus::Pending => json!({"Pending": null}),
        CoordinationStatus::CollectingGradients { received, expected } => {
            json!({"CollectingGradients": [received, expected]})
        }
        CoordinationStatus::Aggregating => json!({"Aggregating": null}),
        CoordinationStatus::Complete { aggregated_cid } => json!({"Complete": aggregated_cid}),
        CoordinationStatus::Failed { reason } => json!({"Failed": reason}),
    }
}

fn pass_id_of(op: &Value) -> BackwardPassId {
    BackwardPassId::new(arg(op, "round").as_u64().expect("round"), str_arg(op, "peer"))
}

// ------------------------------------------------------------------ scenarios

fn step_coordinator(a: &Value) -> Value {
    let mut coord = LegacyBackwardPassCoordinator::new(config_of(a));
    if let Some(lr) = a.get("lr") {
        coord = coord.with_learning_rate(f32_of(lr));
    }
    let mut out = Vec::new();
    for op in arg(a, "ops").as_array().expect("ops") {
        let r = match str_arg(op, "op").as_str() {
            "schedule" => {
                let peers = strs_of(arg(op, "peers"));
                let refs: Vec<&str> = peers.iter().map(|s| s.as_str()).collect();
                coord.schedule_step(&str_arg(op, "node"), &str_arg(op, "name"), &refs);
                json!({"ok": null})
            }
            "receive" => wrap(
                coord.receive_gradient(
                    &str_arg(op, "node"),
                    &str_arg(op, "peer"),
                    &str_arg(op, "cid"),
                ),
                |_| Value::Null,
                gerr,
            ),
            "aggregate" => {
                let data: Vec<(String, Vec<f32>)> = arg(op, "data")
                    .as_array()
                    .expect("data")
                    .iter()
                    .map(|p| (str_of(&p[0]), f32s_of(&p[1])))
                    .collect();
                wrap(
                    coord.aggregate_gradients(&str_arg(op, "node"), data),
                    |v| bits_vec(&v),
                    gerr,
                )
            }
            "apply" => {
                let mut params = f32s_arg(op, "params");
                let grad = f32s_arg(op, "grad");
                wrap(
                    coord.apply_gradient(&mut params, &grad),
                    |_| bits_vec(&params),
                    gerr,
                )
            }
            "clip" => {
                let mut grad = f32s_arg(op, "grad");
                coord.clip_gradients(&mut grad);
                json!({"ok": bits_vec(&grad)})
            }
            "next_ready" => json!({"ok": coord.next_ready_step().map(|s| s.node_id.clone())}),
            "stats" => {
                let s = coord.stats();
                json!({"ok": {
                    "total_steps": s.total_steps,
                    "completed_steps": s.completed_steps,
                    "pending_steps": s.pending_steps,
                    "failed_steps": s.failed_steps,
                    "total_gradient_bytes": s.total_gradient_bytes,
                    "participating_peers": s.participating_peers,
                }})
            }
            other => panic!("unknown step op {other}"),
        };
        out.push(r);
    }
    Value::Array(out)
}

fn backward_step(a: &Value) -> Value {
    let mut step = BackwardPassStep::new("node".to_string(), "op".to_string());
    let mut out = Vec::new();
    for op in arg(a, "ops").as_array().expect("ops") {
        match str_arg(op, "op").as_str() {
            "add" => step.add_peer(&str_arg(op, "peer")),
            "received" => step.record_gradient_received(&str_arg(op, "peer"), &str_arg(op, "cid")),
            "failed" => step.record_gradient_failed(&str_arg(op, "peer"), &str_arg(op, "reason")),
            other => panic!("unknown backward step op {other}"),
        }
        out.push(json!({
            "is_complete": step.is_complete(),
            "ready_to_aggregate": step.ready_to_aggregate(),
            "received_count": step.received_count(),
            "failed_count": step.failed_count(),
        }));
    }
    Value::Array(out)
}

fn pass_coordinator(a: &Value) -> Value {
    let coord = BackwardPassCoordinator::new(usize_arg(a, "expected"), 60_000);
    let mut out = Vec::new();
    for op in arg(a, "ops").as_array().expect("ops") {
        let r = match str_arg(op, "op").as_str() {
            "start" => json!({"ok": coord.start_pass(pass_id_of(op))}),
            "submit" => {
                let contribution = GradientContribution {
                    pass_id: pass_id_of(op),
                    peer_id: str_arg(op, "from"),
                    gradient_cid: str_arg(op, "cid"),
                    layer_name: str_arg(op, "layer"),
                    num_samples: usize_arg(op, "samples"),
                    submitted_at_ms: 0,
                };
                wrap(coord.submit_contribution(contribution), |s| status_json(&s), cerr)
            }
            "ready" => json!({"ok": coord.is_ready_to_aggregate(&pass_id_of(op))}),
            "complete" => json!({"ok": coord.mark_complete(&pass_id_of(op), str_arg(op, "cid"))}),
            "fail" => json!({"ok": coord.mark_failed(&pass_id_of(op), str_arg(op, "reason"))}),
            "status" => json!({"ok": coord.status(&pass_id_of(op)).map(|s| status_json(&s))}),
            "contributions" => {
                let peers: Vec<String> = coord
                    .contributions(&pass_id_of(op))
                    .into_iter()
                    .map(|c| c.peer_id)
                    .collect();
                json!({"ok": peers})
            }
            "active" => json!({"ok": coord.active_count()}),
            "gc" => json!({"ok": coord.gc_before_round(arg(op, "before").as_u64().expect("round"))}),
            other => panic!("unknown pass op {other}"),
        };
        out.push(r);
    }
    Value::Array(out)
}

fn graph_node(op: &Value) -> ComputationNode {
    let mut node = ComputationNode::new(str_arg(op, "name"), strs_of(arg(op, "inputs")));
    node.id = str_arg(op, "id");
    if let Some(o) = op.get("output") {
        if !o.is_null() {
            node.output_cid = Some(str_of(o));
        }
    }
    node
}

fn node_ids(nodes: Vec<&ComputationNode>) -> Value {
    json!(nodes.iter().map(|n| n.id.clone()).collect::<Vec<_>>())
}

fn graph(a: &Value) -> Value {
    let mut store = match a.get("checkpoint") {
        Some(c) => match ComputationGraphStore::from_checkpoint(str_of(c).as_bytes()) {
            Ok(s) => s,
            Err(e) => return json!([{"err": gerr(&e)}]),
        },
        None => ComputationGraphStore::new(),
    };
    let mut out = Vec::new();
    for op in arg(a, "ops").as_array().expect("ops") {
        let r = match str_arg(op, "op").as_str() {
            "add" => {
                store.add_node(graph_node(op));
                json!({"ok": null})
            }
            "output" => wrap(
                store.record_output(&str_arg(op, "id"), str_arg(op, "cid")),
                |_| Value::Null,
                gerr,
            ),
            "gradient" => wrap(
                store.record_gradient(&str_arg(op, "id"), str_arg(op, "cid")),
                |_| Value::Null,
                gerr,
            ),
            "topo" => json!({"ok": store.topological_order()}),
            "provenance" => json!({"ok": node_ids(store.provenance_chain(&str_arg(op, "cid")))}),
            "consumers" => {
                let mut ids: Vec<String> = store
                    .find_consumers(&str_arg(op, "cid"))
                    .iter()
                    .map(|n| n.id.clone())
                    .collect();
                ids.sort();
                json!({"ok": ids})
            }
            "counts" => json!({"ok": [store.node_count(), store.edge_count()]}),
            "checkpoint" => {
                let bytes = store.checkpoint().expect("checkpoint");
                let parsed: Value = serde_json::from_slice(&bytes).expect("checkpoint json");
                json!({"ok": parsed})
            }
            other => panic!("unknown graph op {other}"),
        };
        out.push(r);
    }
    Value::Array(out)
}

/// The Arrow bytes `ComputationGraphStore::store_gradient_as_arrow` hashes (it keeps no copy).
fn graph_arrow_bytes(values: &[f32], shape: &[usize]) -> Vec<u8> {
    let shape_str = shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
    let mut tensor = ArrowTensor::from_slice_f32("gradient", shape.to_vec(), values);
    tensor.metadata.custom.insert("gradient_shape".to_string(), shape_str);
    let mut store = ArrowTensorStore::new();
    store.insert(tensor);
    store.to_bytes().expect("arrow encode").to_vec()
}

fn convergence(a: &Value) -> Value {
    let mut det = match a.get("config") {
        Some(c) if !c.is_null() => ConvergenceDetector::with_config(ConvergenceConfig {
            threshold: f32_arg(c, "threshold"),
            window_size: usize_arg(c, "window_size"),
            smoothing: f32_arg(c, "smoothing"),
            patience: usize_arg(c, "patience"),
        }),
        _ => ConvergenceDetector::new(usize_arg(a, "window"), f64_arg(a, "threshold")),
    };
    let mut out = Vec::new();
    if let Some(losses) = a.get("ema_losses") {
        for l in f32s_of(losses) {
            let converged = det.update(l);
            out.push(json!({
                "converged": converged,
                "smoothed": bits(det.smoothed_loss()),
                "norm": bits(det.gradient_norm()),
                "plateau": det.plateau_rounds(),
            }));
        }
    }
    if let Some(losses) = a.get("losses") {
        for l in losses.as_array().expect("losses") {
            det.add_loss(f64_of(l));
            out.push(json!({
                "converged": det.has_converged(),
                "latest": det.latest_loss().map(bits64),
                "history": det.history().iter().map(|x| bits64(*x)).collect::<Vec<_>>(),
            }));
        }
    }
    Value::Array(out)
}

fn model_sync(a: &Value) -> Value {
    let mut sync = ModelSyncProtocol::new(
        usize_arg(a, "max_rounds"),
        usize_arg(a, "min_clients"),
        usize_arg(a, "window"),
        f64_arg(a, "threshold"),
    );
    let mut out = Vec::new();
    for op in arg(a, "ops").as_array().expect("ops") {
        let r = match str_arg(op, "op").as_str() {
            "start" => wrap(
                sync.start_round(Cid::default(), usize_arg(op, "clients")),
                |i| json!(i),
                gerr,
            ),
            "complete" => wrap(
                sync.complete_round(usize_arg(op, "round"), f32s_arg(op, "grad"), f64_arg(op, "loss")),
                |_| Value::Null,
                gerr,
            ),
            "state" => json!({"ok": {
                "should_continue": sync.should_continue(),
                "has_converged": sync.has_converged(),
                "current_round": sync.current_round(),
                "total_rounds": sync.total_rounds(),
                "latest_loss": sync.latest_loss().map(bits64),
                "max_rounds": sync.max_rounds(),
            }}),
            "get_round" => json!({"ok": sync.get_round(usize_arg(op, "round")).map(|r| json!({
                "round_num": r.round_num,
                "client_count": r.client_count,
                "completed_count": r.completed_count,
                "aggregated": r.aggregated_gradient.as_ref().map(|g| bits_vec(g)),
                "is_complete": r.is_complete(),
            }))}),
            other => panic!("unknown sync op {other}"),
        };
        out.push(r);
    }
    Value::Array(out)
}

fn privacy_budget(a: &Value) -> Value {
    let mut budget = PrivacyBudget::new(f64_arg(a, "epsilon"), f64_arg(a, "delta"));
    let mut out = Vec::new();
    for used in arg(a, "consume").as_array().expect("consume") {
        let r = wrap(budget.consume(f64_of(used)), |_| Value::Null, gerr);
        out.push(json!({
            "result": r,
            "remaining": bits64(budget.remaining_epsilon),
            "exhausted": budget.is_exhausted(),
            "fraction": bits64(budget.remaining_fraction()),
        }));
    }
    Value::Array(out)
}

fn dp(a: &Value) -> Value {
    let mechanism = if str_arg(a, "mechanism") == "Gaussian" {
        DPMechanism::Gaussian
    } else {
        DPMechanism::Laplacian
    };
    let mut dp = DifferentialPrivacy::new(
        f64_arg(a, "epsilon"),
        f64_arg(a, "delta"),
        f64_arg(a, "sensitivity"),
        mechanism,
    );
    let mut out = Vec::new();
    for op in arg(a, "ops").as_array().expect("ops") {
        let r = match str_arg(op, "op").as_str() {
            "params" => {
                let (e, d) = dp.get_privacy_params();
                json!({"ok": [bits64(e), bits64(d)]})
            }
            "remaining_after" => {
                let rounds = arg(op, "rounds").as_u64().expect("rounds") as u32;
                json!({"ok": [bits(dp.remaining_budget_after(rounds)), dp.is_exhausted_after(rounds)]})
            }
            "clip_l2" => {
                let mut g = f32s_arg(op, "grad");
                dp.clip_l2(&mut g, f32_arg(op, "max_norm"));
                json!({"ok": bits_vec(&g)})
            }
            // Noise on an empty gradient draws nothing: only the budget bookkeeping shows.
            "gaussian_empty" => wrap(dp.add_gaussian_noise(&mut []), |_| Value::Null, gerr),
            "laplacian_empty" => wrap(dp.add_laplacian_noise(&mut []), |_| Value::Null, gerr),
            "dp_sgd_empty" => wrap(
                dp.apply_dp_sgd(&mut [], f32_arg(op, "clip")),
                |_| Value::Null,
                gerr,
            ),
            "state" => json!({"ok": [bits64(dp.remaining_budget()), dp.is_budget_exhausted()]}),
            other => panic!("unknown dp op {other}"),
        };
        out.push(r);
    }
    Value::Array(out)
}

fn secure_aggregation(a: &Value) -> Value {
    let mut sa = SecureAggregation::new(usize_arg(a, "min"));
    for _ in 0..usize_arg(a, "participants") {
        sa.add_participant();
    }
    let can = sa.can_aggregate();
    let count = sa.participant_count();
    let r = wrap(sa.aggregate_secure(&grads_of(arg(a, "gradients"))), |v| bits_vec(&v), gerr);
    sa.reset();
    json!({"can": can, "count": count, "result": r, "after_reset": sa.participant_count()})
}

fn federated_round(a: &Value) -> Value {
    if let Some(clients) = a.get("clients") {
        let mut round = FederatedRound::start(
            arg(a, "round_id").as_u64().expect("round id") as u32,
            strs_of(clients),
        );
        for c in arg(a, "contributions").as_array().expect("contributions") {
            round.record_contribution(&str_of(&c[0]), f32s_of(&c[1]));
        }
        let stats = round.stats();
        json!({
            "is_complete": round.is_complete(),
            "aggregate": wrap(round.aggregate(None), |v| bits_vec(&v), ferr),
            "participants": stats.participants,
            "missing": stats.missing_clients,
            "round_id": stats.round_id,
            "converged": stats.converged,
        })
    } else {
        let mut round =
            FederatedRound::new(usize_arg(a, "round_num"), Cid::default(), usize_arg(a, "client_count"));
        let mut states = Vec::new();
        for _ in 0..usize_arg(a, "completed") {
            states.push(round.is_complete());
            round.mark_client_completed();
        }
        states.push(round.is_complete());
        json!({"states": states, "round_id": round.round_id, "completed_count": round.completed_count})
    }
}

fn accumulator(a: &Value) -> Value {
    let mut acc = DistributedGradientAccumulator::new("session", config_of(a));
    acc.local_gradient = f32s_arg(a, "local");
    for p in arg(a, "peers").as_array().expect("peers") {
        acc.peer_gradients.insert(str_of(&p[0]), f32s_of(&p[1]));
    }
    json!({
        "aggregate": wrap(acc.aggregate(), |v| bits_vec(&v), gerr),
        "ready": acc.is_ready(usize_arg(a, "min_peers")),
        "peer_count": acc.peer_count(),
        "session_id": acc.session_id(),
    })
}

fn garw_block(b: &Value) -> GradientArrowBlock {
    GradientArrowBlock {
        cid: String::new(),
        layer_name: b.get("layer").map(str_of).unwrap_or_default(),
        shape: usizes_of(arg(b, "shape")),
        values: f32s_arg(b, "values"),
        num_samples: usize_arg(b, "samples"),
    }
}

fn error_display(a: &Value) -> Value {
    let p = a.get("payload").cloned().unwrap_or(Value::Null);
    let msg = match str_arg(a, "kind").as_str() {
        "ShapeMismatch" => GradientError::ShapeMismatch {
            expected: usizes_of(&p[0]),
            actual: usizes_of(&p[1]),
        }
        .to_string(),
        "ChecksumFailed" => GradientError::ChecksumFailed.to_string(),
        "InvalidCompressionRatio" => GradientError::InvalidCompressionRatio(f32_of(&p)).to_string(),
        "EmptyGradientSet" => GradientError::EmptyGradientSet.to_string(),
        "OutlierDetected" => GradientError::OutlierDetected {
            index: usize_of(&p[0]),
            value: f32_of(&p[1]),
        }
        .to_string(),
        "InvalidGradient" => GradientError::InvalidGradient(str_of(&p)).to_string(),
        "EmptyGradients" => GradientError::EmptyGradients.to_string(),
        "DimensionMismatch" => GradientError::DimensionMismatch.to_string(),
        "NodeNotFound" => GradientError::NodeNotFound(str_of(&p)).to_string(),
        "PeerNotFound" => GradientError::PeerNotFound(str_of(&p)).to_string(),
        "NoContributions" => FederatedError::NoContributions.to_string(),
        "FederatedDimensionMismatch" => FederatedError::DimensionMismatch.to_string(),
        "ClientNotFound" => FederatedError::ClientNotFound(str_of(&p)).to_string(),
        "NotStarted" => FederatedError::NotStarted.to_string(),
        "PassNotFound" => CoordinationError::PassNotFound { pass_id: str_of(&p) }.to_string(),
        "PassAlreadyTerminal" => {
            CoordinationError::PassAlreadyTerminal { status: str_of(&p) }.to_string()
        }
        "EmptyInput" => ArrowBlockError::EmptyInput.to_string(),
        "ArrowBlockShapeMismatch" => ArrowBlockError::ShapeMismatch {
            expected: usizes_of(&p[0]),
            got: usizes_of(&p[1]),
        }
        .to_string(),
        "InvalidMagic" => ArrowBlockError::InvalidMagic.to_string(),
        "TruncatedData" => ArrowBlockError::TruncatedData.to_string(),
        "GraphNodeNotFound" => ComputationGraphError::NodeNotFound(str_of(&p)).to_string(),
        "CircularDependency" => ComputationGraphError::CircularDependency.to_string(),
        "GraphSerializationError" => ComputationGraphError::Serialization(str_of(&p)).to_string(),
        other => panic!("unknown error kind {other}"),
    };
    json!(msg)
}

fn run(f: &str, a: &Value) -> Res {
    let v = match f {
        // -- tensor.rs
        "sparse" => {
            let s = SparseGradient::new(
                usizes_of(arg(a, "indices")),
                f32s_arg(a, "values"),
                usizes_of(arg(a, "shape")),
            );
            let verify = wrap(s.verify_shape(), |_| Value::Null, gerr);
            let memory = LayerGradient::Sparse(s.clone()).memory_size();
            json!({
                "nnz": s.nnz(),
                "total": s.total_elements(),
                "sparsity": bits(s.sparsity_ratio()),
                "dense": bits_vec(&s.to_dense()),
                "verify": verify,
                "memory_size": memory,
            })
        }
        "quantize" => {
            let q = QuantizedGradient::from_dense(&f32s_arg(a, "values"), usizes_of(arg(a, "shape")));
            let via = GradientCompressor::quantize(&f32s_arg(a, "values"), usizes_of(arg(a, "shape")));
            json!({
                "q": q.quantized_values,
                "scale": bits(q.scale),
                "min": bits(q.min_val),
                "dense": bits_vec(&q.to_dense()),
                "ratio": bits(q.compression_ratio()),
                "memory_size": LayerGradient::Quantized(q.clone()).memory_size(),
                "compressor_same": via.quantized_values == q.quantized_values
                    && via.scale.to_bits() == q.scale.to_bits(),
            })
        }
        "dense_memory" => json!(LayerGradient::Dense {
            values: f32s_arg(a, "values"),
            shape: usizes_of(arg(a, "shape")),
        }
        .memory_size()),
        "top_k" => {
            return Ok(wrap(
                GradientCompressor::top_k(&f32s_arg(a, "values"), usizes_of(arg(a, "shape")), usize_arg(a, "k")),
                |s| sparse_json(&s),
                gerr,
            ))
        }
        "threshold" => sparse_json(&GradientCompressor::threshold(
            &f32s_arg(a, "values"),
            usizes_of(arg(a, "shape")),
            f32_arg(a, "threshold"),
        )),
        "random_sparsification" => {
            return Ok(wrap(
                GradientCompressor::random_sparsification(
                    &f32s_arg(a, "values"),
                    usizes_of(arg(a, "shape")),
                    f32_arg(a, "keep_ratio"),
                ),
                |s| sparse_json(&s),
                gerr,
            ))
        }
        "average" => {
            return Ok(wrap(GradientAggregator::average(&grads_of(arg(a, "gradients"))), |v| bits_vec(&v), gerr))
        }
        "weighted_average" => {
            return Ok(wrap(
                GradientAggregator::weighted_average(&grads_of(arg(a, "gradients")), &f32s_arg(a, "weights")),
                |v| bits_vec(&v),
                gerr,
            ))
        }
        "apply_momentum" => {
            return Ok(wrap(
                GradientAggregator::apply_momentum(
                    &f32s_arg(a, "current"),
                    &f32s_arg(a, "previous"),
                    f32_arg(a, "factor"),
                ),
                |v| bits_vec(&v),
                gerr,
            ))
        }
        "verify_shape" => {
            return Ok(wrap(
                GradientVerifier::verify_shape(&f32s_arg(a, "gradient"), &usizes_of(arg(a, "shape"))),
                |_| Value::Null,
                gerr,
            ))
        }
        "detect_outliers" => {
            return Ok(wrap(
                GradientVerifier::detect_outliers(&f32s_arg(a, "gradient"), f32_arg(a, "threshold")),
                |_| Value::Null,
                gerr,
            ))
        }
        "verify_finite" => {
            return Ok(wrap(GradientVerifier::verify_finite(&f32s_arg(a, "gradient")), |_| Value::Null, gerr))
        }
        "l2_norm" => bits(GradientVerifier::l2_norm(&f32s_arg(a, "gradient"))),
        "clip_by_norm" => {
            let mut g = f32s_arg(a, "gradient");
            GradientVerifier::clip_by_norm(&mut g, f32_arg(a, "max_norm"));
            bits_vec(&g)
        }
        // -- backward_pass.rs
        "federated_average" => {
            return Ok(wrap(federated_average(&grads_of(arg(a, "gradients"))), |v| bits_vec(&v), gerr))
        }
        "clip_gradient_norm" => {
            let mut g = f32s_arg(a, "gradient");
            clip_gradient_norm(&mut g, f32_arg(a, "max_norm"));
            bits_vec(&g)
        }
        "step_coordinator" => step_coordinator(a),
        "backward_step" => backward_step(a),
        // -- federated.rs
        "privacy_budget" => privacy_budget(a),
        "dp" => dp(a),
        "noise_multiplier" => bits64(DifferentialPrivacy::calculate_noise_multiplier(
            f64_arg(a, "epsilon"),
            f64_arg(a, "delta"),
            f64_arg(a, "sensitivity"),
        )),
        "secure_aggregation" => secure_aggregation(a),
        "federated_round" => federated_round(a),
        "convergence" => convergence(a),
        "model_sync" => model_sync(a),
        "verify_update" => {
            let sync = GossipModelSync::new("verifier");
            let update = ModelUpdate::new(str_arg(a, "peer"), str_arg(a, "cid"), 0);
            json!(sync.verify_update(&update))
        }
        "accumulator" => accumulator(a),
        // -- arrow_ipc.rs
        "arrow_store" => json!(hex_encode(&store_gradient_as_arrow(&f32s_arg(a, "values")).expect("encode"))),
        "arrow_load" => {
            return Ok(wrap(
                load_gradient_from_arrow(&hex_decode(&str_arg(a, "bytes"))),
                |v| bits_vec(&v),
                anyerr,
            ))
        }
        // -- computation_graph.rs
        "graph" => graph(a),
        "graph_load_arrow" => {
            return Ok(wrap(
                ComputationGraphStore::load_gradient_from_arrow(
                    &hex_decode(&str_arg(a, "bytes")),
                    &usizes_of(arg(a, "expected_shape")),
                ),
                |v| bits_vec(&v),
                gerr,
            ))
        }
        "graph_arrow_bytes" => {
            let values = f32s_arg(a, "values");
            let shape = usizes_of(arg(a, "shape"));
            let mut store = ComputationGraphStore::new();
            let mut node = ComputationNode::new("grad", vec![]);
            node.id = "n".to_string();
            store.add_node(node);
            let cid = store.store_gradient_as_arrow("n", &values, &shape).expect("store");
            json!({"bytes": hex_encode(&graph_arrow_bytes(&values, &shape)), "cid": cid})
        }
        // -- coordination.rs
        "pass_key" => json!(BackwardPassId::new(arg(a, "round").as_u64().expect("round"), str_arg(a, "peer")).as_key()),
        "pass_coordinator" => pass_coordinator(a),
        "garw_bytes" => json!(hex_encode(&garw_block(a).to_arrow_bytes())),
        "garw_parse" => {
            return Ok(wrap(
                GradientArrowBlock::from_arrow_bytes("cid".into(), "layer".into(), &hex_decode(&str_arg(a, "bytes"))),
                |b| json!({"shape": b.shape, "values": bits_vec(&b.values), "samples": b.num_samples}),
                aerr,
            ))
        }
        "garw_cid" => json!(GradientArrowBlock::compute_cid(
            &str_arg(a, "layer"),
            &f32s_arg(a, "values"),
            usize_arg(a, "samples"),
        )),
        "garw_fedavg" => {
            let blocks: Vec<GradientArrowBlock> =
                arg(a, "blocks").as_array().expect("blocks").iter().map(garw_block).collect();
            return Ok(wrap(GradientArrowBlock::fedavg(&blocks), |v| bits_vec(&v), aerr));
        }
        // -- Display of errors and floats
        "error_display" => error_display(a),
        "fmt_f32" => json!(f32s_arg(a, "values").iter().map(|v| format!("{v}")).collect::<Vec<_>>()),
        "fmt_f64" => json!(arg(a, "values")
            .as_array()
            .expect("values")
            .iter()
            .map(|v| format!("{}", f64_of(v)))
            .collect::<Vec<_>>()),
        other => return Err(json!(format!("unknown function {other}"))),
    };
    Ok(json!({"ok": v}))
}

fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read stdin");
    let cases: Vec<Value> = serde_json::from_str(&input).expect("a JSON list of cases");
    std::panic::set_hook(Box::new(|_| {}));
    let mut out = Vec::with_capacity(cases.len());
    for case in &cases {
        let id = case.get("id").cloned().unwrap_or(Value::Null);
        let f = case.get("fn").and_then(Value::as_str).unwrap_or("").to_string();
        let a = case.get("args").cloned().unwrap_or(Value::Null);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&f, &a)));
        let mut entry = match result {
            Ok(Ok(v)) => v,
            Ok(Err(msg)) => json!({"panic": msg}),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".to_string());
                json!({"panic": msg})
            }
        };
        entry["id"] = id;
        out.push(entry);
    }
    println!("{}", serde_json::to_string(&out).expect("encode output"));
}
