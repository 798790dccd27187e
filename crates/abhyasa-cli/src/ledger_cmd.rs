//! `abhyasa ledger …`: the budget ledger's whole surface from the command line — grant,
//! delegate, split, join, return, reserve, dispatch, release, spend, permit, receipt,
//! reclaim, reissue, forfeit, status — each a request to a running node's admin interface
//! (the same requests its MCP `abhyasa_ledger` tool takes), and the offline checker.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::admin::{self, AdminTarget, Request};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// An effect paid from a credit through a gateway (`spend`, `reserve`).
#[derive(clap::Args)]
pub(crate) struct EffectArgs {
    /// The paying credit (hex).
    #[arg(long)]
    credit: String,
    /// The gateway agent.
    #[arg(long)]
    gateway: String,
    /// Maximum charge, e.g. cents=10.
    #[arg(long)]
    max: String,
    /// The normalized operation.
    #[arg(long)]
    operation: String,
    /// Its purpose.
    #[arg(long, default_value = "tools")]
    purpose: String,
    /// Operation key (hex; default: random).
    #[arg(long)]
    key: Option<String>,
}

impl EffectArgs {
    /// The request's form, with the key chosen (and printed) when none was given.
    fn paid(self) -> crate::ledger_cli::PaidEffect {
        let key = hex_id(self.key);
        println!("operation {key}");
        crate::ledger_cli::PaidEffect {
            credit: self.credit,
            gateway: self.gateway,
            purpose: self.purpose,
            operation: self.operation,
            max: self.max,
            key,
        }
    }
}

/// `abhyasa ledger …`.
#[derive(Subcommand)]
pub(crate) enum LedgerCli {
    /// Sign a root grant with the issuer's key and hand it to its holder node.
    Grant {
        #[command(flatten)]
        admin: AdminTarget,
        /// The certificates directory (the issuer's certificate and key).
        #[arg(long, default_value = "certs")]
        certs: PathBuf,
        /// The issuer (its certificate key, `<issuer>.key`, signs).
        #[arg(long, default_value = "issuer")]
        issuer: String,
        /// The holder agent (the node at --admin).
        #[arg(long)]
        holder: String,
        /// Root id (hex).
        #[arg(long)]
        root: String,
        /// The budget, e.g. cents=1000,calls=10.
        #[arg(long)]
        budget: String,
        /// Purposes it may be spent on.
        #[arg(long, value_delimiter = ',', default_value = "tools")]
        label: Vec<String>,
        /// The root credit's id (hex; default: the root id).
        #[arg(long)]
        credit: Option<String>,
    },
    /// Delegate part of a credit to a child branch (a sealed transfer).
    Delegate {
        #[command(flatten)]
        admin: AdminTarget,
        /// The paying credit (hex).
        #[arg(long)]
        credit: String,
        /// The child agent.
        #[arg(long)]
        to: String,
        /// How much, e.g. cents=200.
        #[arg(long)]
        amount: String,
        /// Transfer id (hex; default: random).
        #[arg(long)]
        transfer: Option<String>,
        /// The child's purposes (within the credit's).
        #[arg(long, value_delimiter = ',', default_value = "tools")]
        label: Vec<String>,
        /// The child takes the transfer only once this node confirms its claim; until then
        /// `abhyasa ledger reclaim --transfer` takes it back (for a child that is lost).
        #[arg(long)]
        reclaimable: bool,
    },
    /// Reserve an effect's maximum charge and dispatch it through a gateway.
    Spend {
        #[command(flatten)]
        admin: AdminTarget,
        #[command(flatten)]
        effect: EffectArgs,
    },
    /// Fence a credit's epoch at its gateways to reclaim dispatches that never got an answer
    /// (`--credit`), or take back a reclaimable transfer whose child has had no claim
    /// confirmed (`--transfer`).
    Reclaim {
        #[command(flatten)]
        admin: AdminTarget,
        /// The credit (hex).
        #[arg(
            long,
            required_unless_present = "transfer",
            conflicts_with = "transfer"
        )]
        credit: Option<String>,
        /// A transfer sealed with `delegate --reclaimable` (hex).
        #[arg(long)]
        transfer: Option<String>,
    },
    /// Close a credit's generation (every operation ended, nothing in transit) and move its
    /// available atoms into a fresh generation; prints the new credit.
    Reissue {
        #[command(flatten)]
        admin: AdminTarget,
        /// The credit (hex).
        #[arg(long)]
        credit: String,
    },
    /// Retire a quarantined operation for good: its atoms stay charged (Forfeited).
    Forfeit {
        #[command(flatten)]
        admin: AdminTarget,
        /// The operation key (hex).
        #[arg(long)]
        key: String,
    },
    /// Split part of a credit's available budget into a new local credit (a narrower
    /// label, or a share kept apart); prints the new credit.
    Split {
        #[command(flatten)]
        admin: AdminTarget,
        /// The parent credit (hex).
        #[arg(long)]
        credit: String,
        /// How much, e.g. cents=100.
        #[arg(long)]
        amount: String,
        /// The new credit's purposes (within the parent's).
        #[arg(long, value_delimiter = ',', default_value = "tools")]
        label: Vec<String>,
        /// The new credit's id (hex; default: random).
        #[arg(long)]
        child: Option<String>,
    },
    /// Join operation-free credits of one root into one; prints it.
    Join {
        #[command(flatten)]
        admin: AdminTarget,
        /// The credits (hex, comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        credits: Vec<String>,
        /// The joined credit's id (hex; default: random).
        #[arg(long)]
        output: Option<String>,
    },
    /// Return a received credit's unused budget to the agent it came from (a sealed transfer
    /// of everything available in it).
    Return {
        #[command(flatten)]
        admin: AdminTarget,
        /// The credit (hex).
        #[arg(long)]
        credit: String,
        /// The return's transfer id (hex; default: random). Asking again with the same id is
        /// answered as done.
        #[arg(long)]
        transfer: Option<String>,
    },
    /// Reserve an effect's maximum charge without sending it: `dispatch` sends it later,
    /// `release` gives the reservation back.
    Reserve {
        #[command(flatten)]
        admin: AdminTarget,
        #[command(flatten)]
        effect: EffectArgs,
    },
    /// Dispatch a reserved operation to its gateway.
    Dispatch {
        #[command(flatten)]
        admin: AdminTarget,
        /// The operation key (hex).
        #[arg(long)]
        key: String,
    },
    /// Give back a reservation that was never dispatched.
    Release {
        #[command(flatten)]
        admin: AdminTarget,
        /// The operation key (hex).
        #[arg(long)]
        key: String,
    },
    /// A dispatch permit for a budget-gated MCP tool call at a gateway, reserved through this
    /// node: prints it (base64 CBOR, for the call's `_meta["org.abhyasa/permit"]`).
    Permit {
        #[command(flatten)]
        admin: AdminTarget,
        /// The paying credit (hex).
        #[arg(long)]
        credit: String,
        /// The gateway (the MCP server's agent).
        #[arg(long)]
        gateway: String,
        /// The tool's name.
        #[arg(long)]
        tool: String,
        /// The call's arguments, a JSON object (the permit binds them).
        #[arg(long, default_value = "{}")]
        arguments: String,
        /// The tool's price, e.g. cents=50 (its `cost`).
        #[arg(long)]
        max: String,
        /// The tool's purpose.
        #[arg(long, default_value = "tools")]
        purpose: String,
        /// Operation key (hex; default: random).
        #[arg(long)]
        key: Option<String>,
    },
    /// Settle an operation with the receipt a gateway returned on a tool result (base64 CBOR
    /// from `_meta["org.abhyasa/receipt"]`).
    Receipt {
        #[command(flatten)]
        admin: AdminTarget,
        /// The gateway that signed it.
        #[arg(long)]
        gateway: String,
        /// The receipt (base64 CBOR).
        #[arg(long)]
        receipt: String,
    },
    /// All six buckets per root, credits, operations, transfers.
    Status {
        #[command(flatten)]
        admin: AdminTarget,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the L1–L7 checker over stopped nodes' state directories.
    Check {
        /// The certificates directory: the CA's and the agents' certificates (public files
        /// only; their keys are the ledger keys).
        #[arg(long, default_value = "certs")]
        certs: PathBuf,
        /// A branch node: AGENT=STATE_DIR (repeatable).
        #[arg(long)]
        branch: Vec<String>,
        /// A gateway node: AGENT=STATE_DIR (repeatable; its branch is read too).
        #[arg(long)]
        gateway: Vec<String>,
        /// Who may sign root grants.
        #[arg(long, value_delimiter = ',', default_value = "issuer")]
        issuers: Vec<String>,
    },
}

fn hex_id(given: Option<String>) -> String {
    given.unwrap_or_else(|| format!("{:x}", rand::random::<u64>()))
}

pub(crate) async fn ledger(command: LedgerCli) -> Result<ExitCode> {
    use crate::ledger_cli::LedgerRequest as R;
    let (admin, req, json) = match command {
        LedgerCli::Check {
            certs,
            branch,
            gateway,
            issuers,
        } => {
            let split = |v: &[String]| -> Result<Vec<(String, PathBuf)>> {
                v.iter()
                    .map(|s| {
                        s.split_once('=')
                            .map(|(a, d)| (a.to_owned(), PathBuf::from(d)))
                            .ok_or_else(|| format!("{s:?}: expected AGENT=STATE_DIR").into())
                    })
                    .collect()
            };
            let report = crate::ledger_cli::check_dirs(
                &certs,
                &issuers,
                &split(&branch)?,
                &split(&gateway)?,
            )
            .map_err(|e| e.to_string())?;
            for v in &report.violations {
                println!("{v}");
            }
            println!(
                "ledger check: branches={} gateways={} operations={} effects={} violations={}",
                report.branches,
                report.gateways,
                report.operations,
                report.effects,
                report.violations.len()
            );
            return Ok(if report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        LedgerCli::Grant {
            admin,
            certs,
            issuer,
            holder,
            root,
            budget,
            label,
            credit,
        } => {
            let root_id = u128::from_str_radix(&root, 16)?;
            let grant =
                crate::ledger_cli::signed_grant(&certs, &issuer, &holder, root_id, &budget, &label)
                    .map_err(|e| e.to_string())?;
            let credit = credit.unwrap_or(root);
            println!("root credit {credit}");
            (admin, R::Grant { grant, credit }, false)
        }
        LedgerCli::Delegate {
            admin,
            credit,
            to,
            amount,
            transfer,
            label,
            reclaimable,
        } => {
            let transfer = hex_id(transfer);
            println!("transfer {transfer}");
            (
                admin,
                R::Delegate {
                    credit,
                    transfer,
                    amount,
                    to,
                    label,
                    reclaimable,
                },
                false,
            )
        }
        LedgerCli::Spend { admin, effect } => (admin, R::Spend(effect.paid()), false),
        LedgerCli::Reclaim {
            admin,
            credit,
            transfer,
        } => match (credit, transfer) {
            (_, Some(transfer)) => (admin, R::ReclaimTransfer { transfer }, false),
            (Some(credit), None) => (admin, R::Reclaim { credit }, false),
            (None, None) => return Err("--credit or --transfer".into()),
        },
        LedgerCli::Reissue { admin, credit } => (admin, R::Reissue { credit }, false),
        LedgerCli::Forfeit { admin, key } => (admin, R::Forfeit { key }, false),
        LedgerCli::Split {
            admin,
            credit,
            amount,
            label,
            child,
        } => {
            let child = hex_id(child);
            println!("credit {child}");
            (
                admin,
                R::Split {
                    parent: credit,
                    child,
                    amount,
                    label,
                },
                false,
            )
        }
        LedgerCli::Join {
            admin,
            credits,
            output,
        } => {
            let output = hex_id(output);
            println!("credit {output}");
            (
                admin,
                R::Join {
                    inputs: credits,
                    output,
                },
                false,
            )
        }
        LedgerCli::Return {
            admin,
            credit,
            transfer,
        } => {
            let transfer = hex_id(transfer);
            println!("transfer {transfer}");
            (admin, R::ReturnRights { credit, transfer }, false)
        }
        LedgerCli::Reserve { admin, effect } => (admin, R::Reserve(effect.paid()), false),
        LedgerCli::Dispatch { admin, key } => (admin, R::Dispatch { key }, false),
        LedgerCli::Release { admin, key } => (admin, R::ReleaseUnsent { key }, false),
        LedgerCli::Permit {
            admin,
            credit,
            gateway,
            tool,
            arguments,
            max,
            purpose,
            key,
        } => {
            let arguments: serde_json::Value = serde_json::from_str(&arguments)
                .map_err(|e| format!("--arguments: not JSON: {e}"))?;
            let serde_json::Value::Object(arguments) = arguments else {
                return Err("--arguments: a JSON object".into());
            };
            (
                admin,
                R::Permit {
                    credit,
                    gateway,
                    tool,
                    arguments,
                    purpose,
                    max,
                    key: hex_id(key),
                },
                false,
            )
        }
        LedgerCli::Receipt {
            admin,
            gateway,
            receipt,
        } => (admin, R::Receipt { gateway, receipt }, false),
        LedgerCli::Status { admin, json } => (admin, R::Status, json),
    };
    let reply = admin::request(&admin, Request::Ledger(req)).await?;
    if reply["ok"] != true {
        eprintln!("{}", reply["error"].as_str().unwrap_or("request failed"));
        return Ok(ExitCode::FAILURE);
    }
    if reply.get("ledger").is_some() {
        if json {
            println!("{}", serde_json::to_string_pretty(&reply["ledger"])?);
        } else {
            crate::ledger_cli::print_status(&reply);
        }
    } else if let Some(credit) = reply["credit"].as_str() {
        println!("ok (durable): credit {credit}");
    } else if let Some(permit) = reply["permit"].as_str() {
        // Alone on stdout, for a script to take.
        println!("{permit}");
    } else if let Some(state) = reply["state"].as_str() {
        println!(
            "ok (durable): operation {} {state}",
            reply["operation"].as_str().unwrap_or("")
        );
    } else {
        println!("ok (durable)");
    }
    Ok(ExitCode::SUCCESS)
}
