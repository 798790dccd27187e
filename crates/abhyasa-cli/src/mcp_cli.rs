//! `abhyasa mcp`: a node serving MCP over stdio, its tools governed by what it honours.
//!
//! The node is built from the same TOML as `abhyasa node` (it also listens on QUIC and
//! takes obligations over MOQT); `[mcp]` names the principal the stdio client acts as and
//! the host tools it serves: each runs a command, with the call's arguments as JSON on its
//! standard input and its standard output as the result, and is refused while a consent
//! scope it declares is withheld or the token it presents is revoked.

use std::process::Stdio;
use std::sync::Arc;

use abhyasa_mcp::rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool};
use abhyasa_mcp::{Governance, HostTool};
use abhyasa_node::{Admission, Node};
use abhyasa_wire::{Scope, TokenId};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::admin::IssueSpec;

/// The MCP tool that issues an obligation as this node (its principal side).
pub const TOOL_ISSUE: &str = "abhyasa_issue";

/// `[mcp]` in the node config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// The agent the stdio client acts as (`abhyasa mcp --stdio`): obligations on its calls
    /// must be issued by it, and governed tools check what is withheld for it. MCP sessions
    /// over QUIC (served by `abhyasa node`) act as the peer their certificate names.
    #[serde(default)]
    pub principal: Option<String>,
    /// Host tools, each governed.
    #[serde(default)]
    pub tools: Vec<McpToolConfig>,
    /// Which of the node's own tools the `--stdio` / `--http` client gets: `"issue"`
    /// (`abhyasa_issue`: obligations issued as this node) and `"ledger"` (`abhyasa_ledger`:
    /// this node's budget). Each carries the node's whole authority in that respect, so the
    /// default is neither.
    #[serde(default)]
    pub node_tools: Vec<String>,
    /// The deployment members that may call the host tools over MCP-over-QUIC (`abhyasa
    /// node`); absent: every member of the deployment. A member outside the list still
    /// delivers obligations in its own name over MCP, but sees and runs no host tool.
    #[serde(default)]
    pub quic_callers: Option<Vec<String>>,
}

/// One of the node's own MCP tools, as `[mcp] node_tools` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeTool {
    /// `abhyasa_issue`.
    Issue,
    /// `abhyasa_ledger`.
    Ledger,
}

impl McpConfig {
    /// `node_tools`, checked: each a known tool, `ledger` only with a `[ledger]` section.
    pub fn node_tools(&self, has_ledger: bool) -> Result<Vec<NodeTool>, McpConfigError> {
        self.node_tools
            .iter()
            .map(|t| match t.as_str() {
                "issue" => Ok(NodeTool::Issue),
                "ledger" if has_ledger => Ok(NodeTool::Ledger),
                "ledger" => Err(McpConfigError::NodeTool(
                    "\"ledger\" needs a [ledger] section".into(),
                )),
                other => Err(McpConfigError::NodeTool(format!(
                    "{other:?} is not one of the node's tools (\"issue\", \"ledger\")"
                ))),
            })
            .collect()
    }

    /// `quic_callers`, checked as agent ids.
    pub fn quic_callers(
        &self,
    ) -> Result<Option<std::collections::BTreeSet<abhyasa_wire::AgentId>>, McpConfigError> {
        self.quic_callers
            .as_ref()
            .map(|c| {
                c.iter()
                    .map(|a| {
                        abhyasa_wire::AgentId::new(a.clone()).map_err(|e| {
                            McpConfigError::NodeTool(format!("quic_callers: {a:?}: {e}"))
                        })
                    })
                    .collect()
            })
            .transpose()
    }
}

/// One `[[mcp.tools]]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolConfig {
    /// MCP tool name (letters, digits, `_`, `-`).
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// Consent scopes it exercises.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The token it presents.
    pub token: Option<String>,
    /// The command it runs (program and arguments); the call's arguments arrive as JSON on
    /// its standard input.
    pub command: Vec<String>,
    /// Its price per call (`dim=n,…`): present, a call runs only under a ledger dispatch
    /// permit for it, with this node as the gateway (`[ledger] gateway = true`).
    #[serde(default)]
    pub cost: Option<String>,
    /// The purpose a paying credit's label must allow (with `cost`).
    #[serde(default)]
    pub purpose: Option<String>,
}

/// A configuration error, named.
#[derive(Debug, thiserror::Error)]
pub enum McpConfigError {
    /// `[mcp] node_tools` or `quic_callers` names something it cannot.
    #[error("[mcp] {0}")]
    NodeTool(String),
    /// A tool name MCP does not allow.
    #[error("mcp tool name {0:?}: use letters, digits, '_' and '-' (1 to 64)")]
    Name(String),
    /// A tool without a command.
    #[error("mcp tool {0}: command is empty")]
    Command(String),
    /// A scope or token that is not a valid name.
    #[error("mcp tool {tool}: {what}")]
    Governed {
        /// The tool.
        tool: String,
        /// What is wrong.
        what: String,
    },
}

fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn object_schema() -> Arc<JsonObject> {
    Arc::new(
        json!({"type": "object"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    )
}

/// A host tool that runs `cfg.command`.
pub fn command_tool(cfg: &McpToolConfig) -> Result<HostTool, McpConfigError> {
    if !valid_name(&cfg.name) {
        return Err(McpConfigError::Name(cfg.name.clone()));
    }
    if cfg.command.is_empty() {
        return Err(McpConfigError::Command(cfg.name.clone()));
    }
    let governed = |what: String| McpConfigError::Governed {
        tool: cfg.name.clone(),
        what,
    };
    let scopes = cfg
        .scopes
        .iter()
        .map(|s| Scope::new(s.clone()).map_err(|e| governed(format!("scope {s:?}: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let token = cfg
        .token
        .as_ref()
        .map(|t| TokenId::new(t.clone()).map_err(|e| governed(format!("token {t:?}: {e}"))))
        .transpose()?;
    let budget = match (&cfg.cost, &cfg.purpose) {
        (None, None) => None,
        (Some(cost), Some(purpose)) => Some(abhyasa_mcp::ToolBudget {
            purpose: abhyasa_wire::ledger::Dim::new(purpose.clone())
                .map_err(|e| governed(format!("purpose {purpose:?}: {e}")))?,
            max_cost: crate::ledger_cli::parse_vector(cost)
                .map_err(|e| governed(format!("cost {cost:?}: {e}")))?,
        }),
        _ => return Err(governed("cost and purpose go together".into())),
    };
    let mut description = cfg.description.clone();
    if let Some(b) = &budget {
        description.push_str(&format!(
            " (costs up to {cost} for {}; runs only under a dispatch permit in params._meta[\"{}\"])",
            b.purpose,
            abhyasa_mcp::META_PERMIT,
            cost = abhyasa_mcp::budget::show_vector(&b.max_cost),
        ));
    }
    if !scopes.is_empty() {
        let names: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
        description.push_str(&format!(" (uses consent scopes: {})", names.join(", ")));
    }
    let command = Arc::new(cfg.command.clone());
    let priced = budget.is_some();
    Ok(HostTool {
        tool: Tool::new(cfg.name.clone(), description, object_schema()),
        governance: Governance {
            scopes,
            token,
            budget,
        },
        run: Arc::new(move |args| {
            let command = command.clone();
            Box::pin(async move { run_command(&command, &args, priced).await })
        }),
    })
}

/// Runs a command tool with the call's arguments as JSON on its standard input. A priced
/// tool (`cost`) may write what the call actually charged (`dim=n,…`, at most its price) to
/// the file named by `ABHYASA_CHARGE_FILE`; the receipt then settles that much and the rest
/// of the reservation goes back to the payer. Without it, the call charges its price.
async fn run_command(command: &[String], args: &JsonObject, priced: bool) -> CallToolResult {
    let charge_file = if priced {
        match tempfile::NamedTempFile::new() {
            Ok(f) => Some(f.into_temp_path()),
            Err(e) => return fail(format!("could not make the charge file: {e}")),
        }
    } else {
        None
    };
    let mut cmd = tokio::process::Command::new(&command[0]);
    if let Some(path) = &charge_file {
        cmd.env("ABHYASA_CHARGE_FILE", path);
    }
    let result = run_child(cmd, command, args).await;
    match charge_file.map(|p| std::fs::read_to_string(&p)) {
        Some(Ok(text)) if !text.trim().is_empty() && !result.is_error.unwrap_or(false) => {
            let mut result = result;
            result.meta.get_or_insert_with(Default::default).0.insert(
                abhyasa_mcp::envelope::META_CHARGE.into(),
                Value::String(text.trim().to_owned()),
            );
            result
        }
        _ => result,
    }
}

async fn run_child(
    mut cmd: tokio::process::Command,
    command: &[String],
    args: &JsonObject,
) -> CallToolResult {
    let child = cmd
        .args(&command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return fail(format!("could not start {}: {e}", command[0])),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let input = Value::Object(args.clone()).to_string();
        // A command that does not read its input is fine.
        let _ = stdin.write_all(input.as_bytes()).await;
    }
    match child.wait_with_output().await {
        Ok(out) if out.status.success() => CallToolResult::success(vec![ContentBlock::text(
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )]),
        Ok(out) => fail(format!(
            "{} exited with {}: {}",
            command[0],
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => fail(format!("{}: {e}", command[0])),
    }
}

/// `abhyasa_issue`: the arguments are an [`IssueSpec`] as JSON; the node issues the
/// obligation under custody as its principal and answers with the id and admission.
pub fn issue_tool(node: Node) -> HostTool {
    let kinds: Vec<&str> = abhyasa_wire::Kind::known()
        .iter()
        .map(|k| k.as_str())
        .collect();
    let schema = json!({
        "type": "object",
        "properties": {
            "target": {"type": "string"},
            "kind": {"type": "string", "enum": kinds},
            "payload": {"type": "object", "description": "a registered kind's payload"},
            "decision": {"type": "string", "enum": ["grant", "revoke"]},
            "scope": {"type": "string"},
            "weight_key": {"type": "string"},
            "delta": {"type": "number", "minimum": -1, "maximum": 1},
            "action": {"type": "string", "enum": ["revoke", "issue"]},
            "token": {"type": "string"},
            "client": {"type": "string"},
            "deadline_ms": {"type": "integer", "minimum": 1},
            "max_retries": {"type": "integer", "minimum": 0},
            "sequence": {"type": "integer", "minimum": 0},
            "token_expires_in_ms": {"type": "integer", "minimum": 0},
            "lease_ms": {"type": "integer", "minimum": 0},
            "ttl_ms": {"type": "integer", "minimum": 1}
        },
        "required": ["target", "kind"]
    });
    node_tool(
        node,
        TOOL_ISSUE,
        "Issue an obligation under custody as this node's principal; it ends applied, declined or escalated with its safe action.",
        schema,
        |node, args| async move {
                let spec: IssueSpec = match serde_json::from_value(Value::Object(args)) {
                    Ok(s) => s,
                    Err(e) => return fail(format!("arguments: {e}")),
                };
                let o = match spec.build(node.agent(), |span| node.default_retries(span)) {
                    Ok(o) => o,
                    Err(e) => return fail(e),
                };
                let (id, words) = (o.id, abhyasa_wire::words::obligation(&o));
                match node.issue(o).await {
                    Ok(h) => {
                        let admission = match h.admission() {
                            Admission::Custody => "custody",
                            Admission::BestEffort => "best_effort",
                        };
                        let mut r = CallToolResult::success(vec![ContentBlock::text(format!(
                            "issued {words} ({admission}), id {id}"
                        ))]);
                        r.structured_content =
                            Some(json!({"id": id.to_string(), "admission": admission}));
                        r
                    }
                    Err(e) => fail(e.to_string()),
                }
        },
    )
}

/// A tool's failure, in its words.
fn fail(what: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(what)])
}

/// A host tool that runs `f` with the node and the call's arguments.
fn node_tool<F, Fut>(
    node: Node,
    name: &'static str,
    description: &'static str,
    schema: Value,
    f: F,
) -> HostTool
where
    F: Fn(Node, JsonObject) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = CallToolResult> + Send + 'static,
{
    let f = Arc::new(f);
    HostTool {
        tool: Tool::new(
            name,
            description,
            Arc::new(schema.as_object().cloned().unwrap_or_default()),
        ),
        governance: Governance::default(),
        run: Arc::new(move |args| {
            let (node, f) = (node.clone(), f.clone());
            Box::pin(async move { f(node, args).await })
        }),
    }
}

/// The MCP tool that drives this node's ledger.
pub const TOOL_LEDGER: &str = "abhyasa_ledger";

/// `abhyasa_ledger`: the arguments are a ledger request as JSON, tagged by `"ledger"`
/// (`grant`, `delegate`, `spend`, `reclaim`, `reclaim_transfer`, `reissue`, `forfeit`, `status`; ids in hex, amounts as
/// `dim=n,…`), as on the admin interface; answers with the node's reply.
pub fn ledger_tool(node: Node) -> HostTool {
    let schema = json!({
        "type": "object",
        "properties": {
            "ledger": {"type": "string", "enum": ["grant", "delegate", "split", "join", "return_rights", "reserve", "dispatch", "release_unsent", "spend", "permit", "receipt", "reclaim", "reclaim_transfer", "reissue", "forfeit", "status"]},
            "grant": {"type": "string", "description": "Signed<RootGrant> as hex CBOR (grant)"},
            "credit": {"type": "string", "description": "credit id, hex"},
            "transfer": {"type": "string"},
            "amount": {"type": "string"},
            "to": {"type": "string"},
            "label": {"type": "array", "items": {"type": "string"}},
            "reclaimable": {"type": "boolean", "description": "delegate: the child takes it only on this node's confirmation; until then reclaim_transfer takes it back"},
            "gateway": {"type": "string"},
            "purpose": {"type": "string"},
            "operation": {"type": "string"},
            "max": {"type": "string", "description": "dim=n,…"},
            "key": {"type": "string", "description": "operation key, hex"},
            "parent": {"type": "string", "description": "split: the parent credit, hex"},
            "child": {"type": "string", "description": "split: the new credit's id, hex"},
            "inputs": {"type": "array", "items": {"type": "string"}, "description": "join: the credits, hex"},
            "output": {"type": "string", "description": "join: the joined credit's id, hex"},
            "tool": {"type": "string", "description": "permit: the budget-gated tool at the gateway"},
            "arguments": {"type": "object", "description": "permit: the call's arguments (the permit binds them)"},
            "receipt": {"type": "string", "description": "receipt: base64 CBOR from a result's _meta[\"org.abhyasa/receipt\"]"}
        },
        "required": ["ledger"]
    });
    node_tool(
        node,
        TOOL_LEDGER,
        "This node's budget ledger: status, or grant / delegate / split / join / return_rights / reserve / dispatch / release_unsent / spend (reserve, then dispatch to the gateway) / permit (reserve a budget-gated MCP call at a gateway and get its permit for the call's _meta) / receipt (settle with the receipt a result carried) / reclaim / reclaim_transfer / reissue / forfeit; answered once the step is durable.",
        schema,
        |node, args| async move {
                let req: crate::ledger_cli::LedgerRequest =
                    match serde_json::from_value(Value::Object(args)) {
                        Ok(r) => r,
                        Err(e) => return fail(format!("arguments: {e}")),
                    };
                match req.run(&node).await {
                    Ok(v) => {
                        let mut r = CallToolResult::success(vec![ContentBlock::text(
                            serde_json::to_string_pretty(&v).unwrap_or_default(),
                        )]);
                        r.structured_content = Some(v);
                        r
                    }
                    Err(e) => fail(e.to_string()),
                }
        },
    )
}

/// Serves MCP over this process's stdin/stdout until the client closes it.
pub async fn serve_stdio(
    node: Node,
    principal: abhyasa_wire::AgentId,
    tools: Vec<HostTool>,
) -> Result<(), Box<dyn std::error::Error>> {
    use abhyasa_mcp::rmcp::ServiceExt as _;
    let mut server = abhyasa_mcp::AgentServer::new(node, principal);
    for t in tools {
        server = server.tool(t);
    }
    let running = server.serve(abhyasa_mcp::rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

#[cfg(test)]
mod node_tool_tests {
    use super::*;

    fn config(toml_text: &str) -> McpConfig {
        toml::from_str(toml_text).unwrap()
    }

    /// Reproduced: the MCP HTTP token also exposed `abhyasa_issue` and `abhyasa_ledger` —
    /// the node's whole authority — without the operator asking. Now neither by default;
    /// each only when named; an unknown name or `ledger` without a ledger refused by name.
    #[test]
    fn the_nodes_own_tools_are_granted_only_by_name() {
        assert!(config("principal = \"p\"")
            .node_tools(true)
            .unwrap()
            .is_empty());
        assert_eq!(
            config("node_tools = [\"issue\", \"ledger\"]")
                .node_tools(true)
                .unwrap(),
            vec![NodeTool::Issue, NodeTool::Ledger]
        );
        let e = config("node_tools = [\"ledger\"]")
            .node_tools(false)
            .unwrap_err();
        assert!(e.to_string().contains("[ledger] section"), "{e}");
        let e = config("node_tools = [\"admin\"]")
            .node_tools(true)
            .unwrap_err();
        assert!(e.to_string().contains("\"admin\" is not one"), "{e}");
        assert_eq!(config("").quic_callers().unwrap(), None);
        assert_eq!(
            config("quic_callers = [\"principal\"]")
                .quic_callers()
                .unwrap()
                .unwrap()
                .len(),
            1
        );
        assert!(config("quic_callers = [\"Not An Agent\"]")
            .quic_callers()
            .is_err());
    }
}
