//! The built-in kinds on the wire, one module each: the payload, the checks typing alone does
//! not capture, and its words. Each kind's rules are in `abhyasa_custody::kinds` under the same
//! module name; a kind defined elsewhere gives the same in one module of its own
//! ([`WireKind`](crate::WireKind) and `abhyasa_custody::kinds::KindRules`).

mod belief_update;
mod consent;
mod token;

pub use belief_update::{BeliefUpdatePayload, WeightDelta};
pub use consent::{ConsentDecision, ConsentPayload};
pub use token::{TokenAction, TokenPayload};
