//! The demo's last step, where nginx is installed: nginx in front of a small file service asks
//! the principal's node (its enforcement points, `abhyasa-enforce`) before every call. A call
//! as agent-0 passes; the principal revokes the scope under custody; the same call is refused
//! by nginx, which names the obligation.

use std::time::{Duration, Instant};

use abhyasa_enforce::nginx::{find_nginx, standalone, Protected, Site};
use abhyasa_node::Node;
use abhyasa_wire::{
    ConsentDecision, ConsentPayload, Obligation, ObligationId, Payload, Scope, UnixMillis,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One HTTP/1.0 GET to nginx as `agent`: (status, the named headers that were present).
async fn get(port: u16, path: &str, agent: &str) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.0\r\nHost: files.local\r\nX-Agent: {agent}\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut text = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut text))
        .await
        .map_err(|_| std::io::Error::other("nginx did not answer in 10 s"))??;
    let text = String::from_utf8_lossy(&text);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .filter(|(k, _)| k.starts_with("abhyasa-"))
        .collect();
    Ok((status, headers))
}

/// Serves `{"files": …}` to every request until dropped.
async fn file_service() -> std::io::Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let body = "{\"files\": [\"q3-report.pdf\"]}";
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    Ok((port, task))
}

/// Runs the step, or says why it did not.
pub(crate) async fn story(principal: &Node, agent: &Node, deadline_ms: u64, started: &Instant) {
    let Some(nginx) = find_nginx() else {
        println!("nginx: not installed, so the demo ends here (apt-get install nginx-light, or set ABHYASA_NGINX)");
        return;
    };
    if let Err(e) = run(&nginx, principal, agent, deadline_ms, started).await {
        println!("nginx: the step did not run: {e}");
    }
}

async fn run(
    nginx: &std::path::Path,
    principal: &Node,
    agent: &Node,
    deadline_ms: u64,
    started: &Instant,
) -> Result<(), Box<dyn std::error::Error>> {
    let say = |what: &str| println!("  {:6.2}s  {what}", started.elapsed().as_secs_f64());
    let key = hex::encode(rand::random::<[u8; 32]>());
    let mut config = abhyasa_enforce::EnforceConfig::new("127.0.0.1:0".parse()?);
    config.key = Some(key.clone());
    config.holders = vec![agent.agent().clone()];
    let enforce = abhyasa_enforce::serve(principal.clone(), config).await?;
    let (files, _service) = file_service().await?;
    let listen = crate::free_addr()?.port();
    let scratch = tempfile::tempdir()?;
    let site = Site {
        listen: format!("127.0.0.1:{listen}"),
        enforce: enforce.local_addr(),
        key,
        agent_from: "$http_x_agent".into(),
        protected: vec![Protected {
            path: "/files/".into(),
            scope: "files.read".into(),
            upstream: format!("http://127.0.0.1:{files}"),
        }],
    };
    let conf = scratch.path().join("nginx.conf");
    std::fs::write(&conf, standalone(&site, scratch.path()))?;
    let mut server = tokio::process::Command::new(nginx)
        .arg("-p")
        .arg(scratch.path())
        .arg("-c")
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let up = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(("127.0.0.1", listen))
        .await
        .is_err()
    {
        if Instant::now() > up {
            return Err(format!("{} did not start listening", nginx.display()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "nginx ({}): /files/ asks the principal's node (auth_request to http://{}/authz) for scope files.read",
        nginx.display(),
        enforce.local_addr()
    );
    let who = agent.agent().to_string();
    let (status, _) = get(listen, "/files/q3", &who).await?;
    say(&format!("GET /files/q3 as {who} -> {status}"));
    let now = principal.now();
    let revoke = Obligation {
        id: ObligationId::from_u128(rand::random()),
        issuer: principal.agent().clone(),
        target: agent.agent().clone(),
        created_at: now,
        deadline: UnixMillis(now.0 + deadline_ms),
        max_retries: principal.default_retries(deadline_ms),
        sequence: None,
        payload: Payload::AnumatiConsent(ConsentPayload {
            decision: Some(ConsentDecision::Revoke),
            scope: Scope::new("files.read")?,
            expires_at: None,
        }),
    };
    let words = abhyasa_wire::words::obligation(&revoke);
    let handle = principal.issue(revoke).await?;
    // nginx refuses from the moment the revocation is issued; the custody outcome follows.
    let (status, headers) = get(listen, "/files/q3", &who).await?;
    let refusal = headers
        .iter()
        .find(|(k, _)| k == "abhyasa-refusal")
        .map(|(_, v)| v.as_str())
        .unwrap_or("no reason given");
    say(&format!(
        "{words} issued; GET /files/q3 as {who} -> {status} ({refusal})"
    ));
    if let Ok(Some((record, _))) =
        tokio::time::timeout(Duration::from_millis(deadline_ms + 2_000), handle.outcome()).await
    {
        say(&format!(
            "{words}: {}",
            abhyasa_wire::words::outcome(&record.outcome, record.attempts)
        ));
    }
    let (status, headers) = get(listen, "/files/q3", &who).await?;
    let state = headers
        .iter()
        .find(|(k, _)| k == "abhyasa-obligation-state")
        .map(|(_, v)| v.as_str())
        .unwrap_or("?");
    say(&format!(
        "GET /files/q3 as {who} -> {status} (obligation {state})"
    ));
    let _ = server.kill().await;
    Ok(())
}
