use proptest::prelude::*;

use super::*;

fn agent(name: &str) -> AgentId {
    AgentId::new(name).unwrap()
}

fn revoke() -> Obligation {
    Obligation {
        id: ObligationId::from_u128(0x0102),
        issuer: agent("p"),
        target: agent("a"),
        created_at: UnixMillis(1_000),
        deadline: UnixMillis(61_000),
        max_retries: 8,
        sequence: Some(3),
        payload: Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new("cal").unwrap(),
            expires_at: None,
        }),
    }
}

fn belief() -> Obligation {
    Obligation {
        id: ObligationId::from_u128(2),
        payload: Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
            weight_key: WeightKey::new("s/acme").unwrap(),
            weight_delta: WeightDelta(-250_000),
            ttl_ms: 3_600_000,
        }),
        sequence: None,
        ..revoke()
    }
}

fn token() -> Obligation {
    Obligation {
        id: ObligationId::from_u128(3),
        payload: Payload::OauthToken(TokenPayload {
            action: TokenAction::Revoke,
            token_id: TokenId::new("tok-9").unwrap(),
            client_id: ClientId::new("cli").unwrap(),
            expires_at: None,
        }),
        sequence: None,
        ..revoke()
    }
}

fn token_with_expiry() -> Obligation {
    let mut o = token();
    if let Payload::OauthToken(p) = &mut o.payload {
        p.expires_at = Some(UnixMillis(100_000));
    }
    o
}

/// Every golden vector is also a seed of the fuzz target that reads its kind of bytes:
/// `fuzz/seeds/<target>/golden-<FNV-1a of the bytes>`. The test checks the file is there with
/// these bytes; `ABHYASA_WRITE_FUZZ_SEEDS=1 cargo test -p abhyasa-wire` writes it.
pub(crate) fn fuzz_seed(target: &str, bytes: &[u8]) {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let path = dir.join(format!("golden-{hash:016x}"));
    if std::env::var_os("ABHYASA_WRITE_FUZZ_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&path, bytes).unwrap();
    }
    assert_eq!(
        std::fs::read(&path).ok().as_deref(),
        Some(bytes),
        "{} is not this golden vector: run ABHYASA_WRITE_FUZZ_SEEDS=1 cargo test -p abhyasa-wire",
        path.display()
    );
}

/// Checks `value` encodes to exactly `hex` and decodes back to itself.
fn golden<T>(value: &T, hex: &str)
where
    T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = encode(value);
    assert_eq!(hex::encode(&bytes), hex, "encoding of {value:?} changed");
    let name = std::any::type_name::<T>();
    let target = if name.ends_with("::Obligation") {
        "obligation"
    } else if name.ends_with("::CustodyAck") {
        "ack"
    } else {
        "escalation"
    };
    fuzz_seed(target, &bytes);
    let back: T = decode(&hex::decode(hex).unwrap()).unwrap();
    assert_eq!(&back, value);
}

#[test]
fn golden_custody_ack_applied() {
    // Hand-checked: a3 (map of 3) | 6d "obligation_id" | 50 (bytes 16) ...
    let ack = CustodyAck {
        obligation_id: ObligationId::from_u128(1),
        target: agent("a"),
        status: AckStatus::Applied,
        acked_at: UnixMillis(10),
        detail: None,
    };
    golden(
        &ack,
        "a46d6f626c69676174696f6e5f69645000000000000000000000000000000001\
         667461726765746161\
         66737461747573676170706c696564\
         6861636b65645f61740a",
    );
}

#[test]
fn golden_custody_ack_declined_and_deferred() {
    let declined = CustodyAck {
        obligation_id: ObligationId::from_u128(1),
        target: agent("a"),
        status: AckStatus::Declined(DeclineReason::Superseded),
        acked_at: UnixMillis(10),
        detail: None,
    };
    golden(
        &declined,
        "a46d6f626c69676174696f6e5f69645000000000000000000000000000000001\
         667461726765746161\
         66737461747573a1686465636c696e65646a73757065727365646564\
         6861636b65645f61740a",
    );
    let deferred = CustodyAck {
        status: AckStatus::Deferred,
        ..declined
    };
    golden(
        &deferred,
        "a46d6f626c69676174696f6e5f69645000000000000000000000000000000001\
         667461726765746161\
         667374617475736864656665727265\
         646861636b65645f61740a",
    );
}

#[test]
fn golden_obligations_of_every_kind() {
    for (o, hex) in [
        (revoke(), GOLDEN_REVOKE),
        (belief(), GOLDEN_BELIEF),
        (token(), GOLDEN_TOKEN),
        (token_with_expiry(), GOLDEN_TOKEN_EXPIRES),
    ] {
        let bytes = encode(&o);
        assert_eq!(hex::encode(&bytes), hex, "encoding of {o:?} changed");
        assert_eq!(decode_obligation(&bytes).unwrap(), o);
        assert_eq!(decode::<Obligation>(&bytes).unwrap(), o);
        fuzz_seed("obligation", &bytes);
    }
}

const GOLDEN_REVOKE: &str = "a96269645000000000000000000000000000000102646b696e646f616e756d6174692e636f6e73656e746669737375657261706674617267657461616a637265617465645f61741903e868646561646c696e6519ee486b6d61785f72657472696573086873657175656e636503677061796c6f6164a2686465636973696f6e667265766f6b656573636f70656363616c";
const GOLDEN_BELIEF: &str = "a86269645000000000000000000000000000000002646b696e64737068616c612e62656c6965665f7570646174656669737375657261706674617267657461616a637265617465645f61741903e868646561646c696e6519ee486b6d61785f7265747269657308677061796c6f6164a36a7765696768745f6b657966732f61636d656c7765696768745f64656c74613a0003d08f6674746c5f6d731a0036ee80";
const GOLDEN_TOKEN: &str = "a86269645000000000000000000000000000000003646b696e646b6f617574682e746f6b656e6669737375657261706674617267657461616a637265617465645f61741903e868646561646c696e6519ee486b6d61785f7265747269657308677061796c6f6164a366616374696f6e667265766f6b6568746f6b656e5f696465746f6b2d3969636c69656e745f696463636c69";
// Hand-built from GOLDEN_TOKEN: the payload map grows to a4 and ends with
// 6a "expires_at" 1a 000186a0 (100,000 as a four-byte unsigned integer).
const GOLDEN_TOKEN_EXPIRES: &str = "a86269645000000000000000000000000000000003646b696e646b6f617574682e746f6b656e6669737375657261706674617267657461616a637265617465645f61741903e868646561646c696e6519ee486b6d61785f7265747269657308677061796c6f6164a466616374696f6e667265766f6b6568746f6b656e5f696465746f6b2d3969636c69656e745f696463636c696a657870697265735f61741a000186a0";

#[test]
fn golden_escalation_terminal_and_note() {
    let escalation = Escalation {
        obligation_id: ObligationId::from_u128(2),
        kind: Kind::PhalaBeliefUpdate,
        target: agent("a"),
        attempts: 4,
        cause: EscalationCause::Deadline,
        last_observed: LastObserved::Deferred,
        safe_action: SafeAction::DownWeight {
            obligation_id: ObligationId::from_u128(2),
            target: agent("a"),
            weight_key: WeightKey::new("s/acme").unwrap(),
            amount: 250_000,
            fold_after: UnixMillis(70_000),
            lapses_at: None,
        },
        at: UnixMillis(61_000),
    };
    golden(&escalation, GOLDEN_ESCALATION);
    for (action, hex) in [
        (
            SafeAction::WithholdScope {
                target: agent("a"),
                scope: Scope::new("cal").unwrap(),
                sequence: Some(3),
            },
            GOLDEN_WITHHOLD,
        ),
        (
            SafeAction::StopHonouringToken {
                token_id: TokenId::new("tok-9").unwrap(),
                expires_at: None,
            },
            GOLDEN_STOP_TOKEN,
        ),
        (
            SafeAction::StopHonouringToken {
                token_id: TokenId::new("tok-9").unwrap(),
                expires_at: Some(UnixMillis(100_000)),
            },
            GOLDEN_STOP_TOKEN_EXPIRES,
        ),
        (
            // A belief update's down-weight with its lapse; one without (above, a record
            // written before updates lapsed) encodes as it always did.
            SafeAction::DownWeight {
                obligation_id: ObligationId::from_u128(2),
                target: agent("a"),
                weight_key: WeightKey::new("s/acme").unwrap(),
                amount: 250_000,
                fold_after: UnixMillis(70_000),
                lapses_at: Some(UnixMillis(3_600_000)),
            },
            GOLDEN_DOWN_WEIGHT_LAPSES,
        ),
    ] {
        golden(&action, hex);
    }
    let terminal = TerminalRecord {
        obligation_id: ObligationId::from_u128(3),
        kind: Kind::OauthToken,
        target: agent("a"),
        outcome: Outcome::BestEffort,
        attempts: 0,
        at: UnixMillis(5),
        detail: None,
    };
    golden(&terminal, GOLDEN_TERMINAL_BEST_EFFORT);
    let declined = TerminalRecord {
        outcome: Outcome::Declined(DeclineReason::Expired),
        attempts: 2,
        ..terminal
    };
    golden(&declined, GOLDEN_TERMINAL_DECLINED);
    let note = ReconciliationNote {
        obligation_id: ObligationId::from_u128(2),
        target: agent("a"),
        acked_at: UnixMillis(62_000),
        noted_at: UnixMillis(62_010),
    };
    golden(&note, GOLDEN_NOTE);
}

const GOLDEN_ESCALATION: &str = "a86d6f626c69676174696f6e5f69645000000000000000000000000000000002646b696e64737068616c612e62656c6965665f75706461746566746172676574616168617474656d7074730465636175736568646561646c696e656d6c6173745f6f627365727665646864656665727265646b736166655f616374696f6ea16b646f776e5f776569676874a56d6f626c69676174696f6e5f696450000000000000000000000000000000026674617267657461616a7765696768745f6b657966732f61636d6566616d6f756e741a0003d0906a666f6c645f61667465721a0001117062617419ee48";
const GOLDEN_WITHHOLD: &str =
    "a16e77697468686f6c645f73636f7065a36674617267657461616573636f70656363616c6873657175656e636503";
const GOLDEN_STOP_TOKEN: &str =
    "a17473746f705f686f6e6f7572696e675f746f6b656ea168746f6b656e5f696465746f6b2d39";
// The same with the inner map a2 and 6a "expires_at" 1a 000186a0 appended.
const GOLDEN_DOWN_WEIGHT_LAPSES: &str = "a16b646f776e5f776569676874a66d6f626c69676174696f6e5f696450000000000000000000000000000000026674617267657461616a7765696768745f6b657966732f61636d6566616d6f756e741a0003d0906a666f6c645f61667465721a00011170696c61707365735f61741a0036ee80";
const GOLDEN_STOP_TOKEN_EXPIRES: &str = "a17473746f705f686f6e6f7572696e675f746f6b656ea268746f6b656e5f696465746f6b2d396a657870697265735f61741a000186a0";
const GOLDEN_TERMINAL_BEST_EFFORT: &str = "a66d6f626c69676174696f6e5f69645000000000000000000000000000000003646b696e646b6f617574682e746f6b656e667461726765746161676f7574636f6d656b626573745f6566666f727468617474656d7074730062617405";
const GOLDEN_TERMINAL_DECLINED: &str = "a66d6f626c69676174696f6e5f69645000000000000000000000000000000003646b696e646b6f617574682e746f6b656e667461726765746161676f7574636f6d65a1686465636c696e6564676578706972656468617474656d7074730262617405";
const GOLDEN_NOTE: &str = "a46d6f626c69676174696f6e5f696450000000000000000000000000000000026674617267657461616861636b65645f617419f230686e6f7465645f617419f23a";

#[test]
fn unknown_kind_keeps_the_envelope() {
    let mut value: ciborium::Value = ciborium::Value::serialized(&revoke()).unwrap();
    if let ciborium::Value::Map(entries) = &mut value {
        for (k, v) in entries.iter_mut() {
            if k.as_text() == Some("kind") {
                *v = ciborium::Value::Text("future.kind".into());
            }
        }
    }
    let bytes = encode(&value);
    let err = decode_obligation(&bytes).unwrap_err();
    assert_eq!(err.decline_reason(), Some(DeclineReason::UnknownKind));
    let envelope = err.envelope().unwrap();
    assert_eq!(envelope.id, revoke().id);
    assert_eq!(envelope.kind, "future.kind");
    assert_eq!(envelope.issuer, agent("p"));
}

#[test]
fn payload_that_does_not_match_its_kind_is_malformed() {
    // A token payload under the consent kind.
    let mut o = token();
    let bytes = encode(&o);
    let text = hex::encode(&bytes);
    let swapped = text.replacen(
        &hex::encode(encode(&"oauth.token")),
        &hex::encode(encode(&"anumati.consent")),
        1,
    );
    let err = decode_obligation(&hex::decode(swapped).unwrap()).unwrap_err();
    assert_eq!(err.decline_reason(), Some(DeclineReason::Malformed));
    assert_eq!(err.envelope().unwrap().id, o.id);

    // A weight delta out of range.
    o = belief();
    if let Payload::PhalaBeliefUpdate(p) = &mut o.payload {
        p.weight_delta = WeightDelta(1_000_001);
    }
    let err = decode_obligation(&encode(&o)).unwrap_err();
    assert!(matches!(err, WireError::MalformedPayload { .. }), "{err:?}");
}

#[test]
fn deadline_before_creation_is_refused() {
    let mut o = revoke();
    o.deadline = o.created_at;
    let err = decode_obligation(&encode(&o)).unwrap_err();
    assert_eq!(err.decline_reason(), Some(DeclineReason::Malformed));
}

#[test]
fn a_belief_update_lapses_ttl_ms_after_its_creation_and_a_zero_ttl_is_refused() {
    let mut o = belief();
    let Payload::PhalaBeliefUpdate(p) = &o.payload else {
        unreachable!()
    };
    assert_eq!(
        p.lapses_at(o.created_at),
        UnixMillis(o.created_at.0 + 3_600_000)
    );
    assert_eq!(p.lapses_at(UnixMillis(u64::MAX - 1)), UnixMillis(u64::MAX));
    if let Payload::PhalaBeliefUpdate(p) = &mut o.payload {
        p.ttl_ms = 0;
    }
    let err = decode_obligation(&encode(&o)).unwrap_err();
    assert_eq!(
        err.decline_reason(),
        Some(DeclineReason::Malformed),
        "{err}"
    );
}

#[test]
fn a_lease_rides_a_grant_and_nothing_else() {
    let mut o = revoke();
    let lease = |decision| {
        Payload::AnumatiConsent(ConsentPayload {
            decision,
            scope: Scope::new("cal").unwrap(),
            expires_at: Some(UnixMillis(1_700_000_060_000)),
        })
    };
    o.payload = lease(Some(ConsentDecision::Grant));
    assert_eq!(decode_obligation(&encode(&o)).unwrap(), o);
    for decision in [
        Some(ConsentDecision::Revoke),
        None,
        Some(ConsentDecision::Unrecognized("pause".into())),
    ] {
        o.payload = lease(decision);
        let err = decode_obligation(&encode(&o)).unwrap_err();
        assert_eq!(
            err.decline_reason(),
            Some(DeclineReason::Malformed),
            "{err}"
        );
    }
}

#[test]
fn unrecognized_consent_decision_is_kept() {
    let mut o = revoke();
    o.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: Some(ConsentDecision::Unrecognized("pause".into())),
        scope: Scope::new("cal").unwrap(),
        expires_at: None,
    });
    assert_eq!(decode_obligation(&encode(&o)).unwrap(), o);
    o.payload = Payload::AnumatiConsent(ConsentPayload {
        decision: None,
        scope: Scope::new("cal").unwrap(),
        expires_at: None,
    });
    assert_eq!(decode_obligation(&encode(&o)).unwrap(), o);
}

#[test]
fn limits_and_trailing_bytes() {
    let big = vec![0u8; MAX_OBJECT_SIZE + 1];
    assert_eq!(
        decode::<CustodyAck>(&big),
        Err(WireError::TooLarge {
            len: MAX_OBJECT_SIZE + 1,
            limit: MAX_OBJECT_SIZE
        })
    );
    let mut bytes = encode(&revoke());
    bytes.push(0);
    assert_eq!(decode_obligation(&bytes), Err(WireError::TrailingBytes(1)));
    // 40 nested arrays.
    let deep = [vec![0x81u8; 40], vec![0x00]].concat();
    assert!(matches!(
        decode::<CustodyAck>(&deep),
        Err(WireError::Cbor(_))
    ));
    assert!(matches!(decode::<CustodyAck>(&[]), Err(WireError::Cbor(_))));
}

#[test]
fn unknown_fields_are_refused() {
    let ack = CustodyAck {
        obligation_id: ObligationId::from_u128(1),
        target: agent("a"),
        status: AckStatus::Applied,
        acked_at: UnixMillis(10),
        detail: None,
    };
    let mut value = ciborium::Value::serialized(&ack).unwrap();
    if let ciborium::Value::Map(entries) = &mut value {
        entries.push((
            ciborium::Value::Text("extra".into()),
            ciborium::Value::Integer(1.into()),
        ));
    }
    assert!(matches!(
        decode::<CustodyAck>(&encode(&value)),
        Err(WireError::Cbor(_))
    ));
}

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{1,20}"
}

fn arb_payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        (
            prop_oneof![
                Just(None),
                Just(Some(ConsentDecision::Grant)),
                Just(Some(ConsentDecision::Revoke)),
                "[a-z]{1,10}".prop_map(|w| Some(if w == "grant" || w == "revoke" {
                    ConsentDecision::Unrecognized(format!("x{w}"))
                } else {
                    ConsentDecision::Unrecognized(w)
                })),
            ],
            "\\PC{1,40}",
            any::<Option<u64>>(),
        )
            .prop_map(|(decision, scope, lease)| {
                // Only a grant carries a lease.
                let expires_at = lease
                    .filter(|_| decision == Some(ConsentDecision::Grant))
                    .map(UnixMillis);
                Payload::AnumatiConsent(ConsentPayload {
                    decision,
                    scope: Scope::new(scope).unwrap(),
                    expires_at,
                })
            }),
        ("\\PC{1,40}", -1_000_000i32..=1_000_000, any::<u64>()).prop_map(|(k, d, ttl)| {
            Payload::PhalaBeliefUpdate(BeliefUpdatePayload {
                weight_key: WeightKey::new(k).unwrap(),
                weight_delta: WeightDelta(d),
                ttl_ms: ttl,
            })
        }),
        (any::<bool>(), name(), name(), any::<Option<u64>>()).prop_map(|(revoke, t, c, exp)| {
            Payload::OauthToken(TokenPayload {
                action: if revoke {
                    TokenAction::Revoke
                } else {
                    TokenAction::Issue
                },
                token_id: TokenId::new(t).unwrap(),
                client_id: ClientId::new(c).unwrap(),
                expires_at: exp.map(UnixMillis),
            })
        }),
    ]
}

fn arb_obligation() -> impl Strategy<Value = Obligation> {
    (
        any::<u128>(),
        name(),
        name(),
        0u64..u64::MAX / 2,
        1u64..1_000_000_000,
        0u32..=MAX_RETRIES_LIMIT,
        any::<Option<u64>>(),
        arb_payload(),
    )
        .prop_map(
            |(id, issuer, target, created, span, max_retries, sequence, payload)| Obligation {
                id: ObligationId::from_u128(id),
                issuer: AgentId::new(issuer).unwrap(),
                target: AgentId::new(target).unwrap(),
                created_at: UnixMillis(created),
                deadline: UnixMillis(created + span),
                max_retries,
                sequence,
                payload,
            },
        )
}

fn arb_reason() -> impl Strategy<Value = DeclineReason> {
    prop_oneof![
        Just(DeclineReason::Expired),
        Just(DeclineReason::Superseded),
        Just(DeclineReason::Refused),
        Just(DeclineReason::Malformed),
        Just(DeclineReason::UnknownKind),
        Just(DeclineReason::IdConflict),
    ]
}

proptest! {
    #[test]
    fn obligation_round_trips_deterministically(o in arb_obligation()) {
        let bytes = encode(&o);
        prop_assert!(bytes.len() <= MAX_OBJECT_SIZE);
        prop_assert_eq!(decode_obligation(&bytes).unwrap(), o.clone());
        prop_assert_eq!(encode(&o.clone()), bytes);
    }

    #[test]
    fn ack_round_trips(id in any::<u128>(), t in name(), at in any::<u64>(),
                       s in prop_oneof![Just(AckStatus::Applied), Just(AckStatus::Deferred),
                                        arb_reason().prop_map(AckStatus::Declined)]) {
        let ack = CustodyAck { obligation_id: ObligationId::from_u128(id),
            target: AgentId::new(t).unwrap(), status: s, acked_at: UnixMillis(at),
            detail: None, };
        prop_assert_eq!(decode::<CustodyAck>(&encode(&ack)).unwrap(), ack);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_obligation(&bytes);
        let _ = decode::<CustodyAck>(&bytes);
        let _ = decode::<Escalation>(&bytes);
        let _ = decode::<TerminalRecord>(&bytes);
    }

    #[test]
    fn mutated_obligations_never_panic(o in arb_obligation(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = encode(&o);
        for (at, b) in flips {
            let i = at % bytes.len();
            bytes[i] ^= b;
        }
        if let Ok(back) = decode_obligation(&bytes) {
            // Whatever decodes must satisfy the rules and re-encode to itself.
            prop_assert!(back.validate().is_ok());
            prop_assert_eq!(decode_obligation(&encode(&back)).unwrap(), back);
        }
    }

    #[test]
    fn truncations_are_errors(o in arb_obligation(), cut in any::<usize>()) {
        let bytes = encode(&o);
        let cut = cut % bytes.len();
        prop_assert!(decode_obligation(&bytes[..cut]).is_err());
    }
}

/// The object size limit at and one past it: an object of exactly `MAX_OBJECT_SIZE` bytes is
/// read (what it holds decides), one byte more is refused for its size alone.
#[test]
fn an_object_at_the_size_limit_is_read_and_one_past_it_is_refused() {
    let mut at = encode(&revoke());
    // A CBOR-valid obligation padded to the limit would need fields it may not have; a byte
    // string of the right total size shows the size check lets it through to the decoder.
    at.resize(MAX_OBJECT_SIZE, 0);
    assert!(!matches!(
        decode_obligation(&at),
        Err(WireError::TooLarge { .. })
    ));
    assert!(!matches!(
        decode::<CustodyAck>(&at),
        Err(WireError::TooLarge { .. })
    ));
    at.push(0);
    assert_eq!(
        decode_obligation(&at),
        Err(WireError::TooLarge {
            len: MAX_OBJECT_SIZE + 1,
            limit: MAX_OBJECT_SIZE
        })
    );
}

/// Every bounded name at its limit and one past it, directly and inside a decoded obligation.
#[test]
fn names_at_their_length_limit_are_taken_and_one_past_is_refused_naming_it() {
    fn check<T: std::fmt::Debug>(
        what: &str,
        limit: usize,
        new: impl Fn(String) -> Result<T, NameError>,
    ) {
        assert!(new("a".repeat(limit)).is_ok(), "{what} of {limit} bytes");
        match new("a".repeat(limit + 1)) {
            Err(NameError::TooLong { len, limit: l, .. }) => {
                assert_eq!((len, l), (limit + 1, limit), "{what}");
            }
            other => panic!("{what} of {} bytes: {other:?}", limit + 1),
        }
    }
    check("agent id", 64, AgentId::new);
    check("scope", 256, Scope::new);
    check("weight key", 256, WeightKey::new);
    check("token id", 256, TokenId::new);
    check("client id", 256, ClientId::new);
    // On the wire: a scope one past its limit makes the obligation unreadable, and the error
    // says which limit.
    let bytes = encode(&revoke());
    let name = b"cal";
    let pos = bytes.windows(3).position(|w| w == name).unwrap();
    assert_eq!(bytes[pos - 1], 0x63, "a 3-byte CBOR text string");
    // The same text string, 257 bytes long (a 3-byte head).
    let mut long = bytes[..pos - 1].to_vec();
    long.extend_from_slice(&[0x79, 0x01, 0x01]);
    long.extend_from_slice(&[b'a'; 257]);
    long.extend_from_slice(&bytes[pos + name.len()..]);
    let err = decode_obligation(&long).unwrap_err().to_string();
    assert!(
        err.contains("scope is 257 bytes, over the limit of 256"),
        "{err}"
    );
    // At the limit it reads.
    let mut at = bytes[..pos - 1].to_vec();
    at.extend_from_slice(&[0x79, 0x01, 0x00]);
    at.extend_from_slice(&[b'a'; 256]);
    at.extend_from_slice(&bytes[pos + name.len()..]);
    assert!(decode_obligation(&at).is_ok());
}

#[test]
fn a_detail_at_its_limit_is_read_and_past_it_is_refused() {
    let ack = |detail: &str| {
        // Built through the encoder's own path: a detail is only ever made by `Detail`, so
        // the over-long one is written as a CBOR map by hand.
        let mut m = std::collections::BTreeMap::new();
        m.insert("obligation_id", ciborium::Value::Bytes(vec![0; 16]));
        m.insert("target", ciborium::Value::Text("agent-1".into()));
        m.insert(
            "status",
            ciborium::Value::Map(vec![(
                ciborium::Value::Text("declined".into()),
                ciborium::Value::Text("policy".into()),
            )]),
        );
        m.insert("acked_at", ciborium::Value::Integer(5.into()));
        m.insert("detail", ciborium::Value::Text(detail.into()));
        let mut out = Vec::new();
        ciborium::into_writer(&m, &mut out).unwrap();
        out
    };
    let at = "d".repeat(Detail::MAX_LEN);
    let read = decode::<CustodyAck>(&ack(&at)).unwrap();
    assert_eq!(read.status, AckStatus::Declined(DeclineReason::Policy));
    assert_eq!(read.detail.as_ref().map(Detail::as_str), Some(at.as_str()));
    assert_eq!(decode::<CustodyAck>(&encode(&read)).unwrap(), read);
    let past = "d".repeat(Detail::MAX_LEN + 1);
    let err = decode::<CustodyAck>(&ack(&past)).unwrap_err();
    assert!(err.to_string().contains("over 256 bytes"), "{err}");
    assert!(decode::<CustodyAck>(&ack("two\nlines")).is_err());
    assert!(Detail::new(past.clone()).is_err());
    assert_eq!(Detail::lossy(&past).as_str().len(), Detail::MAX_LEN);
    assert_eq!(Detail::lossy("a\u{7}b").as_str(), "a b");
}
