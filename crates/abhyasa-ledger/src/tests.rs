//! Hand-driven schedules of branches and a gateway, checked by the independent checker.

use abhyasa_wire::{AgentId, UnixMillis};

use super::*;
use crate::check::{check, EffectInstance, World};

fn id(s: &str) -> AgentId {
    AgentId::new(s).unwrap()
}

fn sk(n: u8) -> LedgerSigningKey {
    signing_key([n; 32])
}

fn v(pairs: &[(&str, u64)]) -> Vector {
    Vector::of(pairs).unwrap()
}

/// Issuer, root branch `r`, child `c`, gateway `g`.
struct Net {
    keys: Keyring,
    r: Branch,
    c: Branch,
    g: Gateway,
    effects: Vec<EffectInstance>,
    /// The durable steps of `r` since the grant (for the history auditor).
    journal_r: Vec<Step>,
    /// The gateway's durable records, in order.
    log_g: Vec<GatewayRecord>,
    now: u64,
}

const ROOT_CREDIT: CreditId = CreditId::from_u128(1);

impl Net {
    fn new(budget: &[(&str, u64)], mutation: Option<LedgerMutation>) -> Self {
        let keys = Keyring::new([
            (id("issuer"), sk(1).verifying_key()),
            (id("r"), sk(2).verifying_key()),
            (id("c"), sk(3).verifying_key()),
            (id("g"), sk(4).verifying_key()),
            // A member in no role here: it signs only what it should not.
            (id("m"), sk(5).verifying_key()),
        ])
        .with_issuers([id("issuer")]);
        let config = BranchConfig {
            resend_ms: 100,
            mutation,
            ..BranchConfig::default()
        };
        let mut n = Self {
            r: Branch::new(id("r"), sk(2), keys.clone(), config.clone()),
            c: Branch::new(id("c"), sk(3), keys.clone(), config),
            g: Gateway::new(id("g"), sk(4), keys.clone()).with_mutation(mutation),
            keys,
            effects: Vec::new(),
            journal_r: Vec::new(),
            log_g: Vec::new(),
            now: 0,
        };
        let grant = RootGrant {
            root: RootId::from_u128(7),
            issuer: id("issuer"),
            holder: id("r"),
            budget: v(budget),
            label: Label::of(&["tools", "travel"]).unwrap(),
            issued_at: UnixMillis(0),
        };
        n.r.grant(Signed::sign(&grant, &id("issuer"), &sk(1)), ROOT_CREDIT)
            .unwrap();
        n.persist_all();
        n
    }

    /// The history auditor over `r`'s journal.
    fn audit_r(&mut self) -> Vec<check::Violation> {
        self.persist_all();
        check::audit(&id("r"), &self.journal_r, &self.keys)
    }

    /// Makes every step and record durable (releasing what waited).
    fn persist_all(&mut self) {
        while let Some((t, s)) = self.r.poll_persist() {
            self.journal_r.push(s);
            self.r.handle_persisted(t);
        }
        while let Some((t, _)) = self.c.poll_persist() {
            self.c.handle_persisted(t);
        }
        while let Some((t, r)) = self.g.poll_persist() {
            self.log_g.push(r);
            self.g.handle_persisted(t);
        }
    }

    /// Delivers every queued message (dropping those `drop` picks), runs effects charging
    /// `charge`, until quiet.
    fn run(&mut self, charge: &Vector, drop: &mut dyn FnMut(&AgentId, &LedgerMessage) -> bool) {
        for _ in 0..50 {
            self.persist_all();
            let mut moved = false;
            let mut msgs = Vec::new();
            for (from, b) in [(id("r"), &mut self.r), (id("c"), &mut self.c)] {
                while let Some((to, m)) = b.poll_transmit() {
                    msgs.push((from.clone(), to, m));
                }
            }
            while let Some((to, m)) = self.g.poll_transmit() {
                msgs.push((id("g"), to, m));
            }
            while let Some(e) = self.g.poll_execute() {
                moved = true;
                let ran = self
                    .effects
                    .iter()
                    .any(|x| x.key == e.key && x.payer == e.payer);
                if !(e.resume && ran) {
                    self.effects.push(EffectInstance {
                        gateway: id("g"),
                        payer: e.payer.clone(),
                        key: e.key,
                        charge: charge.clone(),
                        expires: e.expires,
                    });
                }
                self.g.handle_executed(&e.payer, e.key, charge.clone());
            }
            for (from, to, m) in msgs {
                moved = true;
                if drop(&to, &m) {
                    continue;
                }
                match to.as_str() {
                    "r" => self.r.handle_message(UnixMillis(self.now), &from, m),
                    "c" => self.c.handle_message(UnixMillis(self.now), &from, m),
                    "g" => self.g.handle_message(UnixMillis(self.now), &from, m),
                    _ => panic!("no such agent {to}"),
                }
            }
            if !moved {
                return;
            }
        }
        panic!("did not settle");
    }

    fn violations(&self) -> Vec<check::Violation> {
        check(&World {
            branches: &[&self.r, &self.c],
            gateways: &[&self.g],
            effects: &self.effects,
            keys: &self.keys,
        })
    }

    fn effect(&self, op: &str, max: &[(&str, u64)]) -> Effect {
        Effect {
            purpose: Dim::new("tools").unwrap(),
            operation: op.into(),
            max_charge: v(max),
            carried_by: None,
        }
    }

    /// `r` reserves `max` from `credit` for the effect `op` at `g` under key `k`, and
    /// dispatches it.
    fn spend(&mut self, credit: CreditId, op: &str, max: &[(&str, u64)], k: u128) {
        let e = self.effect(op, max);
        self.r
            .reserve(UnixMillis(self.now), credit, e, &id("g"), key(k))
            .unwrap();
        self.r.dispatch(UnixMillis(0), key(k)).unwrap();
    }

    /// `r` seals `cents` from its root credit to `c` (transfer 1, labelled `{tools}`).
    fn send_to_c(&mut self, cents: u64) {
        self.r
            .transfer(
                ROOT_CREDIT,
                TransferId::from_u128(1),
                &v(&[("cents", cents)]),
                &id("c"),
                Label::of(&["tools"]).unwrap(),
            )
            .unwrap();
    }
}

fn key(n: u128) -> OpKey {
    OpKey::from_u128(n)
}

#[test]
fn partial_charge_commits_the_actual_and_returns_the_remainder() {
    // The paper's example: reserve (1000 cents, 3 calls), receipt (730, 1) → commit (730, 1),
    // return (270, 2).
    let mut n = Net::new(&[("cents", 5_000), ("calls", 10)], None);
    let e = n.effect("search", &[("cents", 1_000), ("calls", 3)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    let root = RootId::from_u128(7);
    assert_eq!(n.r.buckets(root)[2], v(&[("cents", 1_000), ("calls", 3)]));
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    assert_eq!(n.r.buckets(root)[3], v(&[("cents", 1_000), ("calls", 3)]));
    n.run(&v(&[("cents", 730), ("calls", 1)]), &mut |_, _| false);
    let [a, t, r, q, c, f] = n.r.buckets(root);
    assert_eq!(c, v(&[("cents", 730), ("calls", 1)]));
    assert_eq!(
        a,
        v(&[("cents", 4_270), ("calls", 9)]),
        "270 cents and 2 calls came back"
    );
    assert!(t.is_zero() && r.is_zero() && q.is_zero() && f.is_zero());
    assert_eq!(n.violations(), vec![]);
    // A replayed receipt changes nothing.
    let receipt = match &n.r.operation(key(1)).unwrap().state {
        OpState::Settled { receipt, .. } => receipt.clone(),
        s => panic!("{s:?}"),
    };
    let before = n.r.journal_len();
    n.r.handle_message(UnixMillis(1), &id("g"), LedgerMessage::Receipt(receipt));
    assert_eq!(n.r.journal_len(), before);
    assert_eq!(n.r.buckets(root)[4], v(&[("cents", 730), ("calls", 1)]));
}

#[test]
fn late_completion_a_two_unit_root_lost_reply() {
    // The paper's late-completion schedule: a 2-unit root, one 2-unit operation, the reply is
    // lost, the request times out. The atoms must stay quarantined (no refund), so nothing
    // else can be funded; the late receipt then settles it.
    let mut n = Net::new(&[("units", 2)], None);
    let root = RootId::from_u128(7);
    let e = n.effect("pay", &[("units", 2)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    // The gateway accepts and runs the effect; its receipt is lost.
    n.run(&v(&[("units", 2)]), &mut |to, m| {
        to.as_str() == "r" && matches!(m, LedgerMessage::Receipt(_))
    });
    assert_eq!(n.effects.len(), 1);
    // Timeouts pass: still quarantined, and no second spend fits.
    for t in [100, 200, 300] {
        n.now = t;
        n.r.handle_timeout(UnixMillis(t));
        n.r.poll_transmit(); // The resend is lost too.
    }
    assert_eq!(n.r.buckets(root)[3], v(&[("units", 2)]));
    let again = n.effect("pay-again", &[("units", 1)]);
    assert!(matches!(
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, again, &id("g"), key(2)),
        Err(LedgerError::Insufficient { .. })
    ));
    assert_eq!(n.violations(), vec![]);
    // The late completion arrives (the resend is answered with the prior receipt).
    n.now = 400;
    n.r.handle_timeout(UnixMillis(400));
    n.run(&v(&[("units", 2)]), &mut |_, _| false);
    assert_eq!(n.r.buckets(root)[4], v(&[("units", 2)]));
    assert_eq!(
        n.effects.len(),
        1,
        "the resend did not run the effect again"
    );
    assert_eq!(n.violations(), vec![]);
}

#[test]
fn late_completion_is_caught_when_timeouts_refund() {
    let mut n = Net::new(&[("units", 2)], Some(LedgerMutation::RefundOnTimeout));
    let e = n.effect("pay", &[("units", 2)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.run(&v(&[("units", 2)]), &mut |to, m| {
        to.as_str() == "r" && matches!(m, LedgerMessage::Receipt(_))
    });
    n.now = 200;
    n.r.handle_timeout(UnixMillis(200));
    n.persist_all();
    // The refunded units fund a second effect: 4 units spent from a 2-unit root.
    let e = n.effect("pay-again", &[("units", 2)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(2))
        .unwrap();
    n.r.dispatch(UnixMillis(200), key(2)).unwrap();
    n.run(&v(&[("units", 2)]), &mut |_, _| false);
    let found = n.violations();
    assert!(found.iter().any(|x| x.law == "L6"), "{found:?}");
    assert!(found.iter().any(|x| x.law == "L3"), "{found:?}");
}

/// L2 alone: a branch restored from its journal and run beside the original (a split brain)
/// settles every key the original settled — one key, two settlements.
#[test]
fn a_branch_beside_its_restored_copy_is_found_settling_twice() {
    let mut n = Net::new(&[("units", 2)], None);
    let e = n.effect("pay", &[("units", 2)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.run(&v(&[("units", 2)]), &mut |_, _| false);
    assert_eq!(n.r.buckets(RootId::from_u128(7))[4], v(&[("units", 2)]));
    assert_eq!(n.violations(), vec![]);
    let (copy, rejected) = Branch::recover(
        id("r"),
        sk(2),
        n.keys.clone(),
        BranchConfig::default(),
        n.journal_r.clone(),
    );
    assert!(rejected.is_empty(), "{rejected:?}");
    let found = check(&World {
        branches: &[&n.r, &copy, &n.c],
        gateways: &[&n.g],
        effects: &n.effects,
        keys: &n.keys,
    });
    assert!(
        found
            .iter()
            .any(|x| x.law == "L2" && x.detail.contains("settled 2 times")),
        "{found:?}"
    );
}

#[test]
fn transfer_is_accepted_once_and_cancelled_only_on_a_signed_refusal() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    let label = Label::of(&["tools"]).unwrap();
    n.r.transfer(
        ROOT_CREDIT,
        TransferId::from_u128(1),
        &v(&[("cents", 40)]),
        &id("c"),
        label.clone(),
    )
    .unwrap();
    assert_eq!(n.r.buckets(root)[1], v(&[("cents", 40)]), "in transit");
    // The certificate is delivered twice (a duplicate and a resend).
    let cert = match n.r.poll_transmit() {
        None => {
            n.persist_all();
            n.r.poll_transmit().unwrap()
        }
        Some(m) => m,
    };
    n.c.handle_message(UnixMillis(0), &id("r"), cert.1.clone());
    n.c.handle_message(UnixMillis(0), &id("r"), cert.1.clone());
    assert_eq!(n.c.credits().count(), 1, "accepted once");
    assert_eq!(n.c.buckets(root)[0], v(&[("cents", 40)]));
    n.run(&Vector::zero(), &mut |_, _| false);
    assert_eq!(n.r.buckets(root)[0], v(&[("cents", 60)]));
    assert!(n.r.buckets(root)[1].is_zero());
    assert_eq!(n.violations(), vec![]);

    // A refused transfer comes back exactly once, on the destination's signed decision.
    n.c.set_refusing(true);
    n.r.transfer(
        ROOT_CREDIT,
        TransferId::from_u128(2),
        &v(&[("cents", 10)]),
        &id("c"),
        label,
    )
    .unwrap();
    // Timeouts alone never cancel.
    n.persist_all();
    n.r.poll_transmit();
    n.r.handle_timeout(UnixMillis(1_000));
    assert_eq!(n.r.buckets(root)[1], v(&[("cents", 10)]));
    n.run(&Vector::zero(), &mut |_, _| false);
    assert_eq!(n.r.buckets(root)[0], v(&[("cents", 60)]));
    assert!(n.r.buckets(root)[1].is_zero());
    assert_eq!(n.violations(), vec![]);
}

#[test]
fn a_replayed_transfer_accepted_twice_is_caught() {
    let mut n = Net::new(
        &[("cents", 100)],
        Some(LedgerMutation::AcceptReplayedTransfer),
    );
    n.r.transfer(
        ROOT_CREDIT,
        TransferId::from_u128(1),
        &v(&[("cents", 40)]),
        &id("c"),
        Label::of(&["tools"]).unwrap(),
    )
    .unwrap();
    n.persist_all();
    let (_, m) = n.r.poll_transmit().unwrap();
    n.c.handle_message(UnixMillis(0), &id("r"), m.clone());
    n.c.handle_message(UnixMillis(0), &id("r"), m);
    assert_eq!(n.c.credits().count(), 2);
    let found = n.violations();
    assert!(found.iter().any(|x| x.law == "L1"));
    // Each branch alone holds only atoms that entered it; the sub-DAG r → c holds 40 atoms
    // twice, more than entered it.
    assert!(
        found
            .iter()
            .any(|x| x.law == "L5" && x.detail.contains("sub-DAG under r")),
        "{found:?}"
    );
    assert!(!found
        .iter()
        .any(|x| x.law == "L5" && !x.detail.contains("sub-DAG")));
}

#[test]
fn joins_need_distinct_disjoint_idle_inputs() {
    let mut n = Net::new(&[("cents", 100)], None);
    let (a, b, out) = (
        CreditId::from_u128(10),
        CreditId::from_u128(11),
        CreditId::from_u128(12),
    );
    let label = Label::of(&["tools"]).unwrap();
    n.r.split(ROOT_CREDIT, a, v(&[("cents", 30)]), label.clone())
        .unwrap();
    n.r.split(ROOT_CREDIT, b, v(&[("cents", 20)]), label)
        .unwrap();
    assert!(matches!(
        n.r.join(vec![a, a], out),
        Err(LedgerError::Join(_))
    ));
    n.r.join(vec![a, b], out).unwrap();
    assert_eq!(
        n.r.credit(out).unwrap().available.size(),
        v(&[("cents", 50)])
    );
    assert_eq!(n.violations(), vec![]);

    let mut n = Net::new(
        &[("cents", 100)],
        Some(LedgerMutation::JoinWithoutDisjointness),
    );
    n.r.split(
        ROOT_CREDIT,
        a,
        v(&[("cents", 30)]),
        Label::of(&["tools"]).unwrap(),
    )
    .unwrap();
    n.r.join(vec![a, a], out).unwrap();
    assert_eq!(
        n.r.credit(out).unwrap().available.size(),
        v(&[("cents", 60)])
    );
    assert!(n.violations().iter().any(|x| x.law == "L1"));
}

#[test]
fn fence_then_no_effect_returns_a_lost_dispatch_and_stale_permits_are_refused() {
    for mutation in [None, Some(LedgerMutation::GatewayWithoutFence)] {
        let mut n = Net::new(&[("units", 5)], mutation);
        let root = RootId::from_u128(7);
        let e = n.effect("call", &[("units", 5)]);
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
            .unwrap();
        n.r.dispatch(UnixMillis(0), key(1)).unwrap();
        n.persist_all();
        // The permit is delayed in the network (held here).
        let (_, late) = n.r.poll_transmit().unwrap();
        // Reclaim: fence the credit's epoch, then the query proves no effect.
        n.r.request_fence(ROOT_CREDIT).unwrap();
        n.run(&v(&[("units", 5)]), &mut |_, _| false);
        assert_eq!(
            n.r.buckets(root)[0],
            v(&[("units", 5)]),
            "returned on the proof"
        );
        assert!(matches!(
            n.r.operation(key(1)).unwrap().state,
            OpState::NoEffect(_)
        ));
        // The fenced generation closed with its last operation; the units are spent again
        // from its successor, at the new epoch.
        let e2 = n.effect("call-2", &[("units", 5)]);
        assert_eq!(
            n.r.reserve(UnixMillis(0), ROOT_CREDIT, e2.clone(), &id("g"), key(2)),
            Err(LedgerError::UnknownCredit(ROOT_CREDIT))
        );
        let next = n.r.current(ROOT_CREDIT).unwrap();
        assert_eq!(n.r.credit(next).unwrap().epoch, 1);
        n.r.reserve(UnixMillis(0), next, e2, &id("g"), key(2))
            .unwrap();
        n.r.dispatch(UnixMillis(1), key(2)).unwrap();
        n.run(&v(&[("units", 5)]), &mut |_, _| false);
        // Now the stale permit arrives.
        n.g.handle_message(UnixMillis(0), &id("r"), late);
        n.run(&v(&[("units", 5)]), &mut |_, _| false);
        let found = n.violations();
        match mutation {
            None => {
                assert_eq!(found, vec![]);
                assert_eq!(n.effects.len(), 1);
            }
            Some(_) => assert!(found.iter().any(|x| x.law == "L3"), "{found:?}"),
        }
    }
}

#[test]
fn a_gateway_answers_a_repeated_key_with_its_prior_decision() {
    for mutation in [None, Some(LedgerMutation::GatewayAcceptsKeyTwice)] {
        let mut n = Net::new(&[("units", 3)], mutation);
        let e = n.effect("call", &[("units", 3)]);
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
            .unwrap();
        n.r.dispatch(UnixMillis(0), key(1)).unwrap();
        n.persist_all();
        let (_, m) = n.r.poll_transmit().unwrap();
        n.g.handle_message(UnixMillis(0), &id("r"), m.clone());
        n.persist_all();
        n.g.handle_message(UnixMillis(0), &id("r"), m);
        n.run(&v(&[("units", 1)]), &mut |_, _| false);
        match mutation {
            None => {
                assert_eq!(n.effects.len(), 1);
                assert_eq!(n.violations(), vec![]);
            }
            Some(_) => {
                assert_eq!(n.effects.len(), 2);
                assert!(n.violations().iter().any(|x| x.law == "L3"));
            }
        }
    }
}

#[test]
fn bad_evidence_is_rejected_and_changes_nothing() {
    let mut n = Net::new(&[("units", 3)], None);
    let e = n.effect("call", &[("units", 3)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e.clone(), &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.persist_all();
    let binding = n.r.operation(key(1)).unwrap().binding.clone();
    // A receipt signed by someone else, one tampered with, one above the maximum.
    let forged = Receipt {
        key: key(1),
        binding: binding.digest(),
        gateway: id("g"),
        actual: v(&[("units", 1)]),
    };
    let before = n.r.journal_len();
    n.r.handle_message(
        UnixMillis(1),
        &id("g"),
        LedgerMessage::Receipt(Signed::sign(&forged, &id("g"), &sk(9))),
    );
    let good = Signed::sign(&forged, &id("g"), &sk(4));
    n.r.handle_message(
        UnixMillis(1),
        &id("g"),
        LedgerMessage::Receipt(good.tampered(3)),
    );
    let over = Receipt {
        actual: v(&[("units", 4)]),
        ..forged.clone()
    };
    n.r.handle_message(
        UnixMillis(1),
        &id("g"),
        LedgerMessage::Receipt(Signed::sign(&over, &id("g"), &sk(4))),
    );
    // A no-effect proof without a fence above the binding's epoch.
    let unfenced = NoEffect {
        key: key(1),
        binding: binding.digest(),
        gateway: id("g"),
        fence: 0,
    };
    n.r.handle_message(
        UnixMillis(1),
        &id("g"),
        LedgerMessage::NoEffect(Signed::sign(&unfenced, &id("g"), &sk(4))),
    );
    // A receipt and a fenced proof from the right gateway, for the right key, naming another
    // binding (the same one with another epoch: its digest, computed here from the binding).
    let elsewhere = Binding {
        epoch: binding.epoch + 1,
        ..binding.clone()
    }
    .digest();
    assert_ne!(elsewhere, binding.digest());
    let misbound = Receipt {
        binding: elsewhere,
        ..forged.clone()
    };
    n.r.handle_message(
        UnixMillis(1),
        &id("g"),
        LedgerMessage::Receipt(Signed::sign(&misbound, &id("g"), &sk(4))),
    );
    let misbound = NoEffect {
        binding: elsewhere,
        fence: binding.epoch + 1,
        ..unfenced.clone()
    };
    n.r.handle_message(
        UnixMillis(1),
        &id("g"),
        LedgerMessage::NoEffect(Signed::sign(&misbound, &id("g"), &sk(4))),
    );
    assert_eq!(n.r.journal_len(), before);
    let rejected = std::iter::from_fn(|| n.r.poll_event())
        .filter(|e| matches!(e, LedgerEvent::Rejected(_)))
        .count();
    assert_eq!(rejected, 6);
    assert_eq!(n.r.operation(key(1)).unwrap().state, OpState::Quarantined);
    // A permit the gateway cannot match to the effect is refused, and runs nothing.
    let (_, m) = n.r.poll_transmit().unwrap();
    let LedgerMessage::Dispatch { permit, .. } = m else {
        panic!()
    };
    let other = Effect {
        operation: "something else".into(),
        ..e
    };
    n.g.handle_message(
        UnixMillis(0),
        &id("r"),
        LedgerMessage::Dispatch {
            permit,
            effect: other,
        },
    );
    assert!(matches!(
        n.g.poll_transmit(),
        Some((
            _,
            LedgerMessage::Refused {
                reason: Refusal::BindingMismatch,
                ..
            }
        ))
    ));
    assert!(n.g.poll_persist().is_none());
}

#[test]
fn recovery_replays_the_journal_to_the_same_state() {
    let mut n = Net::new(&[("cents", 100), ("calls", 5)], None);
    let mut journal = Vec::new();
    let grant = RootGrant {
        root: RootId::from_u128(7),
        issuer: id("issuer"),
        holder: id("r"),
        budget: v(&[("cents", 100), ("calls", 5)]),
        label: Label::of(&["tools", "travel"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    let mut r = Branch::new(id("r"), sk(2), n.keys.clone(), BranchConfig::default());
    r.grant(Signed::sign(&grant, &id("issuer"), &sk(1)), ROOT_CREDIT)
        .unwrap();
    r.split(
        ROOT_CREDIT,
        CreditId::from_u128(5),
        v(&[("cents", 10)]),
        Label::of(&["tools"]).unwrap(),
    )
    .unwrap();
    let e = n.effect("x", &[("cents", 20), ("calls", 1)]);
    r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(3))
        .unwrap();
    r.dispatch(UnixMillis(0), key(3)).unwrap();
    while let Some((t, s)) = r.poll_persist() {
        journal.push(s);
        r.handle_persisted(t);
    }
    let (back, rejected) = Branch::recover(
        id("r"),
        sk(2),
        n.keys.clone(),
        BranchConfig::default(),
        journal.clone(),
    );
    assert!(rejected.is_empty());
    let root = RootId::from_u128(7);
    assert_eq!(back.buckets(root), r.buckets(root));
    assert_eq!(back.journal_len(), r.journal_len());
    // Replaying the journal twice is the same as once.
    let doubled: Vec<Step> = journal.iter().chain(journal.iter()).cloned().collect();
    let (twice, rejected) = Branch::recover(
        id("r"),
        sk(2),
        n.keys.clone(),
        BranchConfig::default(),
        doubled,
    );
    assert!(rejected.is_empty());
    assert_eq!(twice.buckets(root), r.buckets(root));
    n.r = back;
    assert_eq!(n.violations(), vec![]);
}

#[test]
fn only_a_trusted_issuer_can_mint_a_root() {
    let n = Net::new(&[("cents", 10)], None);
    let mut r = Branch::new(id("r"), sk(2), n.keys.clone(), BranchConfig::default());
    // Signed correctly, but by a branch, not a trusted issuer.
    let grant = RootGrant {
        root: RootId::from_u128(8),
        issuer: id("r"),
        holder: id("r"),
        budget: v(&[("cents", 1_000_000)]),
        label: Label::of(&["tools"]).unwrap(),
        issued_at: UnixMillis(0),
    };
    assert!(matches!(
        r.grant(
            Signed::sign(&grant, &id("r"), &sk(2)),
            CreditId::from_u128(9)
        ),
        Err(LedgerError::Signature(SignatureError::UnexpectedSigner(_)))
    ));
    // Claiming to be the issuer without its key.
    let claimed = RootGrant {
        issuer: id("issuer"),
        ..grant
    };
    assert!(r
        .grant(
            Signed::sign(&claimed, &id("issuer"), &sk(2)),
            CreditId::from_u128(9)
        )
        .is_err());
    assert_eq!(r.credits().count(), 0);
    assert!(r.poll_persist().is_none());
}

// ---------------------------------------------------------------------------------------
// Evidence binds its signer: a keyring member `m` signs what only another party may sign.

/// `r` reserves and dispatches `units` to `g`; returns the permit message, held back.
fn dispatched(n: &mut Net, units: u64) -> LedgerMessage {
    let e = n.effect("call", &[("units", units)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.persist_all();
    n.r.poll_transmit().unwrap().1
}

#[test]
fn a_no_effect_proof_counts_only_from_the_gateway_of_the_binding() {
    for mutation in [None, Some(LedgerMutation::EvidenceFromAnyMember)] {
        let mut n = Net::new(&[("units", 5)], mutation);
        let root = RootId::from_u128(7);
        let permit = dispatched(&mut n, 5);
        let b = n.r.operation(key(1)).unwrap().binding.clone();
        // m signs a proof that names g, and sends it itself.
        let proof = NoEffect {
            key: key(1),
            binding: b.digest(),
            gateway: id("g"),
            fence: b.epoch + 1,
        };
        let forged = LedgerMessage::NoEffect(Signed::sign(&proof, &id("m"), &sk(5)));
        n.r.handle_message(UnixMillis(1), &id("m"), forged);
        n.persist_all();
        // Meanwhile g runs the effect.
        n.g.handle_message(UnixMillis(0), &id("r"), permit);
        n.run(&v(&[("units", 5)]), &mut |_, _| false);
        match mutation {
            None => {
                assert_eq!(n.r.buckets(root)[4], v(&[("units", 5)]), "committed");
                assert!(n.r.buckets(root)[0].is_zero(), "not available again");
                assert_eq!(n.violations(), vec![]);
            }
            Some(_) => assert!(
                n.violations().iter().any(|x| x.law == "L3"),
                "{:?}",
                n.violations()
            ),
        }
    }
}

#[test]
fn a_transfer_is_cancelled_only_by_its_destination() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    let label = Label::of(&["tools"]).unwrap();
    n.r.transfer(
        ROOT_CREDIT,
        TransferId::from_u128(1),
        &v(&[("cents", 40)]),
        &id("c"),
        label,
    )
    .unwrap();
    n.persist_all();
    let (_, cert) = n.r.poll_transmit().unwrap();
    let LedgerMessage::Transfer(signed) = &cert else {
        panic!("{cert:?}")
    };
    let body = signed.peek().unwrap();
    // The destination accepts; its decision is slow.
    n.c.handle_message(UnixMillis(0), &id("r"), cert.clone());
    n.persist_all();
    let (_, accepted) = n.c.poll_transmit().unwrap();
    // m signs a refusal in c's name.
    let refusal = TransferDecision {
        root,
        transfer: body.transfer,
        cert: body.digest(),
        source: id("r"),
        destination: id("c"),
        credit: None,
    };
    let forged = LedgerMessage::Decision(Signed::sign(&refusal, &id("m"), &sk(5)));
    n.r.handle_message(UnixMillis(1), &id("m"), forged);
    n.persist_all();
    assert_eq!(
        n.r.buckets(root)[1],
        v(&[("cents", 40)]),
        "still in transit"
    );
    // c's own refusal of another certificate does not decide this one either.
    let elsewhere = TransferDecision {
        cert: abhyasa_wire::ledger::Digest::of(&[b"another certificate"]),
        ..refusal
    };
    let misbound = LedgerMessage::Decision(Signed::sign(&elsewhere, &id("c"), &sk(3)));
    n.r.handle_message(UnixMillis(2), &id("c"), misbound);
    n.persist_all();
    assert_eq!(
        n.r.buckets(root)[1],
        v(&[("cents", 40)]),
        "still in transit"
    );
    n.r.handle_message(UnixMillis(3), &id("c"), accepted);
    n.run(&Vector::zero(), &mut |_, _| false);
    assert_eq!(n.r.buckets(root)[0], v(&[("cents", 60)]));
    assert_eq!(n.c.buckets(root)[0], v(&[("cents", 40)]));
    assert_eq!(n.violations(), vec![]);
}

/// `r` seals a reclaimable transfer of 40 cents to `c`; returns the certificate message.
fn reclaimable(n: &mut Net, t: u128) -> LedgerMessage {
    n.r.transfer_reclaimable(
        ROOT_CREDIT,
        TransferId::from_u128(t),
        &v(&[("cents", 40)]),
        &id("c"),
        Label::of(&["tools"]).unwrap(),
    )
    .unwrap();
    n.persist_all();
    let (to, cert) = n.r.poll_transmit().unwrap();
    assert_eq!(to, id("c"));
    cert
}

/// `c` takes the certificate: its claim (a decision naming the credit it would become),
/// durable and on its way to `r`.
fn claim(n: &mut Net, cert: LedgerMessage) -> LedgerMessage {
    n.c.handle_message(UnixMillis(1), &id("r"), cert);
    n.persist_all();
    let (to, claim) = n.c.poll_transmit().unwrap();
    assert_eq!(to, id("r"));
    claim
}

#[test]
fn a_lost_destination_s_transfer_is_reclaimed_and_its_late_claim_takes_nothing() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    let cert = reclaimable(&mut n, 1);
    assert_eq!(n.r.buckets(root)[1], v(&[("cents", 40)]), "in transit");
    // The destination is lost: no word from it. The source takes the transfer back.
    n.r.reclaim_transfer(TransferId::from_u128(1)).unwrap();
    n.persist_all();
    assert_eq!(n.r.buckets(root)[0], v(&[("cents", 100)]));
    assert!(n.r.buckets(root)[1].is_zero());
    // Asking again writes nothing.
    let steps = n.journal_r.len();
    n.r.reclaim_transfer(TransferId::from_u128(1)).unwrap();
    n.persist_all();
    assert_eq!(n.journal_r.len(), steps);
    let _ = n.r.poll_transmit(); // The reclaim, sent to the lost destination.
                                 // The destination comes back and claims the certificate (a late copy): the source
                                 // answers with its reclaim, and the destination ends its claim with no credit.
    n.c.handle_message(UnixMillis(5), &id("r"), cert);
    n.run(&Vector::zero(), &mut |_, _| false);
    assert_eq!(
        n.c.credits().count(),
        0,
        "no credit from a reclaimed transfer"
    );
    assert!(matches!(
        n.c.incoming().next(),
        Some(Step::Reclaimed { .. })
    ));
    assert_eq!(n.r.buckets(root)[0], v(&[("cents", 100)]));
    assert_eq!(n.violations(), vec![]);
    assert_eq!(n.audit_r(), vec![]);
}

#[test]
fn a_confirmed_claim_makes_the_credit_and_cannot_be_reclaimed() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    let cert = reclaimable(&mut n, 1);
    // The destination claims: nothing is its own until the source confirms.
    let claim = claim(&mut n, cert);
    assert_eq!(n.c.credits().count(), 0, "a claim is not a credit");
    // The source confirms; the confirmation is lost on the way.
    n.r.handle_message(UnixMillis(2), &id("c"), claim);
    n.persist_all();
    let (_, lost) = n.r.poll_transmit().unwrap();
    assert!(matches!(lost, LedgerMessage::SourceDecision(_)));
    // Confirmed: the source can no longer take it back, and the atoms are in transit until
    // the destination has its confirmation (the checker counts them there).
    assert!(matches!(
        n.r.reclaim_transfer(TransferId::from_u128(1)),
        Err(LedgerError::WrongState(_))
    ));
    assert_eq!(n.violations(), vec![]);
    // The destination's claim goes again at its next timeout and is answered again.
    n.c.handle_timeout(UnixMillis(1_000));
    n.run(&Vector::zero(), &mut |_, _| false);
    assert_eq!(n.c.buckets(root)[0], v(&[("cents", 40)]));
    assert_eq!(n.r.buckets(root)[0], v(&[("cents", 60)]));
    assert_eq!(n.violations(), vec![]);
    assert_eq!(n.audit_r(), vec![]);
}

#[test]
fn a_source_decision_counts_only_from_the_source_and_for_its_claim() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    let cert = reclaimable(&mut n, 1);
    let LedgerMessage::Transfer(signed) = &cert else {
        panic!("{cert:?}")
    };
    let body = signed.peek().unwrap();
    let claim = claim(&mut n, cert.clone());
    let LedgerMessage::Decision(d) = &claim else {
        panic!("{claim:?}")
    };
    let claimed = d.peek().unwrap().credit;
    let confirm = SourceDecision {
        root,
        transfer: body.transfer,
        cert: body.digest(),
        source: id("r"),
        destination: id("c"),
        credit: claimed,
    };
    // m confirms in r's name, on its own session and on r's: no credit.
    let forged = LedgerMessage::SourceDecision(Signed::sign(&confirm, &id("m"), &sk(5)));
    n.c.handle_message(UnixMillis(2), &id("m"), forged.clone());
    n.c.handle_message(UnixMillis(2), &id("r"), forged);
    // r's confirmation of another credit, or of another certificate: no credit.
    let other_credit = SourceDecision {
        credit: Some(CreditId::from_u128(77)),
        ..confirm.clone()
    };
    let other_cert = SourceDecision {
        cert: abhyasa_wire::ledger::Digest::of(&[b"another certificate"]),
        ..confirm.clone()
    };
    for d in [other_credit, other_cert] {
        let m = LedgerMessage::SourceDecision(Signed::sign(&d, &id("r"), &sk(2)));
        n.c.handle_message(UnixMillis(3), &id("r"), m);
    }
    n.persist_all();
    assert_eq!(
        n.c.credits().count(),
        0,
        "no credit without r's own confirmation"
    );
    // A reclaim forged in r's name does not end the claim either: r's confirmation still
    // makes the credit.
    let reclaim = SourceDecision {
        credit: None,
        ..confirm.clone()
    };
    let m = LedgerMessage::SourceDecision(Signed::sign(&reclaim, &id("m"), &sk(5)));
    n.c.handle_message(UnixMillis(4), &id("r"), m);
    n.persist_all();
    assert!(matches!(n.c.incoming().next(), Some(Step::Claim { .. })));
    // And m cannot reclaim r's transfer at r: a claim relayed by m is not c's.
    n.r.handle_message(UnixMillis(5), &id("m"), claim.clone());
    n.persist_all();
    assert_eq!(
        n.r.buckets(root)[1],
        v(&[("cents", 40)]),
        "still in transit"
    );
    n.r.handle_message(UnixMillis(6), &id("c"), claim);
    n.run(&Vector::zero(), &mut |_, _| false);
    assert_eq!(n.c.buckets(root)[0], v(&[("cents", 40)]));
    assert_eq!(n.violations(), vec![]);
}

#[test]
fn only_a_certificate_that_asks_for_confirmation_can_be_reclaimed() {
    let mut n = Net::new(&[("cents", 100)], None);
    n.r.transfer(
        ROOT_CREDIT,
        TransferId::from_u128(1),
        &v(&[("cents", 40)]),
        &id("c"),
        Label::of(&["tools"]).unwrap(),
    )
    .unwrap();
    n.persist_all();
    assert!(matches!(
        n.r.reclaim_transfer(TransferId::from_u128(1)),
        Err(LedgerError::WrongState(_))
    ));
    assert!(matches!(
        n.r.reclaim_transfer(TransferId::from_u128(2)),
        Err(LedgerError::UnknownTransfer(_))
    ));
    // The same id again with confirmation asked is another transfer: refused.
    assert!(matches!(
        n.r.transfer_reclaimable(
            ROOT_CREDIT,
            TransferId::from_u128(1),
            &v(&[("cents", 40)]),
            &id("c"),
            Label::of(&["tools"]).unwrap(),
        ),
        Err(LedgerError::IdInUse(_))
    ));
}

#[test]
fn the_checker_sees_a_credit_taken_without_confirmation_and_a_reclaim_after_one() {
    // Each mutant runs the race its rule exists for: the destination's claim and the
    // source's reclaim cross. The checker, reading the journals, finds the atoms twice.
    for mutation in [
        LedgerMutation::AcceptWithoutConfirmation,
        LedgerMutation::ReclaimAfterConfirm,
    ] {
        let mut n = Net::new(&[("cents", 100)], Some(mutation));
        let cert = reclaimable(&mut n, 1);
        let claim = claim(&mut n, cert);
        if mutation == LedgerMutation::ReclaimAfterConfirm {
            n.r.handle_message(UnixMillis(2), &id("c"), claim);
            n.run(&Vector::zero(), &mut |_, _| false);
        }
        n.r.reclaim_transfer(TransferId::from_u128(1)).unwrap();
        n.run(&Vector::zero(), &mut |_, _| false);
        let laws: Vec<&str> = n.violations().iter().map(|x| x.law).collect();
        assert!(laws.contains(&"L1"), "{mutation:?}: {:?}", n.violations());
    }
    // Without the race, the child's state alone shows a credit no confirmation stands behind.
    let mut n = Net::new(
        &[("cents", 100)],
        Some(LedgerMutation::AcceptWithoutConfirmation),
    );
    let cert = reclaimable(&mut n, 1);
    n.c.handle_message(UnixMillis(1), &id("r"), cert);
    n.persist_all();
    assert_eq!(n.c.buckets(RootId::from_u128(7))[0], v(&[("cents", 40)]));
    let found = n.violations();
    assert!(
        found
            .iter()
            .any(|x| x.law == "L5" && x.detail.contains("without its source's confirmation")),
        "{found:?}"
    );
}

#[test]
fn a_certificate_counts_only_from_its_source() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    // m mints a certificate in r's name for atoms r still holds.
    let cert = TransferCert {
        root,
        transfer: TransferId::from_u128(9),
        source: id("r"),
        destination: id("c"),
        source_credit: ROOT_CREDIT,
        footprint: Footprint::full(&v(&[("cents", 100)])),
        label: Label::of(&["tools"]).unwrap(),
        confirm: false,
    };
    let forged = LedgerMessage::Transfer(Signed::sign(&cert, &id("m"), &sk(5)));
    n.c.handle_message(UnixMillis(0), &id("m"), forged.clone());
    n.persist_all();
    assert_eq!(
        n.c.credits().count(),
        0,
        "no credit from a forged certificate"
    );
    // Not even when it is relayed by the source's session: the signature must be r's.
    n.c.handle_message(UnixMillis(0), &id("r"), forged);
    n.persist_all();
    assert_eq!(n.c.credits().count(), 0);
    assert_eq!(n.violations(), vec![]);
}

#[test]
fn a_fence_counts_only_from_the_holder_and_a_fenced_reply_only_from_its_gateway() {
    let mut n = Net::new(&[("units", 5)], None);
    let permit = dispatched(&mut n, 5);
    n.g.handle_message(UnixMillis(0), &id("r"), permit);
    n.persist_all();
    // m fences r's credit in r's name at g.
    let fence = Fence {
        root: RootId::from_u128(7),
        credit: ROOT_CREDIT,
        epoch: 1,
        holder: id("r"),
    };
    n.g.handle_message(
        UnixMillis(0),
        &id("m"),
        LedgerMessage::Fence(Signed::sign(&fence, &id("m"), &sk(5))),
    );
    n.persist_all();
    assert_eq!(n.g.fences().count(), 0, "a fence from a non-holder");
    assert!(n.g.poll_transmit().is_none());
    // m claims g fenced the credit.
    let fenced = Fenced {
        credit: ROOT_CREDIT,
        epoch: 9,
        gateway: id("g"),
    };
    n.r.handle_message(
        UnixMillis(1),
        &id("m"),
        LedgerMessage::Fenced(Signed::sign(&fenced, &id("m"), &sk(5))),
    );
    n.persist_all();
    assert_eq!(n.r.credit(ROOT_CREDIT).unwrap().epoch, 0);
}

#[test]
fn the_last_epoch_is_refused_cleanly_not_wrapped() {
    let mut n = Net::new(&[("units", 5)], None);
    dispatched(&mut n, 5);
    // g (the credit's gateway) reports a fence at the last epoch there is.
    let fenced = Fenced {
        credit: ROOT_CREDIT,
        epoch: u64::MAX,
        gateway: id("g"),
    };
    n.r.handle_message(
        UnixMillis(1),
        &id("g"),
        LedgerMessage::Fenced(Signed::sign(&fenced, &id("g"), &sk(4))),
    );
    n.persist_all();
    assert_eq!(n.r.credit(ROOT_CREDIT).unwrap().epoch, u64::MAX);
    assert_eq!(n.r.request_fence(ROOT_CREDIT), Err(LedgerError::Overflow));
}

#[test]
fn gateway_evidence_waits_for_its_record() {
    let mut n = Net::new(&[("units", 5)], None);
    let permit = dispatched(&mut n, 5);
    n.g.handle_message(UnixMillis(0), &id("r"), permit.clone());
    n.persist_all();
    let run = n.g.poll_execute().unwrap();
    n.g.handle_executed(&run.payer, run.key, v(&[("units", 2)]));
    // The receipt's record is not durable yet: a repeated dispatch hears "pending", and the
    // receipt itself is not out.
    let (_, receipt_record) = n.g.poll_persist().unwrap();
    n.g.handle_message(UnixMillis(0), &id("r"), permit.clone());
    let replies: Vec<_> = std::iter::from_fn(|| n.g.poll_transmit()).collect();
    assert!(
        replies
            .iter()
            .all(|(_, m)| matches!(m, LedgerMessage::Pending { .. })),
        "{replies:?}"
    );
    assert!(matches!(receipt_record, GatewayRecord::Receipt { .. }));
    // A fence still being written proves nothing either.
    let mut m = Net::new(&[("units", 5)], None);
    let lost = dispatched(&mut m, 5);
    drop(lost);
    m.r.request_fence(ROOT_CREDIT).unwrap();
    let (_, fence) = m.r.poll_transmit().unwrap();
    m.g.handle_message(UnixMillis(0), &id("r"), fence);
    let (token, _) = m.g.poll_persist().unwrap();
    let b = m.r.operation(key(1)).unwrap().binding.clone();
    m.g.handle_message(
        UnixMillis(0),
        &id("r"),
        LedgerMessage::Query {
            key: key(1),
            binding: Box::new(b.clone()),
        },
    );
    let replies: Vec<_> = std::iter::from_fn(|| m.g.poll_transmit()).collect();
    assert!(
        replies
            .iter()
            .all(|(_, m)| matches!(m, LedgerMessage::Pending { .. })),
        "{replies:?}"
    );
    // Once it is durable: the fenced reply, and the no-effect proof.
    m.g.handle_persisted(token);
    assert!(matches!(
        m.g.poll_transmit(),
        Some((_, LedgerMessage::Fenced(_)))
    ));
    m.g.handle_message(
        UnixMillis(0),
        &id("r"),
        LedgerMessage::Query {
            key: key(1),
            binding: Box::new(b),
        },
    );
    assert!(matches!(
        m.g.poll_transmit(),
        Some((_, LedgerMessage::NoEffect(_)))
    ));
}

#[test]
fn another_payer_cannot_squat_a_key() {
    let mut n = Net::new(&[("units", 5)], None);
    let root = RootId::from_u128(7);
    // m learns the key r will use and gets a permit of its own in first, under that key.
    let e = n.effect("call", &[("units", 5)]);
    let squat = Permit {
        binding: Binding {
            root,
            credit: CreditId::from_u128(99),
            generation: 0,
            epoch: 0,
            effect: e.digest(),
            receiver: id("g"),
            max_charge: v(&[("units", 5)]),
            key: key(1),
            payer: id("m"),
            expires: None,
        },
        footprint: Footprint::full(&v(&[("units", 5)])),
    };
    n.g.handle_message(
        UnixMillis(0),
        &id("m"),
        LedgerMessage::Dispatch {
            permit: Signed::sign(&squat, &id("m"), &sk(5)),
            effect: e.clone(),
        },
    );
    n.persist_all();
    while n.g.poll_execute().is_some() {}
    // r's own operation under the same key is still accepted, runs and settles.
    let permit = dispatched(&mut n, 5);
    n.g.handle_message(UnixMillis(0), &id("r"), permit);
    n.run(&v(&[("units", 3)]), &mut |_, _| false);
    assert!(
        matches!(
            n.r.operation(key(1)).unwrap().state,
            OpState::Settled { .. }
        ),
        "{:?}",
        n.r.operation(key(1)).unwrap().state
    );
    assert_eq!(n.r.buckets(root)[4], v(&[("units", 3)]));
    assert_eq!(n.r.buckets(root)[0], v(&[("units", 2)]));
    // A reused key with different content from the same payer is refused.
    let other = n.effect("other-call", &[("units", 1)]);
    let mut again = squat.clone();
    again.binding.effect = other.digest();
    again.binding.max_charge = v(&[("units", 1)]);
    again.footprint = Footprint::full(&v(&[("units", 1)]));
    n.g.handle_message(
        UnixMillis(0),
        &id("m"),
        LedgerMessage::Dispatch {
            permit: Signed::sign(&again, &id("m"), &sk(5)),
            effect: other,
        },
    );
    assert!(matches!(
        n.g.poll_transmit(),
        Some((
            _,
            LedgerMessage::Refused {
                reason: Refusal::KeyConflict,
                ..
            }
        ))
    ));
}

#[test]
fn a_remembered_verification_covers_only_the_same_bytes() {
    let keys = Keyring::new([
        (id("g"), sk(4).verifying_key()),
        (id("m"), sk(5).verifying_key()),
    ]);
    let fenced = Fenced {
        credit: ROOT_CREDIT,
        epoch: 3,
        gateway: id("g"),
    };
    let signed = Signed::sign(&fenced, &id("g"), &sk(4));
    assert_eq!(keys.open(&signed, &id("g")), Ok(fenced.clone()));
    // Remembered now; still only for exactly these bytes, this signer, this expectation.
    assert_eq!(keys.open(&signed, &id("g")), Ok(fenced.clone()));
    assert!(keys.open(&signed, &id("m")).is_err());
    assert_eq!(
        keys.open(&signed.tampered(3), &id("g")),
        Err(SignatureError::BadSignature)
    );
    let by_m = Signed::sign(&fenced, &id("m"), &sk(5));
    assert!(keys.open(&by_m, &id("g")).is_err());
}

#[test]
fn a_reused_id_with_different_content_is_refused_and_the_same_request_is_a_replay() {
    // Paper §5.7: the same id with the same content is the same request (answered as done,
    // nothing new written); the same id with other content is refused and changes nothing.
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    let tools = Label::of(&["tools"]).unwrap();
    let (child, out) = (CreditId::from_u128(10), CreditId::from_u128(12));

    // Split: 30 cents into `child`.
    n.r.split(ROOT_CREDIT, child, v(&[("cents", 30)]), tools.clone())
        .unwrap();
    n.persist_all();
    let journal = n.r.journal_len();
    n.r.split(ROOT_CREDIT, child, v(&[("cents", 30)]), tools.clone())
        .unwrap();
    assert_eq!(n.r.journal_len(), journal, "the same split is a replay");
    assert_eq!(
        n.r.split(ROOT_CREDIT, child, v(&[("cents", 40)]), tools.clone()),
        Err(LedgerError::IdInUse("credit"))
    );
    assert_eq!(n.r.journal_len(), journal);
    assert_eq!(
        n.r.credit(ROOT_CREDIT).unwrap().available.size(),
        v(&[("cents", 70)])
    );

    // Reserve: 10 cents under key 1.
    let e = n.effect("search", &[("cents", 10)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e.clone(), &id("g"), key(1))
        .unwrap();
    let journal = n.r.journal_len();
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    assert_eq!(
        n.r.journal_len(),
        journal,
        "the same reservation is a replay"
    );
    let other = n.effect("book", &[("cents", 10)]);
    assert_eq!(
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, other, &id("g"), key(1)),
        Err(LedgerError::IdInUse("operation key"))
    );
    let bigger = n.effect("search", &[("cents", 20)]);
    assert_eq!(
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, bigger, &id("g"), key(1)),
        Err(LedgerError::IdInUse("operation key"))
    );
    assert_eq!(
        n.r.buckets(root)[2],
        v(&[("cents", 10)]),
        "one reservation, 10"
    );

    // Transfer: 5 cents to c under transfer 3.
    let t = TransferId::from_u128(3);
    n.r.transfer(ROOT_CREDIT, t, &v(&[("cents", 5)]), &id("c"), tools.clone())
        .unwrap();
    let journal = n.r.journal_len();
    n.r.transfer(ROOT_CREDIT, t, &v(&[("cents", 5)]), &id("c"), tools.clone())
        .unwrap();
    assert_eq!(n.r.journal_len(), journal, "the same transfer is a replay");
    assert_eq!(
        n.r.transfer(ROOT_CREDIT, t, &v(&[("cents", 6)]), &id("c"), tools.clone()),
        Err(LedgerError::IdInUse("transfer"))
    );
    assert_eq!(
        n.r.buckets(root)[1],
        v(&[("cents", 5)]),
        "one transfer in transit, 5"
    );

    // Join: the output id of a join may not name an existing credit, nor be reused for
    // other inputs.
    let other_child = CreditId::from_u128(11);
    n.r.split(ROOT_CREDIT, other_child, v(&[("cents", 20)]), tools.clone())
        .unwrap();
    assert_eq!(
        n.r.join(vec![child, other_child], ROOT_CREDIT),
        Err(LedgerError::IdInUse("join output"))
    );
    n.r.join(vec![child, other_child], out).unwrap();
    let journal = n.r.journal_len();
    n.r.join(vec![child, other_child], out).unwrap();
    assert_eq!(n.r.journal_len(), journal, "the same join is a replay");
    let third = CreditId::from_u128(13);
    n.r.split(ROOT_CREDIT, third, v(&[("cents", 1)]), tools)
        .unwrap();
    assert!(n.r.join(vec![third, out], out).is_err());
    assert_eq!(
        n.r.credit(out).unwrap().available.size(),
        v(&[("cents", 50)])
    );

    // Root: 100 = 50 (out) + 1 (third) + 10 reserved + 5 in transit + 34 available.
    assert_eq!(
        n.r.credit(ROOT_CREDIT).unwrap().available.size(),
        v(&[("cents", 34)])
    );
    n.persist_all();
    assert_eq!(n.violations(), vec![]);
}

#[test]
fn a_journal_that_reuses_an_id_for_other_content_does_not_replay() {
    // A damaged or forged journal: a second split under the child id of the first, with
    // another amount. Recovery refuses the step instead of ignoring it.
    let mut n = Net::new(&[("cents", 100)], None);
    let tools = Label::of(&["tools"]).unwrap();
    let child = CreditId::from_u128(10);
    n.r.split(ROOT_CREDIT, child, v(&[("cents", 30)]), tools.clone())
        .unwrap();
    // The journal: the grant (signed again: Ed25519 is deterministic), then the split.
    let grant = n.r.roots().next().unwrap().clone();
    let mut steps = vec![Step::Grant {
        grant: Signed::sign(&grant, &id("issuer"), &sk(1)),
        credit: ROOT_CREDIT,
    }];
    while let Some((t, s)) = n.r.poll_persist() {
        n.r.handle_persisted(t);
        steps.push(s);
    }
    assert_eq!(steps.len(), 2);
    steps.push(Step::Split {
        parent: ROOT_CREDIT,
        child,
        amount: v(&[("cents", 40)]),
        label: tools,
    });
    let (b, rejected) = Branch::recover(
        id("r"),
        sk(2),
        n.keys.clone(),
        BranchConfig::default(),
        steps,
    );
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].1, LedgerError::IdInUse("credit"));
    assert_eq!(
        b.credit(ROOT_CREDIT).unwrap().available.size(),
        v(&[("cents", 70)])
    );
}

/// Reserve, dispatch, lose the receipt, forfeit, then deliver the late receipt.
fn forfeit_then_late_receipt(mutation: Option<LedgerMutation>) -> Net {
    let mut n = Net::new(&[("units", 5)], mutation);
    let e = n.effect("pay", &[("units", 2)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    let mut lost = None;
    n.run(&v(&[("units", 1)]), &mut |to, m| {
        if to.as_str() == "r" && matches!(m, LedgerMessage::Receipt(_)) {
            lost = Some(m.clone());
            true
        } else {
            false
        }
    });
    n.r.forfeit(key(1)).unwrap();
    n.persist_all();
    n.r.handle_message(UnixMillis(1), &id("g"), lost.expect("a receipt was sent"));
    n
}

#[test]
fn the_history_auditor_finds_an_undone_forfeit_the_final_state_hides() {
    let mut honest = forfeit_then_late_receipt(None);
    assert_eq!(honest.audit_r(), vec![]);
    assert_eq!(honest.violations(), vec![]);
    assert!(matches!(
        honest.r.operation(key(1)).unwrap().state,
        OpState::Forfeited {
            annotation: Some(_)
        }
    ));
    // Forfeited atoms stay charged: 2 of 5 units.
    assert_eq!(
        honest.r.buckets(RootId::from_u128(7))[5],
        v(&[("units", 2)])
    );

    let mut mutant = forfeit_then_late_receipt(Some(LedgerMutation::UnforfeitOnLateEvidence));
    assert!(matches!(
        mutant.r.operation(key(1)).unwrap().state,
        OpState::Settled { .. }
    ));
    let history = mutant.audit_r();
    assert!(history.iter().any(|x| x.law == "H2"), "{history:?}");
}

#[test]
fn the_history_auditor_reads_each_transition() {
    // A hand-written journal, checked step by step against expectations computed here.
    let tools = Label::of(&["tools"]).unwrap();
    let wide = Label::of(&["tools", "travel", "food"]).unwrap();
    let n = Net::new(&[("cents", 100)], None);
    let grant = n.journal_r[0].clone();
    let fence = |epoch| Step::Fenced {
        fenced: Signed::sign(
            &Fenced {
                credit: ROOT_CREDIT,
                gateway: id("g"),
                epoch,
            },
            &id("g"),
            &sk(4),
        ),
    };
    let steps = vec![
        grant,
        // H1: "food" is not in the root's label {tools, travel}.
        Step::Split {
            parent: ROOT_CREDIT,
            child: CreditId::from_u128(2),
            amount: v(&[("cents", 1)]),
            label: wide,
        },
        Step::Split {
            parent: ROOT_CREDIT,
            child: CreditId::from_u128(3),
            amount: v(&[("cents", 1)]),
            label: tools,
        },
        // H3: a dispatch of a key never reserved.
        Step::Dispatch { key: key(9) },
        // H4: epochs 2 then 2.
        fence(2),
        fence(2),
    ];
    let found = check::audit(&id("r"), &steps, &n.keys);
    let laws: Vec<&str> = found.iter().map(|x| x.law).collect();
    assert_eq!(laws, vec!["H1", "H3", "H4"], "{found:?}");
}

/// H5 and H6 each alone, on a real journal with one step changed: a transfer's decision
/// recorded twice, and a settlement on a receipt (signed by the gateway) above the maximum.
#[test]
fn the_history_auditor_finds_a_second_decision_and_a_charge_above_the_maximum() {
    let mut n = Net::new(&[("units", 10)], None);
    n.r.transfer(
        ROOT_CREDIT,
        TransferId::from_u128(1),
        &v(&[("units", 4)]),
        &id("c"),
        Label::of(&["tools"]).unwrap(),
    )
    .unwrap();
    let e = n.effect("pay", &[("units", 2)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.run(&v(&[("units", 2)]), &mut |_, _| false);
    assert_eq!(n.audit_r(), vec![]);
    let journal = n.journal_r.clone();

    let decided = journal
        .iter()
        .position(|s| matches!(s, Step::Decided { .. }))
        .expect("the transfer was decided");
    let mut twice = journal.clone();
    twice.insert(decided + 1, journal[decided].clone());
    let found = check::audit(&id("r"), &twice, &n.keys);
    let laws: Vec<&str> = found.iter().map(|x| x.law).collect();
    assert_eq!(laws, vec!["H5"], "{found:?}");
    assert!(found[0].detail.contains("decided twice"), "{found:?}");

    let settled = journal
        .iter()
        .position(|s| matches!(s, Step::Settle { .. }))
        .expect("the operation was settled");
    let mut above = journal.clone();
    let Step::Settle { key: k, receipt } = &journal[settled] else {
        unreachable!()
    };
    let mut body = receipt.peek().unwrap();
    assert_eq!(body.actual, v(&[("units", 2)]));
    body.actual = v(&[("units", 3)]);
    above[settled] = Step::Settle {
        key: *k,
        receipt: Signed::sign(&body, &id("g"), &sk(4)),
    };
    let found = check::audit(&id("r"), &above, &n.keys);
    let laws: Vec<&str> = found.iter().map(|x| x.law).collect();
    assert_eq!(laws, vec!["H6"], "{found:?}");
}

// ---------------------------------------------------------------------------------------
// The charge is complete: the escrow is the maximum, the gateway runs only the effect bound
// and holds it to the maximum.

fn refusal(g: &mut Gateway) -> Option<Refusal> {
    std::iter::from_fn(|| g.poll_transmit()).find_map(|(_, m)| match m {
        LedgerMessage::Refused { reason, .. } => Some(reason),
        _ => None,
    })
}

#[test]
fn an_escrow_short_of_the_maximum_is_refused_by_gateway_and_journal() {
    // The mutant's branch escrows 4 units for a 5-unit maximum: the checker sees it, and the
    // gateway refuses the permit, so nothing runs.
    let mut n = Net::new(&[("units", 10)], Some(LedgerMutation::ReserveBelowMaximum));
    let e = n.effect("call", &[("units", 5)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e.clone(), &id("g"), key(1))
        .unwrap();
    assert_eq!(
        n.r.operation(key(1)).unwrap().footprint.size(),
        v(&[("units", 4)])
    );
    assert!(
        n.violations().iter().any(|x| x.law == "L4"),
        "{:?}",
        n.violations()
    );
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.persist_all();
    let (_, permit) = n.r.poll_transmit().unwrap();
    let mut correct = Gateway::new(id("g"), sk(4), n.keys.clone());
    correct.handle_message(UnixMillis(0), &id("r"), permit);
    // The permit does not validate as a permit (its escrow is not its maximum).
    assert_eq!(refusal(&mut correct), Some(Refusal::BadSignature));
    assert!(correct.poll_persist().is_none() && correct.poll_execute().is_none());

    // A correct branch will not replay a journal step whose escrow is short, nor one whose
    // permit names another effect.
    let mut n = Net::new(&[("units", 10)], None);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e.clone(), &id("g"), key(1))
        .unwrap();
    let grant = n.r.roots().next().unwrap().clone();
    let (_, good) = n.r.poll_persist().unwrap();
    let Step::Reserve { permit, effect } = good else {
        panic!("a reserve step")
    };
    let p = permit.peek().unwrap();
    let short = Signed::sign(
        &Permit {
            binding: p.binding.clone(),
            footprint: Footprint::full(&v(&[("units", 4)])),
        },
        &id("r"),
        &sk(2),
    );
    let other = Effect {
        operation: "something else".into(),
        ..effect.clone()
    };
    for (permit, effect, why) in [
        (short, effect, "reservation other than the maximum charge"),
        (permit, other, "permit for another effect"),
    ] {
        let steps = vec![
            Step::Grant {
                grant: Signed::sign(&grant, &id("issuer"), &sk(1)),
                credit: ROOT_CREDIT,
            },
            Step::Reserve { permit, effect },
        ];
        let (b, rejected) = Branch::recover(
            id("r"),
            sk(2),
            n.keys.clone(),
            BranchConfig::default(),
            steps,
        );
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].1, LedgerError::Mismatch(why));
        assert!(b.operation(key(1)).is_none());
        assert_eq!(
            b.credit(ROOT_CREDIT).unwrap().available.size(),
            v(&[("units", 10)])
        );
    }
}

/// `r` reserves and dispatches a 5-unit effect; the permit is sent with `larger` attached (as
/// an on-path relay could) to a gateway under `mutation`. Returns the limit the executor got.
fn run_with_effect(mutation: Option<LedgerMutation>, larger: bool) -> (Option<Vector>, Net) {
    let mut n = Net::new(&[("units", 10)], None);
    n.g = Gateway::new(id("g"), sk(4), n.keys.clone()).with_mutation(mutation);
    let e = n.effect("call", &[("units", 5)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e.clone(), &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.persist_all();
    let (_, m) = n.r.poll_transmit().unwrap();
    let LedgerMessage::Dispatch { permit, .. } = m else {
        panic!("a dispatch")
    };
    let effect = if larger {
        Effect {
            operation: "call, but bigger".into(),
            max_charge: v(&[("units", 10)]),
            ..e
        }
    } else {
        e
    };
    n.g.handle_message(
        UnixMillis(0),
        &id("r"),
        LedgerMessage::Dispatch { permit, effect },
    );
    n.persist_all();
    let limit = n.g.poll_execute().map(|x| x.max_charge);
    (limit, n)
}

#[test]
fn a_gateway_runs_only_the_effect_its_binding_names() {
    let (limit, mut n) = run_with_effect(None, true);
    assert_eq!(limit, None, "nothing runs");
    assert_eq!(refusal(&mut n.g), Some(Refusal::BindingMismatch));
    let (limit, _) = run_with_effect(None, false);
    assert_eq!(limit, Some(v(&[("units", 5)])));
    // The mutant runs the larger effect with its own limit.
    let (limit, _) = run_with_effect(Some(LedgerMutation::GatewayTrustsBinding), true);
    assert_eq!(limit, Some(v(&[("units", 10)])));
}

#[test]
fn a_report_above_the_maximum_is_signed_as_the_maximum() {
    for mutation in [None, Some(LedgerMutation::GatewayWithoutClamp)] {
        let (limit, mut n) = run_with_effect(mutation, false);
        let limit = limit.expect("accepted");
        // The executor is held to its limit; a meter reports 7 units asked for.
        n.g.handle_executed(&id("r"), key(1), v(&[("units", 7)]));
        n.persist_all();
        let receipt = std::iter::from_fn(|| n.g.poll_transmit())
            .find_map(|(_, m)| match m {
                LedgerMessage::Receipt(r) => Some(r.peek().unwrap().actual),
                _ => None,
            })
            .expect("a receipt");
        match mutation {
            None => {
                assert_eq!(limit, v(&[("units", 5)]));
                assert_eq!(receipt, v(&[("units", 5)]));
                assert_eq!(n.violations(), vec![]);
            }
            Some(_) => {
                assert_eq!(limit, v(&[("units", u64::MAX)]), "no limit handed over");
                assert_eq!(receipt, v(&[("units", 7)]));
                assert!(
                    n.violations().iter().any(|x| x.law == "L3"),
                    "{:?}",
                    n.violations()
                );
            }
        }
    }
}

#[test]
fn a_no_effect_proof_rests_only_on_a_durable_fence() {
    // The permit is held back on the path; the payer fences and asks while the fence's record
    // is still being written; the gateway crashes before it lands; the permit arrives.
    for mutation in [None, Some(LedgerMutation::NoEffectBeforeDurableFence)] {
        let mut n = Net::new(&[("units", 5)], None);
        n.g = Gateway::new(id("g"), sk(4), n.keys.clone()).with_mutation(mutation);
        let root = RootId::from_u128(7);
        let held_back = dispatched(&mut n, 5);
        n.r.request_fence(ROOT_CREDIT).unwrap();
        let (_, fence) = n.r.poll_transmit().unwrap();
        n.g.handle_message(UnixMillis(0), &id("r"), fence);
        let (_, being_written) = n.g.poll_persist().unwrap();
        assert!(matches!(being_written, GatewayRecord::Fence { .. }));
        let b = n.r.operation(key(1)).unwrap().binding.clone();
        n.g.handle_message(
            UnixMillis(0),
            &id("r"),
            LedgerMessage::Query {
                key: key(1),
                binding: Box::new(b),
            },
        );
        for (_, m) in std::iter::from_fn(|| n.g.poll_transmit()).collect::<Vec<_>>() {
            n.r.handle_message(UnixMillis(1), &id("g"), m);
        }
        n.persist_all();
        // The crash: the fence never landed.
        n.g = Gateway::recover_with_mutation(id("g"), sk(4), n.keys.clone(), mutation, Vec::new());
        n.g.handle_message(UnixMillis(0), &id("r"), held_back);
        n.run(&v(&[("units", 5)]), &mut |_, _| false);
        match mutation {
            None => {
                // No proof went out: the atoms stayed quarantined, and the late permit's
                // effect settles them.
                assert_eq!(n.r.buckets(root)[4], v(&[("units", 5)]), "committed");
                assert_eq!(n.violations(), vec![]);
            }
            Some(_) => {
                assert!(matches!(
                    n.r.operation(key(1)).unwrap().state,
                    OpState::NoEffect(_)
                ));
                assert!(
                    n.violations().iter().any(|x| x.law == "L3"),
                    "{:?}",
                    n.violations()
                );
            }
        }
    }
}

#[test]
fn an_amount_too_fragmented_for_the_wire_is_refused_before_anything_is_signed() {
    // 300 one-unit charges out of 300 two-unit reservations leave every other atom free:
    // [1,2), [3,4), … — 300 single-atom ranges below the untouched tail [600, 1000).
    let mut n = Net::new(&[("units", 1_000)], None);
    for k in 0..300u128 {
        let e = n.effect(&format!("call-{k}"), &[("units", 2)]);
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1_000 + k))
            .unwrap();
        n.r.dispatch(UnixMillis(0), key(1_000 + k)).unwrap();
    }
    n.run(&v(&[("units", 1)]), &mut |_, _| false);
    let avail = n.r.credit(ROOT_CREDIT).unwrap().available.clone();
    let ranges = avail
        .dim(&Dim::new("units").unwrap())
        .unwrap()
        .ranges()
        .len();
    assert_eq!(
        ranges, 300,
        "299 holes and the tail merged with the last free atom"
    );
    assert_eq!(avail.size(), v(&[("units", 700)]));
    // The lowest 400 atoms are the 299 single free atoms and 101 of the tail: 300 ranges, more
    // than a footprint may carry. Refused, nothing changes.
    let before = n.r.journal_len();
    let big = n.effect("big", &[("units", 400)]);
    assert_eq!(
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, big, &id("g"), key(9)),
        Err(LedgerError::Fragmented {
            dim: "units".into(),
            ranges: 300,
            limit: MAX_RANGES
        })
    );
    assert_eq!(n.r.journal_len(), before);
    assert!(n.r.operation(key(9)).is_none());
    // A transfer of as much is refused the same way; a smaller amount is fine.
    assert!(matches!(
        n.r.transfer(
            ROOT_CREDIT,
            TransferId::from_u128(5),
            &v(&[("units", 400)]),
            &id("c"),
            Label::of(&["tools"]).unwrap()
        ),
        Err(LedgerError::Fragmented { .. })
    ));
    // One past the limit: the lowest 257 atoms are 257 single-atom ranges. Refused.
    let past = n.effect("past", &[("units", MAX_RANGES as u64 + 1)]);
    assert_eq!(
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, past, &id("g"), key(11)),
        Err(LedgerError::Fragmented {
            dim: "units".into(),
            ranges: MAX_RANGES + 1,
            limit: MAX_RANGES
        })
    );
    // At the limit: the lowest 256 atoms, 256 ranges, are taken.
    let at = n.effect("at", &[("units", MAX_RANGES as u64)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, at, &id("g"), key(12))
        .unwrap();
    let small = n.effect("small", &[("units", 50)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, small, &id("g"), key(10))
        .unwrap();
    assert_eq!(n.violations(), vec![]);
}

#[test]
fn a_refusal_of_a_tampered_copy_does_not_stop_the_genuine_permit() {
    // On the path, the payer's permit is sent again with another effect attached; the gateway
    // refuses that copy under the same key. The branch keeps resending its own permit, which
    // the gateway then accepts and settles.
    let mut n = Net::new(&[("units", 5)], None);
    let e = n.effect("call", &[("units", 5)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e.clone(), &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.persist_all();
    let (_, genuine) = n.r.poll_transmit().unwrap();
    let LedgerMessage::Dispatch { permit, .. } = genuine else {
        panic!("a dispatch")
    };
    let tampered = LedgerMessage::Dispatch {
        permit,
        effect: Effect {
            operation: "something else".into(),
            ..e
        },
    };
    n.g.handle_message(UnixMillis(0), &id("r"), tampered);
    for (_, m) in std::iter::from_fn(|| n.g.poll_transmit()).collect::<Vec<_>>() {
        assert!(matches!(
            m,
            LedgerMessage::Refused {
                reason: Refusal::BindingMismatch,
                ..
            }
        ));
        n.r.handle_message(UnixMillis(1), &id("g"), m);
    }
    // The genuine permit was lost; the resend carries it.
    n.r.handle_timeout(UnixMillis(1_000));
    n.run(&v(&[("units", 3)]), &mut |_, _| false);
    assert!(matches!(
        n.r.operation(key(1)).unwrap().state,
        OpState::Settled { .. }
    ));
    assert_eq!(n.violations(), vec![]);
}

#[test]
fn timeouts_resend_only_what_is_still_undecided() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    // Decided for good: a settled operation and an accepted transfer.
    let one = n.effect("one", &[("cents", 10)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, one, &id("g"), key(1))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.r.transfer(
        ROOT_CREDIT,
        TransferId::from_u128(1),
        &v(&[("cents", 20)]),
        &id("c"),
        Label::of(&["tools"]).unwrap(),
    )
    .unwrap();
    n.run(&v(&[("cents", 10)]), &mut |_, _| false);
    // Undecided: operation 2, whose dispatch never reaches the gateway.
    let two = n.effect("two", &[("cents", 5)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, two, &id("g"), key(2))
        .unwrap();
    n.r.dispatch(UnixMillis(0), key(2)).unwrap();
    n.run(&Vector::zero(), &mut |to, _| to == &id("g"));
    assert!(matches!(
        n.r.operation(key(1)).unwrap().state,
        OpState::Settled { .. }
    ));
    assert_eq!(n.r.operation(key(2)).unwrap().state, OpState::Quarantined);
    assert_eq!(
        n.r.buckets(root)[1],
        Vector::zero(),
        "the transfer is decided"
    );
    // Each timeout resends operation 2's dispatch and nothing else.
    for t in [1_000, 2_000, 3_000] {
        n.r.handle_timeout(UnixMillis(t));
        let sent: Vec<(AgentId, LedgerMessage)> =
            std::iter::from_fn(|| n.r.poll_transmit()).collect();
        assert_eq!(sent.len(), 1, "at {t} ms: {sent:?}");
        let (to, LedgerMessage::Dispatch { permit, .. }) = &sent[0] else {
            panic!("at {t} ms: {:?}", sent[0]);
        };
        assert_eq!(to, &id("g"));
        assert_eq!(permit.peek().unwrap().binding.key, key(2));
    }
    // Once it is decided too, a timeout sends nothing at all.
    n.r.handle_timeout(UnixMillis(4_000));
    n.run(&v(&[("cents", 5)]), &mut |_, _| false);
    assert!(matches!(
        n.r.operation(key(2)).unwrap().state,
        OpState::Settled { .. }
    ));
    n.r.handle_timeout(UnixMillis(10_000));
    assert_eq!(n.r.poll_transmit(), None);
    assert_eq!(n.violations(), vec![]);
}

/// `max_journal_steps`: the step that reaches the limit is taken; past it new work is refused
/// with the limit named and nothing changes, an incoming transfer is refused (its rights go
/// back to the source), and work already started still ends (dispatch, settlement). A journal
/// longer than the limit still recovers whole.
#[test]
fn a_full_journal_takes_no_new_work_but_ends_what_was_started() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    let tools = Label::of(&["tools"]).unwrap();
    // Before the limit: 40 cents go to c (so c can send some back later).
    n.r.transfer(
        ROOT_CREDIT,
        TransferId::from_u128(1),
        &v(&[("cents", 40)]),
        &id("c"),
        tools.clone(),
    )
    .unwrap();
    n.run(&Vector::zero(), &mut |_, _| false);
    n.persist_all();
    // r again, from its journal, with room for exactly one more step.
    let used = n.journal_r.len() as u64;
    let limit = used + 1;
    let config = BranchConfig {
        resend_ms: 100,
        max_journal_steps: limit,
        ..BranchConfig::default()
    };
    let (r, rejected) = Branch::recover(
        id("r"),
        sk(2),
        n.keys.clone(),
        config.clone(),
        n.journal_r.clone(),
    );
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(r.journal_len(), used);
    n.r = r;
    // At the limit: the reservation that reaches it is taken.
    let e = n.effect("call", &[("cents", 10)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(1))
        .unwrap();
    n.persist_all();
    assert_eq!(n.r.journal_len(), limit);
    // Past it: each kind of new work is refused naming the limit, and nothing changes.
    let full = Err(LedgerError::JournalFull { limit });
    let before = n.r.buckets(root);
    let e2 = n.effect("call-2", &[("cents", 10)]);
    assert_eq!(
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, e2, &id("g"), key(2)),
        full
    );
    assert_eq!(
        n.r.transfer(
            ROOT_CREDIT,
            TransferId::from_u128(2),
            &v(&[("cents", 5)]),
            &id("c"),
            tools.clone()
        ),
        full
    );
    assert_eq!(
        n.r.split(
            ROOT_CREDIT,
            CreditId::from_u128(50),
            v(&[("cents", 5)]),
            tools.clone()
        ),
        full
    );
    assert_eq!(n.r.buckets(root), before);
    assert_eq!(n.r.journal_len(), limit);
    assert!(n.r.operation(key(2)).is_none());
    // An incoming transfer is refused: c's 15 cents come back to c.
    let c_credit = n.c.credits().next().map(|c| c.id).unwrap();
    n.c.transfer(
        c_credit,
        TransferId::from_u128(3),
        &v(&[("cents", 15)]),
        &id("r"),
        tools,
    )
    .unwrap();
    // Work started before the limit ends: the dispatch goes out and settles at 7.
    n.r.dispatch(UnixMillis(0), key(1)).unwrap();
    n.run(&v(&[("cents", 7)]), &mut |_, _| false);
    assert_eq!(
        n.c.buckets(root)[0],
        v(&[("cents", 40)]),
        "the refused 15 are back at c"
    );
    assert!(n.c.buckets(root)[1].is_zero());
    assert!(matches!(
        n.r.operation(key(1)).map(|o| &o.state),
        Some(OpState::Settled { .. })
    ));
    assert_eq!(
        n.r.buckets(root)[0],
        v(&[("cents", 53)]),
        "60 less the 7 charged"
    );
    assert_eq!(n.violations(), vec![]);
    // The journal, now past its limit, recovers whole under the same limit.
    n.persist_all();
    let (again, rejected) =
        Branch::recover(id("r"), sk(2), n.keys.clone(), config, n.journal_r.clone());
    assert!(rejected.is_empty(), "{rejected:?}");
    assert!(again.journal_len() > limit);
    assert_eq!(again.buckets(root), n.r.buckets(root));
}

// ---------------------------------------------------------------------------------------
// Generations: terminal rollover, the fused terminal transition, fenced reclaim (§5.7, §6.8).

/// The ids of `r`'s reissue steps, with whether each fused an operation's end.
fn reissues(journal: &[Step]) -> Vec<(CreditId, CreditId, Option<OpKey>)> {
    journal
        .iter()
        .filter_map(|s| match s {
            Step::Reissue {
                credit,
                successor,
                last,
            } => Some((
                *credit,
                *successor,
                last.as_deref().map(|l| match l {
                    Step::Settle { key, .. } | Step::NoEffect { key, .. } => *key,
                    other => panic!("fused {other:?}"),
                }),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn terminal_rollover_moves_only_the_available_atoms_into_a_fresh_generation() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    // Settled: 30 reserved, 20 charged, 10 back. Forfeited: 10 stay charged.
    n.spend(ROOT_CREDIT, "one", &[("cents", 30)], 1);
    n.run(&v(&[("cents", 20)]), &mut |_, _| false);
    n.spend(ROOT_CREDIT, "two", &[("cents", 10)], 2);
    n.run(&Vector::zero(), &mut |to, _| to == &id("g"));
    n.r.forfeit(key(2)).unwrap();
    // Work in progress keeps the generation open: a reservation, then a sealed transfer.
    let three = n.effect("three", &[("cents", 5)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, three, &id("g"), key(3))
        .unwrap();
    let busy = Err(LedgerError::WrongState(
        "reissue of a generation with work in progress",
    ));
    assert_eq!(n.r.reissue(ROOT_CREDIT), busy);
    n.r.release_unsent(key(3)).unwrap();
    n.send_to_c(15);
    assert_eq!(n.r.reissue(ROOT_CREDIT), busy);
    n.run(&Vector::zero(), &mut |_, _| false); // c accepts.
    let before = n.journal_r.len();
    let next = n.r.reissue(ROOT_CREDIT).unwrap();
    n.persist_all();
    // 100 - 20 committed - 10 forfeited - 15 sent to c = 55, all of it in the successor.
    let s = n.r.credit(next).unwrap();
    assert_eq!(s.available.size(), v(&[("cents", 55)]));
    assert_eq!((s.generation, s.epoch, s.fenced), (1, 0, false));
    assert_eq!(s.label, Label::of(&["tools", "travel"]).unwrap());
    let old = n.r.credit(ROOT_CREDIT).unwrap();
    assert!(old.closed && old.available.is_empty());
    assert_eq!(old.successor, Some(next));
    let [a, t, r, q, c, f] = n.r.buckets(root);
    assert_eq!(a, v(&[("cents", 55)]));
    assert_eq!((t, r, q), (Vector::zero(), Vector::zero(), Vector::zero()));
    assert_eq!((c, f), (v(&[("cents", 20)]), v(&[("cents", 10)])));
    // Written once: asking again names the same successor and writes nothing.
    assert_eq!(n.r.reissue(ROOT_CREDIT), Ok(next));
    n.persist_all();
    assert_eq!(n.journal_r.len(), before + 1);
    assert_eq!(n.r.current(ROOT_CREDIT), Some(next));
    // The closed generation takes no work; its successor does.
    let four = n.effect("four", &[("cents", 5)]);
    assert_eq!(
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, four.clone(), &id("g"), key(4)),
        Err(LedgerError::UnknownCredit(ROOT_CREDIT))
    );
    n.r.reserve(UnixMillis(0), next, four, &id("g"), key(4))
        .unwrap();
    assert_eq!(n.r.operation(key(4)).unwrap().binding.generation, 1);
    assert_eq!(n.violations(), vec![]);
    assert_eq!(n.audit_r(), vec![]);
    // A journal that reissues the same generation to another credit does not replay.
    let mut forged = n.journal_r.clone();
    let at = forged
        .iter()
        .position(|s| matches!(s, Step::Reissue { .. }))
        .unwrap();
    forged.insert(
        at + 1,
        Step::Reissue {
            credit: ROOT_CREDIT,
            successor: CreditId::from_u128(99),
            last: None,
        },
    );
    let (_, rejected) = Branch::replay(id("r"), n.keys.clone(), forged);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(
        rejected[0].1,
        LedgerError::IdInUse("a generation already reissued to another credit")
    );
    // The genuine journal replays to the same credits, twice over too.
    let twice: Vec<Step> = n.journal_r.iter().chain(&n.journal_r).cloned().collect();
    let (b, rejected) = Branch::replay(id("r"), n.keys.clone(), twice);
    assert_eq!(rejected, vec![]);
    assert_eq!(
        b.credit(next).unwrap().available.size(),
        v(&[("cents", 50)])
    );
    assert!(b.credit(ROOT_CREDIT).unwrap().closed);
}

#[test]
fn a_fenced_generation_closes_with_its_last_operation_in_one_step() {
    let mut n = Net::new(&[("units", 10)], None);
    let root = RootId::from_u128(7);
    // Operation 1 settles at 2 of its 4 units; operation 2 (3 units) never reaches the
    // gateway.
    n.spend(ROOT_CREDIT, "one", &[("units", 4)], 1);
    n.run(&v(&[("units", 2)]), &mut |_, _| false);
    n.spend(ROOT_CREDIT, "two", &[("units", 3)], 2);
    n.run(&Vector::zero(), &mut |to, _| to == &id("g"));
    n.r.request_fence(ROOT_CREDIT).unwrap();
    // Deliver the fence and its confirmation, but not yet the query it prompts.
    n.run(&Vector::zero(), &mut |_, m| {
        matches!(m, LedgerMessage::Query { .. })
    });
    let c = n.r.credit(ROOT_CREDIT).unwrap();
    assert!(c.fenced && !c.closed);
    assert_eq!(c.epoch, 1);
    // A fenced generation takes no new work, only ends.
    let three = n.effect("three", &[("units", 1)]);
    assert_eq!(
        n.r.reserve(UnixMillis(0), ROOT_CREDIT, three, &id("g"), key(3)),
        Err(LedgerError::Fenced(ROOT_CREDIT))
    );
    assert_eq!(
        n.r.split(
            ROOT_CREDIT,
            CreditId::from_u128(5),
            v(&[("units", 1)]),
            Label::of(&["tools"]).unwrap()
        ),
        Err(LedgerError::Fenced(ROOT_CREDIT))
    );
    assert_eq!(
        n.r.buckets(root)[3],
        v(&[("units", 3)]),
        "still quarantined"
    );
    // The query is answered with a no-effect proof: operation 2 ends and the generation
    // closes in the same durable step.
    n.r.handle_timeout(UnixMillis(10_000));
    n.run(&Vector::zero(), &mut |_, _| false);
    n.persist_all();
    let fused = reissues(&n.journal_r);
    assert_eq!(fused.len(), 1, "{fused:?}");
    let (credit, next, last) = fused[0];
    assert_eq!((credit, last), (ROOT_CREDIT, Some(key(2))));
    assert!(
        !n.journal_r
            .iter()
            .any(|s| matches!(s, Step::NoEffect { key: k, .. } if *k == key(2))),
        "the proof is not a step of its own"
    );
    assert!(matches!(
        n.r.operation(key(2)).unwrap().state,
        OpState::NoEffect(_)
    ));
    // 10 - 2 committed = 8, in the successor (generation 1, at the fenced epoch).
    let s = n.r.credit(next).unwrap();
    assert_eq!(s.available.size(), v(&[("units", 8)]));
    assert_eq!((s.generation, s.epoch, s.fenced), (1, 1, false));
    assert!(n.r.credit(ROOT_CREDIT).unwrap().available.is_empty());
    assert_eq!(n.r.current(ROOT_CREDIT), Some(next));
    assert_eq!(n.violations(), vec![]);
    assert_eq!(n.audit_r(), vec![]);
    let (b, rejected) = Branch::replay(id("r"), n.keys.clone(), n.journal_r.clone());
    assert_eq!(rejected, vec![]);
    assert_eq!(b.credit(next).unwrap().available.size(), v(&[("units", 8)]));
}

#[test]
fn a_fenced_generation_with_only_ended_work_closes_when_its_last_reservation_is_released() {
    let mut n = Net::new(&[("units", 6)], None);
    n.spend(ROOT_CREDIT, "one", &[("units", 2)], 1);
    n.run(&Vector::zero(), &mut |to, _| to == &id("g"));
    let two = n.effect("two", &[("units", 1)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, two, &id("g"), key(2))
        .unwrap();
    n.r.request_fence(ROOT_CREDIT).unwrap();
    n.run(&Vector::zero(), &mut |_, _| false);
    // Operation 1's proof came, but operation 2 is still reserved: not closed yet.
    assert!(matches!(
        n.r.operation(key(1)).unwrap().state,
        OpState::NoEffect(_)
    ));
    assert!(!n.r.credit(ROOT_CREDIT).unwrap().closed);
    n.r.release_unsent(key(2)).unwrap();
    n.persist_all();
    let done = reissues(&n.journal_r);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].2, None, "a plain reissue after the release");
    assert_eq!(
        n.r.credit(done[0].1).unwrap().available.size(),
        v(&[("units", 6)])
    );
    assert_eq!(n.violations(), vec![]);
    assert_eq!(n.audit_r(), vec![]);
}

#[test]
fn a_generation_reissued_with_work_in_progress_is_caught() {
    for mutation in [None, Some(LedgerMutation::ReissueWithWorkInProgress)] {
        let mut n = Net::new(&[("cents", 50)], mutation);
        n.spend(ROOT_CREDIT, "one", &[("cents", 20)], 1);
        n.persist_all();
        let (_, held) = n.r.poll_transmit().unwrap();
        let r = n.r.reissue(ROOT_CREDIT);
        // The receipt (5 of 20) comes back after the generation closed.
        n.g.handle_message(UnixMillis(0), &id("r"), held);
        n.run(&v(&[("cents", 5)]), &mut |_, _| false);
        match mutation {
            None => {
                assert_eq!(
                    r,
                    Err(LedgerError::WrongState(
                        "reissue of a generation with work in progress"
                    ))
                );
                assert_eq!(n.violations(), vec![]);
                assert_eq!(n.audit_r(), vec![]);
            }
            Some(_) => {
                assert!(r.is_ok());
                // 15 cents went back to a closed credit: missing from every bucket.
                let found = n.violations();
                assert!(found.iter().any(|x| x.law == "L1"), "{found:?}");
                let audit = n.audit_r();
                assert!(audit.iter().any(|x| x.law == "H7"), "{audit:?}");
            }
        }
    }
}

#[test]
fn the_history_auditor_reads_generations() {
    let mut n = Net::new(&[("cents", 100)], None);
    n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
    n.persist_all();
    let (grant, reserve, dispatch) = (
        n.journal_r[0].clone(),
        n.journal_r[1].clone(),
        n.journal_r[2].clone(),
    );
    let split = |child| Step::Split {
        parent: ROOT_CREDIT,
        child: CreditId::from_u128(child),
        amount: v(&[("cents", 1)]),
        label: Label::of(&["tools"]).unwrap(),
    };
    let reissue = |to| Step::Reissue {
        credit: ROOT_CREDIT,
        successor: CreditId::from_u128(to),
        last: None,
    };
    let fence = Step::Fenced {
        fenced: Signed::sign(
            &Fenced {
                credit: ROOT_CREDIT,
                gateway: id("g"),
                epoch: 1,
            },
            &id("g"),
            &sk(4),
        ),
    };
    let laws = |steps: Vec<Step>| -> Vec<&'static str> {
        check::audit(&id("r"), &steps, &n.keys)
            .iter()
            .map(|x| x.law)
            .collect()
    };
    // Closed with an operation open; drawn on after it closed; closed again (and still
    // with the operation open).
    assert_eq!(
        laws(vec![
            grant.clone(),
            reserve.clone(),
            dispatch.clone(),
            reissue(20),
            split(21),
            reissue(22),
        ]),
        vec!["H7", "H7", "H7", "H7"]
    );
    // New work after a fence.
    assert_eq!(
        laws(vec![grant.clone(), fence.clone(), split(21)]),
        vec!["H8"]
    );
    // Into a credit that already exists.
    assert_eq!(
        laws(vec![grant.clone(), split(21), reissue(21)]),
        vec!["H7"]
    );
    // And the same shapes done right are clean: a fence, then a reissue once nothing is
    // open, then work on the successor.
    assert_eq!(laws(vec![grant, fence, reissue(20)]), Vec::<&str>::new());
}

#[test]
fn unused_rights_return_to_their_source_with_a_label_no_broader() {
    let mut n = Net::new(&[("cents", 100)], None);
    let root = RootId::from_u128(7);
    let tools = Label::of(&["tools"]).unwrap();
    // r sends 40 cents labelled {tools} to c; c spends 10 of them (charged 4).
    n.send_to_c(40);
    n.run(&Vector::zero(), &mut |_, _| false);
    let got = n.c.credits().next().unwrap().id;
    let e = n.effect("one", &[("cents", 10)]);
    n.c.reserve(UnixMillis(0), got, e, &id("g"), key(1))
        .unwrap();
    n.c.dispatch(UnixMillis(0), key(1)).unwrap();
    n.run(&v(&[("cents", 4)]), &mut |_, _| false);
    // The root's own credit is not returnable: it came from a grant, not a transfer.
    assert_eq!(
        n.r.return_rights(ROOT_CREDIT, TransferId::from_u128(8)),
        Err(LedgerError::WrongState(
            "only rights received by transfer return to their source"
        ))
    );
    // c returns what it did not use (40 - 4 = 36) under a stable return id.
    let ret = TransferId::from_u128(9);
    n.c.return_rights(got, ret).unwrap();
    let before: Vec<_> = std::iter::from_fn(|| n.c.poll_persist()).collect();
    for (t, _) in &before {
        n.c.handle_persisted(*t);
    }
    assert_eq!(before.len(), 1, "one seal");
    // Asked again (a duplicate completion): answered as done, nothing new written.
    n.c.return_rights(got, ret).unwrap();
    assert_eq!(n.c.poll_persist(), None);
    n.run(&Vector::zero(), &mut |_, _| false);
    let back: Vec<&Credit> =
        n.r.credits()
            .filter(|c| c.id != ROOT_CREDIT && !c.closed)
            .collect();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].available.size(), v(&[("cents", 36)]));
    assert_eq!(back[0].label, tools, "no broader than what went out");
    // r holds 60 + 36 available; 4 committed at c; nothing in transit.
    assert_eq!(n.r.buckets(root)[0], v(&[("cents", 96)]));
    assert_eq!(n.c.buckets(root)[4], v(&[("cents", 4)]));
    assert_eq!(n.r.buckets(root)[1], Vector::zero());
    assert_eq!(n.c.buckets(root)[1], Vector::zero());
    assert_eq!(n.violations(), vec![]);
    // Nothing is left to return under another id.
    assert_eq!(
        n.c.return_rights(got, TransferId::from_u128(10)),
        Err(LedgerError::WrongState("nothing available to return"))
    );
}

#[test]
fn the_gateway_log_auditor_reads_each_record_in_order() {
    let mut n = Net::new(&[("cents", 100)], None);
    n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
    n.run(&v(&[("cents", 6)]), &mut |_, _| false);
    n.persist_all();
    let laws = |records: Vec<GatewayRecord>| -> Vec<&'static str> {
        check::audit_gateway(&id("g"), &records, &n.keys)
            .iter()
            .map(|x| x.law)
            .collect()
    };
    let [accepted, receipt] = [n.log_g[0].clone(), n.log_g[1].clone()];
    assert!(matches!(accepted, GatewayRecord::Accepted { .. }));
    assert!(matches!(receipt, GatewayRecord::Receipt { .. }));
    assert_eq!(laws(n.log_g.clone()), Vec::<&str>::new());
    let fence = |epoch| GatewayRecord::Fence {
        credit: ROOT_CREDIT,
        epoch,
    };
    // A receipt before its acceptance.
    assert_eq!(laws(vec![receipt.clone(), accepted.clone()]), vec!["G4"]);
    // Accepted twice, receipted twice.
    assert_eq!(
        laws(vec![
            accepted.clone(),
            accepted.clone(),
            receipt.clone(),
            receipt.clone()
        ]),
        vec!["G3", "G4"]
    );
    // An acceptance below a fence already in the log; a fence that falls.
    assert_eq!(
        laws(vec![fence(2), accepted.clone(), fence(1)]),
        vec!["G2", "G1"]
    );
    // The same permit accepted before the fence is in order.
    assert_eq!(
        laws(vec![accepted.clone(), fence(1), receipt.clone()]),
        Vec::<&str>::new()
    );
    // A receipt signed by another member.
    let forged = GatewayRecord::Receipt {
        receipt: Signed::sign(
            &Receipt {
                key: key(1),
                binding: n.r.operation(key(1)).unwrap().binding.digest(),
                gateway: id("g"),
                actual: v(&[("cents", 1)]),
            },
            &id("m"),
            &sk(5),
        ),
        payer: Some(id("r")),
    };
    assert_eq!(laws(vec![accepted, forged]), vec!["G4"]);
}

#[test]
fn a_gateway_that_signs_above_the_maximum_is_caught_in_its_log() {
    for mutation in [None, Some(LedgerMutation::GatewayWithoutClamp)] {
        let mut n = Net::new(&[("cents", 100)], mutation);
        n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
        // The effect reports 25 cents against a maximum of 10.
        n.run(&v(&[("cents", 25)]), &mut |_, _| false);
        n.persist_all();
        let found: Vec<&str> = check::audit_gateway(&id("g"), &n.log_g, &n.keys)
            .iter()
            .map(|x| x.law)
            .collect();
        match mutation {
            None => assert_eq!(found, Vec::<&str>::new()),
            Some(_) => assert_eq!(found, vec!["G4"]),
        }
    }
}

/// Nothing goes out again from memory before the step it rests on is durable: a crash
/// could lose the step after the message went out (found by the simulation once branch steps
/// took time to land: atoms missing, or owned twice, and an effect run for a released
/// operation).
#[test]
fn nothing_is_resent_or_repeated_before_its_step_is_durable() {
    let mut n = Net::new(&[("cents", 100)], None);
    // A seal and a dispatch handed out, not yet durable: the timer sends neither.
    n.send_to_c(30);
    n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
    n.r.handle_timeout(UnixMillis(10_000));
    assert_eq!(n.r.poll_transmit(), None, "nothing before the steps land");
    // Once they land: each once (released), then again on the next timeout.
    while let Some((t, s)) = n.r.poll_persist() {
        n.journal_r.push(s);
        n.r.handle_persisted(t);
    }
    let first: Vec<_> = std::iter::from_fn(|| n.r.poll_transmit()).collect();
    assert_eq!(first.len(), 2, "{first:?}");
    n.r.handle_timeout(UnixMillis(20_000));
    let again: Vec<_> = std::iter::from_fn(|| n.r.poll_transmit()).collect();
    assert_eq!(again.len(), 2, "{again:?}");

    // At the destination: a repeated certificate is answered with the decision only once the
    // acceptance is durable.
    let cert = first
        .iter()
        .find(|(to, _)| to == &id("c"))
        .map(|(_, m)| m.clone())
        .unwrap();
    n.c.handle_message(UnixMillis(0), &id("r"), cert.clone());
    let (t, step) = n.c.poll_persist().unwrap();
    assert!(matches!(step, Step::Accept { .. }));
    n.c.handle_message(UnixMillis(0), &id("r"), cert);
    assert_eq!(
        n.c.poll_transmit(),
        None,
        "no decision while the acceptance is not durable"
    );
    n.c.handle_persisted(t);
    let decisions: Vec<_> = std::iter::from_fn(|| n.c.poll_transmit()).collect();
    assert_eq!(
        decisions.len(),
        2,
        "the first answer and the repeat: {decisions:?}"
    );
    assert!(decisions
        .iter()
        .all(|(to, m)| to == &id("r") && matches!(m, LedgerMessage::Decision(_))));
}

// ---------------------------------------------------------------------------------------
// Checkpoints: compaction of the journal.

/// `r` after: op 1 settled at 20 of 30, op 2 settled at 5 of 10, op 3 released unsent, op 4
/// forfeited (10), op 5 quarantined (gateway unreachable, 7), 15 sent to `c` and accepted.
/// Of the root's 100 cents: available 100-20-5-10-7-15 = 43.
fn worked(mutation: Option<LedgerMutation>) -> Net {
    let mut n = Net::new(&[("cents", 100)], mutation);
    n.spend(ROOT_CREDIT, "one", &[("cents", 30)], 1);
    n.run(&v(&[("cents", 20)]), &mut |_, _| false);
    n.spend(ROOT_CREDIT, "two", &[("cents", 10)], 2);
    n.run(&v(&[("cents", 5)]), &mut |_, _| false);
    let three = n.effect("three", &[("cents", 4)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, three, &id("g"), key(3))
        .unwrap();
    n.r.release_unsent(key(3)).unwrap();
    n.spend(ROOT_CREDIT, "four", &[("cents", 10)], 4);
    n.run(&Vector::zero(), &mut |to, _| to == &id("g"));
    n.r.forfeit(key(4)).unwrap();
    n.spend(ROOT_CREDIT, "five", &[("cents", 7)], 5);
    n.run(&Vector::zero(), &mut |to, _| to == &id("g"));
    n.send_to_c(15);
    n.run(&Vector::zero(), &mut |to, _| to == &id("g"));
    n.persist_all();
    n
}

fn recover_r(n: &Net, steps: Vec<Step>) -> (Branch, Vec<(Step, LedgerError)>) {
    let config = BranchConfig {
        resend_ms: 100,
        ..BranchConfig::default()
    };
    Branch::recover(id("r"), sk(2), n.keys.clone(), config, steps)
}

#[test]
fn a_checkpoint_folds_ended_operations_and_recovery_starts_from_it() {
    let mut n = worked(None);
    let root = RootId::from_u128(7);
    let before = n.journal_r.len();
    let buckets = n.r.buckets(root);
    // Expected from the schedule, not from the branch: committed 25, forfeited 10,
    // quarantined 7, available 43.
    let expect = [
        v(&[("cents", 43)]),
        Vector::zero(),
        Vector::zero(),
        v(&[("cents", 7)]),
        v(&[("cents", 25)]),
        v(&[("cents", 10)]),
    ];
    assert_eq!(buckets, expect);
    assert_eq!(n.r.checkpoint(), Ok(before as u64));
    n.persist_all();
    assert_eq!(n.r.buckets(root), expect, "folding moves no atom");
    assert_eq!(n.r.journal_len(), 1);
    assert_eq!(n.r.folded_steps(), before as u64);
    // Ended operations left the live state; the open and the forfeited stayed.
    let mut ended: Vec<(OpKey, Ended)> = n.r.ended().map(|e| (e.key, e.outcome.clone())).collect();
    ended.sort_by_key(|e| e.0);
    assert_eq!(
        ended,
        vec![
            (
                key(1),
                Ended::Settled {
                    actual: v(&[("cents", 20)])
                }
            ),
            (
                key(2),
                Ended::Settled {
                    actual: v(&[("cents", 5)])
                }
            ),
            (key(3), Ended::Released),
        ]
    );
    let live: Vec<OpKey> = n.r.operations().map(|o| o.binding.key).collect();
    assert_eq!(live, vec![key(4), key(5)]);
    assert_eq!(n.violations(), vec![]);

    // The journal before the checkpoint goes: recovery from the checkpoint alone.
    let compacted = n.journal_r[before..].to_vec();
    assert!(matches!(compacted.as_slice(), [Step::Checkpoint(_)]));
    let (b, rejected) = recover_r(&n, compacted.clone());
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(b.buckets(root), expect);
    assert_eq!((b.journal_len(), b.folded_steps()), (1, before as u64));
    assert_eq!(check::audit(&id("r"), &compacted, &n.keys), vec![]);
    // The whole journal, checkpoint included, recovers to the same state and audits clean.
    let (whole, rejected) = recover_r(&n, n.journal_r.clone());
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(whole.buckets(root), expect);
    assert_eq!(n.audit_r(), vec![]);

    // Work goes on from the recovered branch: the quarantined op settles at 6 (1 back),
    // a folded key is refused, late evidence for a folded op is a quiet repeat.
    n.r = b;
    let again = n.effect("again", &[("cents", 1)]);
    assert_eq!(
        n.r.reserve(UnixMillis(0), next_credit(&n.r), again, &id("g"), key(1)),
        Err(LedgerError::IdInUse("operation key"))
    );
    n.r.handle_timeout(UnixMillis(1_000));
    n.run(&v(&[("cents", 6)]), &mut |_, _| false);
    assert!(matches!(
        n.r.operation(key(5)).map(|o| &o.state),
        Some(OpState::Settled { .. })
    ));
    let receipt =
        n.g.acceptance(&id("r"), key(1))
            .and_then(|a| match &a.state {
                AcceptanceState::Done(r) => Some(r.clone()),
                _ => None,
            })
            .unwrap();
    while n.r.poll_event().is_some() {}
    n.r.handle_message(UnixMillis(1_000), &id("g"), LedgerMessage::Receipt(receipt));
    assert_eq!(n.r.poll_event(), None, "a repeat, not a rejection");
    assert_eq!(
        n.r.buckets(root)[0..5],
        [
            v(&[("cents", 44)]),
            Vector::zero(),
            Vector::zero(),
            Vector::zero(),
            v(&[("cents", 31)])
        ]
    );
    assert_eq!(n.violations(), vec![]);
    assert_eq!(n.audit_r(), vec![]);
    // A second checkpoint folds op 5 too and counts every step folded so far.
    let len = n.r.journal_len();
    n.r.checkpoint().unwrap();
    n.persist_all();
    assert_eq!(n.r.folded_steps(), before as u64 + len);
    assert_eq!(n.r.ended().count(), 4);
    let last = n.journal_r.last().cloned().unwrap();
    let (b, rejected) = recover_r(&n, vec![last]);
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(b.buckets(root), n.r.buckets(root));
}

/// The live credit of `r`'s root lineage.
fn next_credit(b: &Branch) -> CreditId {
    b.current(ROOT_CREDIT).unwrap()
}

#[test]
fn a_damaged_foreign_or_disagreeing_checkpoint_is_refused() {
    let mut n = worked(None);
    let cut = n.journal_r.len();
    n.r.checkpoint().unwrap();
    n.persist_all();
    let Some(Step::Checkpoint(record)) = n.journal_r.last().cloned() else {
        panic!("no checkpoint");
    };
    // A flipped byte: the signature no longer verifies.
    let damaged = Step::Checkpoint(Box::new(record.tampered(40)));
    let (_, rejected) = recover_r(&n, vec![damaged.clone()]);
    assert!(
        matches!(
            rejected.as_slice(),
            [(_, LedgerError::Signature(SignatureError::BadSignature))]
        ),
        "{rejected:?}"
    );
    assert_eq!(check::audit(&id("r"), &[damaged], &n.keys)[0].law, "H9");
    // Another branch's checkpoint offered as r's.
    let mut c = Branch::new(id("c"), sk(3), n.keys.clone(), BranchConfig::default());
    c.checkpoint().unwrap();
    let (_, foreign) = c.poll_persist().unwrap();
    let (_, rejected) = recover_r(&n, vec![foreign.clone()]);
    assert!(
        matches!(rejected.as_slice(), [(_, LedgerError::WrongParty { .. })]),
        "{rejected:?}"
    );
    assert_eq!(check::audit(&id("r"), &[foreign], &n.keys)[0].law, "H9");
    // A true checkpoint placed where the history before it says otherwise: one settlement
    // short (the journal without op 2's settle).
    let settle_2 = n.journal_r[..cut]
        .iter()
        .position(|s| matches!(s, Step::Settle { key: k, .. } if *k == key(2)))
        .unwrap();
    let mut wrong: Vec<Step> = n.journal_r[..cut].to_vec();
    wrong.remove(settle_2);
    wrong.push(Step::Checkpoint(record));
    let (_, rejected) = recover_r(&n, wrong.clone());
    assert_eq!(
        rejected.last().map(|r| &r.1),
        Some(&LedgerError::WrongState(
            "checkpoint does not match the journal before it"
        ))
    );
    let found = check::audit(&id("r"), &wrong, &n.keys);
    assert!(
        found
            .iter()
            .any(|v| v.law == "H9" && v.detail.contains("1 operations")),
        "{found:?}"
    );
}

#[test]
fn the_checker_still_disagrees_about_folded_operations() {
    // Released after dispatch (the mutant), then folded: still L6.
    let mut n = Net::new(
        &[("cents", 100)],
        Some(LedgerMutation::ReleaseAfterDispatch),
    );
    n.spend(ROOT_CREDIT, "one", &[("cents", 30)], 1);
    n.run(&Vector::zero(), &mut |to, _| to == &id("g"));
    n.r.release_unsent(key(1)).unwrap();
    n.r.checkpoint().unwrap();
    n.persist_all();
    assert_eq!(n.r.ended().count(), 1);
    let found = n.violations();
    assert!(
        found
            .iter()
            .any(|v| v.law == "L6" && v.detail.contains("released after dispatch")),
        "{found:?}"
    );

    // An effect whose folded operation settled at another charge, and one whose operation
    // ended without effect: L3 for both.
    let mut n = worked(None);
    n.r.checkpoint().unwrap();
    n.persist_all();
    assert_eq!(n.violations(), vec![]);
    let one = n.effects.iter().position(|e| e.key == key(1)).unwrap();
    n.effects[one].charge = v(&[("cents", 21)]);
    let found = n.violations();
    assert!(
        found
            .iter()
            .any(|v| v.law == "L3" && v.detail.contains("folded")),
        "{found:?}"
    );
    n.effects[one].charge = v(&[("cents", 20)]);
    assert_eq!(n.violations(), vec![]);
    n.effects.push(EffectInstance {
        gateway: id("g"),
        payer: id("r"),
        key: key(3),
        charge: Vector::zero(),
        expires: None,
    });
    let found = n.violations();
    assert!(found.iter().any(|v| v.law == "L3"), "{found:?}");
}

#[test]
fn a_checkpoint_makes_room_in_a_full_journal() {
    let mut n = Net::new(&[("cents", 100)], None);
    let limit = 8;
    let config = BranchConfig {
        resend_ms: 100,
        max_journal_steps: limit,
        ..BranchConfig::default()
    };
    n.r = Branch::recover(id("r"), sk(2), n.keys.clone(), config, n.journal_r.clone()).0;
    let mut k = 0;
    let full = loop {
        k += 1;
        let e = n.effect(&format!("op-{k}"), &[("cents", 1)]);
        match n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(k)) {
            Ok(()) => {
                n.r.dispatch(UnixMillis(0), key(k)).unwrap();
                n.run(&v(&[("cents", 1)]), &mut |_, _| false);
            }
            Err(e) => break e,
        }
    };
    assert_eq!(full, LedgerError::JournalFull { limit });
    assert!(n.r.journal_len() >= limit);
    n.r.checkpoint().unwrap();
    n.persist_all();
    assert_eq!(n.r.journal_len(), 1);
    let e = n.effect("after", &[("cents", 1)]);
    n.r.reserve(UnixMillis(0), ROOT_CREDIT, e, &id("g"), key(k))
        .unwrap();
    // k - 1 settled at 1 cent each, 1 reserved now.
    let root = RootId::from_u128(7);
    assert_eq!(n.r.buckets(root)[4], v(&[("cents", k as u64 - 1)]));
    assert_eq!(n.r.buckets(root)[0], v(&[("cents", 100 - k as u64)]));
}

// ---------------------------------------------------------------------------------------
// Permit expiry and gateway pruning.

/// `n` with `r` signing permits valid for `ttl` ms and the gateway forgetting settled
/// acceptances `retain` ms after their permits expired.
fn expiring(n: &mut Net, ttl: u64, retain: u64, mutation: Option<LedgerMutation>) {
    let config = BranchConfig {
        resend_ms: 100,
        permit_ttl_ms: ttl,
        mutation,
        ..BranchConfig::default()
    };
    let (r, rejected) =
        Branch::recover(id("r"), sk(2), n.keys.clone(), config, n.journal_r.clone());
    assert!(rejected.is_empty());
    n.r = r;
    n.g = Gateway::new(id("g"), sk(4), n.keys.clone())
        .with_mutation(mutation)
        .retaining(retain);
}

/// At `now`, `r` spends 10 cents under key 1 and it settles at 6; the dispatches `g` got.
fn settle_one_at(n: &mut Net, now: u64) -> Vec<LedgerMessage> {
    n.now = now;
    n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
    let mut dispatches = Vec::new();
    n.run(&v(&[("cents", 6)]), &mut |to, m| {
        if to == &id("g") && matches!(m, LedgerMessage::Dispatch { .. }) {
            dispatches.push(m.clone());
        }
        false
    });
    dispatches
}

/// Every message `g` sends, drained.
fn sent_by_g(n: &mut Net) -> Vec<LedgerMessage> {
    std::iter::from_fn(|| n.g.poll_transmit().map(|(_, m)| m)).collect()
}

#[test]
fn a_forgotten_acceptance_is_refused_when_replayed_and_never_proven_without_effect() {
    let mut n = Net::new(&[("cents", 100)], None);
    expiring(&mut n, 100, 50, None);
    // Settled at 6 under a permit that expires at 1,100.
    let dispatches = settle_one_at(&mut n, 1_000);
    let binding = n.r.operation(key(1)).unwrap().binding.clone();
    assert_eq!(binding.expires, Some(UnixMillis(1_100)));
    // Not yet: 1,149 - 50 = 1,099 is not past the expiry.
    n.g.handle_timeout(UnixMillis(1_149));
    assert!(n.g.acceptance(&id("r"), key(1)).is_some());
    // At 1,200 the horizon is 1,150: the acceptance is forgotten, durably.
    n.g.handle_timeout(UnixMillis(1_200));
    n.persist_all();
    assert!(n.g.acceptance(&id("r"), key(1)).is_none());
    assert_eq!((n.g.pruned(), n.g.horizon()), (1, UnixMillis(1_150)));
    assert!(matches!(
        n.log_g.last(),
        Some(GatewayRecord::Pruned { horizon: UnixMillis(1_150), keys }) if keys == &[(id("r"), key(1))]
    ));
    // The permit replayed: refused as expired, nothing runs.
    let effects = n.effects.len();
    sent_by_g(&mut n);
    n.g.handle_message(UnixMillis(0), &id("r"), dispatches[0].clone());
    assert_eq!(
        sent_by_g(&mut n),
        vec![LedgerMessage::Refused {
            key: key(1),
            reason: Refusal::Expired
        }]
    );
    assert!(n.g.poll_execute().is_none());
    // A query for it: it may have run, so no proof of no effect — forgotten.
    n.g.handle_message(
        UnixMillis(0),
        &id("r"),
        LedgerMessage::Query {
            key: key(1),
            binding: Box::new(binding.clone()),
        },
    );
    assert_eq!(
        sent_by_g(&mut n),
        vec![LedgerMessage::Refused {
            key: key(1),
            reason: Refusal::Forgotten
        }]
    );
    n.run(&Vector::zero(), &mut |_, _| false);
    assert_eq!(n.effects.len(), effects);
    // The checker finds the effect covered by the settled operation, the log clean.
    assert_eq!(n.violations(), vec![]);
    assert_eq!(check::audit_gateway(&id("g"), &n.log_g, &n.keys), vec![]);
    // Restarted, before its clock has moved, the gateway still refuses the replay: what it
    // forgot expired before its durable horizon.
    let mut g = Gateway::recover(id("g"), sk(4), n.keys.clone(), n.log_g.clone());
    assert_eq!(g.horizon(), UnixMillis(1_150));
    assert!(g.acceptance(&id("r"), key(1)).is_none());
    g.handle_message(UnixMillis(0), &id("r"), dispatches[0].clone());
    assert!(g.poll_execute().is_none());
    assert_eq!(
        g.poll_transmit().map(|(_, m)| m),
        Some(LedgerMessage::Refused {
            key: key(1),
            reason: Refusal::Expired
        })
    );
    // A permit that is still valid goes through; one that is not is refused and its atoms
    // wait for evidence (quarantined).
    n.now = 1_200;
    n.spend(ROOT_CREDIT, "two", &[("cents", 10)], 2);
    n.run(&v(&[("cents", 3)]), &mut |_, _| false);
    assert!(matches!(
        n.r.operation(key(2)).map(|o| &o.state),
        Some(OpState::Settled { .. })
    ));
    n.spend(ROOT_CREDIT, "three", &[("cents", 10)], 3);
    n.g.handle_timeout(UnixMillis(1_301));
    n.run(&Vector::zero(), &mut |_, _| false);
    assert_eq!(
        n.r.operation(key(3)).map(|o| &o.state),
        Some(&OpState::Quarantined)
    );
    let root = RootId::from_u128(7);
    assert_eq!(n.r.buckets(root)[3], v(&[("cents", 10)]));
    assert_eq!(n.r.buckets(root)[4], v(&[("cents", 9)]));
    assert_eq!(n.violations(), vec![]);
}

/// `r` after the schedule of [`forgetting`]: key 1 (expiring at 1,100) and key 2 (at 1,220)
/// settled and folded, the gateway's horizon 1,150 told to `r`, and a checkpoint after it.
fn forgetting(mutation: Option<LedgerMutation>) -> (Net, Vec<LedgerMessage>) {
    let mut n = Net::new(&[("cents", 100)], None);
    expiring(&mut n, 100, 50, mutation);
    settle_one_at(&mut n, 1_000);
    n.now = 1_120;
    n.spend(ROOT_CREDIT, "two", &[("cents", 10)], 2);
    n.run(&v(&[("cents", 3)]), &mut |_, _| false);
    n.r.checkpoint().unwrap();
    n.persist_all();
    assert_eq!(n.r.ended().count(), 2);
    // The gateway forgets key 1 (its permit expired before 1,150), not key 2; it tells `r`
    // only once the record of it is durable.
    n.g.handle_timeout(UnixMillis(1_200));
    assert!(sent_by_g(&mut n).is_empty());
    n.persist_all();
    let told = sent_by_g(&mut n);
    for m in &told {
        n.r.handle_message(UnixMillis(1_200), &id("g"), m.clone());
    }
    n.r.checkpoint().unwrap();
    n.persist_all();
    (n, told)
}

#[test]
fn a_branch_forgets_an_ended_operation_only_behind_its_gateways_horizon() {
    let (mut n, told) = forgetting(None);
    // The instant is the gateway's horizon: what is left of `r` there expires later.
    assert_eq!(
        told,
        vec![LedgerMessage::Horizon {
            horizon: UnixMillis(1_150)
        }]
    );
    let ended: Vec<OpKey> = n.r.ended().map(|e| e.key).collect();
    assert_eq!(ended, vec![key(2)]);
    assert_eq!(
        n.r.horizons().collect::<Vec<_>>(),
        vec![(&id("g"), &UnixMillis(1_150))]
    );
    // The effect of key 1 is covered though neither side remembers it: its permit expired
    // behind both horizons. The journal, checkpoints and all, audits clean.
    assert_eq!(n.violations(), vec![]);
    assert_eq!(n.audit_r(), vec![]);
    // Recovered from the whole journal (each checkpoint checked against the steps before
    // it, forgetting by its own horizons): the same state.
    let config = BranchConfig {
        resend_ms: 100,
        permit_ttl_ms: 100,
        ..BranchConfig::default()
    };
    let (back, rejected) = Branch::recover(
        id("r"),
        sk(2),
        n.keys.clone(),
        config.clone(),
        n.journal_r.clone(),
    );
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(
        back.ended().map(|e| e.key).collect::<Vec<_>>(),
        vec![key(2)]
    );
    // And from its last checkpoint alone.
    let last = n.journal_r.last().cloned().into_iter();
    let (back, rejected) = Branch::recover(id("r"), sk(2), n.keys.clone(), config, last);
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(
        back.ended().map(|e| e.key).collect::<Vec<_>>(),
        vec![key(2)]
    );
    assert_eq!(back.horizons().count(), 1);
    // A horizon from an agent `r` never paid through is refused, and changes nothing.
    while n.r.poll_event().is_some() {}
    n.r.handle_message(
        UnixMillis(1_300),
        &id("m"),
        LedgerMessage::Horizon {
            horizon: UnixMillis(9_999),
        },
    );
    assert!(matches!(n.r.poll_event(), Some(LedgerEvent::Rejected(_))));
    assert_eq!(n.r.horizons().count(), 1);
    // The checker can disagree: an effect whose permit expired at the horizon, not before
    // it, may not have been forgotten.
    let one = n.effects.iter().position(|e| e.key == key(1)).unwrap();
    n.effects[one].expires = Some(UnixMillis(1_150));
    let found = n.violations();
    assert!(
        found
            .iter()
            .any(|v| v.law == "L3" && v.detail.contains("no acceptance")),
        "{found:?}"
    );
}

#[test]
fn forgetting_past_the_horizon_is_found_by_the_checker_and_the_auditor() {
    // The mutant forgets key 2 too, which the gateway still holds: L7 (an acceptance its
    // payer has no record of) and H9 (a checkpoint missing an operation its horizon does
    // not cover).
    let (mut n, _) = forgetting(Some(LedgerMutation::ForgetBeforeHorizon));
    assert_eq!(n.r.ended().count(), 0);
    let found = n.violations();
    assert!(found.iter().any(|v| v.law == "L7"), "{found:?}");
    let audit = n.audit_r();
    assert!(audit.iter().any(|v| v.law == "H9"), "{audit:?}");
}

#[test]
fn a_gateway_that_forgets_takes_only_permits_that_expire() {
    // Permits without expiry (ttl 0) at a gateway that forgets: refused, nothing recorded or
    // run, the atoms quarantined until evidence (a refusal is none).
    let mut n = Net::new(&[("cents", 100)], None);
    expiring(&mut n, 0, 50, None);
    n.now = 1_000;
    n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
    let mut refused = Vec::new();
    n.run(&v(&[("cents", 6)]), &mut |to, m| {
        if to == &id("r") && matches!(m, LedgerMessage::Refused { .. }) {
            refused.push(m.clone());
        }
        false
    });
    assert_eq!(n.r.operation(key(1)).unwrap().binding.expires, None);
    assert!(refused.contains(&LedgerMessage::Refused {
        key: key(1),
        reason: Refusal::NoExpiry
    }));
    assert!(n.g.acceptance(&id("r"), key(1)).is_none());
    assert!(n.effects.is_empty());
    assert!(!n
        .log_g
        .iter()
        .any(|r| matches!(r, GatewayRecord::Accepted { .. })));
    assert_eq!(
        n.r.operation(key(1)).map(|o| &o.state),
        Some(&OpState::Quarantined)
    );
    assert_eq!(n.violations(), vec![]);

    // The same permit at a gateway that keeps everything: accepted, run, settled.
    let mut n = Net::new(&[("cents", 100)], None);
    expiring(&mut n, 0, 50, None);
    n.g = Gateway::new(id("g"), sk(4), n.keys.clone());
    n.now = 1_000;
    n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
    n.run(&v(&[("cents", 6)]), &mut |_, _| false);
    assert!(matches!(
        n.r.operation(key(1)).map(|o| &o.state),
        Some(OpState::Settled { .. })
    ));
    assert_eq!(n.effects.len(), 1);
}

#[test]
fn the_checkers_catch_a_gateway_that_forgets_too_early_or_accepts_the_expired() {
    // Forgetting a settled acceptance before its permit expired: the replay runs again.
    let mut n = Net::new(&[("cents", 100)], Some(LedgerMutation::PruneBeforeExpiry));
    expiring(&mut n, 10_000, 50, Some(LedgerMutation::PruneBeforeExpiry));
    let dispatches = settle_one_at(&mut n, 1_000);
    n.g.handle_timeout(UnixMillis(1_200));
    n.persist_all();
    assert!(n.g.acceptance(&id("r"), key(1)).is_none());
    let found = check::audit_gateway(&id("g"), &n.log_g, &n.keys);
    assert!(found.iter().any(|v| v.law == "G5"), "{found:?}");
    n.g.handle_message(UnixMillis(0), &id("r"), dispatches[0].clone());
    n.run(&v(&[("cents", 6)]), &mut |_, _| false);
    assert_eq!(n.effects.len(), 2, "the replay ran");
    let found = n.violations();
    assert!(found.iter().any(|v| v.law == "L3"), "{found:?}");
    let found = check::audit_gateway(&id("g"), &n.log_g, &n.keys);
    assert!(found.iter().any(|v| v.law == "G3"), "{found:?}");

    // Accepting an expired permit after a horizon past its expiry.
    let mut n = Net::new(
        &[("cents", 100)],
        Some(LedgerMutation::GatewayAcceptsExpired),
    );
    expiring(&mut n, 100, 50, Some(LedgerMutation::GatewayAcceptsExpired));
    n.now = 1_000;
    n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
    n.run(&v(&[("cents", 6)]), &mut |_, _| false);
    n.g.handle_timeout(UnixMillis(1_200)); // Horizon 1,150.
    n.spend(ROOT_CREDIT, "two", &[("cents", 10)], 2); // Expires 1,100: long gone.
    n.run(&v(&[("cents", 6)]), &mut |_, _| false);
    let found = check::audit_gateway(&id("g"), &n.log_g, &n.keys);
    assert!(found.iter().any(|v| v.law == "G6"), "{found:?}");
}

#[test]
fn a_gateway_checkpoint_keeps_what_is_live_and_refuses_what_does_not_match() {
    let mut n = Net::new(&[("cents", 100)], None);
    expiring(&mut n, 100, 50, None);
    // Key 1 settled and forgotten, key 2 settled and kept, key 3 accepted, not yet run;
    // a fence on another credit.
    n.now = 1_000;
    n.spend(ROOT_CREDIT, "one", &[("cents", 10)], 1);
    n.run(&v(&[("cents", 6)]), &mut |_, _| false);
    n.g.handle_timeout(UnixMillis(1_200));
    n.now = 1_200;
    n.spend(ROOT_CREDIT, "two", &[("cents", 10)], 2);
    n.run(&v(&[("cents", 4)]), &mut |_, _| false);
    n.spend(ROOT_CREDIT, "three", &[("cents", 10)], 3);
    n.persist_all();
    let permit = n.r.poll_transmit().map(|(_, m)| m).unwrap();
    n.g.handle_message(UnixMillis(0), &id("r"), permit);
    n.persist_all();
    let running = n.g.poll_execute().unwrap();
    assert_eq!(running.key, key(3));
    let before = n.log_g.len();
    assert_eq!(n.g.checkpoint(), before as u64);
    n.persist_all();
    let compacted = n.log_g[before..].to_vec();
    assert!(matches!(
        compacted.as_slice(),
        [GatewayRecord::Checkpoint(_)]
    ));
    let g = Gateway::recover_checked(id("g"), sk(4), n.keys.clone(), compacted.clone()).unwrap();
    // What is live came back: key 2 receipted, key 3 to be resumed; key 1 stays forgotten
    // and the horizon with it.
    assert!(g.acceptance(&id("r"), key(1)).is_none());
    assert!(matches!(
        g.acceptance(&id("r"), key(2)).map(|a| &a.state),
        Some(AcceptanceState::Done(_))
    ));
    assert_eq!(
        g.acceptance(&id("r"), key(3)).map(|a| &a.state),
        Some(&AcceptanceState::Accepted)
    );
    assert_eq!(
        (g.horizon(), g.folded_records()),
        (UnixMillis(1_150), before as u64)
    );
    let mut g = g;
    assert_eq!(
        g.poll_execute().map(|e| (e.key, e.resume)),
        Some((key(3), true))
    );
    assert_eq!(check::audit_gateway(&id("g"), &compacted, &n.keys), vec![]);
    assert_eq!(check::audit_gateway(&id("g"), &n.log_g, &n.keys), vec![]);
    // The whole log recovers to the same; so does one whose checkpoint is damaged — not.
    assert!(Gateway::recover_checked(id("g"), sk(4), n.keys.clone(), n.log_g.clone()).is_ok());
    let GatewayRecord::Checkpoint(record) = &compacted[0] else {
        unreachable!()
    };
    let damaged = vec![GatewayRecord::Checkpoint(Box::new(record.tampered(30)))];
    assert!(matches!(
        Gateway::recover_checked(id("g"), sk(4), n.keys.clone(), damaged.clone()),
        Err(LedgerError::Signature(_))
    ));
    assert_eq!(
        check::audit_gateway(&id("g"), &damaged, &n.keys)[0].law,
        "G7"
    );
    // A true checkpoint after a log missing key 2's receipt: refused, and G7.
    let mut wrong = n.log_g[..before].to_vec();
    let receipt_2 = wrong
        .iter()
        .position(|r| matches!(r, GatewayRecord::Receipt { receipt, .. } if receipt.peek().unwrap().key == key(2)))
        .unwrap();
    wrong.remove(receipt_2);
    wrong.push(compacted[0].clone());
    assert_eq!(
        Gateway::recover_checked(id("g"), sk(4), n.keys.clone(), wrong.clone()).err(),
        Some(LedgerError::WrongState(
            "gateway checkpoint does not match the log before it"
        ))
    );
    let found = check::audit_gateway(&id("g"), &wrong, &n.keys);
    assert!(found.iter().any(|v| v.law == "G7"), "{found:?}");
    // An acceptance whose permit its payer never signed (m forged it): G3 in the log;
    // checkpointed, the row is G7 — recovery trusts its own signed rows, the auditor
    // verifies each again.
    let op = n.r.operation(key(2)).unwrap();
    let binding = Binding {
        key: key(9),
        ..op.binding.clone()
    };
    let forged = Signed::sign(
        &Permit {
            binding: binding.clone(),
            footprint: op.footprint.clone(),
        },
        &id("m"),
        &sk(5),
    );
    let accepted = GatewayRecord::Accepted {
        binding: Box::new(binding),
        permit: forged,
        effect: op.effect.clone(),
    };
    let found = check::audit_gateway(&id("g"), std::slice::from_ref(&accepted), &n.keys);
    assert!(found.iter().any(|v| v.law == "G3"), "{found:?}");
    let mut g = Gateway::recover(id("g"), sk(4), n.keys.clone(), vec![accepted]);
    g.checkpoint();
    let (_, record) = g.poll_persist().unwrap();
    let found = check::audit_gateway(&id("g"), &[record], &n.keys);
    assert!(
        found
            .iter()
            .any(|v| v.law == "G7" && v.detail.contains("without its payer's permit")),
        "{found:?}"
    );
}

/// Signatures verified together are remembered only when they hold: handling the message
/// after opens the good ones from memory and still refuses the bad ones.
#[test]
fn signatures_verified_together_are_remembered_only_when_they_hold() {
    let keys = Keyring::new([
        (id("r"), sk(2).verifying_key()),
        (id("g"), sk(4).verifying_key()),
    ]);
    let fence = |epoch| Fence {
        root: RootId::from_u128(7),
        credit: ROOT_CREDIT,
        epoch,
        holder: id("r"),
    };
    let good = Signed::sign(&fence(1), &id("r"), &sk(2));
    let also_good = Signed::sign(&fence(2), &id("r"), &sk(2));
    // Claims r, signed with g's key.
    let forged = Signed::sign(&fence(3), &id("r"), &sk(4));
    // A signer the keyring does not know.
    let stranger = Signed::sign(&fence(4), &id("x"), &sk(9));
    let messages = vec![
        LedgerMessage::Fence(good.clone()),
        LedgerMessage::Pending {
            key: OpKey::from_u128(1),
        },
        LedgerMessage::Fence(forged.clone()),
        LedgerMessage::Fence(stranger.clone()),
        LedgerMessage::Fence(good.clone()),
        LedgerMessage::Fence(also_good.clone()),
    ];
    assert_eq!(
        keys.verify_together(&messages),
        2,
        "the two good ones, once each"
    );
    assert_eq!(
        keys.verify_together(&messages),
        0,
        "remembered: nothing to verify again"
    );
    assert_eq!(keys.open(&good, &id("r")).unwrap(), fence(1));
    assert_eq!(keys.open(&also_good, &id("r")).unwrap(), fence(2));
    assert_eq!(
        keys.open(&forged, &id("r")),
        Err(SignatureError::BadSignature)
    );
    assert!(keys.open(&stranger, &id("x")).is_err());
    // A clone shares the memory (a branch or gateway made with it).
    assert_eq!(keys.clone().verify_together(&messages[..1]), 0);
}
