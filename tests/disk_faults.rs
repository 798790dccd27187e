//! A damaged or foreign state directory: the node refuses to start with a clear error (never a
//! panic), leaves the file as it found it, and `abhyasa check` says what is wrong. Obligations
//! acked before the damage are still there in the undamaged original.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::{
    abhyasa, free_udp, issue_revocation, output_text, refused_start, spawn_node_piped, wait_for,
    NodeProc,
};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    certs: String,
    peer: String,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let certs = root.join("certs").display().to_string();
        assert!(abhyasa(&["certs", "init", "--dir", &certs])
            .status
            .success());
        assert!(abhyasa(&["certs", "issue", "agent-1", "--dir", &certs])
            .status
            .success());
        Self {
            _dir: dir,
            root,
            certs,
            peer: free_udp().to_string(),
        }
    }

    /// A node's state (`original`) holding three obligations acked under custody (pending:
    /// their target never answers), the node stopped; with its config.
    fn three_pending(&self) -> (PathBuf, PathBuf) {
        let original = self.root.join("original");
        let cfg = self.config(&original);
        let node = NodeProc::start(&cfg);
        wait_for("the node", Duration::from_secs(20), || {
            pending(&original).is_some()
        });
        for t in ["t1", "t2", "t3"] {
            let admin = original.display().to_string();
            let out = issue_revocation(&["--admin", &admin], t, &["--deadline-ms", "3600000"]);
            assert!(out.status.success(), "{}", output_text(&out));
        }
        assert_eq!(pending(&original), Some(3));
        node.stop();
        (original, cfg)
    }

    /// A config for `agent-1` keeping its state in `state` (one peer that never answers).
    fn config(&self, state: &Path) -> PathBuf {
        let cfg = state.with_extension("toml");
        std::fs::write(
            &cfg,
            format!(
                "agent = \"agent-1\"\nlisten = \"{}\"\ncerts = \"{}\"\nstate = \"{}\"\n\n\
                 [[peers]]\nid = \"agent-2\"\naddr = \"{}\"\n",
                free_udp(),
                self.certs,
                state.display(),
                self.peer
            ),
        )
        .unwrap();
        cfg
    }
}

fn pending(state: &Path) -> Option<usize> {
    let out = abhyasa(&["status", "--json", "--admin", &state.display().to_string()]);
    out.status.success().then(|| {
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        s["pending"].as_array().unwrap().len()
    })
}

/// Every table of a database that redb can open, with its number of rows.
fn tables(db: &Path) -> Vec<(String, u64)> {
    use redb::{ReadableDatabase as _, ReadableTableMetadata as _, TableHandle as _};
    let db = redb::Database::open(db).unwrap();
    let read = db.begin_read().unwrap();
    read.list_tables()
        .unwrap()
        .map(|t| {
            let name = t.name().to_owned();
            (name, read.open_untyped_table(t).unwrap().len().unwrap())
        })
        .collect()
}

/// Refused cleanly: a non-zero exit that is not a panic, with `says` in the output, and the
/// database as it was: byte for byte when redb cannot open it, every table and row count
/// when it can (redb's own header flags change on any open).
fn assert_refused(fx: &Fixture, state: &Path, says: &str, opens: bool) {
    let db = state.join("node.redb");
    let before = std::fs::read(&db).unwrap();
    let rows = opens.then(|| tables(&db));
    let out = refused_start(&fx.config(state));
    let t = output_text(&out);
    assert!(
        !out.status.success() && out.status.code() != Some(101),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
    assert!(t.contains(says), "expected {says:?} in: {t}");
    match rows {
        Some(rows) => assert_eq!(tables(&db), rows, "the refused start changed the tables"),
        None => assert!(
            std::fs::read(&db).unwrap() == before,
            "the refused start changed {}",
            db.display()
        ),
    }
    let check = abhyasa(&["check", "--state", &format!("agent-1={}", state.display())]);
    let c = output_text(&check);
    assert!(!check.status.success(), "check passed damaged state: {c}");
    assert!(!c.contains("panicked"), "{c}");
    assert!(c.contains(says), "check: expected {says:?} in: {c}");
}

fn copy_state(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(from.join("node.redb"), to.join("node.redb")).unwrap();
}

#[test]
fn damaged_or_foreign_state_is_refused_clearly_and_left_as_it_was() {
    let fx = Fixture::new();
    let (original, cfg) = fx.three_pending();
    let len = std::fs::metadata(original.join("node.redb")).unwrap().len();

    // Truncated to half its length (a copy cut short, a file system that lost its tail).
    let truncated = fx.root.join("truncated");
    copy_state(&original, &truncated);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(truncated.join("node.redb"))
        .unwrap();
    f.set_len(len / 2).unwrap();
    drop(f);
    assert_refused(&fx, &truncated, "node.redb: opening the database", false);

    // Not a database at all (its header overwritten).
    let garbage = fx.root.join("garbage");
    copy_state(&original, &garbage);
    let mut bytes = std::fs::read(garbage.join("node.redb")).unwrap();
    for (i, b) in bytes.iter_mut().take(4096).enumerate() {
        *b = (i * 31 + 7) as u8;
    }
    std::fs::write(garbage.join("node.redb"), &bytes).unwrap();
    assert_refused(&fx, &garbage, "node.redb: opening the database", false);

    // Written by a newer layout.
    let newer = fx.root.join("newer");
    copy_state(&original, &newer);
    {
        let db = redb::Database::open(newer.join("node.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let meta: redb::TableDefinition<'_, &str, u64> = redb::TableDefinition::new("meta");
            let mut t = txn.open_table(meta).unwrap();
            t.insert("schema", 99).unwrap();
        }
        txn.commit().unwrap();
    }
    assert_refused(&fx, &newer, "schema version 99", true);
    assert!(tables(&newer.join("node.redb"))
        .iter()
        .any(|(t, n)| t == "custodian.pending" && *n == 3));

    // The original, untouched, still holds what was acked.
    let node = NodeProc::start(&cfg);
    wait_for("the node again", Duration::from_secs(20), || {
        pending(&original).is_some()
    });
    assert_eq!(pending(&original), Some(3));
    node.stop();
}

/// How a node given `cfg` ended up: serving with this many pending, or refused.
enum Start {
    Serving(usize),
    Refused(Output),
}

fn start_or_refuse(cfg: &Path, state: &Path) -> Start {
    let mut child = spawn_node_piped(cfg);
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if child.try_wait().unwrap().is_some() {
            return Start::Refused(child.wait_with_output().unwrap());
        }
        if let Some(n) = pending(state) {
            let _ = child.kill();
            let _ = child.wait();
            return Start::Serving(n);
        }
        assert!(
            Instant::now() < until,
            "the node neither served nor stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each 4 KiB page of a node's file damaged in turn (64 bytes flipped): the node either refuses
/// cleanly (exit 1 naming the file, no panic, the file left as it was) or the page was not in
/// use and every acked obligation is there. `abhyasa check` agrees page by page.
#[test]
fn every_damaged_page_is_refused_or_harmless() {
    let fx = Fixture::new();
    let (original, _) = fx.three_pending();
    let clean = std::fs::read(original.join("node.redb")).unwrap();
    let (mut refusals, mut harmless) = (0, 0);
    for page in 1..clean.len() / 4096 {
        let state = fx.root.join(format!("page-{page}"));
        std::fs::create_dir_all(&state).unwrap();
        let mut bytes = clean.clone();
        for b in &mut bytes[page * 4096 + 64..page * 4096 + 128] {
            *b ^= 0x5a;
        }
        let db = state.join("node.redb");
        std::fs::write(&db, &bytes).unwrap();
        let check = abhyasa(&["check", "--state", &format!("agent-1={}", state.display())]);
        let c = output_text(&check);
        assert!(!c.contains("panicked"), "page {page}: check: {c}");
        match start_or_refuse(&fx.config(&state), &state) {
            Start::Serving(n) => {
                assert_eq!(n, 3, "page {page}: the node started and lost obligations");
                assert!(check.status.success(), "page {page}: check: {c}");
                harmless += 1;
            }
            Start::Refused(out) => {
                let t = output_text(&out);
                assert_eq!(out.status.code(), Some(1), "page {page}: {t}");
                assert!(
                    t.contains("node.redb: opening the database"),
                    "page {page}: {t}"
                );
                assert_eq!(
                    std::fs::read(&db).unwrap(),
                    bytes,
                    "page {page}: file changed"
                );
                assert!(!check.status.success(), "page {page}: check passed: {c}");
                assert!(c.contains("node.redb"), "page {page}: check: {c}");
                refusals += 1;
            }
        }
    }
    println!("damaged pages: {refusals} refused, {harmless} not in use");
    assert!(refusals > 0, "no damaged page was detected");
}
