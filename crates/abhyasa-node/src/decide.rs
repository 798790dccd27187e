//! What an enforcement point asks a principal's node, and the answer: the node as the decision
//! point that proxies, authorization servers and tools consult (`abhyasa-enforce` serves it
//! over HTTP as RFC 7662 introspection and an nginx `auth_request` / Envoy `ext_authz` check).
//!
//! The answer comes from the custodian's principal-side state, which a revocation changes the
//! moment it is issued — before it is durable, before any agent acks it — and which an
//! escalation's safe action re-asserts. So a refusal never waits on the network.

use abhyasa_wire::{AgentId, ObligationId, Outcome, Scope, TokenId, UnixMillis};

/// A question for the principal's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// May `agent` exercise `scope`, an authority this node mediates?
    Scope {
        /// The agent.
        agent: AgentId,
        /// The scope.
        scope: Scope,
    },
    /// Does this node still honour `token`?
    Token(TokenId),
}

/// Where the obligation that carried a decision stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Carried {
    /// Still under custody: the agent has not yet acked it.
    Pending {
        /// Attempts made so far.
        attempts: u32,
    },
    /// Ended with this outcome (`Escalated`: the agent was not reached by its deadline, and
    /// the safe action stands on this side).
    Ended(Outcome),
    /// Not known here any more (its record was pruned) or never named.
    Unknown,
}

/// A refusal: the decision in force, and the obligation that carried it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The obligation whose decision stands (`None` for a decision recorded before names
    /// were kept).
    pub obligation: Option<ObligationId>,
    /// Where that obligation stands.
    pub carried: Carried,
    /// For a token: until when the refusal is recorded (the token's own expiry; `None`: for
    /// good).
    pub until: Option<UnixMillis>,
    /// For a scope granted with a lease that has ended: when it ended (the grant, named by
    /// `obligation`, stands, but its authority lapsed; a renewal reopens it).
    pub lease_ended: Option<UnixMillis>,
}

/// The node's answer to an [`Ask`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A decision of this node refuses it.
    Refuse(Refusal),
    /// This node decided, and allows it (a scope granted, confirmed and not withheld since,
    /// its lease running), naming the obligation of the grant.
    Allow {
        /// The grant's obligation.
        obligation: Option<ObligationId>,
        /// When the grant's lease ends (`None`: no lease).
        until: Option<UnixMillis>,
    },
    /// No decision of this node concerns it: the node neither allows nor refuses (an
    /// introspection endpoint then asks its upstream; a proxy check lets it through).
    NotGoverned,
}

impl Verdict {
    /// Whether it refuses.
    pub fn refuses(&self) -> bool {
        matches!(self, Verdict::Refuse(_))
    }
}

impl std::fmt::Display for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Carried::Pending { .. } => f.write_str("pending"),
            Carried::Ended(Outcome::Applied) => f.write_str("applied"),
            Carried::Ended(Outcome::Declined(_)) => f.write_str("declined"),
            Carried::Ended(Outcome::Escalated(_)) => f.write_str("escalated"),
            Carried::Ended(Outcome::BestEffort) => f.write_str("best-effort"),
            Carried::Unknown => f.write_str("unknown"),
        }
    }
}
