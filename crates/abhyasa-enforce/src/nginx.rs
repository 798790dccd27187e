//! The nginx configuration that puts the node's check in front of a service (the one
//! docs/ENFORCEMENT.md shows; the demo and `tests/nginx.rs` run exactly this).
//!
//! Each protected location asks the node through `auth_request` before proxying: nginx sends
//! the check to `/authz` with the enforcement key, the agent and the scope; 2xx lets the call
//! through, 403 refuses it, and the node's `Abhyasa-Obligation`, `Abhyasa-Obligation-State` and
//! `Abhyasa-Refusal` headers are copied onto nginx's answer.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

/// One location nginx protects.
#[derive(Clone, Debug)]
pub struct Protected {
    /// The location prefix, e.g. `/calendar/`.
    pub path: String,
    /// The scope a call there exercises.
    pub scope: String,
    /// Where the service behind it listens, as `proxy_pass` takes it (`http://127.0.0.1:8080`).
    pub upstream: String,
}

/// A server block: where nginx listens, where the node's enforcement points are, and what it
/// protects.
#[derive(Clone, Debug)]
pub struct Site {
    /// nginx's `listen` (e.g. `127.0.0.1:8080`, or `443 ssl` with the TLS lines added).
    pub listen: String,
    /// The node's `[enforce] listen`.
    pub enforce: SocketAddr,
    /// The node's enforcement key (`<state>/enforce.key`).
    pub key: String,
    /// The nginx variable that names the calling agent: `$ssl_client_s_dn` behind mutual TLS
    /// with the deployment CA (the node reads the CN), or a header the caller sets, such as
    /// `$http_x_agent`, where something in front has authenticated it.
    pub agent_from: String,
    /// The locations.
    pub protected: Vec<Protected>,
}

fn check_name(i: usize) -> String {
    format!("/_abhyasa_check_{i}")
}

/// The `server { … }` block.
pub fn server_block(site: &Site) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "  server {{");
    let _ = writeln!(s, "    listen {};", site.listen);
    for (i, p) in site.protected.iter().enumerate() {
        let _ = write!(
            s,
            "
    # Asks the principal's node whether the agent may exercise {scope}.
    location = {check} {{
      internal;
      proxy_pass http://{enforce}/authz;
      proxy_pass_request_body off;
      proxy_set_header Content-Length \"\";
      proxy_set_header Abhyasa-Key \"{key}\";
      proxy_set_header Abhyasa-Agent {agent};
      proxy_set_header Abhyasa-Scope \"{scope}\";
    }}

    location {path} {{
      auth_request {check};
      auth_request_set $abhyasa_obligation $upstream_http_abhyasa_obligation;
      auth_request_set $abhyasa_state $upstream_http_abhyasa_obligation_state;
      auth_request_set $abhyasa_refusal $upstream_http_abhyasa_refusal;
      add_header Abhyasa-Obligation $abhyasa_obligation always;
      add_header Abhyasa-Obligation-State $abhyasa_state always;
      add_header Abhyasa-Refusal $abhyasa_refusal always;
      proxy_pass {upstream};
    }}
",
            scope = p.scope,
            check = check_name(i),
            enforce = site.enforce,
            key = site.key,
            agent = site.agent_from,
            path = p.path,
            upstream = p.upstream,
        );
    }
    let _ = writeln!(s, "  }}");
    s
}

/// A whole `nginx.conf` for `nginx -p <scratch> -c <file>` in the foreground, every file it
/// writes under `scratch`: what the demo and the test start.
pub fn standalone(site: &Site, scratch: &Path) -> String {
    let d = scratch.display();
    format!(
        "daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log notice;
events {{ worker_connections 64; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
{}}}
",
        server_block(site)
    )
}

/// Where nginx is: `ABHYASA_NGINX`, else `/usr/sbin/nginx` (Debian's), else on `PATH`.
pub fn find_nginx() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("ABHYASA_NGINX") {
        return Some(p.into());
    }
    let sbin = std::path::PathBuf::from("/usr/sbin/nginx");
    if sbin.is_file() {
        return Some(sbin);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("nginx"))
            .find(|p| p.is_file())
    })
}
