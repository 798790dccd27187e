//! The official A2A Python SDK (`a2a-sdk` 1.x) and raw HTTP drive `abhyasa node` with `[a2a]`:
//! `tests/a2a/client.py` reads the card with the SDK's resolver and parser over mutual TLS,
//! checks the Abhyasa extension and its profiles against the retry rule (computed in Python),
//! POSTs an obligation in the reference implementation's JSON shape (twice: applied once),
//! sends bad input (refused with the right status, nothing applied) and reads the agent's
//! status.
//!
//! It needs a Python with the SDK: `ABHYASA_A2A_PYTHON=/path/to/venv/bin/python` (`.ci/run`
//! creates one with a pinned `a2a-sdk`). Without it the test says plainly that it skipped.

mod common;

#[test]
fn the_python_a2a_sdk_reads_the_card_and_raw_http_gets_acks() {
    let Some(stdout) = common::python_client("ABHYASA_A2A_PYTHON", "a2a-sdk 1.x", "a2a/client.py")
    else {
        return;
    };
    assert!(stdout.contains("a2a python client: all checks passed"));
    assert!(stdout.lines().filter(|l| l.starts_with("ok: ")).count() >= 13);
}
