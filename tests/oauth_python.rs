//! An independent OAuth client library — Authlib 1.x over httpx — drives `abhyasa node` with
//! `[enforce]` (`tests/oauth/introspect.py`): RFC 7662 introspection with the node in front of
//! an upstream authorization server, and an RFC 7009 revocation that becomes a custody
//! obligation to the token's holder, after which the token is inactive at once.
//!
//! It needs a Python with Authlib: `ABHYASA_OAUTH_PYTHON=/path/to/venv/bin/python` (`.ci/run`
//! creates one with pinned versions). Without it the test says plainly that it skipped.

mod common;

#[test]
fn authlib_introspects_and_revokes_through_the_node() {
    let Some(stdout) = common::python_client(
        "ABHYASA_OAUTH_PYTHON",
        "authlib and httpx",
        "oauth/introspect.py",
    ) else {
        return;
    };
    assert!(stdout.contains("oauth python client: all checks passed"));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok: ")).count(), 8);
}
