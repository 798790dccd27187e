//! `anumati.consent` on the wire: the payload, its checks and its words. Its rules are
//! `abhyasa_custody::kinds::AnumatiConsent`'s.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{Scope, UnixMillis};
use crate::WireError;

/// Anumati consent: a decision on a scope.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConsentPayload {
    /// The decision; missing or unrecognized is treated as restrictive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ConsentDecision>,
    /// The scope the decision is about.
    pub scope: Scope,
    /// A grant's lease: the authority it opens lapses at this time unless a later grant
    /// renews it (custody paper §4.1, bounded autonomy). Only a grant carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
}

/// A consent decision.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConsentDecision {
    /// `grant`: permissive, so inadmissible (best-effort).
    Grant,
    /// `revoke`: restrictive.
    Revoke,
    /// Any other word: kept as received and treated as restrictive.
    Unrecognized(String),
}

impl Serialize for ConsentDecision {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            ConsentDecision::Grant => "grant",
            ConsentDecision::Revoke => "revoke",
            ConsentDecision::Unrecognized(word) => word,
        })
    }
}

impl<'de> Deserialize<'de> for ConsentDecision {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let word = String::deserialize(deserializer)?;
        if word.len() > 64 {
            return Err(serde::de::Error::custom("consent decision over 64 bytes"));
        }
        Ok(match word.as_str() {
            "grant" => ConsentDecision::Grant,
            "revoke" => ConsentDecision::Revoke,
            _ => ConsentDecision::Unrecognized(word),
        })
    }
}

impl ConsentPayload {
    /// The rules typing alone does not capture: only a grant carries a lease.
    pub(crate) fn validate(&self) -> Result<(), WireError> {
        if self.expires_at.is_some() && self.decision != Some(ConsentDecision::Grant) {
            return Err(WireError::Invalid(
                "a lease on a consent that is not a grant",
            ));
        }
        Ok(())
    }

    /// What the payload says: `revoke calendar.read`.
    pub(crate) fn words(&self) -> String {
        let decision = match &self.decision {
            Some(ConsentDecision::Grant) => "grant".to_owned(),
            Some(ConsentDecision::Revoke) => "revoke".to_owned(),
            Some(ConsentDecision::Unrecognized(d)) => format!("{d:?}"),
            None => "(no decision)".to_owned(),
        };
        format!("{decision} {}", self.scope)
    }
}
