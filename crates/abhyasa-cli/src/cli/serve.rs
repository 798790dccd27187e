//! `abhyasa node` and `abhyasa mcp`: a node built from its configuration, with its admin
//! interface, bindings (MCP, A2A) and enforcement points started beside it.

use super::*;

pub(super) async fn node(path: PathBuf) -> Result<ExitCode> {
    let config = read_config(&path)?;
    let agent = AgentId::new(config.agent.clone())?;
    let node = Arc::new(build_node(&config).await?);
    let admin = bind_admin(&config)?;
    println!(
        "node {agent} listening on {} (admin {})",
        node.local_addr(),
        admin.addr()
    );
    let _bindings = start_bindings(&config, &node).await?;
    let admin = tokio::spawn(admin.serve(node.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        r = admin => {
            eprintln!("admin interface stopped: {r:?}");
        }
    }
    if let Ok(node) = Arc::try_unwrap(node) {
        node.shutdown().await;
    }
    println!("node {agent} stopped");
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn mcp(path: PathBuf, stdio: bool, http: Option<SocketAddr>) -> Result<ExitCode> {
    if !stdio && http.is_none() {
        return Err("abhyasa mcp: say how to serve (--stdio or --http ADDR)".into());
    }
    let config = read_config(&path)?;
    let Some(mcp) = config.mcp.clone() else {
        return Err(format!("{}: no [mcp] section", path.display()).into());
    };
    let principal = AgentId::new(mcp.principal.clone().ok_or_else(|| {
        format!(
            "{}: [mcp] principal is needed for --stdio and --http",
            path.display()
        )
    })?)?;
    let mut tools = mcp_tools(&config)?;
    let node_tools = mcp.node_tools(config.ledger.is_some())?;
    let node = build_node(&config).await?;
    // The node's own tools only where the operator granted them: each carries the node's
    // whole authority (issuing as it, spending its budget).
    for t in node_tools {
        tools.push(match t {
            crate::mcp_cli::NodeTool::Issue => crate::mcp_cli::issue_tool(node.clone()),
            crate::mcp_cli::NodeTool::Ledger => crate::mcp_cli::ledger_tool(node.clone()),
        });
    }
    let admin = bind_admin(&config)?;
    let admin_addr = admin.addr();
    let _bindings = start_bindings(&config, &node).await?;
    let admin = tokio::spawn(admin.serve(Arc::new(node.clone())));
    let served: Result<()> = match http {
        Some(addr) => {
            let server =
                abhyasa_mcp::http::serve_http(node.clone(), principal.clone(), tools, addr, {
                    let path = config.state.join(MCP_TOKEN_FILE);
                    Some(hex::encode(admin::load_or_create_token(&path)?))
                })
                .await?;
            // Stdout says where, once; the node's logs go to stderr.
            println!(
                "MCP on http://{}{} for {principal} (bearer token in {})",
                server.local_addr(),
                abhyasa_mcp::http::HTTP_PATH,
                config.state.join(MCP_TOKEN_FILE).display()
            );
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = server.wait() => {}
            }
            Ok(())
        }
        None => {
            // Stdout carries MCP: everything else goes to stderr.
            eprintln!(
                "node {} listening on {} (admin {}); MCP on stdio for {principal}",
                node.agent(),
                node.local_addr(),
                admin_addr
            );
            crate::mcp_cli::serve_stdio(node.clone(), principal, tools).await
        }
    };
    admin.abort();
    let _ = admin.await;
    node.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Binds the node's admin interface: `admin` from the config, or `<state>/admin.sock`.
pub(super) fn bind_admin(config: &NodeConfig) -> Result<admin::AdminServer> {
    let addr = match config.admin.as_deref() {
        None => AdminAddr::Unix(config.state.join(admin::SOCKET_FILE)),
        Some(a) => AdminAddr::parse(a).map_err(|e| format!("admin: {e}"))?,
    };
    Ok(admin::AdminServer::bind(
        &addr,
        &config.state,
        config.admin_allow_remote,
    )?)
}

/// Raises this process's soft limit on open descriptors to its hard limit: a node holds a
/// descriptor per connection on each listener, and the soft limit (often 1,024) is what idle
/// connections exhausted first.
pub(super) fn raise_descriptor_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(limit = n, "open descriptor limit"),
        Err(e) => tracing::warn!(%e, "could not raise the open descriptor limit"),
    }
}

pub(super) async fn build_node(config: &NodeConfig) -> Result<Node> {
    raise_descriptor_limit();
    let agent = AgentId::new(config.agent.clone())?;
    let identity = Identity::load(&config.certs, &agent)?;
    let mut builder = Node::builder(identity)
        .listen(config.listen)
        .transport(config.transport.settings()?)
        .state_dir(&config.state)
        .custodian(CustodianConfig {
            response_timeout_ms: config.custody.response_timeout_ms,
            backoff_base_ms: config.custody.backoff_base_ms,
            backoff_cap_ms: config.custody.backoff_cap_ms,
            first_attempt: config.custody.channel()?,
            require_spanning_budget: config
                .custody
                .require_spanning_budget
                .iter()
                .copied()
                .collect(),
            max_pending: config.limits.max_pending,
            max_pending_per_target: config.limits.max_pending_per_target,
            max_principal_entries: config.limits.max_principal_entries,
            ..CustodianConfig::default()
        })
        .receiver(abhyasa_custody::ReceiverConfig {
            max_applied: config.limits.max_applied,
            max_governed: config.limits.max_governed,
            ..abhyasa_custody::ReceiverConfig::default()
        })
        .store(abhyasa_store::StoreConfig {
            retention_ms: config.limits.history_retention_ms,
            max_terminal: config.limits.max_terminal_records,
            cache_bytes: config.limits.store_cache_bytes,
            events: config.events.is_some(),
            ..abhyasa_store::StoreConfig::default()
        })
        .limits(abhyasa_node::Limits {
            sessions_per_peer: config.limits.sessions_per_peer,
            session: abhyasa_moq::SessionLimits {
                max_requests: config.limits.requests_per_session,
                max_objects_per_group: config.limits.objects_per_group,
            },
            requests_per_second_per_peer: config.limits.requests_per_second_per_peer,
            answer_within: Duration::from_millis(config.limits.answer_within_ms),
        })
        .maintenance(Duration::from_millis(config.custody.maintenance_ms));
    config.check()?;
    if let Some(p) = &config.policy {
        builder = builder.policy(p.policy());
    }
    for p in &config.peers {
        // `a2a` and `mcp` peers are reached by `start_bindings` once the node runs.
        if p.transport.as_deref().unwrap_or("moqt") == "moqt" {
            builder = builder.peer(AgentId::new(p.id.clone())?, p.addr()?);
        }
    }
    for r in &config.relays {
        builder = builder.relay_trusting(AgentId::new(r.name.clone())?, r.addr()?, r.trust()?);
        if let Some(peers) = &r.peers {
            let peers: std::result::Result<Vec<_>, _> =
                peers.iter().map(|p| AgentId::new(p.clone())).collect();
            builder = builder.relay_peers(peers?);
        }
    }
    if let Some(l) = &config.ledger {
        let executor: Option<Arc<dyn abhyasa_node::Executor>> = if l.gateway {
            {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&config.state)?;
            }
            Some(Arc::new(
                ledger_cli::FileExecutor::open(&config.state.join("effects.log"))
                    .map_err(|e| e.to_string())?,
            ))
        } else {
            None
        };
        builder = builder.ledger(abhyasa_node::LedgerSetup {
            keys: ledger_cli::load_keyring(&config.certs, &l.issuers).map_err(|e| e.to_string())?,
            executor,
            resend_ms: l.resend_ms,
            max_journal_steps: l.max_journal_steps,
            checkpoint_steps: l.checkpoint_steps,
            permit_ttl_ms: l.permit_ttl_ms,
            gateway_retain_ms: (l.gateway_retain_ms > 0).then_some(l.gateway_retain_ms),
        });
    }
    Ok(builder.build().await?)
}

/// The card this node's config describes.
pub(super) fn card_settings(config: &NodeConfig) -> Result<abhyasa_a2a::CardSettings> {
    let agent = AgentId::new(config.agent.clone())?;
    let a2a = config
        .a2a
        .as_ref()
        .ok_or("no [a2a] section: the node serves no card")?;
    let mut deadline_seconds = std::collections::BTreeMap::new();
    for (k, s) in &a2a.deadline_seconds {
        let kind = abhyasa_wire::Kind::from_name(k)
            .ok_or_else(|| format!("[a2a] deadline_seconds: unknown kind {k:?}"))?;
        if *s == 0 {
            return Err(format!("[a2a] deadline_seconds.{k} must be > 0").into());
        }
        deadline_seconds.insert(kind, *s);
    }
    Ok(abhyasa_a2a::CardSettings {
        base_url: a2a
            .public
            .clone()
            .unwrap_or_else(|| format!("https://{agent}:{}", a2a.listen.port())),
        agent,
        required: a2a.required,
        deadline_seconds,
        backoff_base_seconds: config.custody.backoff_base_ms as f64 / 1_000.0,
        backoff_cap_seconds: config.custody.backoff_cap_ms.div_ceil(1_000).max(1),
        moqt_endpoint: Some(format!("moqt://{}:{}", config.agent, config.listen.port())),
    })
}

/// The card this node's config describes, checked as any reader checks it (a profile whose
/// budget cannot span its deadline is refused with the number needed).
pub(super) fn valid_card(config: &NodeConfig) -> Result<abhyasa_a2a::AgentCard> {
    let card = card_settings(config)?.card();
    card.abhyasa()
        .map_err(|e| format!("[a2a]: the card would be refused: {e}"))?;
    Ok(card)
}

/// What a running node serves and reaches besides MOQT; dropping it stops them.
pub(super) struct Bindings {
    pub(super) _observe: Option<abhyasa_observe::Server>,
    pub(super) _events: Option<abhyasa_events::Delivery>,
    pub(super) _enforce: Option<abhyasa_enforce::Server>,
    pub(super) _a2a: Option<abhyasa_a2a::A2aServer>,
    pub(super) a2a_peers: Vec<tokio::task::JoinHandle<()>>,
    pub(super) _mcp_links: Vec<abhyasa_mcp::PrincipalLink>,
    pub(super) mcp_server: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Bindings {
    fn drop(&mut self) {
        for t in self.a2a_peers.iter().chain(self.mcp_server.iter()) {
            t.abort();
        }
    }
}

/// The `[[mcp.tools]]`; a priced tool needs this node to be a ledger gateway.
pub(super) fn mcp_tools(config: &NodeConfig) -> Result<Vec<abhyasa_mcp::HostTool>> {
    let mut tools = Vec::new();
    let gateway = config.ledger.as_ref().is_some_and(|l| l.gateway);
    for t in config.mcp.iter().flat_map(|m| &m.tools) {
        if t.cost.is_some() && !gateway {
            return Err(format!(
                "mcp tool {}: a tool with a cost runs under ledger permits; this node must be a gateway ([ledger] gateway = true)",
                t.name
            )
            .into());
        }
        tools.push(crate::mcp_cli::command_tool(t)?);
    }
    Ok(tools)
}

/// Serves `[a2a]` and `[mcp]` (MCP sessions over the node's QUIC endpoint, with the
/// `[[mcp.tools]]` governed), and reaches the `transport = "a2a"` and `"mcp"` peers.
pub(super) async fn start_bindings(config: &NodeConfig, node: &Node) -> Result<Bindings> {
    let mut mcp_server = None;
    if let Some(mcp) = &config.mcp {
        let tools = mcp_tools(config)?;
        let callers = mcp.quic_callers()?;
        let node = node.clone();
        mcp_server = Some(tokio::spawn(async move {
            if let Err(e) = abhyasa_mcp::serve_quic_for(node, tools, callers).await {
                eprintln!("MCP over QUIC stopped: {e}");
            }
        }));
    }
    let mut mcp_links = Vec::new();
    for p in config
        .peers
        .iter()
        .filter(|p| p.transport.as_deref() == Some("mcp"))
    {
        mcp_links.push(abhyasa_mcp::PrincipalLink::spawn_route(
            node.clone(),
            AgentId::new(p.id.clone())?,
            p.mcp_route()?,
            Duration::from_millis(10),
        ));
    }
    let (a2a, a2a_peers) = start_a2a(config, node).await?;
    let enforce = start_enforce(config, node).await?;
    let events = match &config.events {
        None => None,
        Some(e) => {
            let identity = Identity::load(&config.certs, &AgentId::new(config.agent.clone())?)?;
            Some(e.start(node, &identity).await?)
        }
    };
    let observe = match &config.observe {
        None => None,
        Some(o) => Some(o.start(node, &config.state).await?),
    };
    Ok(Bindings {
        _observe: observe,
        _events: events,
        _enforce: enforce,
        _a2a: a2a,
        a2a_peers,
        _mcp_links: mcp_links,
        mcp_server,
    })
}

/// Serves `[enforce]`.
pub(super) async fn start_enforce(
    config: &NodeConfig,
    node: &Node,
) -> Result<Option<abhyasa_enforce::Server>> {
    let Some(e) = &config.enforce else {
        return Ok(None);
    };
    let key_path = e
        .key_file
        .clone()
        .unwrap_or_else(|| config.state.join(ENFORCE_KEY_FILE));
    let mut c = abhyasa_enforce::EnforceConfig::new(e.listen);
    c.key = Some(hex::encode(admin::load_or_create_token(&key_path)?));
    c.holders = match &e.holders {
        Some(h) => h
            .iter()
            .map(|a| AgentId::new(a.clone()))
            .collect::<std::result::Result<_, _>>()?,
        None => config
            .peers
            .iter()
            .map(|p| AgentId::new(p.id.clone()))
            .collect::<std::result::Result<_, _>>()?,
    };
    c.revoke_deadline = Duration::from_millis(e.revoke_deadline_ms);
    if let Some(id) = &e.client_id {
        c.client_id = abhyasa_wire::ClientId::new(id.clone())
            .map_err(|err| format!("[enforce] client_id {id:?}: {err}"))?;
    }
    if let Some(u) = &e.upstream {
        let authorization = match &u.authorization_file {
            None => None,
            Some(path) => Some(secret_file(path)?),
        };
        let roots =
            u.ca.as_deref()
                .map(crate::operator::read_roots)
                .transpose()?;
        c.upstream = Some(abhyasa_enforce::Upstream {
            url: u.url.clone(),
            authorization,
            roots,
        });
    }
    let server = abhyasa_enforce::serve(node.clone(), c).await?;
    eprintln!(
        "node {}: enforcement points on http://{} (key in {})",
        node.agent(),
        server.local_addr(),
        key_path.display()
    );
    Ok(Some(server))
}

/// Reads a secret from a file that only its owner may read (trimmed).
pub(super) fn secret_file(path: &std::path::Path) -> Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{}: readable by other users (mode {mode:o}); chmod 600 it",
            path.display()
        )
        .into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text.trim().to_owned())
}

/// Serves `[a2a]` and reaches the `transport = "a2a"` peers.
pub(super) async fn start_a2a(
    config: &NodeConfig,
    node: &Node,
) -> Result<(
    Option<abhyasa_a2a::A2aServer>,
    Vec<tokio::task::JoinHandle<()>>,
)> {
    let agent = AgentId::new(config.agent.clone())?;
    let identity = Identity::load(&config.certs, &agent)?;
    let server = match &config.a2a {
        Some(a2a) => {
            let card = valid_card(config)?;
            let server = abhyasa_a2a::serve(node.clone(), &identity, a2a.listen, &card).await?;
            eprintln!("node {agent}: A2A on https://{}", server.local_addr());
            Some(server)
        }
        None => None,
    };
    let mut peers = Vec::new();
    for p in config
        .peers
        .iter()
        .filter(|p| p.transport.as_deref() == Some("a2a"))
    {
        let id = AgentId::new(p.id.clone())?;
        let addr = p.addr()?;
        let card_url = p
            .card
            .clone()
            .unwrap_or_else(|| format!("https://{id}:{}/.well-known/agent-card.json", addr.port()));
        peers.push(abhyasa_a2a::spawn_peer(
            node.clone(),
            &identity,
            abhyasa_a2a::A2aPeer {
                agent: id,
                card_url,
                addr: Some(addr),
            },
        )?);
    }
    Ok((server, peers))
}
