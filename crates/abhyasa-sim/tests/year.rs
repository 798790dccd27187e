//! The long run of `abhyasa-sim year`, shortened: the state of a payer and its gateway stays
//! flat when the gateway forgets and tells the payer, and grows when nothing is forgotten.

use abhyasa_sim::{run_year, YearParams};

fn params(retain_ms: Option<u64>) -> YearParams {
    YearParams {
        days: 21,
        ops_per_day: 144,
        retain_ms,
        seed: 7,
        ..YearParams::default()
    }
}

#[test]
fn three_weeks_of_spending_leave_flat_state_on_both_sides() {
    let r = run_year(&params(Some(3_600_000)));
    assert_eq!(r.violations, Vec::<String>::new());
    assert_eq!(r.samples.len(), 21);
    assert_eq!(r.effects, 21 * 144);
    assert!(r.lost > 0, "the link lost nothing: the run tests no resend");
    r.flat().expect("flat");
    // Every summary kept is of the last hours: an hour of retention, a minute of permit,
    // 144 operations a day (six an hour), and the checkpoint's own cadence.
    let last = r.samples.last().unwrap();
    assert_eq!(last.settled, 21 * 144);
    assert!(last.ended < 144, "{last:?}");
}

#[test]
fn without_forgetting_the_summaries_grow_with_every_operation() {
    // The gateway keeps every acceptance, so it never tells the payer a horizon: what the
    // payer keeps grows by one summary per operation, and `flat` says so.
    let r = run_year(&params(None));
    assert_eq!(r.violations, Vec::<String>::new());
    let err = r.flat().expect_err("grew");
    assert!(err.contains("ended summaries grew"), "{err}");
    let last = r.samples.last().unwrap();
    assert!(last.ended > 19 * 144, "{last:?}");
}
