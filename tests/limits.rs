//! `[limits]` in a node's config reaches the running node: a limit set there is the one the
//! node enforces, named in its refusal; a limit that would refuse all work is refused at start.
//! (Each limit at and past its value is tested where it is enforced: `abhyasa-custody`,
//! `abhyasa-moq`, `abhyasa-node`.)

mod common;

use common::{certs, config, issue_revocation, output_text, refused_start, status, NodeProc};

#[test]
fn a_configured_limit_is_the_one_a_running_node_enforces() {
    let dir = tempfile::tempdir().unwrap();
    let c = certs(dir.path());
    // agent-2 never answers: what is issued to it stays pending.
    let (cfg, state) = config(dir.path(), &c, "[limits]\nmax_pending_per_target = 2");
    let st = state.display().to_string();
    let _node = NodeProc::start(&cfg);
    common::wait_for(
        "the admin interface",
        std::time::Duration::from_secs(20),
        || status(&st).is_some(),
    );
    for tok in ["tok-1", "tok-2"] {
        let out = issue_revocation(&["--admin", &st], tok, &[]);
        assert!(out.status.success(), "{}", output_text(&out));
    }
    let out = issue_revocation(&["--admin", &st], "tok-3", &[]);
    assert!(!out.status.success());
    let text = output_text(&out);
    assert!(
        text.contains("custody is full (2 pending obligations for one target)"),
        "{text}"
    );
    let s = status(&st).unwrap();
    assert_eq!(s["pending"].as_array().map(Vec::len), Some(2), "{s}");
}

#[test]
fn a_limit_that_would_refuse_all_work_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let c = certs(dir.path());
    for (extra, said) in [
        (
            "[limits]\nmax_pending = 0",
            "[limits] max_pending must be at least 1",
        ),
        (
            "[limits]\nrequests_per_session = 3",
            "requests_per_session must be at least 4",
        ),
        (
            "[limits]\nmax_pendings = 10",
            "unknown field `max_pendings`",
        ),
    ] {
        let (cfg, _) = config(dir.path(), &c, extra);
        let out = refused_start(&cfg);
        assert!(!out.status.success());
        let text = output_text(&out);
        assert!(text.contains(said), "{extra}: {text}");
    }
}
