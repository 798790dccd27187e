//! The conservation checker, L1–L7 of docs/DESIGN.md ("The ledger: the rules").
//!
//! It is written apart from the ledger's transitions: it reads what the branches and
//! gateways hold durably (through their read accessors) and the effects that actually ran,
//! and recomputes everything with its own interval arithmetic on raw atom ranges — never
//! with the ledger's own `take`, `union` or `subtract`, so a bug there cannot hide itself.
//! Signed evidence is verified again with the keyring.

use std::collections::BTreeMap;
use std::fmt;

use abhyasa_wire::ledger::*;
use abhyasa_wire::AgentId;

use crate::{Branch, Gateway, GatewayRecord, Keyring, Step};
use facts::Facts;
mod atoms;
mod audit;
mod facts;
mod laws;
pub use audit::{audit, audit_gateway};
use laws::confirms;

/// One effect that really happened at a gateway (the executor's own record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectInstance {
    /// Where it ran.
    pub gateway: AgentId,
    /// Whose operation it ran for (keys are scoped per payer).
    pub payer: AgentId,
    /// The operation key it ran under.
    pub key: OpKey,
    /// What it charged.
    pub charge: Vector,
    /// When its permit expired, as the gateway told the executor ([`Execute::expires`]);
    /// `None` when it had none or the record does not say. Only an effect whose permit
    /// expired may have every record of it forgotten (its gateway's and its payer's).
    ///
    /// [`Execute::expires`]: crate::Execute::expires
    pub expires: Option<abhyasa_wire::UnixMillis>,
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which: `L1` … `L7`.
    pub law: &'static str,
    /// What was found.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.law, self.detail)
    }
}

/// Everything the checker reads.
pub struct World<'a> {
    /// Every branch's durable state.
    pub branches: &'a [&'a Branch],
    /// Every gateway's durable state.
    pub gateways: &'a [&'a Gateway],
    /// Every effect that ran.
    pub effects: &'a [EffectInstance],
    /// Keys of issuers, branches and gateways.
    pub keys: &'a Keyring,
}

/// Runs every check; returns what is broken (empty when all hold).
///
/// First the facts every law reads are gathered from the durable states alone
/// ([`facts::Facts::gather`]: what each branch holds and at what risk, the delegation edges, the
/// operations, acceptances and receipts by key); then each law is one function over them.
pub fn check(w: &World<'_>) -> Vec<Violation> {
    let facts = Facts::gather(w);
    let mut found = Found::default();
    laws::l1_exact_partition(w, &facts, &mut found);
    laws::l2_one_settlement(w, &facts, &mut found);
    laws::l3_effects_covered(w, &facts, &mut found);
    laws::l4_escrow_and_budget(w, &facts, &mut found);
    laws::l5_no_amplification(w, &facts, &mut found);
    laws::l6_evidence(w, &mut found);
    laws::l7_paid_from_own_escrow(w, &facts, &mut found);
    found.0
}

/// The violations found so far.
#[derive(Default)]
struct Found(Vec<Violation>);

impl Found {
    fn bad(&mut self, law: &'static str, detail: String) {
        self.0.push(Violation { law, detail });
    }
}
