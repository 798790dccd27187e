//! The obligation: an id, a kind, who must honour it, a typed payload and a fixed deadline.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{AgentId, ObligationId, UnixMillis};
use crate::kinds::{BeliefUpdatePayload, ConsentPayload, TokenPayload};
use crate::registered::{RegisteredError, RegisteredPayload};
use crate::WireError;

/// The largest attempt budget an obligation may carry.
pub const MAX_RETRIES_LIMIT: u32 = 1_000;

/// One governance obligation.
///
/// The `kind` on the wire is derived from the payload, so the two can never disagree.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Obligation {
    /// Unique per issuer; the idempotency key everywhere.
    pub id: ObligationId,
    /// The custodian's agent id.
    pub issuer: AgentId,
    /// The agent that must honour the obligation.
    pub target: AgentId,
    /// When the obligation was issued.
    pub created_at: UnixMillis,
    /// Fixed at issue; never moves.
    pub deadline: UnixMillis,
    /// Attempt budget after the first attempt.
    pub max_retries: u32,
    /// Issuance sequence per governed key; a receiver declines one that is not newer than the
    /// last it applied on that key.
    pub sequence: Option<u64>,
    /// The typed, per-kind content.
    pub payload: Payload,
}

impl Obligation {
    /// The obligation's kind, from its payload.
    pub fn kind(&self) -> Kind {
        self.payload.kind()
    }

    /// Checks the rules that typing alone does not capture.
    pub fn validate(&self) -> Result<(), WireError> {
        if self.deadline <= self.created_at {
            return Err(WireError::Invalid("deadline is not after created_at"));
        }
        if self.max_retries > MAX_RETRIES_LIMIT {
            return Err(WireError::Invalid("max_retries over the limit"));
        }
        self.payload.validate()
    }

    /// The digest of the whole obligation (its deterministic CBOR): what a receiver keeps with
    /// an applied id, so that a different obligation under a known id is told apart.
    pub fn digest(&self) -> crate::Digest {
        Self::digest_of_encoded(&crate::encode(self))
    }

    /// [`digest`](Self::digest) from the obligation's encoding as [`encode`](crate::encode)
    /// wrote it (deterministic: the same obligation, the same bytes).
    pub fn digest_of_encoded(encoded: &[u8]) -> crate::Digest {
        crate::Digest::of(&[b"abhyasa/v1/obligation", encoded])
    }

    /// The envelope: what a receiver needs to decline an obligation it cannot read.
    pub fn envelope(&self) -> Envelope {
        Envelope {
            id: self.id,
            kind: self.kind().as_str().to_owned(),
            issuer: self.issuer.clone(),
            target: self.target.clone(),
            deadline: self.deadline,
        }
    }
}

/// The kinds this build knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `anumati.consent`: grant or revoke a consent scope.
    AnumatiConsent,
    /// `phala.belief_update`: adjust a preference weight.
    PhalaBeliefUpdate,
    /// `oauth.token`: revoke or issue a token.
    OauthToken,
    /// A kind registered by another crate ([`crate::KindEntry`]), by its wire name.
    Registered(&'static str),
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 3] = [
        Kind::AnumatiConsent,
        Kind::PhalaBeliefUpdate,
        Kind::OauthToken,
    ];

    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::AnumatiConsent => "anumati.consent",
            Kind::PhalaBeliefUpdate => "phala.belief_update",
            Kind::OauthToken => "oauth.token",
            Kind::Registered(name) => name,
        }
    }

    /// Parses a wire name: one of [`ALL`](Self::ALL), or a kind registered once.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .or_else(|| crate::KindEntry::find(name).map(|e| Kind::Registered(e.name())))
    }

    /// Every kind this build reads: [`ALL`](Self::ALL), then the registered kinds by name.
    pub fn known() -> Vec<Kind> {
        let registered = crate::KindEntry::names().into_iter();
        Kind::ALL
            .into_iter()
            .chain(registered.filter_map(Kind::from_name))
            .collect()
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Kind::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format_args!("unknown kind {name:?}")))
    }
}

/// The typed content of an obligation, one variant per kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    /// `anumati.consent`.
    AnumatiConsent(ConsentPayload),
    /// `phala.belief_update`.
    PhalaBeliefUpdate(BeliefUpdatePayload),
    /// `oauth.token`.
    OauthToken(TokenPayload),
    /// A registered kind's ([`crate::KindEntry`]).
    Registered(RegisteredPayload),
}

impl Payload {
    /// The kind this payload belongs to.
    pub fn kind(&self) -> Kind {
        match self {
            Payload::AnumatiConsent(_) => Kind::AnumatiConsent,
            Payload::PhalaBeliefUpdate(_) => Kind::PhalaBeliefUpdate,
            Payload::OauthToken(_) => Kind::OauthToken,
            Payload::Registered(p) => Kind::Registered(p.kind()),
        }
    }

    fn validate(&self) -> Result<(), WireError> {
        match self {
            Payload::AnumatiConsent(p) => p.validate(),
            Payload::PhalaBeliefUpdate(p) => p.validate(),
            Payload::OauthToken(_) => Ok(()),
            // Checked when it was read or built (`RegisteredPayload::new`).
            Payload::Registered(_) => Ok(()),
        }
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Payload::AnumatiConsent(p) => p.serialize(serializer),
            Payload::PhalaBeliefUpdate(p) => p.serialize(serializer),
            Payload::OauthToken(p) => p.serialize(serializer),
            Payload::Registered(p) => p.serialize(serializer),
        }
    }
}

/// What can be read of an obligation whose kind or payload cannot: enough to decline it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The obligation id.
    pub id: ObligationId,
    /// The kind as received.
    pub kind: String,
    /// The issuer.
    pub issuer: AgentId,
    /// The target.
    pub target: AgentId,
    /// The deadline.
    pub deadline: UnixMillis,
}

#[derive(Serialize)]
struct ObligationOut<'a> {
    id: &'a ObligationId,
    kind: Kind,
    issuer: &'a AgentId,
    target: &'a AgentId,
    created_at: UnixMillis,
    deadline: UnixMillis,
    max_retries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    sequence: Option<u64>,
    payload: &'a Payload,
}

impl Serialize for Obligation {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ObligationOut {
            id: &self.id,
            kind: self.kind(),
            issuer: &self.issuer,
            target: &self.target,
            created_at: self.created_at,
            deadline: self.deadline,
            max_retries: self.max_retries,
            sequence: self.sequence,
            payload: &self.payload,
        }
        .serialize(serializer)
    }
}

/// The obligation as read before its kind is known.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawObligation {
    id: ObligationId,
    kind: String,
    issuer: AgentId,
    target: AgentId,
    created_at: UnixMillis,
    deadline: UnixMillis,
    max_retries: u32,
    #[serde(default)]
    sequence: Option<u64>,
    payload: ciborium::Value,
}

impl RawObligation {
    /// Resolves the kind and its payload, keeping the envelope for typed errors.
    pub(crate) fn resolve(mut self) -> Result<Obligation, WireError> {
        use ciborium::Value::Null;
        // The envelope is built only for an error: the ids it copies are not needed otherwise.
        let envelope = |o: &RawObligation| Envelope {
            id: o.id,
            kind: o.kind.clone(),
            issuer: o.issuer.clone(),
            target: o.target.clone(),
            deadline: o.deadline,
        };
        let Some(kind) = Kind::from_name(&self.kind) else {
            return Err(WireError::UnknownKind(Box::new(envelope(&self))));
        };
        let payload = match kind {
            Kind::AnumatiConsent => self.payload.deserialized().map(Payload::AnumatiConsent),
            Kind::PhalaBeliefUpdate => self.payload.deserialized().map(Payload::PhalaBeliefUpdate),
            Kind::OauthToken => self.payload.deserialized().map(Payload::OauthToken),
            Kind::Registered(name) => {
                match RegisteredPayload::read(name, std::mem::replace(&mut self.payload, Null)) {
                    Ok(p) => Ok(Payload::Registered(p)),
                    Err(RegisteredError::NotRegistered) => {
                        return Err(WireError::UnknownKind(Box::new(envelope(&self))))
                    }
                    Err(RegisteredError::Malformed(detail)) => {
                        return Err(WireError::MalformedPayload {
                            envelope: Box::new(envelope(&self)),
                            detail,
                        })
                    }
                }
            }
        };
        let payload = match payload {
            Ok(p) => p,
            Err(e) => {
                return Err(WireError::MalformedPayload {
                    envelope: Box::new(envelope(&self)),
                    detail: e.to_string(),
                })
            }
        };
        let obligation = Obligation {
            id: self.id,
            issuer: self.issuer,
            target: self.target,
            created_at: self.created_at,
            deadline: self.deadline,
            max_retries: self.max_retries,
            sequence: self.sequence,
            payload,
        };
        match obligation.validate() {
            Ok(()) => Ok(obligation),
            Err(e) => Err(WireError::MalformedPayload {
                envelope: Box::new(Envelope {
                    id: obligation.id,
                    kind: self.kind,
                    issuer: obligation.issuer,
                    target: obligation.target,
                    deadline: obligation.deadline,
                }),
                detail: e.to_string(),
            }),
        }
    }
}

impl<'de> Deserialize<'de> for Obligation {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RawObligation::deserialize(deserializer)?
            .resolve()
            .map_err(serde::de::Error::custom)
    }
}
