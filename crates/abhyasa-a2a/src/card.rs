//! The AgentCard and its Abhyasa extension (`capabilities.extensions[]`, docs/A2A.md).
//!
//! The card follows A2A v1.0 (`supportedInterfaces`, camelCase); the extension's `params` are
//! the reference implementation's `AbhyasaServiceRef` (snake_case), with our additions.

use std::collections::BTreeMap;

use abhyasa_wire::Kind;
use serde::{Deserialize, Serialize};

/// The extension's URI: the reference implementation's constant, so its parser finds ours.
pub const EXTENSION_URI: &str = "https://ravikiran438.github.io/abhyasa-protocol/v1";

/// The version of the extension's parameters we write.
pub const PARAMS_VERSION: &str = "1.0.0";

/// Where the card is served.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// The path of the custody-ack endpoint.
pub const ACK_PATH: &str = "/abhyasa/v1/custody-ack";
/// A2A `message:send` of the HTTP+JSON binding (obligations as parts, acks on the reply).
pub const MESSAGE_SEND_PATH: &str = "/message:send";

/// The path of `kind`'s obligation endpoint.
pub fn obligation_path(kind: Kind) -> String {
    format!("/abhyasa/v1/obligations/{}", kind.as_str())
}

/// An A2A v1.0 AgentCard, with the fields this binding writes and reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    /// The agent's name (its agent id).
    pub name: String,
    /// What it is.
    pub description: String,
    /// The agent's software version.
    pub version: String,
    /// How to reach it.
    pub supported_interfaces: Vec<AgentInterface>,
    /// What it can do, with the Abhyasa extension.
    pub capabilities: AgentCapabilities,
    /// Media types it takes.
    pub default_input_modes: Vec<String>,
    /// Media types it returns.
    pub default_output_modes: Vec<String>,
    /// Its skills.
    #[serde(default)]
    pub skills: Vec<AgentSkill>,
}

/// One way to reach the agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    /// The URL.
    pub url: String,
    /// `HTTP+JSON`, `JSONRPC`, `GRPC`.
    pub protocol_binding: String,
    /// The A2A protocol version.
    pub protocol_version: String,
}

/// The card's capabilities.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// Extensions the agent supports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<AgentExtension>,
}

/// An A2A `AgentExtension`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentExtension {
    /// Which extension.
    pub uri: String,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether a client must speak it.
    #[serde(default)]
    pub required: bool,
    /// Its parameters (for ours: [`AbhyasaParams`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Value>,
}

/// A skill on the card.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Tags.
    pub tags: Vec<String>,
}

/// The Abhyasa extension's parameters (the reference's `AbhyasaServiceRef`, plus ours).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbhyasaParams {
    /// Semver of these parameters.
    pub version: String,
    /// Where this agent, as principal, takes asynchronous acks.
    pub custody_ack_endpoint: String,
    /// One profile per kind it takes under custody (at least one).
    pub supported_kinds: Vec<KindProfile>,
    /// Ours: the node's MOQT endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moqt_endpoint: Option<String>,
    /// Ours: the node's MCP endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_endpoint: Option<String>,
}

/// How obligations of one kind are taken.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KindProfile {
    /// The kind's wire name.
    pub kind: String,
    /// Where to POST them.
    pub obligation_endpoint: String,
    /// The deadline the profile is made for, seconds (> 0).
    pub deadline_seconds: u64,
    /// The retry budget (must span the deadline).
    pub max_retries: u32,
    /// `"exponential"`.
    pub backoff: String,
    /// First backoff ceiling, seconds (> 0).
    #[serde(default = "one")]
    pub backoff_base_seconds: f64,
    /// Largest backoff ceiling, seconds (> 0).
    pub backoff_cap_seconds: u64,
}

fn one() -> f64 {
    1.0
}

/// Why a card or a profile is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CardError {
    /// The card does not parse.
    #[error("the card does not parse: {0}")]
    Parse(String),
    /// The card carries no Abhyasa extension.
    #[error("the card carries no extension {EXTENSION_URI}")]
    NoExtension,
    /// The card carries the extension twice.
    #[error("the card carries the Abhyasa extension more than once")]
    TwoExtensions,
    /// The extension's parameters do not parse.
    #[error("the Abhyasa extension's params do not parse: {0}")]
    Params(String),
    /// No profile.
    #[error("the Abhyasa extension lists no supported kind")]
    NoKinds,
    /// A kind listed twice.
    #[error("kind {0} is listed twice")]
    DuplicateKind(String),
    /// A field out of range.
    #[error("profile for {kind}: {what}")]
    Invalid {
        /// The kind.
        kind: String,
        /// What is wrong.
        what: &'static str,
    },
    /// The retry budget is over the wire's limit.
    #[error("profile for {kind}: max_retries {max_retries} is over the limit of {limit}")]
    OverLimit {
        /// The kind.
        kind: String,
        /// What it has.
        max_retries: u32,
        /// The wire's limit.
        limit: u32,
    },
    /// No budget within the wire's limit spans the deadline with this backoff.
    #[error(
        "profile for {kind}: a {deadline_seconds} s deadline with a {cap_seconds} s backoff cap \
         needs {needed} retries, over the limit of {limit}; raise the backoff cap ([custody] \
         backoff_cap_ms) to at least {least_cap_seconds} s, or shorten the deadline ([a2a] \
         deadline_seconds.{kind})"
    )]
    CannotSpan {
        /// The kind.
        kind: String,
        /// Its deadline.
        deadline_seconds: u64,
        /// The backoff cap.
        cap_seconds: u64,
        /// What the rule needs.
        needed: u32,
        /// The wire's limit.
        limit: u32,
        /// The least cap, in whole seconds, under which the rule fits the limit.
        least_cap_seconds: u64,
    },
    /// The retry budget does not span the deadline.
    #[error(
        "profile for {kind}: max_retries {max_retries} does not span its {deadline_seconds} s \
         deadline; it needs at least {needed}"
    )]
    BudgetTooSmall {
        /// The kind.
        kind: String,
        /// Its deadline.
        deadline_seconds: u64,
        /// What it has.
        max_retries: u32,
        /// What it needs.
        needed: u32,
    },
}

/// The wire's own limit on `max_retries`.
const RETRIES_LIMIT: u32 = abhyasa_wire::MAX_RETRIES_LIMIT;

/// The retry rule (docs/DESIGN.md, "On the wire"): the smallest `n` with
/// `Σ_{k=1..n} min(cap, base·2^(k−1)) ≥ deadline`, in seconds (custody's
/// [`profile_retries`](abhyasa_custody::profile_retries), in milliseconds).
pub fn retries_needed(deadline_seconds: u64, base_seconds: f64, cap_seconds: u64) -> u32 {
    abhyasa_custody::profile_retries(
        deadline_seconds.saturating_mul(1_000),
        seconds_to_ms(base_seconds),
        cap_seconds.saturating_mul(1_000),
    )
}

/// The least backoff cap, in whole seconds, under which the retry rule for
/// `deadline_seconds` needs at most the wire's limit of retries.
pub fn least_cap_seconds(deadline_seconds: u64, base_seconds: f64) -> u64 {
    let (mut lo, mut hi) = (1u64, deadline_seconds.max(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if retries_needed(deadline_seconds, base_seconds, mid) <= RETRIES_LIMIT {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Seconds (a positive, finite number) to whole milliseconds, at least 1.
pub fn seconds_to_ms(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        ((s * 1_000.0).round() as u64).max(1)
    } else {
        1
    }
}

impl KindProfile {
    /// The profile of `kind` for a deadline of `deadline_seconds`, with the least retry budget
    /// that spans it.
    pub fn spanning(
        kind: Kind,
        endpoint: String,
        deadline_seconds: u64,
        base_seconds: f64,
        cap_seconds: u64,
    ) -> Self {
        Self {
            kind: kind.as_str().to_owned(),
            obligation_endpoint: endpoint,
            deadline_seconds,
            max_retries: retries_needed(deadline_seconds, base_seconds, cap_seconds),
            backoff: "exponential".into(),
            backoff_base_seconds: base_seconds,
            backoff_cap_seconds: cap_seconds,
        }
    }

    /// Checks the profile: fields in range, a known kind, a retry budget that spans the
    /// deadline.
    pub fn validate(&self) -> Result<Kind, CardError> {
        let bad = |what| CardError::Invalid {
            kind: self.kind.clone(),
            what,
        };
        let kind = Kind::from_name(&self.kind).ok_or_else(|| bad("unknown kind"))?;
        if self.deadline_seconds == 0 {
            return Err(bad("deadline_seconds must be > 0"));
        }
        if self.backoff != "exponential" {
            return Err(bad("backoff must be \"exponential\""));
        }
        if !(self.backoff_base_seconds.is_finite() && self.backoff_base_seconds > 0.0) {
            return Err(bad("backoff_base_seconds must be > 0"));
        }
        if self.backoff_cap_seconds == 0 {
            return Err(bad("backoff_cap_seconds must be > 0"));
        }
        let needed = retries_needed(
            self.deadline_seconds,
            self.backoff_base_seconds,
            self.backoff_cap_seconds,
        );
        if needed > RETRIES_LIMIT {
            return Err(CardError::CannotSpan {
                kind: self.kind.clone(),
                deadline_seconds: self.deadline_seconds,
                cap_seconds: self.backoff_cap_seconds,
                needed,
                limit: RETRIES_LIMIT,
                least_cap_seconds: least_cap_seconds(
                    self.deadline_seconds,
                    self.backoff_base_seconds,
                ),
            });
        }
        if self.max_retries > RETRIES_LIMIT {
            return Err(CardError::OverLimit {
                kind: self.kind.clone(),
                max_retries: self.max_retries,
                limit: RETRIES_LIMIT,
            });
        }
        if !self.obligation_endpoint.starts_with("https://") {
            return Err(bad("obligation_endpoint must be an https:// URL"));
        }
        if self.max_retries < needed {
            return Err(CardError::BudgetTooSmall {
                kind: self.kind.clone(),
                deadline_seconds: self.deadline_seconds,
                max_retries: self.max_retries,
                needed,
            });
        }
        Ok(kind)
    }
}

impl AbhyasaParams {
    /// Checks every profile; returns them by kind.
    pub fn validate(&self) -> Result<BTreeMap<Kind, KindProfile>, CardError> {
        if self.supported_kinds.is_empty() {
            return Err(CardError::NoKinds);
        }
        let mut out = BTreeMap::new();
        for p in &self.supported_kinds {
            let kind = p.validate()?;
            if out.insert(kind, p.clone()).is_some() {
                return Err(CardError::DuplicateKind(p.kind.clone()));
            }
        }
        Ok(out)
    }
}

impl AgentCard {
    /// Parses a card from JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Self, CardError> {
        serde_json::from_slice(bytes).map_err(|e| CardError::Parse(e.to_string()))
    }

    /// The card's Abhyasa parameters, validated; profiles by kind.
    pub fn abhyasa(&self) -> Result<(AbhyasaParams, BTreeMap<Kind, KindProfile>), CardError> {
        let mut ours = self
            .capabilities
            .extensions
            .iter()
            .filter(|e| e.uri == EXTENSION_URI);
        let ext = ours.next().ok_or(CardError::NoExtension)?;
        if ours.next().is_some() {
            return Err(CardError::TwoExtensions);
        }
        let params: AbhyasaParams = serde_json::from_value(ext.params.clone().unwrap_or_default())
            .map_err(|e| CardError::Params(e.to_string()))?;
        let profiles = params.validate()?;
        Ok((params, profiles))
    }
}

/// What a node's card says, from its settings.
#[derive(Clone, Debug)]
pub struct CardSettings {
    /// The agent.
    pub agent: abhyasa_wire::AgentId,
    /// The base URL the card's endpoints are under (`https://<agent>:<port>`).
    pub base_url: String,
    /// Whether clients must speak the extension.
    pub required: bool,
    /// The deadline each kind's profile is made for, seconds.
    pub deadline_seconds: BTreeMap<Kind, u64>,
    /// First backoff ceiling, seconds (the custodian's `backoff_base_ms`).
    pub backoff_base_seconds: f64,
    /// Largest backoff ceiling, seconds (the custodian's `backoff_cap_ms`, rounded up).
    pub backoff_cap_seconds: u64,
    /// The node's MOQT endpoint, if it has one.
    pub moqt_endpoint: Option<String>,
}

impl CardSettings {
    /// The settings of `agent`'s card under `base_url` with the custodian's default backoff
    /// ([`abhyasa_custody::CustodianConfig::default`]), the default deadline for every kind,
    /// the extension optional and no MOQT endpoint named.
    pub fn new(agent: abhyasa_wire::AgentId, base_url: impl Into<String>) -> Self {
        let c = abhyasa_custody::CustodianConfig::default();
        Self {
            agent,
            base_url: base_url.into(),
            required: false,
            deadline_seconds: BTreeMap::new(),
            backoff_base_seconds: c.backoff_base_ms as f64 / 1_000.0,
            backoff_cap_seconds: c.backoff_cap_ms.div_ceil(1_000).max(1),
            moqt_endpoint: None,
        }
    }

    /// The card.
    pub fn card(&self) -> AgentCard {
        let base = self.base_url.trim_end_matches('/');
        let supported_kinds = Kind::known()
            .into_iter()
            .map(|k| {
                KindProfile::spanning(
                    k,
                    format!("{base}{}", obligation_path(k)),
                    self.deadline_seconds.get(&k).copied().unwrap_or(3_600),
                    self.backoff_base_seconds,
                    self.backoff_cap_seconds,
                )
            })
            .collect();
        let params = AbhyasaParams {
            version: PARAMS_VERSION.into(),
            custody_ack_endpoint: format!("{base}{ACK_PATH}"),
            supported_kinds,
            moqt_endpoint: self.moqt_endpoint.clone(),
            mcp_endpoint: None,
        };
        AgentCard {
            name: self.agent.as_str().to_owned(),
            description: format!(
                "Abhyasa node {}: takes obligations under custody (deliver-or-report)",
                self.agent
            ),
            version: env!("CARGO_PKG_VERSION").into(),
            supported_interfaces: vec![AgentInterface {
                url: base.to_owned(),
                protocol_binding: "HTTP+JSON".into(),
                protocol_version: "1.0".into(),
            }],
            capabilities: AgentCapabilities {
                extensions: vec![AgentExtension {
                    uri: EXTENSION_URI.into(),
                    description: Some(
                        "Abhyasa custody: obligations POSTed per kind or as parts of \
                         message:send, CustodyAcks on the response or to the custody-ack \
                         endpoint"
                            .into(),
                    ),
                    required: self.required,
                    params: Some(serde_json::to_value(&params).unwrap_or_default()),
                }],
            },
            default_input_modes: vec!["application/cbor".into(), "application/json".into()],
            default_output_modes: vec!["application/cbor".into(), "application/json".into()],
            skills: vec![AgentSkill {
                id: "abhyasa.custody".into(),
                name: "Obligations under custody".into(),
                description: "Applies consent revocations, corrective weight updates and token \
                              revocations durably, once, and acks them"
                    .into(),
                tags: Kind::known()
                    .iter()
                    .map(|k| k.as_str().to_owned())
                    .collect(),
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_rule_gives_the_figures_of_bindings() {
        // Written out by hand: 1+2+4+…+2048 = 4095 after 12; then 3600 each.
        assert_eq!(retries_needed(86_400, 1.0, 3_600), 35);
        assert_eq!(retries_needed(3_600, 1.0, 600), 15);
        assert_eq!(retries_needed(1, 1.0, 600), 1);
        assert_eq!(retries_needed(3, 1.0, 600), 2);
        assert_eq!(retries_needed(4, 1.0, 600), 3);
    }

    /// Reproduced: with the default backoff (0.25 s, cap 30 s) a 24 h deadline needs 2,886
    /// retries by the rule, and the card said 1,000 (the count stopped at the wire's limit)
    /// and passed its own validation. The count is exact now, and the card is refused,
    /// naming the setting to change and the least value that fits.
    #[test]
    fn a_card_that_cannot_satisfy_its_own_rule_is_refused_naming_the_setting() {
        // By hand: 0.25+0.5+…+16 = 31.75 s after 7; then 30 s each: ⌈(86,400 − 31.75)/30⌉
        // = 2,879 more.
        assert_eq!(retries_needed(86_400, 0.25, 30), 2_886);
        // Twenty years: ⌈(630,720,000 − 31.75)/30⌉ = 21,023,999 after the first 7.
        assert_eq!(retries_needed(20 * 365 * 86_400, 0.25, 30), 21_024_006);
        let mut s = settings();
        s.backoff_base_seconds = 0.25;
        s.backoff_cap_seconds = 30;
        let card = s.card();
        let e = card.abhyasa().unwrap_err();
        let least = least_cap_seconds(86_400, 0.25);
        // By hand: at 88 s, 9 doublings cover 127.75 s, then ⌈86,272.25/88⌉ = 981: 990.
        assert_eq!(least, 88);
        assert_eq!(
            e,
            CardError::CannotSpan {
                kind: "anumati.consent".into(),
                deadline_seconds: 86_400,
                cap_seconds: 30,
                needed: 2_886,
                limit: 1_000,
                least_cap_seconds: least,
            }
        );
        let words = e.to_string();
        assert!(words.contains("backoff_cap_ms") && words.contains("deadline_seconds"));
        // The least cap is the least: it fits, one second less does not.
        assert!(retries_needed(86_400, 0.25, least) <= 1_000);
        assert!(retries_needed(86_400, 0.25, least - 1) > 1_000);
        s.backoff_cap_seconds = least;
        let (_, profiles) = s.card().abhyasa().unwrap();
        assert!(profiles[&Kind::AnumatiConsent].max_retries <= 1_000);
    }

    fn settings() -> CardSettings {
        CardSettings {
            agent: abhyasa_wire::AgentId::new("agent-1").unwrap(),
            base_url: "https://agent-1:8443".into(),
            required: false,
            deadline_seconds: [(Kind::AnumatiConsent, 86_400)].into(),
            backoff_base_seconds: 1.0,
            backoff_cap_seconds: 3_600,
            moqt_endpoint: Some("moqt://agent-1:4433".into()),
        }
    }

    #[test]
    fn a_card_reads_back_with_its_profiles() {
        let card = settings().card();
        let json = serde_json::to_vec(&card).unwrap();
        let back = AgentCard::from_json(&json).unwrap();
        assert_eq!(back, card);
        let (params, profiles) = back.abhyasa().unwrap();
        assert_eq!(
            params.custody_ack_endpoint,
            "https://agent-1:8443/abhyasa/v1/custody-ack"
        );
        assert_eq!(profiles.len(), 3);
        let consent = &profiles[&Kind::AnumatiConsent];
        assert_eq!(consent.max_retries, 35);
        assert_eq!(
            consent.obligation_endpoint,
            "https://agent-1:8443/abhyasa/v1/obligations/anumati.consent"
        );
        // The JSON keys are the reference's.
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let ext = &v["capabilities"]["extensions"][0];
        assert_eq!(ext["uri"], EXTENSION_URI);
        assert_eq!(
            ext["params"]["supported_kinds"][0]["backoff"],
            "exponential"
        );
        assert!(v["supportedInterfaces"][0]["url"].is_string());
    }

    #[test]
    fn a_profile_whose_budget_does_not_span_its_deadline_is_refused_with_the_number_needed() {
        let mut card = settings().card();
        let ext = &mut card.capabilities.extensions[0];
        let mut params: AbhyasaParams =
            serde_json::from_value(ext.params.clone().unwrap()).unwrap();
        params.supported_kinds[0].max_retries = 34;
        ext.params = Some(serde_json::to_value(&params).unwrap());
        assert_eq!(
            card.abhyasa().unwrap_err(),
            CardError::BudgetTooSmall {
                kind: "anumati.consent".into(),
                deadline_seconds: 86_400,
                max_retries: 34,
                needed: 35
            }
        );
        for (field, value, what) in [
            (
                "deadline_seconds",
                serde_json::json!(0),
                "deadline_seconds must be > 0",
            ),
            (
                "backoff",
                serde_json::json!("linear"),
                "backoff must be \"exponential\"",
            ),
            ("kind", serde_json::json!("x.unknown"), "unknown kind"),
            (
                "obligation_endpoint",
                serde_json::json!("http://agent-1/x"),
                "obligation_endpoint must be an https:// URL",
            ),
        ] {
            let mut p = serde_json::to_value(&params.supported_kinds[1]).unwrap();
            p[field] = value;
            let profile: KindProfile = serde_json::from_value(p).unwrap();
            match profile.validate().unwrap_err() {
                CardError::Invalid { what: w, .. } => assert_eq!(w, what),
                e => panic!("{field}: {e}"),
            }
        }
        let mut twice = settings().card();
        let again = twice.capabilities.extensions[0].clone();
        twice.capabilities.extensions.push(again);
        assert_eq!(twice.abhyasa().unwrap_err(), CardError::TwoExtensions);
        let mut none = settings().card();
        none.capabilities.extensions.clear();
        assert_eq!(none.abhyasa().unwrap_err(), CardError::NoExtension);
    }
}
