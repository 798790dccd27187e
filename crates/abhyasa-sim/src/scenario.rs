//! Scenario parameters drawn from a seed ("swarm testing"): every seed picks its own network,
//! fault schedule, workload and timing, so the seeds together cover far more corners than
//! one fixed configuration.

use std::collections::{BTreeMap, BTreeSet};

use crate::rng::SimRng;
use abhyasa_custody::{Channel, CustodianConfig, ReceiverConfig};
use abhyasa_machine::{binding, NodeMutation};
use abhyasa_wire::{
    AgentId, BeliefUpdatePayload, ClientId, ConsentDecision, ConsentPayload, Kind, Obligation,
    ObligationId, Payload, Scope, TokenAction, TokenId, TokenPayload, UnixMillis, WeightDelta,
    WeightKey,
};
use rand::Rng;

/// Network impairment of one run.
#[derive(Clone, Debug)]
pub struct NetParams {
    /// Independent loss probability.
    pub loss: f64,
    /// Probability that a message is duplicated.
    pub duplicate: f64,
    /// Base one-way delay, ms.
    pub delay: u64,
    /// Extra uniform delay, ms (this is what reorders).
    pub jitter: u64,
    /// Gilbert–Elliott bursty loss on.
    pub bursty: bool,
    /// Good→bad transition probability per message.
    pub burst_enter: f64,
    /// Bad→good transition probability per message.
    pub burst_exit: f64,
    /// Loss probability in the bad state.
    pub burst_loss: f64,
    /// Probability that a message is delivered once more, much later (a stale copy).
    pub replay: f64,
    /// Probability that an obligation is also delivered to a target it does not name.
    pub misroute: f64,
    /// Probability that the relay on the path sends, beside a message, a copy it altered (one
    /// bit), relabelled (claimed from another node) or replaced by a forgery of its own (an
    /// `applied` ack for some obligation, signed with the relay's own valid key and claimed
    /// from the obligation's target). Every such copy must be dropped as unverified.
    pub tamper: f64,
}

/// One target agent.
#[derive(Clone, Debug)]
pub struct TargetParams {
    /// Clock offset, ms.
    pub skew: i64,
    /// Kinds its build lacks.
    pub unsupported: BTreeSet<Kind>,
}

/// What the node machine around the custody machines meets: steady traffic, and targets
/// reached over a text binding.
#[derive(Clone, Debug, Default)]
pub struct NodeParams {
    /// Every target sends the principal a stale ack this often, in ms: steady traffic, the
    /// load under which a timer that is not a deadline never fires. `None`: quiet links.
    pub chatter_ms: Option<u64>,
    /// Targets (node indices) reached over a text binding (as over A2A JSON): obligations to
    /// them are named by text ids, which their node maps to obligation ids.
    pub text_targets: BTreeSet<usize>,
    /// The text id of each obligation to a text target; its id is the binding's mapping of
    /// it. Some spell the digits of another's in another letter case or without dashes.
    pub text_ids: BTreeMap<ObligationId, String>,
    /// Certificates with real lifetimes: `(lifetime, overlap)` in ms. Every node's
    /// certificate is replaced every `lifetime`; the old one stays valid `overlap` longer.
    /// A message that arrives outside its certificate's validity is refused. `None`:
    /// certificates outlive the run.
    pub cert_ms: Option<(u64, u64)>,
    /// A broken node decision (mutants only).
    pub mutation: Option<NodeMutation>,
}

/// Everything one run does, fixed by its seed. Nodes are numbered principals first
/// (`0..principals`), then targets.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Unix time of simulated time zero.
    pub epoch: u64,
    /// How many principals govern the targets (nodes `0..principals`): each issues with its
    /// own custodian and its own sequences, on the same scope, weight and token names.
    pub principals: usize,
    /// Target agents (nodes `principals..`).
    pub targets: Vec<TargetParams>,
    /// Obligations to issue, at their `created_at`.
    pub obligations: Vec<Obligation>,
    /// `(node, at, downtime)`.
    pub crashes: Vec<(usize, u64, u64)>,
    /// `(node, start, end)`: the node is cut off from everyone.
    pub partitions: Vec<(usize, u64, u64)>,
    /// Times at which the rogue agent sends an ack for someone else's obligation (forged, or
    /// honestly labelled with its own identity; `applied` or `declined`).
    pub rogue_acks: Vec<u64>,
    /// `(target node, start, count, interval)`: the target's session flaps — it drops and the
    /// target re-subscribes `count` times, every `interval` ms, losing what was in flight.
    pub flaps: Vec<(usize, u64, u32, u64)>,
    /// Indices of obligations whose payload their target cannot read (declined `malformed`
    /// on every copy).
    pub malformed: BTreeSet<usize>,
    /// Network impairment.
    pub net: NetParams,
    /// Largest commit latency, ms.
    pub commit_latency: u64,
    /// Probability of power loss right after a commit returns.
    pub crash_after_commit: f64,
    /// Downtime after such a power loss, ms.
    pub commit_crash_downtime: u64,
    /// Custodian settings.
    pub custodian: CustodianConfig,
    /// Receiver settings.
    pub receiver: ReceiverConfig,
    /// Simulated end time: past every deadline and every restart.
    pub end: u64,
    /// The node machine's world.
    pub node: NodeParams,
    /// Obligations every copy of which the network loses (a lease's renewals): their custody
    /// must end escalated, and the lease they would have extended must end on both sides.
    pub lost: BTreeSet<ObligationId>,
}

const MAX_DOWNTIME: u64 = 1_500;
/// Longest a stale copy of a message arrives after the original.
pub(crate) const MAX_REPLAY: u64 = 3_000;

impl Scenario {
    /// Draws a scenario.
    pub fn generate(rng: &mut SimRng) -> Self {
        let epoch = 1_700_000_000_000;
        let skew_limit = 50;
        // Mostly one principal; often two or three over the same agents.
        let principals = [1, 1, 2, 3][rng.random_range(0..4)];
        let targets: Vec<TargetParams> = (0..rng.random_range(1..=3))
            .map(|_| TargetParams {
                // Biased to the rare edges: a receiver clock ahead (or behind) by the whole
                // half-limit a quarter of the time, anywhere within it otherwise.
                skew: match rng.random_range(0..8u32) {
                    0 => skew_limit as i64 / 2,
                    1 => -(skew_limit as i64) / 2,
                    _ => rng.random_range(-(skew_limit as i64) / 2..=skew_limit as i64 / 2),
                },
                unsupported: if rng.random_bool(0.1) {
                    BTreeSet::from([Kind::PhalaBeliefUpdate])
                } else {
                    BTreeSet::new()
                },
            })
            .collect();
        let principal_names: Vec<AgentId> = (0..principals).map(principal_name).collect();
        let admissible_share = rng.random_range(0.3..=1.0);
        // Each principal's own sequences (they start equal: the same numbers on the same
        // names, which a receiver keyed by name alone would confuse).
        let mut sequences = vec![0u64; principals];
        let mut obligations = Vec::new();
        for i in 0..rng.random_range(1..=24u32) {
            let who = rng.random_range(0..principals);
            let principal = principal_names[who].clone();
            let sequence = &mut sequences[who];
            let issue_at = rng.random_range(0..=1_500);
            let span = rng.random_range(400..=4_000);
            let target = rng.random_range(0..targets.len());
            let admissible = rng.random_bool(admissible_share);
            let max_retries = if rng.random_bool(0.2) {
                rng.random_range(0..=2)
            } else {
                rng.random_range(3..=12)
            };
            let seq = rng.random_bool(0.5).then(|| {
                *sequence += 1;
                *sequence
            });
            obligations.push(Obligation {
                id: ObligationId::from_u128(
                    (u128::from(rng.random::<u64>()) << 32) | u128::from(i),
                ),
                issuer: principal.clone(),
                target: AgentId::new(format!("agent-{target}")).expect("valid"),
                created_at: UnixMillis(epoch + issue_at),
                deadline: UnixMillis(epoch + issue_at + span),
                max_retries,
                sequence: seq,
                payload: payload(rng, admissible),
            });
        }
        // Best-effort decisions racing custody ones on the same governed key: a grant and a
        // revocation of one scope, a raise and a cut of one weight, issued close together
        // with adjacent sequences in either order.
        for _ in 0..if rng.random_bool(0.4) {
            rng.random_range(1..=2)
        } else {
            0
        } {
            let i = obligations.len() as u32;
            let who = rng.random_range(0..principals);
            let principal = principal_names[who].clone();
            let sequence = &mut sequences[who];
            let issue_at = rng.random_range(0..=1_200);
            let target = AgentId::new(format!("agent-{}", rng.random_range(0..targets.len())))
                .expect("valid");
            let kind = rng.random_range(0..2u32);
            let key = rng.random_range(0..3u32).to_string();
            let first_is_grant = rng.random_bool(0.5);
            let (s1, s2) = (*sequence + 1, *sequence + 2);
            *sequence += 2;
            for (n, admissible) in [(0u32, !first_is_grant), (1, first_is_grant)] {
                let decision = if admissible {
                    Some(ConsentDecision::Revoke)
                } else {
                    Some(ConsentDecision::Grant)
                };
                let delta = if admissible { -200_000 } else { 150_000 };
                let at = issue_at + rng.random_range(0..=40);
                let span = rng.random_range(600..=3_000);
                obligations.push(Obligation {
                    id: ObligationId::from_u128(
                        (u128::from(rng.random::<u64>()) << 32) | u128::from(i + n),
                    ),
                    issuer: principal.clone(),
                    target: target.clone(),
                    created_at: UnixMillis(epoch + at),
                    deadline: UnixMillis(epoch + at + span),
                    max_retries: rng.random_range(3..=12),
                    sequence: Some(if n == 0 { s1 } else { s2 }),
                    payload: make_payload(kind, admissible, decision, delta, &key),
                });
            }
        }
        // Leases: half the grants lapse a while after they are issued.
        for o in &mut obligations {
            if let Payload::AnumatiConsent(p) = &mut o.payload {
                if p.decision == Some(ConsentDecision::Grant) && rng.random_bool(0.5) {
                    p.expires_at = Some(UnixMillis(o.created_at.0 + rng.random_range(200..=4_000)));
                }
            }
        }
        // Lapses: half the belief updates run out within the run (some before custody of
        // them ends), the rest outlive it.
        for o in &mut obligations {
            if let Payload::PhalaBeliefUpdate(p) = &mut o.payload {
                if rng.random_bool(0.5) {
                    p.ttl_ms = rng.random_range(200..=4_000);
                }
            }
        }
        // A lease whose every renewal is lost: a grant, then renewals each half a lease
        // later (a later lease, the next sequence), none of which ever reaches the agent.
        let mut lost_at = Vec::new();
        if rng.random_bool(0.3) {
            let who = rng.random_range(0..principals);
            let target = AgentId::new(format!("agent-{}", rng.random_range(0..targets.len())))
                .expect("valid");
            let lease = rng.random_range(600..=2_000u64);
            let start = rng.random_range(0..=500u64);
            for k in 0..=rng.random_range(1..=4u64) {
                let at = start + k * lease / 2;
                sequences[who] += 1;
                if k > 0 {
                    lost_at.push(obligations.len());
                }
                obligations.push(Obligation {
                    id: ObligationId::from_u128(
                        (u128::from(rng.random::<u64>()) << 32) | obligations.len() as u128,
                    ),
                    issuer: principal_names[who].clone(),
                    target: target.clone(),
                    created_at: UnixMillis(epoch + at),
                    deadline: UnixMillis(epoch + at + lease / 3),
                    max_retries: rng.random_range(3..=12),
                    sequence: Some(sequences[who]),
                    payload: Payload::AnumatiConsent(ConsentPayload {
                        decision: Some(ConsentDecision::Grant),
                        scope: Scope::new("scope-lease").expect("valid"),
                        expires_at: Some(UnixMillis(epoch + at + lease)),
                    }),
                });
            }
        }
        let last_deadline = obligations
            .iter()
            .map(|o| o.deadline.0 - epoch)
            .max()
            .unwrap_or(0);
        let nodes = targets.len() + principals;
        let mut partitions = Vec::new();
        if rng.random_bool(0.25) {
            // One agent stays offline for the whole run: its obligations must escalate.
            partitions.push((rng.random_range(principals..nodes), 0, u64::MAX));
        }
        for _ in 0..rng.random_range(0..=3) {
            let start = rng.random_range(0..=last_deadline);
            partitions.push((
                rng.random_range(0..nodes),
                start,
                start + rng.random_range(50..=2_500),
            ));
        }
        let crashes = (0..rng.random_range(0..=4))
            .map(|_| {
                (
                    rng.random_range(0..nodes),
                    rng.random_range(0..=last_deadline),
                    rng.random_range(1..=MAX_DOWNTIME),
                )
            })
            .collect();
        let flaps = (0..if rng.random_bool(0.3) {
            rng.random_range(1..=3)
        } else {
            0
        })
            .map(|_| {
                (
                    rng.random_range(principals..nodes),
                    rng.random_range(0..=last_deadline),
                    rng.random_range(2..=12),
                    rng.random_range(20..=120),
                )
            })
            .collect();
        let malformed = if rng.random_bool(0.15) {
            (0..obligations.len())
                .filter(|_| rng.random_bool(0.2))
                .collect()
        } else {
            BTreeSet::new()
        };
        let rogue_acks = (0..rng.random_range(0..=3))
            .map(|_| rng.random_range(0..=last_deadline))
            .collect();
        let bursty = rng.random_bool(0.3);
        let net = NetParams {
            loss: if rng.random_bool(0.2) {
                0.0
            } else {
                rng.random_range(0.0..0.5)
            },
            duplicate: rng.random_range(0.0..0.25),
            delay: rng.random_range(1..=30),
            jitter: rng.random_range(0..=80),
            bursty,
            burst_enter: rng.random_range(0.05..0.3),
            burst_exit: rng.random_range(0.1..0.5),
            burst_loss: rng.random_range(0.5..=1.0),
            replay: if rng.random_bool(0.3) {
                rng.random_range(0.0..0.1)
            } else {
                0.0
            },
            misroute: if rng.random_bool(0.2) {
                rng.random_range(0.0..0.2)
            } else {
                0.0
            },
            tamper: 0.0, // drawn last, below
        };
        let custodian = CustodianConfig {
            response_timeout_ms: rng.random_range(10..=150),
            backoff_base_ms: rng.random_range(5..=80),
            backoff_cap_ms: rng.random_range(50..=800),
            max_clock_skew_ms: skew_limit,
            max_inflight_per_target: if rng.random_bool(0.3) {
                rng.random_range(1..=4)
            } else {
                1_024
            },
            first_attempt: if rng.random_bool(0.3) {
                Channel::Datagram
            } else {
                Channel::Stream
            },
            // Sometimes so small that issues are refused (`Full`) and issued again later.
            max_pending: if rng.random_bool(0.1) {
                rng.random_range(1..=4)
            } else {
                100_000
            },
            ..CustodianConfig::default()
        };
        let receiver = ReceiverConfig {
            max_clock_skew_ms: skew_limit,
            max_inflight: if rng.random_bool(0.2) { 1 } else { 4_096 },
            ..ReceiverConfig::default()
        };
        let mut net = net;
        net.tamper = if rng.random_bool(0.4) {
            rng.random_range(0.0..0.3)
        } else {
            0.0
        };
        let node = node_params(rng, principals, nodes, &mut obligations);
        // After `node_params`, which renames obligations to text targets.
        let lost = lost_at.iter().map(|&i| obligations[i].id).collect();
        // Biased to the rare schedule: now and then a deadline so tight that the first retry
        // goes just before it and its ack can only arrive after it.
        for o in &mut obligations {
            if rng.random_bool(0.1) {
                let retry = custodian.response_timeout_ms + custodian.backoff_base_ms;
                let span = retry + rng.random_range(0..=net.delay * 2 + net.jitter);
                o.deadline = UnixMillis(o.created_at.0 + span.max(1));
            }
        }
        Self {
            epoch,
            principals,
            targets,
            obligations,
            crashes,
            partitions,
            rogue_acks,
            flaps,
            malformed,
            net,
            commit_latency: rng.random_range(0..=8),
            crash_after_commit: if rng.random_bool(0.3) { 0.02 } else { 0.0 },
            commit_crash_downtime: rng.random_range(1..=500),
            custodian,
            receiver,
            end: last_deadline + 2 * MAX_DOWNTIME + MAX_REPLAY + 500,
            node,
            lost,
        }
    }
}

/// Draws the node machine's world, and names the obligations to text targets by text ids
/// (their ids become the binding's mapping of those texts).
fn node_params(
    rng: &mut SimRng,
    principals: usize,
    nodes: usize,
    obligations: &mut [Obligation],
) -> NodeParams {
    let chatter_ms = rng.random_bool(0.35).then(|| rng.random_range(40..=400));
    let text_targets: BTreeSet<usize> = (principals..nodes)
        .filter(|_| rng.random_bool(0.3))
        .collect();
    let mut text_ids = BTreeMap::new();
    let mut last_digits: Option<u128> = None;
    for o in obligations.iter_mut() {
        let node = o
            .target
            .as_str()
            .strip_prefix("agent-")
            .and_then(|i| i.parse::<usize>().ok())
            .map_or(0, |i| i + principals);
        if !text_targets.contains(&node) {
            continue;
        }
        // Sometimes the digits of the last text id again, spelled another way: a different
        // obligation, which a binding that folds spellings would take for the same one.
        let digits = match last_digits {
            Some(d) if rng.random_bool(0.3) => d,
            _ => rng.random::<u128>(),
        };
        last_digits = Some(digits);
        let canonical = binding::id_text(ObligationId::from_u128(digits));
        let text = match rng.random_range(0..4u32) {
            0 => canonical,
            1 => canonical.to_ascii_uppercase(),
            2 => canonical.replace('-', ""),
            _ => format!("revocation-{:x}", digits as u32),
        };
        let Some(id) = binding::text_obligation_id(&text) else {
            continue;
        };
        if text_ids.contains_key(&id) {
            continue; // The same text twice: keep the first; this one stays on CBOR ids.
        }
        o.id = id;
        text_ids.insert(id, text);
    }
    let cert_ms = rng
        .random_bool(0.3)
        .then(|| (rng.random_range(300..=3_000), rng.random_range(0..=200)));
    NodeParams {
        chatter_ms,
        text_targets,
        text_ids,
        cert_ms,
        mutation: None,
    }
}

/// The name of principal `i`.
pub(crate) fn principal_name(i: usize) -> AgentId {
    match i {
        0 => AgentId::new("principal"),
        i => AgentId::new(format!("principal-{i}")),
    }
    .expect("valid")
}

fn payload(rng: &mut SimRng, admissible: bool) -> Payload {
    let key = rng.random_range(0..3u32);
    let kind = rng.random_range(0..3u32);
    let decision = if admissible {
        [
            Some(ConsentDecision::Revoke),
            None,
            Some(ConsentDecision::Unrecognized("pause".into())),
        ][rng.random_range(0..3)]
        .clone()
    } else {
        Some(ConsentDecision::Grant)
    };
    let delta = if admissible {
        -rng.random_range(1..=WeightDelta::ONE)
    } else {
        rng.random_range(0..=WeightDelta::ONE)
    };
    make_payload(kind, admissible, decision, delta, &key.to_string())
}

/// A payload of kind `kind` (0 consent, 1 belief update, 2 token) whose names end in `key`.
fn make_payload(
    kind: u32,
    admissible: bool,
    decision: Option<ConsentDecision>,
    delta: i32,
    key: &str,
) -> Payload {
    match kind {
        0 => Payload::AnumatiConsent(ConsentPayload {
            decision,
            scope: Scope::new(format!("scope-{key}")).expect("valid"),
            expires_at: None,
        }),
        1 => Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new(format!("supplier/{key}")).expect("valid"),
            weight_delta: WeightDelta(delta),
            ttl_ms: 60_000,
        }),
        _ => Payload::OauthToken(TokenPayload {
            action: if admissible {
                TokenAction::Revoke
            } else {
                TokenAction::Issue
            },
            token_id: TokenId::new(format!("tok-{key}")).expect("valid"),
            client_id: ClientId::new("client").expect("valid"),
            // The simulation keeps every token record (no expiry): the oracle's model of
            // the principal and receiver has no clock. Expiry is tested in the custody and
            // store crates and run by the soak.
            expires_at: None,
        }),
    }
}
