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

/// `abhyasa mcp --http` allowed 256 descriptors, 2,000 idle connections held against it: the
/// server keeps running and the host holding the bearer token is answered on time (before,
/// idle connections were never closed and the host got no answer while they were held).
#[test]
fn idle_connections_to_mcp_http_do_not_stop_the_server() {
    use std::io::{Read as _, Write as _};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let setup = common::Setup::new(dir.path());
    let (_, a_cfg) = configs(dir.path(), &setup, free_udp(), free_udp());
    let http: SocketAddr = ([127, 0, 0, 1], common::free_tcp()).into();
    let log = dir.path().join("mcp.log");
    let (a, h) = (a_cfg.to_str().unwrap(), http.to_string());
    let Some(mut server) =
        common::abhyasa_with_descriptors(&["mcp", "--config", a, "--http", &h], 256, &log)
    else {
        println!("SKIPPED: needs prlimit (util-linux) to start the server with few descriptors");
        return;
    };
    let token_file = setup.state.1.join("mcp.token");
    common::wait_for("the MCP HTTP port", Duration::from_secs(30), || {
        token_file.exists() && std::net::TcpStream::connect(http).is_ok()
    });
    let token = std::fs::read_to_string(&token_file).unwrap();
    let idle = common::idle_connections(http, 2_000);
    assert!(
        server.try_wait().unwrap().is_none(),
        "the server stopped under {} idle connections: {}",
        idle.len(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // The host, with every idle connection still held.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood-test","version":"1"}}}"#;
    // An authorized `initialize` sent on a new connection.
    let initialize = |http: SocketAddr| -> std::io::Result<std::net::TcpStream> {
        let mut s = std::net::TcpStream::connect_timeout(&http, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "POST /mcp HTTP/1.1\r\nHost: {http}\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Content-Length: {}\r\n\r\n{body}",
            token.trim(),
            body.len()
        )?;
        Ok(s)
    };
    let t = Instant::now();
    let answer = (|| -> std::io::Result<String> {
        let mut s = initialize(http)?;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains("serverInfo") {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        Ok(String::from_utf8_lossy(&got).into_owned())
    })()
    .unwrap_or_else(|e| {
        panic!(
            "the host was not answered within 5 s under {} idle connections: {e}",
            idle.len()
        )
    });
    let took = t.elapsed();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the host's initialize: {answer}"
    );
    assert!(
        answer.contains("serverInfo"),
        "an MCP initialize result: {answer}"
    );
    assert!(
        server.try_wait().unwrap().is_none(),
        "the server still runs"
    );
    println!(
        "mcp http flood: {} idle connections held, the host answered in {} ms",
        idle.len(),
        took.as_millis()
    );
    drop(idle);
    // Authorized connections are capped too (a quarter of the 256 descriptors: 64), the
    // newest past the cap answered 503 and closed: a token holder opening many cannot take
    // the descriptors the node needs.
    let authorized = |http: SocketAddr| -> std::io::Result<(String, std::net::TcpStream)> {
        let mut s = initialize(http)?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head)?;
        Ok((String::from_utf8_lossy(&head).into_owned(), s))
    };
    let mut held = Vec::new();
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..80 {
        let (status, s) = authorized(http).expect("an authorized connection is answered");
        match status.as_str() {
            "HTTP/1.1 200" => ok += 1,
            "HTTP/1.1 503" => refused += 1,
            other => panic!("unexpected answer {other:?}"),
        }
        held.push(s);
    }
    assert!(
        (63..=64).contains(&ok) && ok + refused == 80,
        "{ok} served, {refused} refused"
    );
    drop(held);
    common::wait_for(
        "an authorized connection again",
        Duration::from_secs(10),
        || authorized(http).is_ok_and(|(status, _)| status == "HTTP/1.1 200"),
    );
    let _ = server.kill();
    let _ = server.wait();
}
