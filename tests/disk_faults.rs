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

/// The ids of the obligations pending at the node whose state is `state`.
fn pending_ids(state: &Path) -> Option<std::collections::BTreeSet<String>> {
    let out = abhyasa(&["status", "--json", "--admin", &state.display().to_string()]);
    out.status.success().then(|| {
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        s["pending"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_owned())
            .collect()
    })
}

/// A full disk, emulated without root or a small filesystem: the node runs under a file-size
/// limit (`ulimit -f`, with SIGXFSZ ignored so a write past it fails with EFBIG as it would
/// with ENOSPC) equal to its store's size, so every commit that needs a new page fails.
/// Issues the store cannot take are refused, each naming the cause; the node keeps running
/// and answering; and after a SIGKILL and a restart without the limit, what is pending is
/// exactly what was acked: nothing acked is lost, nothing refused slipped in.
#[test]
fn a_full_disk_refuses_issues_with_the_cause_and_loses_nothing_acked() {
    let fx = Fixture::new();
    let state = fx.root.join("full");
    let cfg = fx.config(&state);
    let node = NodeProc::start(&cfg);
    wait_for("the node", Duration::from_secs(20), || {
        pending(&state).is_some()
    });
    node.stop();
    let size = std::fs::metadata(state.join("node.redb")).unwrap().len();
    let mut limited = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f {}; exec \"$0\" node --config \"$1\"",
            size / 1024
        ))
        .arg(env!("CARGO_BIN_EXE_abhyasa"))
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the limited node", Duration::from_secs(20), || {
        pending(&state).is_some()
    });
    let admin = state.display().to_string();
    let (mut acked, mut refused) = (std::collections::BTreeSet::new(), Vec::new());
    for i in 0..400 {
        let out = issue_revocation(
            &["--admin", &admin],
            &format!("tok-{i}"),
            &["--deadline-ms", "3600000"],
        );
        let reply: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", output_text(&out)));
        if reply["ok"] == true {
            assert!(out.status.success());
            acked.insert(reply["id"].as_str().unwrap().to_owned());
        } else {
            assert!(!out.status.success(), "{reply}");
            refused.push(reply["error"].as_str().unwrap().to_owned());
            if refused.len() == 5 {
                break;
            }
        }
    }
    assert!(
        !refused.is_empty(),
        "the limit never bit: {} acked",
        acked.len()
    );
    println!(
        "full disk: {} acked, then {} refused, first: {}",
        acked.len(),
        refused.len(),
        refused[0]
    );
    for e in &refused {
        assert!(
            e.contains("File too large") && e.contains("issue it again"),
            "a refusal that does not say why: {e}"
        );
    }
    // Still running and answering; what it holds is what it acked.
    assert!(limited.try_wait().unwrap().is_none(), "the node exited");
    assert_eq!(pending_ids(&state).as_ref(), Some(&acked));
    limited.kill().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(limited.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    limited.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("File too large"),
        "the log names the cause: {stderr}"
    );

    let _node = NodeProc::start(&cfg);
    wait_for("the restarted node", Duration::from_secs(20), || {
        pending(&state).is_some()
    });
    assert_eq!(
        pending_ids(&state),
        Some(acked.clone()),
        "after a SIGKILL and a restart: exactly what was acked ({} of them)",
        acked.len()
    );
}

/// A state directory the node may read but not write (a read-only mount, or another user's
/// files): it refuses to start, naming the file and the cause, and leaves it as it was; the
/// obligations in it are all there for a node that may write. Needs root and `setpriv` to
/// run the node as another user (root writes through any mode); says plainly when it skipped.
#[test]
fn a_state_directory_the_node_cannot_write_is_refused_clearly() {
    use std::os::unix::fs::PermissionsExt as _;
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n");
    let setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok();
    if !root || !setpriv {
        println!("SKIPPED: needs root and setpriv to run the node as a user who may not write");
        return;
    }
    let fx = Fixture::new();
    std::fs::set_permissions(&fx.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (original, _) = fx.three_pending();
    // The node's certificates, readable by the user it runs as; the state, root's.
    let certs = fx.root.join("certs-nobody");
    std::fs::create_dir_all(&certs).unwrap();
    std::os::unix::fs::chown(&certs, Some(65534), Some(65534)).unwrap();
    for f in std::fs::read_dir(&fx.certs).unwrap() {
        let f = f.unwrap().path();
        let to = certs.join(f.file_name().unwrap());
        std::fs::copy(&f, &to).unwrap();
        std::os::unix::fs::chown(&to, Some(65534), Some(65534)).unwrap();
    }
    let ro = fx.root.join("read-only");
    copy_state(&original, &ro);
    let cfg = fx.root.join("read-only.toml");
    let text = std::fs::read_to_string(fx.config(&ro))
        .unwrap()
        .replace(&fx.certs, &certs.display().to_string());
    std::fs::write(&cfg, text).unwrap();
    let db = ro.join("node.redb");
    let before = std::fs::read(&db).unwrap();
    let mut child = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_abhyasa"))
        .args(["node", "--config"])
        .arg(&cfg)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < until,
            "the node started on a state it cannot write"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let t = output_text(&out);
    assert!(
        !out.status.success() && out.status.code() != Some(101),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
    assert!(
        t.contains(&db.display().to_string()) && t.contains("Permission denied"),
        "the refusal names the file and the cause: {t}"
    );
    println!("read-only state: {}", t.trim());
    assert!(
        std::fs::read(&db).unwrap() == before,
        "the refused start changed the file"
    );
    // Where it may write, all three are there.
    std::fs::remove_dir_all(&original).unwrap();
    copy_state(&ro, &original);
    let _node = NodeProc::start(&fx.config(&original));
    wait_for("the node", Duration::from_secs(20), || {
        pending(&original).is_some()
    });
    assert_eq!(pending(&original), Some(3));
}
