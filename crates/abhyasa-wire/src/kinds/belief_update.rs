//! `phala.belief_update` on the wire: the payload, its checks and its words. Its rules are
//! `abhyasa_custody::kinds::PhalaBeliefUpdate`'s.

use serde::{Deserialize, Serialize};

use crate::ids::{UnixMillis, WeightKey};
use crate::WireError;

/// A signed weight change in millionths: `-1_000_000..=1_000_000` stands for `[-1, 1]`.
///
/// Fixed point keeps clipping exact and every replica's arithmetic identical.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct WeightDelta(pub i32);

impl WeightDelta {
    /// The value standing for 1.0.
    pub const ONE: i32 = 1_000_000;
}

/// Phala belief update: move a preference weight.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BeliefUpdatePayload {
    /// Which preference weight.
    pub weight_key: WeightKey,
    /// The change; negative is corrective.
    pub weight_delta: WeightDelta,
    /// How long the update stays meaningful, in milliseconds from the obligation's
    /// `created_at` (at least 1): the weight change lapses then, on the agent's side and on
    /// the principal's (a down-weight applied as the fail-safe lapses with it).
    pub ttl_ms: u64,
}

impl BeliefUpdatePayload {
    /// When the change lapses for an obligation created at `created_at`: the first moment
    /// it no longer applies (saturating: a `ttl_ms` past the end of time never lapses).
    pub fn lapses_at(&self, created_at: UnixMillis) -> UnixMillis {
        created_at.saturating_add(self.ttl_ms)
    }
}

impl BeliefUpdatePayload {
    /// The rules typing alone does not capture: a delta within [-1, 1], a lifetime.
    pub(crate) fn validate(&self) -> Result<(), WireError> {
        if !(-WeightDelta::ONE..=WeightDelta::ONE).contains(&self.weight_delta.0) {
            return Err(WireError::Invalid("weight_delta outside [-1, 1]"));
        }
        if self.ttl_ms == 0 {
            return Err(WireError::Invalid(
                "ttl_ms is zero: the update would never hold",
            ));
        }
        Ok(())
    }

    /// What the payload says: `supplier/acme -0.25`.
    pub(crate) fn words(&self) -> String {
        format!(
            "{} {}",
            self.weight_key,
            crate::words::delta(i64::from(self.weight_delta.0))
        )
    }
}
