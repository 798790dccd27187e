//! Every committed fuzz input — `fuzz/seeds/<target>` and `fuzz/kept/<target>.tar.gz` — replayed
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

/// The inputs of `target`, each named: the files of `fuzz/seeds/<target>` and, where it
/// exists, every entry of the archive `fuzz/kept/<target>.tar.gz`. Returns how many are
/// seeds, and all of them.
fn inputs(target: &str) -> (usize, Vec<(String, Vec<u8>)>) {
    let dir = Path::new(FUZZ_DIR);
    let seeds_dir = dir.join("seeds").join(target);
    let mut seeds: Vec<PathBuf> = match std::fs::read_dir(&seeds_dir) {
        Ok(entries) => entries
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.is_file())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("reading {}: {e}", seeds_dir.display()),
    };
    seeds.sort();
    let n = seeds.len();
    let mut all: Vec<(String, Vec<u8>)> = seeds
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).expect("a seed file");
            (p.display().to_string(), data)
        })
        .collect();
    let archive = dir.join("kept").join(format!("{target}.tar.gz"));
    match std::fs::File::open(&archive) {
        Ok(f) => {
            let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(f));
            for entry in tar.entries().expect("a tar.gz archive") {
                let mut entry = entry.expect("an archive entry");
                if !entry.header().entry_type().is_file() {
                    continue;
                }
                let name = entry.path().expect("an entry name").display().to_string();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).expect("an entry's bytes");
                all.push((format!("{}:{name}", archive.display()), data));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("reading {}: {e}", archive.display()),
    }
    (n, all)
}

/// Runs `check` over every input of `target`; fails naming each input that panicked.
fn replay(target: &str, check: fn(&[u8])) {
    let (seeds, inputs) = inputs(target);
    assert!(seeds > 0, "fuzz/seeds/{target} is missing or empty");
    let failed: Vec<&str> = inputs
        .iter()
        .filter(|(_, data)| std::panic::catch_unwind(|| check(data)).is_err())
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs fail its check: {failed:?}",
        failed.len(),
        inputs.len()
    );
}

/// The kept corpora are read: each archive holds what the loose directories held.
#[test]
fn every_kept_archive_reads_and_holds_inputs() {
    for (target, at_least) in [
        ("a2a_json", 4_000),
        ("ack", 950),
        ("config", 4_000),
        ("escalation", 1_800),
        ("ledger", 2_900),
        ("mcp_meta", 2_500),
        ("moqt_subgroup", 350),
        ("obligation", 1_500),
        ("signed", 1_500),
    ] {
        let (seeds, all) = inputs(target);
        assert!(
            all.len() - seeds >= at_least,
            "{target}: {} kept inputs",
            all.len() - seeds
        );
    }
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

/// A group's envelope, byte for byte: the fixed deployment (`fuzz/fixtures/signed`) signs three
/// payloads as one group (one Ed25519 signature over their Merkle root; Ed25519 is
/// deterministic), and the second envelope must be the pinned vector
/// `fuzz/fixtures/signed/group-1-of-3.hex` — the construction's labels, proof encoding, tree
/// and signature input, fixed. A deliberate change to the construction rewrites the file
/// (`ABHYASA_WRITE_VECTORS=1`) and says so in docs/TRANSPORT.md.
#[test]
fn a_group_envelope_is_the_pinned_vector() {
    let (signer, verifier) = bindings::deployment();
    let payloads: [&[u8]; 3] = [b"golden-0", b"golden-1", b"golden-2"];
    let group = signer.sign_group(abhyasa_moq::SignedKind::Obligation, &payloads);
    let hex: String = group[1].iter().map(|b| format!("{b:02x}")).collect();
    let path = Path::new(FUZZ_DIR).join("fixtures/signed/group-1-of-3.hex");
    if std::env::var_os("ABHYASA_WRITE_VECTORS").is_some() {
        std::fs::write(&path, format!("{hex}\n")).expect("the vector written");
    }
    let want = std::fs::read_to_string(&path).expect("the pinned vector");
    assert_eq!(hex, want.trim(), "the group envelope changed");
    for (e, p) in group.iter().zip(payloads) {
        let opened = verifier
            .open(abhyasa_moq::SignedKind::Obligation, e)
            .expect("a group envelope opens alone");
        assert_eq!(opened.payload, p);
    }
}

/// The `signed` check over fresh deployments: a new CA (ECDSA P-256, as `abhyasa certs` makes
/// it) and principal per round, and inputs shaped like the one abort the target ever reported
/// (a run whose deployment was generated per process, so the key, certificate and CA
/// signature bytes its edits met differed from the committed fixture's): forged mode, a short
/// payload, byte edits anywhere in the envelope. A search, not a regression test — ignored by
/// default; `ABHYASA_SIGNED_ROUNDS` (default 20) deployments × `ABHYASA_SIGNED_INPUTS` (default
/// 20,000) inputs each:
///
/// ```sh
/// ABHYASA_SIGNED_ROUNDS=200 cargo test --test fuzz_corpora -- --ignored --nocapture
/// ```
///
/// A failing input is written with its deployment (`ca.pem`, `ca.key`, the principal's
/// certificate and key) into a directory the failure names, so it replays.
#[test]
#[ignore = "a long search over fresh deployments; run with --ignored (docs/FUZZING.md)"]
fn the_signed_check_holds_over_fresh_deployments() {
    use abhyasa_moq::{Ca, Signer, Verifier};
    use rand::Rng as _;
    let count = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name}={v}: not a count"))
            })
            .unwrap_or(default)
    };
    let (rounds, per_round) = (
        count("ABHYASA_SIGNED_ROUNDS", 20),
        count("ABHYASA_SIGNED_INPUTS", 20_000),
    );
    let principal = abhyasa_wire::AgentId::new("principal").expect("an agent id");
    let mut rng = rand::rng();
    let (mut opened, mut total) = (0usize, 0usize);
    for round in 0..rounds {
        let ca = Ca::generate("fuzz").expect("a CA");
        let identity = ca.issue(&principal).expect("the principal's identity");
        let signer = Signer::new(&identity).expect("an Ed25519 identity");
        let verifier = Verifier::new(ca.certificate().clone());
        for _ in 0..per_round {
            // Mode: forged (bit 1), either kind (bit 0), the other bits as the fuzzer leaves
            // them. Then the payload's length and bytes, then (offset u16, xor u8) edits, one
            // of three shapes: anywhere (few, or many: the reported input had 19); inside the
            // signature (the envelope parses and its certificate verifies, so the signature
            // is checked alone and in the batch with this deployment's key); or an edit and
            // its undoing (the envelope opens, and payload, signer and the batch's answer are
            // compared).
            let mut data = vec![rng.random::<u8>() | 2];
            let len: u8 = rng.random_range(0..=8);
            data.push(len);
            data.extend((0..len).map(|_| rng.random::<u8>()));
            let edit = |data: &mut Vec<u8>, at: u16, xor: u8| {
                data.extend(at.to_le_bytes());
                data.push(xor);
            };
            match rng.random_range(0..3) {
                0 => {
                    let n = if rng.random_bool(0.5) {
                        rng.random_range(1..=3)
                    } else {
                        rng.random_range(4..=24)
                    };
                    for _ in 0..n {
                        edit(&mut data, rng.random(), rng.random_range(1..=255));
                    }
                }
                1 => {
                    // The signature is the envelope's last 64 bytes.
                    let kind = if data[0] & 1 == 0 {
                        abhyasa_moq::SignedKind::Obligation
                    } else {
                        abhyasa_moq::SignedKind::Ack
                    };
                    let size = signer.sign(kind, &data[2..]).len();
                    for _ in 0..rng.random_range(1..=4) {
                        let at = size - 1 - rng.random_range(0..64);
                        edit(&mut data, at as u16, rng.random_range(1..=255));
                    }
                }
                _ => {
                    let (at, xor) = (rng.random(), rng.random_range(1..=255));
                    edit(&mut data, at, xor);
                    edit(&mut data, at, xor);
                }
            }
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                bindings::signed_in(&signer, &verifier, &data)
            }));
            total += 1;
            match outcome {
                // An edited envelope that opened: the check compared its payload, signer and
                // batch answer (counted, so a run shows it reached that branch).
                Ok(envelope_opened) => opened += usize::from(envelope_opened),
                Err(_) => {
                    let dir = tempfile::Builder::new()
                        .prefix("signed-failure-")
                        .tempdir()
                        .expect("a directory for the failing case")
                        .keep();
                    ca.save(&dir).expect("the CA saved");
                    identity.save(&dir).expect("the identity saved");
                    std::fs::write(dir.join("input"), &data).expect("the input saved");
                    panic!(
                        "round {round}: the signed check failed on {data:02x?}; the input and \
                         its deployment are in {}",
                        dir.display()
                    );
                }
            }
        }
    }
    println!("{rounds} deployments, {total} inputs, {opened} edited envelopes opened, no failure");
}

/// The hand-made seed of a registered kind reads as one, so the replay above (and the fuzzer,
/// which starts from it) goes through the registered read path.
#[test]
fn the_registered_kind_seed_reads_as_its_kind() {
    let seed = std::fs::read(format!("{FUZZ_DIR}/seeds/obligation/registered-fuzz-kind")).unwrap();
    let o = abhyasa::wire::decode_obligation(&seed).unwrap();
    assert_eq!(o.kind(), abhyasa::wire::Kind::Registered("fuzz.kind"));
    assert_eq!(
        abhyasa::wire::words::obligation(&o),
        "fuzz.kind seed 7 for agent-1"
    );
    decoders::obligation(&seed);
}
