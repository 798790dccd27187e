//! The agent's side as an MCP server: every `tools/call` first hands the obligations it
//! carries to the node's receiver (so a revocation riding a call governs that very call),
//! then runs the tool only if what the node honours allows it, and returns the acks on the
//! result.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use abhyasa_custody::GovernedKey;
use abhyasa_node::{Node, NodeError};
use abhyasa_wire::{AckStatus, AgentId, CustodyAck, ObligationId, Scope, TokenId, UnixMillis};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListResourcesResult, ListToolsResult, MetaObject, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use tracing::info;

use crate::budget::{
    permit_from_meta, receipt_to_meta, refusal_words, show_vector, tool_effect, ToolBudget,
};
use crate::envelope::{
    acks_to_meta, obligations_from_meta, META_ACKS, META_OBLIGATIONS, META_PERMIT, META_RECEIPT,
};
use abhyasa_node::GatewayAnswer;

/// Tool that only carries obligations (when no other call is due).
pub const TOOL_DELIVER: &str = "abhyasa_deliver";
/// Tool that answers, by obligation id, what this agent has applied.
pub const TOOL_CUSTODY_STATUS: &str = "abhyasa_custody_status";
/// The resource holding the routing weights this agent applies for the calling principal.
pub const RESOURCE_WEIGHTS: &str = "abhyasa://honours/weights";
/// The resource holding everything this agent honours for the calling principal.
pub const RESOURCE_HONOURS: &str = "abhyasa://honours";

/// What a host tool uses, checked against what the node honours for the calling principal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Governance {
    /// Consent scopes the tool exercises: a call is refused while any of them is withheld.
    pub scopes: Vec<Scope>,
    /// The token the tool presents: a call is refused once the token is revoked.
    pub token: Option<TokenId>,
    /// Its price: present, a call runs only under a ledger dispatch permit for it, with this
    /// node as the gateway.
    pub budget: Option<ToolBudget>,
}

/// The future a host tool returns.
pub type ToolFuture = Pin<Box<dyn Future<Output = CallToolResult> + Send>>;

/// How a host tool runs: its arguments in, its result out.
pub type ToolFn = Arc<dyn Fn(JsonObject) -> ToolFuture + Send + Sync>;

/// A tool the embedding host serves, governed by what its node honours.
#[derive(Clone)]
pub struct HostTool {
    /// The MCP description (name, schema …).
    pub tool: Tool,
    /// What it uses.
    pub governance: Governance,
    /// What it does.
    pub run: ToolFn,
}

impl std::fmt::Debug for HostTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTool")
            .field("name", &self.tool.name)
            .field("governance", &self.governance)
            .finish_non_exhaustive()
    }
}

/// An MCP server backed by a node. `principal` is the agent the MCP session authenticated
/// (for stdio: the host that spawned the server, as configured); obligations in another
/// issuer's name are dropped as forged, as on every binding.
#[derive(Clone)]
pub struct AgentServer {
    node: Node,
    principal: AgentId,
    tools: Arc<BTreeMap<String, HostTool>>,
}

impl AgentServer {
    /// A server for `node`, whose MCP client acts as `principal`.
    pub fn new(node: Node, principal: AgentId) -> Self {
        Self {
            node,
            principal,
            tools: Arc::new(BTreeMap::new()),
        }
    }

    /// Adds a host tool (replacing one of the same name).
    pub fn tool(mut self, t: HostTool) -> Self {
        Arc::make_mut(&mut self.tools).insert(t.tool.name.to_string(), t);
        self
    }

    /// The principal this server's client acts as.
    pub fn principal(&self) -> &AgentId {
        &self.principal
    }

    /// Why a governed tool may not run now, naming the obligation that decided it.
    async fn refusal(&self, g: &Governance) -> Result<Option<String>, NodeError> {
        if g.scopes.is_empty() && g.token.is_none() {
            return Ok(None);
        }
        let honours = self.node.honours().await?;
        // Leases and token expiries are read against the clock now: no sweep has to run first.
        let now = self.node.now();
        let named = |by: Option<abhyasa_wire::ObligationId>| {
            by.map(|id| format!(" (obligation {id})"))
                .unwrap_or_default()
        };
        for scope in &g.scopes {
            if honours.permits(&self.principal, scope, now) {
                continue;
            }
            let key = GovernedKey::Scope(self.principal.clone(), scope.clone());
            let by = named(self.node.governed_by(key).await?);
            let principal = &self.principal;
            return Ok(Some(match honours.lease(principal, scope) {
                Some(end) if !honours.is_withheld(principal, scope) => format!(
                    "refused: the lease on consent to {scope} for {principal} ended at {end} \
                     (unix time){by}"
                ),
                _ => format!("refused: consent to {scope} is withheld for {principal}{by}"),
            }));
        }
        if let Some(token) = &g.token {
            if !honours.token_in_force(token, now) {
                let key = GovernedKey::Token(self.principal.clone(), token.clone());
                let by = named(self.node.governed_by(key).await?);
                return Ok(Some(match honours.token_record(token) {
                    Some((false, Some(end))) => {
                        format!("refused: token {token} expired at {end} (unix){by}")
                    }
                    _ => format!("refused: token {token} is revoked{by}"),
                }));
            }
        }
        Ok(None)
    }

    /// Hands the envelope to the receiver; one more try after a commit of unknown outcome
    /// (delivery is idempotent on the obligation id).
    async fn deliver(&self, objects: Vec<Vec<u8>>) -> Result<Vec<Option<CustodyAck>>, McpError> {
        let mut last = None;
        for _ in 0..2 {
            match self
                .node
                .deliver(self.principal.clone(), objects.clone())
                .await
            {
                Ok(acks) => return Ok(acks),
                Err(e @ NodeError::IssueAgain { .. }) => last = Some(e),
                Err(e) => return Err(McpError::internal_error(e.to_string(), None)),
            }
        }
        let e = last.map(|e| e.to_string()).unwrap_or_default();
        Err(McpError::internal_error(e, None))
    }

    /// Runs a budget-gated tool under the permit the call carries: this node's gateway
    /// verifies it against the call as asked (tool, arguments, price, caller), makes its first
    /// acceptance durable, and only then is the tool run — once; the receipt rides the
    /// result. A replayed permit gets the first decision's receipt and runs nothing.
    async fn run_budgeted(
        &self,
        t: &HostTool,
        budget: &ToolBudget,
        args: JsonObject,
        meta: &Map<String, Value>,
    ) -> Result<CallToolResult, McpError> {
        let name = t.tool.name.to_string();
        let refuse = |why: String| {
            info!(tool = %name, principal = %self.principal, %why, "budget-gated tool refused");
            Ok(CallToolResult::error(vec![ContentBlock::text(why)]))
        };
        let permit = match permit_from_meta(meta) {
            Ok(Some(p)) => p,
            Ok(None) => {
                return refuse(format!(
                    "refused: {name} costs up to {} ({}); it runs only with a dispatch permit in params._meta[\"{META_PERMIT}\"]",
                    show_vector(&budget.max_cost),
                    budget.purpose
                ))
            }
            Err(e) => return refuse(format!("refused: {e}")),
        };
        let effect = tool_effect(&name, &args, budget);
        let internal = |e: NodeError| McpError::internal_error(e.to_string(), None);
        let answer = self
            .node
            .gateway_dispatch(self.principal.clone(), permit, effect)
            .await
            .map_err(internal)?;
        let (mut result, receipt) = match answer {
            GatewayAnswer::Refused(r) => {
                return refuse(format!("refused: the dispatch permit — {}", refusal_words(r)))
            }
            GatewayAnswer::Pending => {
                return refuse(format!(
                    "pending: this permit's call of {name} was accepted and has no receipt yet; call again with the same permit"
                ))
            }
            GatewayAnswer::Receipt(r) => {
                let key = r.peek().map(|b| b.key.to_string()).unwrap_or_default();
                let text = format!(
                    "{name} already ran under this permit (operation {key}); it does not run again: its receipt is attached"
                );
                (CallToolResult::success(vec![ContentBlock::text(text)]), r)
            }
            GatewayAnswer::Run(e) => {
                // Run and report even if this request is dropped: the acceptance is durable,
                // and a receipt must follow it.
                let (node, run, args) = (self.node.clone(), t.run.clone(), args);
                let done = tokio::spawn(async move {
                    let mut result = run(args).await;
                    // The tool may say it charged less than its price (partial settlement).
                    let charge = crate::budget::take_charge(
                        result.meta.as_mut().map(|m| &mut m.0),
                        &e.max_charge,
                    );
                    let receipt = node
                        .gateway_executed(e.payer.clone(), e.key, charge)
                        .await;
                    (result, receipt)
                });
                let (result, receipt) = done
                    .await
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                (result, receipt.map_err(internal)?)
            }
        };
        let meta = result.meta.get_or_insert_with(MetaObject::default);
        meta.0
            .insert(META_RECEIPT.into(), receipt_to_meta(&receipt));
        Ok(result)
    }

    /// `abhyasa_custody_status`: with `ids`, which of them this agent applied (an ack for
    /// each applied one); without, everything it applied recently for this principal. Bad
    /// arguments are a tool result with `isError: true` naming what to fix, so a model can
    /// correct its call; only a failing node is a protocol error.
    async fn custody_status(
        &self,
        args: &JsonObject,
    ) -> Result<(CallToolResult, Vec<CustodyAck>), McpError> {
        let bad = |why: String| {
            Ok((
                CallToolResult::error(vec![ContentBlock::text(format!(
                    "{TOOL_CUSTODY_STATUS}: {why}"
                ))]),
                Vec::new(),
            ))
        };
        if let Some(extra) = args.keys().find(|k| k.as_str() != "ids") {
            return bad(format!(
                "unknown argument {extra:?}; the one argument is \"ids\" (optional)"
            ));
        }
        let internal = |e: NodeError| McpError::internal_error(e.to_string(), None);
        let ids = match args.get("ids") {
            None => None,
            Some(Value::Array(ids)) => {
                let mut parsed = Vec::with_capacity(ids.len());
                for v in ids {
                    // One spelling per id (as ids are printed: 32 lowercase hex digits), so
                    // two strings never name one obligation.
                    match v
                        .as_str()
                        .filter(|s| {
                            s.len() == 32
                                && s.bytes()
                                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                        })
                        .and_then(|s| u128::from_str_radix(s, 16).ok())
                    {
                        Some(n) => parsed.push(ObligationId::from_u128(n)),
                        None => {
                            return bad(format!(
                                "ids: {v} is not an obligation id (32 lowercase hex digits)"
                            ))
                        }
                    }
                }
                Some(parsed)
            }
            Some(v) => {
                return bad(format!(
                    "ids must be an array of obligation ids (32 lowercase hex digits), got {v}"
                ))
            }
        };
        let now = UnixMillis(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        );
        let ack = |id: ObligationId| CustodyAck {
            obligation_id: id,
            target: self.node.agent().clone(),
            status: AckStatus::Applied,
            acked_at: now,
            detail: None,
        };
        let mut acks = Vec::new();
        let mut status = Map::new();
        let text = match ids {
            Some(ids) => {
                let applied = self.node.applied(ids.clone()).await.map_err(internal)?;
                for (id, applied) in ids.iter().zip(applied) {
                    status.insert(
                        id.to_string(),
                        Value::String(if applied { "applied" } else { "unknown" }.into()),
                    );
                    if applied {
                        acks.push(ack(*id));
                    }
                }
                format!("{} of {} applied", acks.len(), ids.len())
            }
            None => {
                let recent = self.node.status().await.map_err(internal)?.applied;
                for e in recent
                    .iter()
                    .filter(|e| e.obligation.issuer == self.principal)
                {
                    let o = &e.obligation;
                    status.insert(
                        o.id.to_string(),
                        json!({
                            "status": "applied",
                            "kind": o.kind().as_str(),
                            "applied_at": crate::envelope::rfc3339(e.at),
                            "applied_at_ms": e.at.0,
                        }),
                    );
                    acks.push(ack(o.id));
                }
                format!(
                    "{} applied recently for {} (the most recent {} kept)",
                    acks.len(),
                    self.principal,
                    abhyasa_node::STATUS_APPLIED
                )
            }
        };
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        result.structured_content = Some(Value::Object(status));
        Ok((result, acks))
    }

    fn builtin_tools() -> Vec<Tool> {
        let empty: JsonObject = serde_json::from_value(json!({
            "type": "object",
            "properties": {}
        }))
        .unwrap_or_default();
        let ids: JsonObject = serde_json::from_value(json!({
            "type": "object",
            "properties": {
                "ids": {
                    "type": "array",
                    "description": "obligation ids to look up; omit for everything applied recently",
                    "items": {"type": "string", "description": "obligation id, 32 lowercase hex digits"}
                }
            }
        }))
        .unwrap_or_default();
        vec![
            Tool::new(
                TOOL_DELIVER,
                format!(
                    "Delivers the obligations in params._meta[\"{META_OBLIGATIONS}\"] under custody; the acks come back in the result's _meta[\"{META_ACKS}\"]."
                ),
                Arc::new(empty),
            ),
            Tool::new(
                TOOL_CUSTODY_STATUS,
                "Which of these obligations this agent has applied (without ids: everything it applied recently for you); an ack for each applied one comes back in the result's _meta.",
                Arc::new(ids),
            ),
        ]
    }
}

fn merged_meta(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Map<String, Value> {
    let mut m = context.meta.0 .0.clone();
    if let Some(r) = &request.meta {
        for (k, v) in r.0 .0.iter() {
            m.insert(k.clone(), v.clone());
        }
    }
    m
}

impl ServerHandler for AgentServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        );
        info.server_info = Implementation::new("abhyasa", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(format!(
            "Abhyasa agent {}: obligations in params._meta[\"{META_OBLIGATIONS}\"] of any tools/call are applied before the tool runs; acks return in the result's _meta[\"{META_ACKS}\"].",
            self.node.agent()
        ));
        info
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let json = |r: Resource| r.with_mime_type("application/json");
        Ok(ListResourcesResult::with_all_items(vec![
            json(
                Resource::new(RESOURCE_WEIGHTS, "routing weights")
                    .with_description("The routing weights this agent applies for you, by key (-1..1), from the corrective updates it applied"),
            ),
            json(
                Resource::new(RESOURCE_HONOURS, "what this agent honours")
                    .with_description("For you: the consent scopes it no longer uses, its routing weights, and the tokens it dropped"),
            ),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri.as_str();
        if uri != RESOURCE_WEIGHTS && uri != RESOURCE_HONOURS {
            return Err(McpError::resource_not_found(
                format!("no resource {uri}"),
                None,
            ));
        }
        let state = self
            .node
            .honours()
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let me = &self.principal;
        // Weights as they stand now: a change that lapsed counts no more.
        let weights: Map<String, Value> = state
            .weights(self.node.now())
            .filter(|((issuer, _), _)| issuer == me)
            .map(|((_, key), w)| {
                (
                    key.to_string(),
                    json!(w as f64 / f64::from(abhyasa_wire::WeightDelta::ONE)),
                )
            })
            .collect();
        let body = if uri == RESOURCE_WEIGHTS {
            json!({ "principal": me.as_str(), "weights": weights })
        } else {
            let withheld: Vec<String> = state
                .withheld()
                .filter(|(issuer, _)| issuer == me)
                .map(|(_, scope)| scope.to_string())
                .collect();
            let dropped: Vec<String> = state.dropped_tokens().map(ToString::to_string).collect();
            json!({
                "principal": me.as_str(),
                "withheld_scopes": withheld,
                "weights": weights,
                "dropped_tokens": dropped,
            })
        };
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(body.to_string(), uri).with_mime_type("application/json")
        ])
        .into())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = Self::builtin_tools();
        tools.extend(self.tools.values().map(|t| t.tool.clone()));
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // The envelope first, before anything runs: a malformed one refuses the whole
        // request and delivers nothing.
        let meta = merged_meta(&request, &context);
        let objects = obligations_from_meta(&meta).map_err(|e| {
            McpError::invalid_params(e.to_string(), Some(json!({ "key": e.key() })))
        })?;
        let mut acks: Vec<CustodyAck> = if objects.is_empty() {
            Vec::new()
        } else {
            let n = objects.len();
            let acks: Vec<CustodyAck> =
                self.deliver(objects).await?.into_iter().flatten().collect();
            info!(principal = %self.principal, delivered = n, acked = acks.len(), "obligations rode a tool call");
            acks
        };
        let args = request.arguments.clone().unwrap_or_default();
        let mut result = match request.name.as_ref() {
            TOOL_DELIVER => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(format!(
                    "{} acks",
                    acks.len()
                ))]);
                r.structured_content = Some(json!({
                    "acks": acks.iter().map(crate::envelope::ack_json).collect::<Vec<_>>(),
                }));
                r
            }
            TOOL_CUSTODY_STATUS => {
                let (result, more) = self.custody_status(&args).await?;
                acks.extend(more);
                result
            }
            name => {
                let Some(t) = self.tools.get(name) else {
                    return Err(McpError::invalid_params(
                        format!("unknown tool {name}"),
                        None,
                    ));
                };
                let refusal = self
                    .refusal(&t.governance)
                    .await
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                match (refusal, &t.governance.budget) {
                    (Some(why), _) => {
                        info!(tool = name, principal = %self.principal, %why, "governed tool refused");
                        CallToolResult::error(vec![ContentBlock::text(why)])
                    }
                    (None, Some(budget)) => self.run_budgeted(t, budget, args, &meta).await?,
                    (None, None) => (t.run)(args).await,
                }
            }
        };
        if !acks.is_empty() {
            let meta = result.meta.get_or_insert_with(MetaObject::default);
            meta.0.insert(META_ACKS.into(), acks_to_meta(&acks));
        }
        Ok(result.into())
    }
}
