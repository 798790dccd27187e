//! Two `abhyasa node` processes over MCP carried on their QUIC endpoints (the MCP-over-MOQT
//! layout), set up with the CLI: the agent serves `[mcp]`, the principal reaches it with
//! `transport = "mcp"` (obligations ride `abhyasa_deliver` calls, acks return on the results).
//! The MCP server process is SIGKILLed with obligations in flight and restarted; custody
//! completes; both are stopped and `abhyasa check` audits their redb files. The second test
//! does the same through `abhyasa netem` losing 10% of the packets each way. The third has
//! the principal spawn the agent itself as `abhyasa mcp --stdio` (`command = [...]`), the
//! child SIGKILLed and spawned again by its principal. The fourth reaches the agent as
//! `abhyasa mcp --http` at a `url` (streamable HTTP).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

mod common;
use common::{custody_survives_a_sigkill_of_the_agent, free_udp, AgentStart, NodeProc, Pair};

/// Config files for the principal (reaching `agent-1` at `dial`) and the agent (listening on
/// `a_port`).
fn configs(
    dir: &Path,
    setup: &common::Setup,
    dial: SocketAddr,
    a_port: SocketAddr,
) -> (PathBuf, PathBuf) {
    configs_reaching(dir, setup, &format!("addr = \"{dial}\""), a_port)
}

/// The same, the principal's peer reached by `how` (its `addr` or its `command`).
fn configs_reaching(
    dir: &Path,
    setup: &common::Setup,
    how: &str,
    a_port: SocketAddr,
) -> (PathBuf, PathBuf) {
    let c = setup.certs.as_str();
    let (p_admin, a_admin) = (setup.admin.0.as_str(), setup.admin.1.as_str());
    let (p_state, a_state) = (&setup.state.0, &setup.state.1);
    let p_cfg = dir.join("principal.toml");
    std::fs::write(
        &p_cfg,
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{p_admin}\"\n\n\
             [custody]\nresponse_timeout_ms = 300\nbackoff_base_ms = 50\nbackoff_cap_ms = 400\n\n\
             [[peers]]\nid = \"agent-1\"\n{how}\ntransport = \"mcp\"\n",
            free_udp(),
            p_state.display()
        ),
    )
    .unwrap();
    let a_cfg = dir.join("agent.toml");
    std::fs::write(
        &a_cfg,
        format!(
            "agent = \"agent-1\"\nlisten = \"{a_port}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{a_admin}\"\n\n[mcp]\nprincipal = \"principal\"\n",
            a_state.display()
        ),
    )
    .unwrap();
    (p_cfg, a_cfg)
}

#[test]
fn custody_over_mcp_over_quic_between_two_processes_survives_a_sigkill_of_the_mcp_server() {
    let dir = tempfile::tempdir().unwrap();
    let setup = common::Setup::new(dir.path());
    let a_port = free_udp();
    let (p_cfg, a_cfg) = configs(dir.path(), &setup, a_port, a_port);
    custody_survives_a_sigkill_of_the_agent(&Pair {
        principal: (&p_cfg, &setup.admin.0, &setup.state.0),
        agent: (&a_cfg, &setup.admin.1, &setup.state.1),
        over: "MCP",
        start: AgentStart::Node,
    });
}

#[test]
fn custody_over_mcp_survives_10_percent_loss_and_a_sigkill_of_the_mcp_server_together() {
    let dir = tempfile::tempdir().unwrap();
    let setup = common::Setup::new(dir.path());
    let (a_port, relay) = (free_udp(), free_udp());
    let (p_cfg, a_cfg) = configs(dir.path(), &setup, relay, a_port);
    // The principal dials the relay; the relay loses 10% of the datagrams each way.
    let _netem = NodeProc::run(&[
        "netem",
        "--listen",
        &relay.to_string(),
        "--forward",
        &a_port.to_string(),
        "--loss",
        "10%",
        "--seed",
        "7",
    ]);
    custody_survives_a_sigkill_of_the_agent(&Pair {
        principal: (&p_cfg, &setup.admin.0, &setup.state.0),
        agent: (&a_cfg, &setup.admin.1, &setup.state.1),
        over: "MCP through 10% loss",
        start: AgentStart::Node,
    });
}

#[test]
fn custody_over_mcp_to_a_server_the_principal_spawns_survives_a_sigkill_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let setup = common::Setup::new(dir.path());
    let a_cfg = dir.path().join("agent.toml");
    let command = format!(
        "command = [\"{}\", \"mcp\", \"--config\", \"{}\", \"--stdio\"]",
        env!("CARGO_BIN_EXE_abhyasa"),
        a_cfg.display()
    );
    let (p_cfg, a_cfg) = configs_reaching(dir.path(), &setup, &command, free_udp());
    custody_survives_a_sigkill_of_the_agent(&Pair {
        principal: (&p_cfg, &setup.admin.0, &setup.state.0),
        agent: (&a_cfg, &setup.admin.1, &setup.state.1),
        over: "MCP over the stdio of a spawned server",
        start: AgentStart::SpawnedByPrincipal,
    });
}

#[test]
fn custody_over_mcp_on_streamable_http_survives_a_sigkill_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let setup = common::Setup::new(dir.path());
    let http = format!("127.0.0.1:{}", common::free_tcp());
    // The server makes its bearer token at start; the principal reads it at each attempt.
    let how = format!(
        "url = \"http://{http}/mcp\"\ntoken_file = \"{}\"",
        setup.state.1.join("mcp.token").display()
    );
    let (p_cfg, a_cfg) = configs_reaching(dir.path(), &setup, &how, free_udp());
    let a = a_cfg.to_str().unwrap();
    let args = ["mcp", "--config", a, "--http", &http];
    custody_survives_a_sigkill_of_the_agent(&Pair {
        principal: (&p_cfg, &setup.admin.0, &setup.state.0),
        agent: (&a_cfg, &setup.admin.1, &setup.state.1),
        over: "MCP on streamable HTTP",
        start: AgentStart::Run(&args),
    });
}
