//! Structure-aware: the custody simulation with every choice read from the fuzzer's bytes —
//! the scenario, each message's loss, duplication and delay, partitions, crashes and power
//! loss at any step, the rogue peer's forgeries — so random sequences of `handle_*` calls on
//! the custodian and the receivers are steered by coverage. No panic, and no violation of
//! the custody checkers (AB-1..AB-4, at most once, deadlines, fail-safes).
//!
//! `ABHYASA_FUZZ_MUTANT=<name>` (a name from `abhyasa-sim custody --list-mutants`) runs a
//! broken machine instead, to see the target find what the checkers catch.
#![no_main]

use std::sync::OnceLock;

use abhyasa_sim::Mutation;
use libfuzzer_sys::fuzz_target;

fn mutant() -> Option<Mutation> {
    static M: OnceLock<Option<Mutation>> = OnceLock::new();
    *M.get_or_init(|| {
        let name = std::env::var("ABHYASA_FUZZ_MUTANT").ok()?;
        Some(abhyasa_sim::mutant(&name).unwrap_or_else(|| panic!("no custody mutant {name}")))
    })
}

fuzz_target!(|data: &[u8]| {
    let report = abhyasa_sim::run_custody_bytes(data, mutant());
    assert!(report.violations.is_empty(), "{:?}", report.violations);
});
