//! Process plumbing shared by the tests that run `abhyasa` binaries.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[allow(unused_imports)] // Each test binary uses its own subset.
pub use abhyasa_testkit::{free_tcp, free_udp, wait_for};

/// Runs `abhyasa` with `args` to completion.
pub fn abhyasa(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_abhyasa"))
        .args(args)
        .output()
        .expect("run abhyasa")
}

/// An `abhyasa node --config <path>` process, SIGKILLed when dropped.
pub struct NodeProc(Child);

impl NodeProc {
    /// Starts a node from its config file.
    pub fn start(config: &Path) -> Self {
        Self(
            Command::new(env!("CARGO_BIN_EXE_abhyasa"))
                .args(["node", "--config"])
                .arg(config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn node"),
        )
    }

    /// Any other long-running `abhyasa` command (a netem relay, …), killed on drop.
    pub fn run(args: &[&str]) -> Self {
        Self(
            Command::new(env!("CARGO_BIN_EXE_abhyasa"))
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn abhyasa"),
        )
    }

    /// SIGTERM: the node lands its commits and closes its store.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        // `Child::kill` is SIGKILL on Unix: no destructor, no flush, no goodbye.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// stdout and stderr of a finished command, as one text.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `abhyasa node --config cfg` with its stdout and stderr piped to this process.
pub fn spawn_node_piped(cfg: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_abhyasa"))
        .args(["node", "--config"])
        .arg(cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node")
}

/// The arguments of `abhyasa issue` of a custody token revocation (`tok`) to `agent-2`
/// through the admin interface `admin` (`--admin …` and any `--admin-token …`).
pub fn revocation_args<'a>(admin: &[&'a str], tok: &'a str) -> Vec<&'a str> {
    let mut args = vec!["issue"];
    args.extend_from_slice(admin);
    args.extend_from_slice(&[
        "--target",
        "agent-2",
        "--kind",
        "oauth.token",
        "--action",
        "revoke",
        "--token",
        tok,
    ]);
    args
}

/// `abhyasa issue` of [`revocation_args`], with `extra` arguments.
pub fn issue_revocation(admin: &[&str], tok: &str, extra: &[&str]) -> Output {
    let mut args = revocation_args(admin, tok);
    args.extend_from_slice(extra);
    abhyasa(&args)
}

/// Runs `abhyasa node --config cfg`, which must refuse to start (panics if it is still running
/// after 20 s); returns its output.
pub fn refused_start(cfg: &Path) -> Output {
    let mut child = spawn_node_piped(cfg);
    let until = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!(
                "the node started with {}",
                std::fs::read_to_string(cfg).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// `abhyasa issue` of a consent revocation of `scope` for `target`, due in `deadline_ms`,
/// through the node at `admin`; the obligation's id.
pub fn issue_revoke(admin: &str, target: &str, scope: &str, deadline_ms: u64) -> String {
    let out = abhyasa(&[
        "issue",
        "--admin",
        admin,
        "--target",
        target,
        "--kind",
        "anumati.consent",
        "--decision",
        "revoke",
        "--scope",
        scope,
        "--deadline-ms",
        &deadline_ms.to_string(),
    ]);
    let reply: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", output_text(&out)));
    assert_eq!(reply["ok"], true, "{reply}");
    reply["id"].as_str().unwrap().to_owned()
}

/// `abhyasa status --json` of the node at `admin`, once it answers.
pub fn status(admin: &str) -> Option<serde_json::Value> {
    let out = abhyasa(&["status", "--admin", admin, "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// A principal and `agent-1` as two `abhyasa node` processes, reached over some binding.
pub struct Pair<'a> {
    /// The principal's config, admin address and state directory.
    pub principal: (&'a Path, &'a str, &'a Path),
    /// The agent's.
    pub agent: (&'a Path, &'a str, &'a Path),
    /// The binding's name, for messages.
    pub over: &'a str,
    /// How the agent process starts.
    pub start: AgentStart<'a>,
}

/// How the scenario starts the agent.
#[derive(Clone, Copy)]
pub enum AgentStart<'a> {
    /// `abhyasa node --config <agent config>`.
    Node,
    /// `abhyasa <these args>` (e.g. `mcp --config … --http ADDR`).
    Run(&'a [&'a str]),
    /// The principal spawns it itself (an MCP server over its stdio): the scenario neither
    /// starts nor restarts it, it only kills it.
    SpawnedByPrincipal,
}

/// The pids of processes whose command line has `arg` (read from /proc).
pub fn pids_with_arg(arg: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        cmdline
            .split(|&b| b == 0)
            .any(|a| a == arg.as_bytes())
            .then_some(pid)
    })
    .collect()
}

fn sigkill_all(pids: &[u32]) {
    for pid in pids {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// The SIGKILL scenario every binding must survive: two token revocations applied; the agent
/// SIGKILLed with four more in flight, restarted; all six applied and honoured; both stopped
/// and audited from their redb files with `abhyasa check` (nothing lost, none applied twice).
pub fn custody_survives_a_sigkill_of_the_agent(pair: &Pair<'_>) {
    let (p_cfg, p_admin, p_state) = pair.principal;
    let (a_cfg, a_admin, a_state) = pair.agent;
    let revoke = |token: &str| {
        let out = abhyasa(&[
            "issue",
            "--admin",
            p_admin,
            "--target",
            "agent-1",
            "--kind",
            "oauth.token",
            "--action",
            "revoke",
            "--token",
            token,
        ]);
        assert!(
            out.status.success(),
            "issue failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["admission"], "custody");
    };
    let applied = |s: &serde_json::Value| {
        s["recent"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["outcome"] == "Applied")
            .count()
    };
    let a_arg = a_cfg.to_str().unwrap();
    let start_agent = || match pair.start {
        AgentStart::Node => Some(NodeProc::start(a_cfg)),
        AgentStart::Run(args) => Some(NodeProc::run(args)),
        AgentStart::SpawnedByPrincipal => None,
    };
    let mut agent = start_agent();
    let principal = NodeProc::start(p_cfg);
    wait_for("both nodes up", Duration::from_secs(15), || {
        status(p_admin).is_some() && status(a_admin).is_some()
    });
    for t in ["t1", "t2"] {
        revoke(t);
    }
    wait_for(
        &format!("two applied over {}", pair.over),
        Duration::from_secs(15),
        || status(p_admin).is_some_and(|s| applied(&s) == 2),
    );
    // SIGKILL the agent with obligations in flight, then bring it back.
    match agent.take() {
        Some(a) => drop(a),
        None => {
            let pids = pids_with_arg(a_arg);
            assert_eq!(pids.len(), 1, "the principal runs one agent: {pids:?}");
            sigkill_all(&pids);
        }
    }
    for t in ["t3", "t4", "t5", "t6"] {
        revoke(t);
    }
    let s = status(p_admin).unwrap();
    assert!(
        !s["pending"].as_array().unwrap().is_empty(),
        "nothing in flight"
    );
    std::thread::sleep(Duration::from_millis(500));
    agent = start_agent();
    wait_for(
        "all six applied after the restart",
        Duration::from_secs(20),
        || {
            status(p_admin)
                .is_some_and(|s| applied(&s) == 6 && s["pending"].as_array().unwrap().is_empty())
        },
    );
    let h = status(a_admin).unwrap();
    let dropped: Vec<&str> = h["honours"]["dropped_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(dropped, ["t1", "t2", "t3", "t4", "t5", "t6"]);
    // Stopped, both are audited from their files alone.
    principal.stop();
    match agent {
        Some(a) => a.stop(),
        // Its stdin closed with the principal: it ends by itself.
        None => {
            let gone = (0..100).any(|_| {
                std::thread::sleep(Duration::from_millis(100));
                pids_with_arg(a_arg).is_empty()
            });
            if !gone {
                sigkill_all(&pids_with_arg(a_arg));
            }
            assert!(gone, "the spawned agent did not end with its principal");
        }
    }
    let out = abhyasa(&[
        "check",
        "--state",
        &format!("principal={}", p_state.display()),
        "--state",
        &format!("agent-1={}", a_state.display()),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("lost=0 double_applied=0") && !text.contains("violation:"),
        "{text}"
    );
}

/// Runs a Python SDK client script (`tests/<script>`) with the interpreter named by `env`
/// against the `abhyasa` binary; says SKIPPED when `env` is unset. Returns its stdout.
pub fn python_client(env: &str, what: &str, script: &str) -> Option<String> {
    python_client_with(env, what, script, &[])
}

/// [`python_client`] with more arguments after the binary and the work directory.
pub fn python_client_with(env: &str, what: &str, script: &str, more: &[&str]) -> Option<String> {
    let Ok(python) = std::env::var(env) else {
        println!("SKIPPED: {env} is not set (a python with {what}; .ci/run sets it)");
        return None;
    };
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("run")).unwrap();
    let out = Command::new(&python)
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests")
                .join(script),
        )
        .arg(env!("CARGO_BIN_EXE_abhyasa"))
        .arg(work.path().join("run"))
        .args(more)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the Python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout)
}

/// A CA and certificates for `principal` and `agent-1` made with the CLI in `dir/certs`, admin
/// socket paths and state directories: what both process tests of a binding start from.
pub struct Setup {
    /// The certs directory.
    pub certs: String,
    /// Admin socket paths (principal, agent).
    pub admin: (String, String),
    /// State directories (principal, agent).
    pub state: (std::path::PathBuf, std::path::PathBuf),
}

impl Setup {
    /// Runs `certs init` and `certs issue` for both agents under `dir`.
    pub fn new(dir: &Path) -> Self {
        let certs = dir.join("certs").to_str().unwrap().to_owned();
        assert!(abhyasa(&["certs", "init", "--dir", &certs])
            .status
            .success());
        for a in ["principal", "agent-1"] {
            assert!(abhyasa(&["certs", "issue", a, "--dir", &certs])
                .status
                .success());
        }
        Self {
            certs,
            admin: (
                dir.join("p-admin.sock").to_str().unwrap().to_owned(),
                dir.join("a-admin.sock").to_str().unwrap().to_owned(),
            ),
            state: (dir.join("state-p"), dir.join("state-a")),
        }
    }
}

/// Certificates for `agent-1` under `dir/certs`; returns the directory.
pub fn certs(dir: &Path) -> String {
    let c = dir.join("certs").display().to_string();
    assert!(abhyasa(&["certs", "init", "--dir", &c]).status.success());
    assert!(abhyasa(&["certs", "issue", "agent-1", "--dir", &c])
        .status
        .success());
    c
}

/// A node config for `agent-1` with `extra` lines (an `admin = …`, …) and one peer that never
/// answers (obligations to it stay pending).
pub fn config(dir: &Path, certs: &str, extra: &str) -> (PathBuf, PathBuf) {
    let state = dir.join("state");
    let cfg = dir.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "agent = \"agent-1\"\nlisten = \"{}\"\ncerts = \"{certs}\"\nstate = \"{}\"\n{extra}\n\n\
             [[peers]]\nid = \"agent-2\"\naddr = \"{}\"\n",
            free_udp(),
            state.display(),
            free_udp()
        ),
    )
    .unwrap();
    (cfg, state)
}

/// A node started from `cfg` with `n` descriptors in all (soft and hard, through `prlimit`: it
/// cannot raise them), its log to `log` (a pipe nobody drains could stall it). `None` where
/// `prlimit` (util-linux) is missing; the caller says SKIPPED.
pub fn node_with_descriptors(cfg: &Path, n: u32, log: &Path) -> Option<Child> {
    let cfg = cfg.to_str().expect("a UTF-8 path");
    abhyasa_with_descriptors(&["node", "--config", cfg], n, log)
}

/// `abhyasa ARGS` with `n` descriptors in all, as [`node_with_descriptors`].
pub fn abhyasa_with_descriptors(args: &[&str], n: u32, log: &Path) -> Option<Child> {
    Command::new("prlimit").arg("--version").output().ok()?;
    Some(
        Command::new("prlimit")
            .arg(format!("--nofile={n}:{n}"))
            .arg(env!("CARGO_BIN_EXE_abhyasa"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("the log"))
            .spawn()
            .expect("spawn abhyasa"),
    )
}

/// Up to `n` idle TCP connections to `addr`, held open (this process's descriptor limit
/// raised first). A refused attempt (the backlog full while the node closes the oldest) is
/// skipped after a short pause; after 20 in a row, what is held is returned.
pub fn idle_connections(addr: SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
    rlimit::increase_nofile_limit(u64::MAX).expect("raise the descriptor limit");
    let mut idle = Vec::with_capacity(n);
    let mut failed_in_a_row = 0;
    for _ in 0..n {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => {
                idle.push(s);
                failed_in_a_row = 0;
            }
            Err(_) => {
                // A listener that never accepts again: what is held is the attack.
                failed_in_a_row += 1;
                if failed_in_a_row == 20 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    idle
}
