use super::*;

fn t(n: &str) -> TokenId {
    TokenId::new(n).unwrap()
}

fn drop_(n: &str, at: Option<u64>) -> ReceiverEffect {
    ReceiverEffect::DropToken(t(n), at.map(UnixMillis))
}

fn cache(n: &str, at: Option<u64>) -> ReceiverEffect {
    ReceiverEffect::CacheToken(t(n), at.map(UnixMillis))
}

#[test]
fn weight_changes_are_keyed_summed_clipped_and_lapse_each_at_its_own_end() {
    let (p, k) = (
        AgentId::new("p").unwrap(),
        WeightKey::new("supplier/acme").unwrap(),
    );
    let change = |by: u128, delta, end| {
        ReceiverEffect::AdjustWeight(
            p.clone(),
            k.clone(),
            WeightChange {
                by: ObligationId::from_u128(by),
                delta,
                lapses_at: UnixMillis(end),
            },
        )
    };
    let mut s = ReceiverState::new(-500_000, 500_000);
    s.apply(&change(1, -400_000, 100));
    s.apply(&change(2, -300_000, 200));
    // Applied again (a store replaying its rows): held once.
    s.apply(&change(2, -300_000, 200));
    s.apply(&change(3, 100_000, 50));
    let w = |s: &ReceiverState, t| s.weight(&p, &k, UnixMillis(t));
    // Summed, then clipped: -0.6 holds as -0.5, and each change counts until its end.
    assert_eq!(
        (w(&s, 0), w(&s, 50), w(&s, 100), w(&s, 200)),
        (-500_000, -500_000, -300_000, 0)
    );
    assert_eq!(s.weight_changes().count(), 3);
    // Rebuilt from its rows, the same state.
    let rebuilt = ReceiverState::from_parts([], [], [], [])
        .with_bounds(-500_000, 500_000)
        .with_weight_changes(
            s.weight_changes()
                .map(|(i, k, c)| (i.clone(), k.clone(), c)),
        );
    assert_eq!(rebuilt, s);
    // Upkeep forgets the lapsed ones, at most `limit` at a time, earliest first.
    assert_eq!(s.lapse_weights(UnixMillis(49), usize::MAX), vec![]);
    assert_eq!(
        s.lapse_weights(UnixMillis(150), 1),
        vec![(p.clone(), k.clone(), ObligationId::from_u128(3))]
    );
    assert_eq!(s.lapse_weights(UnixMillis(150), usize::MAX).len(), 1);
    assert_eq!((s.weight_changes().count(), w(&s, 150)), (1, -300_000));
    assert_eq!(s.lapse_weights(UnixMillis(200), usize::MAX).len(), 1);
    assert_eq!((s.weights(UnixMillis(0)).count(), w(&s, 0)), (0, 0));
}

#[test]
fn token_records_are_forgotten_at_the_tokens_expiry_and_a_drop_still_wins_before_it() {
    let mut s = ReceiverState::default();
    s.apply(&cache("a", Some(20)));
    s.apply(&drop_("a", Some(30)));
    // Issued again after the drop: still dropped, its expiry unchanged.
    s.apply(&cache("a", Some(90)));
    assert_eq!(s.token_record(&t("a")), Some((true, Some(UnixMillis(30)))));
    s.apply(&cache("b", Some(10)));
    s.apply(&cache("b", Some(15)));
    s.apply(&drop_("c", None));
    assert_eq!(s.token_record(&t("b")), Some((false, Some(UnixMillis(15)))));

    // Rebuilt from its parts, the same state.
    let rebuilt = ReceiverState::from_parts(
        [],
        [],
        s.dropped_tokens_until().map(|(t, e)| (t.clone(), e)),
        s.cached_tokens_until().map(|(t, e)| (t.clone(), e)),
    );
    assert_eq!(rebuilt, s);

    assert_eq!(s.expire_tokens(UnixMillis(14), usize::MAX), vec![]);
    assert_eq!(
        s.expire_tokens(UnixMillis(29), usize::MAX),
        vec![(t("b"), UnixMillis(15))]
    );
    assert!(s.is_dropped(&t("a")));
    assert_eq!(
        s.expire_tokens(UnixMillis(30), usize::MAX),
        vec![(t("a"), UnixMillis(30))]
    );
    assert_eq!(s.token_record(&t("a")), None);
    assert_eq!(s.expire_tokens(UnixMillis(u64::MAX), usize::MAX), vec![]);
    assert_eq!(s.dropped_tokens().collect::<Vec<_>>(), vec![&t("c")]);
    assert_eq!(s.cached_tokens().count(), 0);
}
