//! What each decoder target checks of one input, as functions: the `fuzz_targets/` call them
//! with the fuzzer's bytes, and the workspace's `tests/fuzz_corpora.rs` (which includes these
//! files by path) calls them with every committed seed and kept input — so every target's
//! corpus is replayed by `cargo test`, the binding targets' included, whose instrumented
//! build is too long for CI to fuzz them.
//!
//! Each function panics exactly when the input breaks what its target checks; the structure-
//! aware simulation targets stay in their own files (a simulated run per input is fuzzing's
//! business, not a replay's).

/// `fuzz/`, where the fixtures the checks load live.
pub const FUZZ_DIR: &str = env!("CARGO_MANIFEST_DIR");

pub mod decoders;

#[cfg(feature = "bindings")]
pub mod bindings;
