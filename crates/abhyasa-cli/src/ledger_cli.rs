//! `abhyasa ledger …`: ledger keys and keyrings, the reference gateway executor, admin
//! requests, and the offline checker over nodes' state directories.
//!
//! Ledger keys are certificate keys: an agent signs its ledger messages with the Ed25519 key
//! of its certificate (`<agent>.pem`, `<agent>.key`), and a node trusts the key of every
//! certificate in its certificates directory that chains to the deployment CA (`ca.pem`) —
//! so the keyring binds each key to the agent its certificate names. `abhyasa certs init`
//! issues the budget issuer's certificate (`issuer.pem`) beside the CA.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use abhyasa_ledger::check::{audit, audit_gateway, check, EffectInstance, Violation, World};
use abhyasa_ledger::{
    Branch, CreditId, Dim, Effect, Execute, Gateway, Keyring, Label, LedgerSigningKey, OpKey,
    RootGrant, RootId, Signed, TransferId, Vector,
};
use abhyasa_moq::{certified_keys, Identity, Signer};
use abhyasa_node::{Executor, LedgerCommand, LedgerReply, LedgerStatus};
use abhyasa_store::{Store, StoreConfig};
use abhyasa_wire::{decode, encode, AgentId, UnixMillis};
use serde::{Deserialize, Serialize};

/// Errors of the ledger commands.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

fn hex_decode(s: &str) -> Result<Vec<u8>, Error> {
    Ok(hex::decode(s.trim())?)
}

/// The ledger signing key of `name`: the key of its certificate `<dir>/<name>.pem`, read
/// from `<dir>/<name>.key` and checked to be that certificate's.
pub fn load_key(dir: &Path, name: &str) -> Result<LedgerSigningKey, Error> {
    let identity = Identity::load(dir, &AgentId::new(name)?)?;
    Ok(Signer::new(&identity)?.key().clone())
}

/// The ledger keyring of a deployment: the key of every agent certificate in `dir` that
/// chains to `dir/ca.pem` (public files only); root grants are trusted from `issuers` only.
/// Certificate files that do not verify are not trusted, and said so on standard error.
pub fn load_keyring(dir: &Path, issuers: &[String]) -> Result<Keyring, Error> {
    let found = certified_keys(dir)?;
    for (path, why) in &found.refused {
        eprintln!("ledger keyring: not trusting {}: {why}", path.display());
    }
    let issuers = issuers
        .iter()
        .map(|i| AgentId::new(i.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    for issuer in &issuers {
        if !found.keys.contains_key(issuer) {
            return Err(format!(
                "root grant issuer {issuer}: no certificate of the deployment in {}",
                dir.display()
            )
            .into());
        }
    }
    Ok(Keyring::new(found.keys).with_issuers(issuers))
}

/// Parses `cents=40,calls=1`.
pub fn parse_vector(s: &str) -> Result<Vector, Error> {
    Ok(abhyasa_mcp::budget::parse_vector(s)?)
}

/// Formats a vector as `cents=40,calls=1`.
pub fn show_vector(v: &Vector) -> String {
    let parts: Vec<String> = v.iter().map(|(d, n)| format!("{d}={n}")).collect();
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join(",")
    }
}

fn id128(s: &str) -> Result<u128, Error> {
    Ok(u128::from_str_radix(s.trim(), 16)?)
}

/// A ledger admin request (ids in hex, amounts as `dim=n,…`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "ledger", rename_all = "snake_case")]
pub enum LedgerRequest {
    /// A root grant, already signed by its issuer (hex CBOR).
    Grant {
        /// `Signed<RootGrant>` as hex CBOR.
        grant: String,
        /// The root credit id.
        credit: String,
    },
    /// Seal a transfer to a child branch.
    Delegate {
        /// Paying credit.
        credit: String,
        /// Transfer id.
        transfer: String,
        /// Amount.
        amount: String,
        /// Destination agent.
        to: String,
        /// Purposes of the child's label.
        label: Vec<String>,
        /// The child takes it only on this node's confirmation; until then it can be
        /// reclaimed (`reclaim_transfer`).
        #[serde(default)]
        reclaimable: bool,
    },
    /// Take back a reclaimable transfer no claim of which was confirmed.
    ReclaimTransfer {
        /// Transfer id.
        transfer: String,
    },
    /// Reserve and dispatch an effect through a gateway.
    Spend(PaidEffect),
    /// Fence a credit's epoch to reclaim stuck dispatches.
    Reclaim {
        /// The credit.
        credit: String,
    },
    /// Close a credit's generation (nothing in progress) into a fresh one.
    Reissue {
        /// The credit.
        credit: String,
    },
    /// Retire a quarantined operation (its atoms stay charged).
    Forfeit {
        /// The operation key.
        key: String,
    },
    /// Split part of a credit's available atoms into a new local credit.
    Split {
        /// The parent credit.
        parent: String,
        /// The new credit's id.
        child: String,
        /// How much.
        amount: String,
        /// The new credit's purposes (within the parent's).
        label: Vec<String>,
    },
    /// Join operation-free credits of one root into one.
    Join {
        /// The credits.
        inputs: Vec<String>,
        /// The joined credit's id.
        output: String,
    },
    /// Return a received credit's unused atoms to their source.
    ReturnRights {
        /// The credit.
        credit: String,
        /// The return's transfer id.
        transfer: String,
    },
    /// Reserve an effect's maximum without dispatching it.
    Reserve(PaidEffect),
    /// Dispatch a reserved operation.
    Dispatch {
        /// The operation key.
        key: String,
    },
    /// Give back a reservation never dispatched.
    ReleaseUnsent {
        /// The operation key.
        key: String,
    },
    /// Reserve and dispatch, through this node, the call of a budget-gated MCP tool at a
    /// gateway, and answer the signed permit (base64 CBOR) for the call's `_meta`.
    Permit {
        /// Paying credit.
        credit: String,
        /// The gateway (the MCP server's agent).
        gateway: String,
        /// The tool.
        tool: String,
        /// The call's arguments (the permit binds them, in canonical JSON).
        #[serde(default)]
        arguments: serde_json::Map<String, serde_json::Value>,
        /// The tool's purpose.
        purpose: String,
        /// The tool's price (its most).
        max: String,
        /// Operation key.
        key: String,
    },
    /// Settle with the receipt a tool result carried (base64 CBOR).
    Receipt {
        /// The gateway that signed it.
        gateway: String,
        /// The receipt.
        receipt: String,
    },
    /// The ledger as this node holds it.
    Status,
}

/// An effect paid from a credit through a gateway (what `spend` and `reserve` name).
#[derive(Debug, Serialize, Deserialize)]
pub struct PaidEffect {
    /// Paying credit.
    pub credit: String,
    /// Gateway agent.
    pub gateway: String,
    /// Purpose (within the credit's label).
    pub purpose: String,
    /// The normalized operation.
    pub operation: String,
    /// Maximum charge.
    pub max: String,
    /// Operation key.
    pub key: String,
}

impl PaidEffect {
    /// The credit, the effect, the gateway and the key, read.
    fn parts(&self) -> Result<(CreditId, Effect, AgentId, OpKey), Error> {
        Ok((
            CreditId::from_u128(id128(&self.credit)?),
            Effect {
                purpose: Dim::new(self.purpose.clone())?,
                operation: self.operation.clone(),
                max_charge: parse_vector(&self.max)?,
                carried_by: None,
            },
            AgentId::new(self.gateway.clone())?,
            OpKey::from_u128(id128(&self.key)?),
        ))
    }
}

impl LedgerRequest {
    /// The node command.
    pub fn command(&self) -> Result<LedgerCommand, Error> {
        Ok(match self {
            LedgerRequest::Grant { grant, credit } => LedgerCommand::Grant {
                grant: decode::<Signed<RootGrant>>(&hex_decode(grant)?)?,
                credit: CreditId::from_u128(id128(credit)?),
            },
            LedgerRequest::Delegate {
                credit,
                transfer,
                amount,
                to,
                label,
                reclaimable,
            } => LedgerCommand::Delegate {
                credit: CreditId::from_u128(id128(credit)?),
                transfer: TransferId::from_u128(id128(transfer)?),
                amount: parse_vector(amount)?,
                to: AgentId::new(to.clone())?,
                label: Label::of(&label.iter().map(String::as_str).collect::<Vec<_>>())?,
                reclaimable: *reclaimable,
            },
            LedgerRequest::ReclaimTransfer { transfer } => LedgerCommand::ReclaimTransfer {
                transfer: TransferId::from_u128(id128(transfer)?),
            },
            LedgerRequest::Spend(paid) => {
                let (credit, effect, gateway, key) = paid.parts()?;
                LedgerCommand::Spend {
                    credit,
                    effect,
                    gateway,
                    key,
                }
            }
            LedgerRequest::Reclaim { credit } => LedgerCommand::Reclaim {
                credit: CreditId::from_u128(id128(credit)?),
            },
            LedgerRequest::Reissue { credit } => LedgerCommand::Reissue {
                credit: CreditId::from_u128(id128(credit)?),
            },
            LedgerRequest::Forfeit { key } => LedgerCommand::Forfeit {
                key: OpKey::from_u128(id128(key)?),
            },
            LedgerRequest::Split {
                parent,
                child,
                amount,
                label,
            } => LedgerCommand::Split {
                parent: CreditId::from_u128(id128(parent)?),
                child: CreditId::from_u128(id128(child)?),
                amount: parse_vector(amount)?,
                label: Label::of(&label.iter().map(String::as_str).collect::<Vec<_>>())?,
            },
            LedgerRequest::Join { inputs, output } => LedgerCommand::Join {
                inputs: inputs
                    .iter()
                    .map(|c| id128(c).map(CreditId::from_u128))
                    .collect::<Result<_, _>>()?,
                output: CreditId::from_u128(id128(output)?),
            },
            LedgerRequest::ReturnRights { credit, transfer } => LedgerCommand::ReturnRights {
                credit: CreditId::from_u128(id128(credit)?),
                transfer: TransferId::from_u128(id128(transfer)?),
            },
            LedgerRequest::Reserve(paid) => {
                let (credit, effect, gateway, key) = paid.parts()?;
                LedgerCommand::Reserve {
                    credit,
                    effect,
                    gateway,
                    key,
                }
            }
            LedgerRequest::Dispatch { key } => LedgerCommand::Dispatch {
                key: OpKey::from_u128(id128(key)?),
            },
            LedgerRequest::ReleaseUnsent { key } => LedgerCommand::ReleaseUnsent {
                key: OpKey::from_u128(id128(key)?),
            },
            LedgerRequest::Receipt { gateway, receipt } => {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(receipt.trim())
                    .map_err(|e| format!("receipt: not base64: {e}"))?;
                LedgerCommand::Receipt {
                    gateway: AgentId::new(gateway.clone())?,
                    receipt: Box::new(
                        decode(&bytes)
                            .map_err(|e| format!("receipt: not a signed receipt: {e}"))?,
                    ),
                }
            }
            LedgerRequest::Permit { .. } => {
                return Err("a permit is asked for with LedgerRequest::run".into())
            }
            LedgerRequest::Status => LedgerCommand::Status,
        })
    }

    /// Runs the request on `node`, answered as JSON (`{"ok": true, …}`) once durable.
    pub async fn run(&self, node: &abhyasa_node::Node) -> Result<serde_json::Value, Error> {
        let LedgerRequest::Permit {
            credit,
            gateway,
            tool,
            arguments,
            purpose,
            max,
            key,
        } = self
        else {
            return Ok(reply_json(&node.ledger(self.command()?).await?));
        };
        let budget = abhyasa_mcp::ToolBudget {
            purpose: Dim::new(purpose.clone())?,
            max_cost: parse_vector(max)?,
        };
        let effect = abhyasa_mcp::tool_effect(tool, arguments, &budget);
        let key = OpKey::from_u128(id128(key)?);
        let permit = node
            .carried_permit(
                CreditId::from_u128(id128(credit)?),
                effect,
                AgentId::new(gateway.clone())?,
                key,
            )
            .await?;
        let expires = permit.peek()?.binding.expires;
        Ok(serde_json::json!({
            "ok": true,
            "permit": abhyasa_mcp::permit_to_meta(&permit),
            "operation": format!("{:x}", key.to_u128()),
            "max": show_vector(&budget.max_cost),
            "expires": expires.map(abhyasa_mcp::envelope::rfc3339),
            "expires_ms": expires.map(|e| e.0),
        }))
    }
}

/// Signs a root grant with the issuer's certificate key, as hex CBOR for [`LedgerRequest::Grant`].
pub fn signed_grant(
    certs: &Path,
    issuer: &str,
    holder: &str,
    root: u128,
    budget: &str,
    label: &[String],
) -> Result<String, Error> {
    let key = load_key(certs, issuer)?;
    let issued_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let grant = RootGrant {
        root: RootId::from_u128(root),
        issuer: AgentId::new(issuer)?,
        holder: AgentId::new(holder)?,
        budget: parse_vector(budget)?,
        label: Label::of(&label.iter().map(String::as_str).collect::<Vec<_>>())?,
        issued_at: abhyasa_wire::UnixMillis(issued_at),
    };
    Ok(hex::encode(encode(&Signed::sign(
        &grant,
        &grant.issuer,
        &key,
    ))))
}

/// A node's ledger reply as JSON.
pub fn reply_json(r: &LedgerReply) -> serde_json::Value {
    match r {
        LedgerReply::Done => serde_json::json!({"ok": true}),
        LedgerReply::Status(s) => serde_json::json!({"ok": true, "ledger": status_json(s)}),
        LedgerReply::Credit { credit } => {
            serde_json::json!({"ok": true, "credit": format!("{:x}", credit.to_u128())})
        }
        LedgerReply::Operation { key, state } => {
            serde_json::json!({"ok": true, "operation": format!("{:x}", key.to_u128()), "state": state})
        }
    }
}

fn status_json(s: &LedgerStatus) -> serde_json::Value {
    let names = abhyasa_node::ledger::BUCKETS;
    serde_json::json!({
        "roots": s.roots.iter().map(|(r, b)| {
            let mut m = serde_json::Map::new();
            m.insert("root".into(), format!("{r}").into());
            for (n, v) in names.iter().zip(b.iter()) {
                m.insert((*n).into(), show_vector(v).into());
            }
            serde_json::Value::Object(m)
        }).collect::<Vec<_>>(),
        "credits": s.credits.iter().map(|c| serde_json::json!({
            "id": format!("{}", c.id), "root": format!("{}", c.root),
            "available": show_vector(&c.available), "generation": c.generation, "epoch": c.epoch,
            "fenced": c.fenced, "closed": c.closed,
            "successor": c.successor.map(|s| format!("{s}")),
        })).collect::<Vec<_>>(),
        "operations": s.operations.iter().map(|o| serde_json::json!({
            "key": format!("{}", o.key), "credit": format!("{}", o.credit),
            "gateway": o.gateway.to_string(), "max": show_vector(&o.max_charge),
            "state": o.state, "charged": o.charged.as_ref().map(show_vector),
        })).collect::<Vec<_>>(),
        "transfers": s.transfers.iter().map(|(t, to, v, st)| serde_json::json!({
            "transfer": format!("{t}"), "to": to.to_string(), "amount": show_vector(v), "state": st,
        })).collect::<Vec<_>>(),
        "incoming": s.incoming.iter().map(|(t, from, v, st)| serde_json::json!({
            "transfer": format!("{t}"), "from": from.to_string(), "amount": show_vector(v), "state": st,
        })).collect::<Vec<_>>(),
        "accepted": s.accepted.iter().map(|(k, done)| serde_json::json!({
            "key": format!("{k}"), "receipted": done,
        })).collect::<Vec<_>>(),
        "journal": {
            "steps": s.journal_steps, "folded_steps": s.folded_steps,
            "ended_operations": s.ended_operations,
        },
        "gateway": s.gateway.map(|(horizon, folded)| serde_json::json!({
            "horizon_ms": horizon.0, "folded_records": folded,
        })),
    })
}

/// Prints a status reply for people.
pub fn print_status(v: &serde_json::Value) {
    let l = &v["ledger"];
    let j = &l["journal"];
    println!(
        "journal: {} steps since a checkpoint of {} ({} ended operations folded)",
        j["steps"], j["folded_steps"], j["ended_operations"]
    );
    if let Some(g) = l["gateway"].as_object() {
        println!(
            "gateway: forgets bindings expiring before {} ms; {} log records folded",
            g["horizon_ms"], g["folded_records"]
        );
    }
    for r in l["roots"].as_array().into_iter().flatten() {
        println!(
            "root {}: available {} | in transit {} | reserved {} | quarantined {} | committed {} | forfeited {}",
            r["root"].as_str().unwrap_or("?"),
            r["available"].as_str().unwrap_or("?"),
            r["in_transit"].as_str().unwrap_or("?"),
            r["reserved"].as_str().unwrap_or("?"),
            r["quarantined"].as_str().unwrap_or("?"),
            r["committed"].as_str().unwrap_or("?"),
            r["forfeited"].as_str().unwrap_or("?"),
        );
    }
    for c in l["credits"].as_array().into_iter().flatten() {
        println!(
            "  credit {} (root {}, epoch {}){}: available {}",
            c["id"].as_str().unwrap_or("?"),
            c["root"].as_str().unwrap_or("?"),
            c["epoch"],
            if c["closed"] == true { " closed" } else { "" },
            c["available"].as_str().unwrap_or("?"),
        );
    }
    for o in l["operations"].as_array().into_iter().flatten() {
        println!(
            "  operation {} at {}: {} (max {}{})",
            o["key"].as_str().unwrap_or("?"),
            o["gateway"].as_str().unwrap_or("?"),
            o["state"].as_str().unwrap_or("?"),
            o["max"].as_str().unwrap_or("?"),
            o["charged"]
                .as_str()
                .map(|c| format!(", charged {c}"))
                .unwrap_or_default(),
        );
    }
    for t in l["transfers"].as_array().into_iter().flatten() {
        println!(
            "  transfer {} to {}: {} ({})",
            t["transfer"].as_str().unwrap_or("?"),
            t["to"].as_str().unwrap_or("?"),
            t["amount"].as_str().unwrap_or("?"),
            t["state"].as_str().unwrap_or("?"),
        );
    }
    for t in l["incoming"].as_array().into_iter().flatten() {
        println!(
            "  transfer {} from {}: {} ({})",
            t["transfer"].as_str().unwrap_or("?"),
            t["from"].as_str().unwrap_or("?"),
            t["amount"].as_str().unwrap_or("?"),
            t["state"].as_str().unwrap_or("?"),
        );
    }
}

/// The reference gateway executor: records each effect that runs in an append-only, fsynced
/// file (`<state>/effects.log`: `key dim=n,… payer [expires]` per line, the permit's expiry in Unix ms when it has one) before reporting it, and charges the
/// effect's declared maximum. Resumed effects are looked up there first. Embedders running
/// real effects provide their own [`Executor`].
pub struct FileExecutor {
    file: Mutex<std::fs::File>,
    /// Effects that ran, by (payer, key): keys are scoped per payer.
    ran: Mutex<BTreeMap<(AgentId, OpKey), Vector>>,
}

impl FileExecutor {
    /// Opens (or creates) `path`.
    pub fn open(path: &Path) -> Result<Self, Error> {
        let ran = read_effects(path)?
            .into_iter()
            .map(|e| ((e.payer, e.key), e.charge))
            .collect();
        // Private, as every state file (0600).
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)?
        };
        // A crash in the middle of a record leaves a torn last line (that effect's record
        // never completed): cut it, or the next record would be glued onto it.
        let bytes = std::fs::read(path)?;
        let whole = bytes.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
        if whole < bytes.len() {
            file.set_len(whole as u64)?;
            file.sync_data()?;
        }
        Ok(Self {
            file: Mutex::new(file),
            ran: Mutex::new(ran),
        })
    }
}

impl Executor for FileExecutor {
    fn execute(&self, run: &Execute) -> Vector {
        let (payer, key, effect, max) = (&run.payer, run.key, &run.effect, &run.max_charge);
        let resume = run.resume;
        let mut ran = self.ran.lock().unwrap_or_else(|e| e.into_inner());
        let id = (payer.clone(), key);
        if let Some(c) = ran.get(&id).filter(|_| resume) {
            return c.clone();
        }
        let charge = if effect.max_charge.le(max) {
            effect.max_charge.clone()
        } else {
            max.clone()
        };
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        // The record is durable before the receipt can exist. A failed write is reported as
        // the maximum charge: conservative, never an unrecorded free effect.
        // One write of the whole line: a crash leaves at most a torn tail.
        let line = match run.expires {
            Some(e) => format!(
                "{:x} {} {payer} {}\n",
                key.to_u128(),
                show_vector(&charge),
                e.0
            ),
            None => format!("{:x} {} {payer}\n", key.to_u128(), show_vector(&charge)),
        };
        let _ = f.write_all(line.as_bytes()).and_then(|()| f.sync_data());
        ran.insert(id, charge.clone());
        charge
    }
}

/// Reads an executor record: complete lines only.
pub fn read_effects(path: &Path) -> Result<Vec<EffectInstance>, Error> {
    read_effects_at(path, None)
}

fn read_effects_at(path: &Path, gateway: Option<&AgentId>) -> Result<Vec<EffectInstance>, Error> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let gw = gateway
        .cloned()
        .unwrap_or_else(|| AgentId::new("gateway").expect("valid"));
    let mut out = Vec::new();
    for line in bytes.split_inclusive(|&c| c == b'\n') {
        if line.last() != Some(&b'\n') {
            break; // Torn by a crash: that effect's record never completed.
        }
        let text = String::from_utf8_lossy(line);
        let parts: Vec<&str> = text.split_whitespace().collect();
        let unreadable = || format!("effects log: unreadable line {:?}", text.trim());
        let (k, c, payer, expires) = match parts[..] {
            [k, c, payer] => (k, c, payer, None),
            [k, c, payer, e] => {
                let e = e.parse::<u64>().map_err(|_| unreadable())?;
                (k, c, payer, Some(UnixMillis(e)))
            }
            _ => return Err(unreadable().into()),
        };
        out.push(EffectInstance {
            gateway: gw.clone(),
            payer: AgentId::new(payer)?,
            key: OpKey::from_u128(id128(k)?),
            charge: if c == "0" {
                Vector::zero()
            } else {
                parse_vector(c)?
            },
            expires,
        });
    }
    Ok(out)
}

/// What `abhyasa ledger check` found.
pub struct CheckReport {
    /// Branches read.
    pub branches: usize,
    /// Gateways read.
    pub gateways: usize,
    /// Operations across branches.
    pub operations: usize,
    /// Effects across gateways.
    pub effects: usize,
    /// What is broken.
    pub violations: Vec<Violation>,
}

/// Runs the checker over stopped nodes' state directories (`agent=dir`), with the keys in
/// `certs` and root grants trusted from `issuers`.
pub fn check_dirs(
    certs: &Path,
    issuers: &[String],
    branches: &[(String, PathBuf)],
    gateways: &[(String, PathBuf)],
) -> Result<CheckReport, Error> {
    let keys = load_keyring(certs, issuers)?;
    let mut bs = Vec::new();
    let mut history = Vec::new();
    for (agent, dir) in branches.iter().chain(gateways.iter()) {
        let store = Store::open(dir.join("node.redb"), StoreConfig::default())?;
        let me = AgentId::new(agent.clone())?;
        let journal = store.ledger_journal()?;
        // Each transition of the journal, not only where it ended.
        history.extend(audit(&me, &journal, &keys));
        // Public keys only: the audit never needs an agent's secret key.
        let (b, rejected) = Branch::replay(me, keys.clone(), journal);
        if !rejected.is_empty() {
            return Err(format!("{agent}: journal steps do not apply: {rejected:?}").into());
        }
        bs.push(b);
    }
    let mut gs = Vec::new();
    let mut effects = Vec::new();
    for (agent, dir) in gateways {
        let store = Store::open(dir.join("node.redb"), StoreConfig::default())?;
        let me = AgentId::new(agent.clone())?;
        let log = store.gateway_log()?;
        // Each record of the log in order: fences before the acceptances they govern.
        history.extend(audit_gateway(&me, &log, &keys));
        gs.push(Gateway::replay(me.clone(), keys.clone(), log));
        effects.extend(read_effects_at(&dir.join("effects.log"), Some(&me))?);
    }
    let brefs: Vec<&Branch> = bs.iter().collect();
    let grefs: Vec<&Gateway> = gs.iter().collect();
    let mut violations = check(&World {
        branches: &brefs,
        gateways: &grefs,
        effects: &effects,
        keys: &keys,
    });
    violations.extend(history);
    Ok(CheckReport {
        branches: bs.len(),
        gateways: gs.len(),
        operations: bs.iter().map(|b| b.operations().count()).sum(),
        effects: effects.len(),
        violations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_executor_cuts_a_torn_record_and_starts_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("effects.log");
        // A whole record, then a crash in the middle of the payer of the next one.
        std::fs::write(&path, "a1 cents=10 root\nb2 cents=10 ro").unwrap();
        let x = FileExecutor::open(&path).expect("a torn tail does not stop the gateway");
        let effect = Effect {
            purpose: Dim::new("tools").unwrap(),
            operation: "call".into(),
            max_charge: parse_vector("cents=7").unwrap(),
            carried_by: None,
        };
        let payer = AgentId::new("child").unwrap();
        let max = parse_vector("cents=10").unwrap();
        for (k, expires) in [(0xc3, Some(UnixMillis(1_700_000_000_000))), (0xc4, None)] {
            x.execute(&Execute {
                payer: payer.clone(),
                key: OpKey::from_u128(k),
                effect: effect.clone(),
                max_charge: max.clone(),
                expires,
                resume: false,
            });
        }
        let got: Vec<(u128, String, Vector, Option<UnixMillis>)> = read_effects(&path)
            .unwrap()
            .into_iter()
            .map(|e| (e.key.to_u128(), e.payer.to_string(), e.charge, e.expires))
            .collect();
        let cents = |s| parse_vector(s).unwrap();
        assert_eq!(
            got,
            vec![
                (0xa1, "root".into(), cents("cents=10"), None),
                (
                    0xc3,
                    "child".into(),
                    cents("cents=7"),
                    Some(UnixMillis(1_700_000_000_000))
                ),
                (0xc4, "child".into(), cents("cents=7"), None),
            ]
        );
    }
}
