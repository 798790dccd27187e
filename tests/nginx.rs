//! A real nginx (Debian's package) in front of a small tool service asks the principal's
//! `abhyasa node` (its `[enforce]` check, through `auth_request`) before every call: a call
//! passes; the principal revokes the scope under custody and the same call is refused by
//! nginx, naming the obligation, without reaching the tool; with the agent down, a revocation
//! refuses at once and the refusal holds while its obligation escalates.
//!
//! nginx is found at `ABHYASA_NGINX`, else `/usr/sbin/nginx`, else on `PATH`; without one the
//! test says plainly that it skipped (`.ci/run` installs nginx and fails on the skip).

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abhyasa::enforce::nginx::{standalone, Protected, Site};
use common::{free_tcp, free_udp, wait_for, NodeProc};

/// The tool: answers every request 200 with a small JSON body and counts them.
fn tool_service() -> (u16, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            c.fetch_add(1, Ordering::SeqCst);
            let body = b"{\"events\": [\"stand-up 09:30\"]}";
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(body);
        }
    });
    (port, calls)
}

/// One HTTP/1.0 GET: (status, headers lower-cased, body).
fn get(port: u16, path: &str, agent: &str) -> (u16, Vec<(String, String)>, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: tools.local\r\nX-Agent: {agent}\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// nginx in the foreground, with its own prefix; stopped when dropped.
struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn issue(admin: &str, scope: &str, deadline_ms: &str) -> String {
    common::issue_revoke(admin, "agent-1", scope, deadline_ms.parse().unwrap())
}

#[test]
fn nginx_refuses_a_call_once_the_principal_revokes_and_names_the_obligation() {
    let Some(nginx) = abhyasa::enforce::nginx::find_nginx() else {
        println!("SKIPPED: no nginx binary (install Debian's nginx or set ABHYASA_NGINX)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = common::Setup::new(dir.path()).certs;
    let (agent_addr, enforce_port) = (free_udp(), free_tcp());
    let (p_admin, a_admin) = (
        dir.path().join("p.sock").display().to_string(),
        dir.path().join("a.sock").display().to_string(),
    );
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let agent_cfg = write(
        "agent.toml",
        format!(
            "agent = \"agent-1\"\nlisten = \"{agent_addr}\"\ncerts = \"{certs}\"\nstate = \"{}\"\nadmin = \"{a_admin}\"\n",
            dir.path().join("state-a").display()
        ),
    );
    let p_state = dir.path().join("state-p");
    let principal_cfg = write(
        "principal.toml",
        format!(
            "agent = \"principal\"\nlisten = \"{}\"\ncerts = \"{certs}\"\nstate = \"{}\"\nadmin = \"{p_admin}\"\n\n\
             [custody]\nresponse_timeout_ms = 300\nbackoff_base_ms = 100\nbackoff_cap_ms = 400\n\n\
             [enforce]\nlisten = \"127.0.0.1:{enforce_port}\"\n\n\
             [[peers]]\nid = \"agent-1\"\naddr = \"{agent_addr}\"\n",
            free_udp(),
            p_state.display()
        ),
    );
    let agent = NodeProc::start(&agent_cfg);
    let _principal = NodeProc::start(&principal_cfg);
    let key_file = p_state.join("enforce.key");
    wait_for(
        "the principal's enforcement key",
        Duration::from_secs(30),
        || key_file.exists() && std::net::TcpStream::connect(("127.0.0.1", enforce_port)).is_ok(),
    );
    wait_for("the agent's admin socket", Duration::from_secs(30), || {
        Path::new(&a_admin).exists()
    });
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_owned();

    let (tool_port, calls) = tool_service();
    let listen = free_tcp();
    // The configuration docs/ENFORCEMENT.md shows. The agent is named by the caller's
    // `X-Agent` header here; behind mutual TLS it is the certificate's `$ssl_client_s_dn`.
    let tool = format!("http://127.0.0.1:{tool_port}");
    let site = Site {
        listen: format!("127.0.0.1:{listen}"),
        enforce: format!("127.0.0.1:{enforce_port}").parse().unwrap(),
        key,
        agent_from: "$http_x_agent".into(),
        protected: vec![
            Protected {
                path: "/calendar/".into(),
                scope: "calendar.read".into(),
                upstream: tool.clone(),
            },
            Protected {
                path: "/mail/".into(),
                scope: "mail.send".into(),
                upstream: tool,
            },
        ],
    };
    let conf = write("nginx.conf", standalone(&site, dir.path()));
    let _nginx = Nginx(
        Command::new(&nginx)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx"),
    );
    wait_for("nginx", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", listen)).is_ok()
    });

    // The call passes: no decision refuses it.
    let (status, _, body) = get(listen, "/calendar/today", "agent-1");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("stand-up"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The principal revokes the scope under custody: nginx refuses the same call, naming the
    // obligation, and the tool never sees it.
    let revoked = issue(&p_admin, "calendar.read", "30000");
    let (status, headers, _) = get(listen, "/calendar/today", "agent-1");
    assert_eq!(status, 403);
    assert_eq!(
        header(&headers, "abhyasa-obligation"),
        Some(revoked.as_str())
    );
    let refusal = header(&headers, "abhyasa-refusal")
        .unwrap_or_default()
        .to_owned();
    assert!(refusal.contains("calendar.read"), "{refusal}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Another agent, and another scope, still pass.
    assert_eq!(get(listen, "/calendar/today", "agent-2").0, 200);
    assert_eq!(get(listen, "/mail/outbox", "agent-1").0, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    wait_for("the revocation applied", Duration::from_secs(20), || {
        let (_, h, _) = get(listen, "/calendar/today", "agent-1");
        header(&h, "abhyasa-obligation-state") == Some("applied")
    });

    // The agent goes down. A revocation refuses at once, and keeps refusing while its
    // obligation is pending and once it escalates at its deadline.
    agent.stop();
    let down = issue(&p_admin, "mail.send", "3000");
    let (status, headers, _) = get(listen, "/mail/outbox", "agent-1");
    assert_eq!(status, 403);
    assert_eq!(header(&headers, "abhyasa-obligation"), Some(down.as_str()));
    assert_eq!(
        header(&headers, "abhyasa-obligation-state"),
        Some("pending")
    );
    let mut states = vec!["pending".to_owned()];
    wait_for("the escalation", Duration::from_secs(30), || {
        let (status, h, _) = get(listen, "/mail/outbox", "agent-1");
        assert_eq!(status, 403, "the refusal must hold throughout");
        let state = header(&h, "abhyasa-obligation-state")
            .unwrap_or_default()
            .to_owned();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        state == "escalated"
    });
    assert_eq!(states, ["pending", "escalated"]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "no refused call reached the tool"
    );
    println!(
        "nginx enforcement: {} refused after revocation (obligation {revoked}, applied); \
         agent down: refused pending then escalated (obligation {down}); tool calls 3",
        nginx.display()
    );
}
