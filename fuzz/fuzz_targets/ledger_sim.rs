//! Structure-aware: the ledger simulation (branches, gateways, a rogue keyring member) with
//! every choice read from the fuzzer's bytes. No panic, and no violation of L1–L6.
//!
//! `ABHYASA_FUZZ_MUTANT=<name>` (from `abhyasa-sim ledger --list-mutants`) runs a broken
//! ledger instead, to see the target find what the checkers catch.
#![no_main]

use std::sync::OnceLock;

use abhyasa_sim::LedgerMutation;
use libfuzzer_sys::fuzz_target;

fn mutant() -> Option<LedgerMutation> {
    static M: OnceLock<Option<LedgerMutation>> = OnceLock::new();
    *M.get_or_init(|| {
        let name = std::env::var("ABHYASA_FUZZ_MUTANT").ok()?;
        Some(abhyasa_sim::ledger_mutant(&name).unwrap_or_else(|| panic!("no ledger mutant {name}")))
    })
}

fuzz_target!(|data: &[u8]| {
    let report = abhyasa_sim::run_ledger_bytes(data, mutant());
    assert!(report.violations.is_empty(), "{:?}", report.violations);
});
