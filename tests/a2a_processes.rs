//! Two `abhyasa node` processes over the A2A binding (HTTPS with mutual TLS on loopback), set
//! up with the CLI: the principal reaches `agent-1` through its card (`transport = "a2a"`).
//! The agent is SIGKILLed with obligations in flight and restarted; custody completes; both
//! are stopped and `abhyasa check` audits their redb files: nothing lost, nothing applied twice.

mod common;
use common::{
    abhyasa, custody_survives_a_sigkill_of_the_agent, free_tcp, free_udp, AgentStart, Pair,
};

#[test]
fn custody_over_a2a_between_two_processes_survives_a_sigkill_of_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let setup = common::Setup::new(dir.path());
    let c = setup.certs.as_str();
    let https = free_tcp();
    let (p_admin, a_admin) = (setup.admin.0.as_str(), setup.admin.1.as_str());
    let (p_state, a_state) = (&setup.state.0, &setup.state.1);
    let p_cfg = dir.path().join("principal.toml");
    std::fs::write(
        &p_cfg,
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{p_admin}\"\n\n\
             [custody]\nresponse_timeout_ms = 300\nbackoff_base_ms = 50\nbackoff_cap_ms = 400\n\n\
             [[peers]]\nid = \"agent-1\"\naddr = \"127.0.0.1:{https}\"\ntransport = \"a2a\"\n",
            free_udp(),
            p_state.display()
        ),
    )
    .unwrap();
    let a_cfg = dir.path().join("agent.toml");
    std::fs::write(
        &a_cfg,
        format!(
            "agent = \"agent-1\"\nlisten = \"{}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{a_admin}\"\n\n\
             [custody]\nbackoff_cap_ms = 120000\n\n\
             [a2a]\nlisten = \"127.0.0.1:{https}\"\n\n[a2a.deadline_seconds]\n\"anumati.consent\" = 86400\n",
            free_udp(),
            a_state.display()
        ),
    )
    .unwrap();

    // The card the agent serves, printed from its config.
    let out = abhyasa(&["card", "--config", a_cfg.to_str().unwrap()]);
    assert!(out.status.success());
    let card: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let params = &card["capabilities"]["extensions"][0]["params"];
    let consent = params["supported_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == "anumati.consent")
        .unwrap();
    assert_eq!(consent["deadline_seconds"], 86_400);
    // 24 h needs a backoff cap of at least 88 s to fit the wire's 1,000 retries (the default
    // 30 s cap is refused: see the next test); at 120 s the rule gives 9 doublings
    // (0.25 s … 64 s, 127.75 s), then ⌈86,272.25/120⌉ = 719: 728.
    assert_eq!(consent["max_retries"], 728);
    assert_eq!(
        consent["obligation_endpoint"],
        format!("https://agent-1:{https}/abhyasa/v1/obligations/anumati.consent")
    );

    custody_survives_a_sigkill_of_the_agent(&Pair {
        principal: (&p_cfg, p_admin, p_state),
        agent: (&a_cfg, a_admin, a_state),
        over: "A2A",
        start: AgentStart::Node,
    });
}

#[test]
fn a_card_that_readers_would_refuse_is_not_printed_or_served() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    let write = |custody: &str| {
        std::fs::write(
            &cfg,
            format!(
                "agent = \"agent-1\"\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\nstate = \"s\"\nadmin = \"127.0.0.1:2\"\n\n\
                 [custody]\n{custody}\n\n[a2a]\nlisten = \"127.0.0.1:3\"\n"
            ),
        )
        .unwrap();
    };
    write("backoff_base_ms = 250");
    let out = abhyasa(&["card", "--config", cfg.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A zero backoff base makes every profile invalid.
    write("backoff_base_ms = 0");
    let out = abhyasa(&["card", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("backoff_base_seconds must be > 0"), "{err}");
    // Reproduced: a 24 h deadline with the default backoff (cap 30 s) needs 2,886 retries;
    // the card said 1,000 and passed its own check. Refused now, naming what to change.
    std::fs::write(
        &cfg,
        "agent = \"agent-1\"\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\nstate = \"s\"\n\
         admin = \"127.0.0.1:2\"\n\n[a2a]\nlisten = \"127.0.0.1:3\"\n\n\
         [a2a.deadline_seconds]\n\"anumati.consent\" = 86400\n",
    )
    .unwrap();
    let out = abhyasa(&["card", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs 2886 retries")
            && err.contains("backoff_cap_ms) to at least 88 s")
            && err.contains("deadline_seconds.anumati.consent"),
        "{err}"
    );
}

/// Reproduced: about 1,500 idle connections to the A2A port — from the network, without a
/// certificate — exhausted the node's descriptors and stopped it. Now connections still in
/// their TLS handshake are capped (a quarter of the descriptor limit; the oldest closed for
/// a new one), handshakes and idle kept-alive connections time out, and a failed accept is
/// retried with backoff: 2,000 idle connections against a node allowed 256 descriptors, and a
/// deployment member's obligation is still applied, the node still running.
#[test]
fn idle_connections_to_the_a2a_port_do_not_stop_the_node() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let c = common::certs(dir.path());
    assert!(abhyasa(&["certs", "issue", "principal", "--dir", &c])
        .status
        .success());
    let https: std::net::SocketAddr = ([127, 0, 0, 1], free_tcp()).into();
    let (cfg, _state) = common::config(
        dir.path(),
        &c,
        &format!(
            "admin = \"{}\"\n\n[a2a]\nlisten = \"127.0.0.1:{}\"\n",
            dir.path().join("admin.sock").display(),
            https.port()
        ),
    );
    let log_path = dir.path().join("node.log");
    let Some(mut node) = common::node_with_descriptors(&cfg, 256, &log_path) else {
        println!("SKIPPED: needs prlimit (util-linux) to start the node with few descriptors");
        return;
    };
    common::wait_for("the A2A port", Duration::from_secs(20), || {
        std::net::TcpStream::connect(https).is_ok()
    });
    let idle = common::idle_connections(https, 2_000);
    assert!(
        node.try_wait().unwrap().is_none(),
        "the node stopped under {} idle connections: {}",
        idle.len(),
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    // A member, with the idle connections held open.
    let identity = abhyasa::moq::Identity::load(
        std::path::Path::new(&c),
        &abhyasa::wire::AgentId::new("principal").unwrap(),
    )
    .unwrap();
    let peer = abhyasa::a2a::A2aPeer {
        agent: abhyasa::wire::AgentId::new("agent-1").unwrap(),
        card_url: format!(
            "https://agent-1:{}/.well-known/agent-card.json",
            https.port()
        ),
        addr: Some(https),
    };
    let http = abhyasa::a2a::client::http_client(&identity, &peer).unwrap();
    let created = abhyasa::a2a::json::format_time(abhyasa::wire::UnixMillis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    ));
    let body = serde_json::json!({
        "obligation_id": "flood-revoke-1",
        "kind": "anumati.consent",
        "target": "agent-1",
        "payload": {"decision": "revoke", "scope": "calendar.read"},
        "deadline_seconds": 3600,
        "max_retries": 15,
        "created_at": created,
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = std::time::Instant::now();
    let ack: serde_json::Value = rt.block_on(async {
        let r = http
            .post(format!(
                "https://agent-1:{}/abhyasa/v1/obligations/anumati.consent",
                https.port()
            ))
            .header("content-type", "application/json")
            .body(body.to_string())
            // On time: well inside the 10 s a stranger's handshake may take, which is how
            // long the member waited before, every descriptor held by the idle connections.
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .expect("the member is served within 5 s");
        assert_eq!(r.status(), 200);
        serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
    });
    assert_eq!(ack["status"], "applied", "{ack}");
    println!(
        "a2a flood: {} idle connections held, a member's obligation applied in {} ms",
        idle.len(),
        t.elapsed().as_millis()
    );
    assert!(node.try_wait().unwrap().is_none(), "the node stopped");
    drop(idle);
    let _ = node.kill();
    let _ = node.wait();
}
