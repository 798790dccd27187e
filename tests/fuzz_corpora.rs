//! Every committed fuzz input — `fuzz/seeds/<target>` and `fuzz/kept/<target>` — replayed
//! through its target's own check (`fuzz/src/`, included here by path, the same code the
//! fuzz targets call). CI fuzzes the core decoders for seconds each; the binding targets
//! (MCP `_meta`, A2A JSON, the node config, the signature envelope) link the whole node and
//! their instrumented build is too long for CI, so this is where their corpora, and every
//! crash that became a seed, run on each `cargo test`. A decoder change that makes any of
//! them panic or break its round trip fails here, naming the file.

use std::path::{Path, PathBuf};

/// `fuzz/`, where the checks' fixtures live (the signature target's fixed deployment).
const FUZZ_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz");

#[path = "../fuzz/src/decoders.rs"]
mod decoders;

#[path = "../fuzz/src/bindings.rs"]
mod bindings;

/// The files of `fuzz/seeds/<target>` and, where it exists, `fuzz/kept/<target>`.
fn inputs(target: &str) -> (usize, Vec<PathBuf>) {
    let dir = Path::new(FUZZ_DIR);
    let list = |d: PathBuf| -> Vec<PathBuf> {
        match std::fs::read_dir(&d) {
            Ok(entries) => {
                let mut v: Vec<PathBuf> = entries
                    .map(|e| e.expect("a directory entry").path())
                    .filter(|p| p.is_file())
                    .collect();
                v.sort();
                v
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("reading {}: {e}", d.display()),
        }
    };
    let seeds = list(dir.join("seeds").join(target));
    let n = seeds.len();
    let mut all = seeds;
    all.extend(list(dir.join("kept").join(target)));
    (n, all)
}

/// Runs `check` over every input of `target`; fails naming each input that panicked.
fn replay(target: &str, check: fn(&[u8])) {
    let (seeds, files) = inputs(target);
    assert!(seeds > 0, "fuzz/seeds/{target} is missing or empty");
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).expect("a corpus file");
            std::panic::catch_unwind(|| check(&data)).is_err()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs fail its check: {failed:?}",
        failed.len(),
        files.len()
    );
}

#[test]
fn obligation_corpus_replays() {
    replay("obligation", decoders::obligation);
}

#[test]
fn ack_corpus_replays() {
    replay("ack", decoders::ack);
}

#[test]
fn escalation_corpus_replays() {
    replay("escalation", decoders::escalation);
}

#[test]
fn ledger_corpus_replays() {
    replay("ledger", decoders::ledger);
}

#[test]
fn moqt_control_corpus_replays() {
    replay("moqt_control", decoders::moqt_control);
}

#[test]
fn moqt_subgroup_corpus_replays() {
    replay("moqt_subgroup", decoders::moqt_subgroup);
}

#[test]
fn moqt_datagram_corpus_replays() {
    replay("moqt_datagram", decoders::moqt_datagram);
}

#[test]
fn mcp_meta_corpus_replays() {
    replay("mcp_meta", bindings::mcp_meta);
}

#[test]
fn a2a_json_corpus_replays() {
    replay("a2a_json", bindings::a2a_json);
}

#[test]
fn config_corpus_replays() {
    replay("config", bindings::config);
}

#[test]
fn signed_corpus_replays() {
    replay("signed", bindings::signed);
}
