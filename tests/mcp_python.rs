//! The Python MCP SDK (`mcp` 2.x) drives `abhyasa mcp --stdio` and `abhyasa mcp --http`
//! (streamable HTTP): `tests/mcp/client.py` makes every check over each transport (tools
//! listed, acks on results, a revocation riding a call refusing it, a revoked token, a
//! malformed envelope refused with nothing applied, no double apply).
//!
//! It needs a Python with the SDK: `ABHYASA_MCP_PYTHON=/path/to/venv/bin/python` (`.ci/run`
//! creates one with a pinned `mcp`). Without it the test says plainly that it skipped.

mod common;

#[test]
fn the_python_mcp_sdk_drives_the_stdio_server() {
    let Some(stdout) = common::python_client("ABHYASA_MCP_PYTHON", "mcp 2.x", "mcp/client.py")
    else {
        return;
    };
    assert!(stdout.contains("mcp python client: all checks passed"));
    // Every check the script makes, each printed as it passed.
    assert!(
        stdout
            .lines()
            .filter(|l| l.starts_with("ok: [stdio] "))
            .count()
            >= 18
    );
    assert!(
        stdout
            .lines()
            .filter(|l| l.starts_with("ok: [http] "))
            .count()
            >= 18
    );
}
