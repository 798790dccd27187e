//! Two `abhyasa node` processes over MCP carried on their QUIC endpoints (the MCP-over-MOQT
//! layout), set up with the CLI: the agent serves `[mcp]`, the principal reaches it with
//! `transport = "mcp"` (obligations ride `abhyasa_deliver` calls, acks return on the results).
//! The MCP server process is SIGKILLed with obligations in flight and restarted; custody
//! completes; both are stopped and `abhyasa check` audits their redb files.

mod common;
use common::{custody_survives_a_sigkill_of_the_agent, free_udp, Pair};

#[test]
fn custody_over_mcp_over_quic_between_two_processes_survives_a_sigkill_of_the_mcp_server() {
    let dir = tempfile::tempdir().unwrap();
    let setup = common::Setup::new(dir.path());
    let c = setup.certs.as_str();
    let a_port = free_udp();
    let (p_admin, a_admin) = (setup.admin.0.as_str(), setup.admin.1.as_str());
    let (p_state, a_state) = (&setup.state.0, &setup.state.1);
    let p_cfg = dir.path().join("principal.toml");
    std::fs::write(
        &p_cfg,
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{p_admin}\"\n\n\
             [custody]\nresponse_timeout_ms = 300\nbackoff_base_ms = 50\nbackoff_cap_ms = 400\n\n\
             [[peers]]\nid = \"agent-1\"\naddr = \"{a_port}\"\ntransport = \"mcp\"\n",
            free_udp(),
            p_state.display()
        ),
    )
    .unwrap();
    let a_cfg = dir.path().join("agent.toml");
    std::fs::write(
        &a_cfg,
        format!(
            "agent = \"agent-1\"\nlisten = \"{a_port}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{a_admin}\"\n\n[mcp]\n",
            a_state.display()
        ),
    )
    .unwrap();

    custody_survives_a_sigkill_of_the_agent(&Pair {
        principal: (&p_cfg, p_admin, p_state),
        agent: (&a_cfg, a_admin, a_state),
        over: "MCP",
    });
}
