//! The Python MCP SDK (`mcp` 2.x) drives `abhyasa mcp --stdio` and `abhyasa mcp --http`
//! (streamable HTTP): `tests/mcp/client.py` makes every check over each transport (tools
//! listed, acks on results, a revocation riding a call refusing it, a revoked token, a
//! malformed envelope refused with nothing applied, no double apply).
//!
//! It needs a Python with the SDK: `ABHYASA_MCP_PYTHON=/path/to/venv/bin/python` (`.ci/run`
//! creates one with a pinned `mcp`). Without it the test says plainly that it skipped.

use std::process::Command;

#[test]
fn the_python_mcp_sdk_drives_the_stdio_server() {
    let Ok(python) = std::env::var("ABHYASA_MCP_PYTHON") else {
        println!("SKIPPED: ABHYASA_MCP_PYTHON is not set (a python with mcp 2.x; .ci/run sets it)");
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_abhyasa"))
        .arg(work.path())
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the Python MCP client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
