//! The MCP binding of Abhyasa custody (docs/DESIGN.md, "On the wire"; docs/MCP.md), on `rmcp`.
//!
//! Roles: the principal's side is the MCP client (it calls tools), the agent's side is the
//! MCP server (it runs tools and honours obligations). Obligations ride any `tools/call` in
//! `params._meta["org.abhyasa/obligations"]` as the CBOR objects of `abhyasa-wire`
//! (base64); the server hands them to the node's receiver — the same sans-IO machine and
//! the same store as on MOQT — **before** it runs the tool, and returns the CustodyAcks in
//! the result's `_meta["org.abhyasa/acks"]`. Host tools declare the consent scopes and the
//! token they use; a call is refused with a tool error naming the obligation that withheld
//! the scope or revoked the token. The idempotency key is the obligation id, never the
//! JSON-RPC request id.

#![warn(missing_docs)]

pub use rmcp;

pub mod http;

pub mod budget;
pub mod channel;
pub mod client;
pub mod envelope;
pub mod quic;
pub mod server;

pub use budget::{
    permit_from_meta, permit_to_meta, receipt_from_meta, receipt_to_meta, tool_effect, PermitError,
    ToolBudget,
};
pub use channel::{McpChannel, McpRole, McpSender, MCP_PATH};
pub use client::{BudgetedCall, BudgetedCallError, PrincipalClient};
pub use envelope::{
    acks_from_meta, acks_to_meta, obligations_from_meta, obligations_to_meta, EnvelopeError,
    META_ACKS, META_OBLIGATIONS, META_PERMIT, META_RECEIPT,
};
pub use quic::{
    connect_command, connect_quic, connect_url, serve_quic, serve_quic_for, McpRoute,
    PrincipalLink, QuicTransport,
};
pub use server::{
    AgentServer, Governance, HostTool, ToolFn, ToolFuture, RESOURCE_HONOURS, RESOURCE_WEIGHTS,
    TOOL_CUSTODY_STATUS, TOOL_DELIVER,
};
