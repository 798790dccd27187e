//! The budget ledger inside the node: a branch (and optionally a gateway) driven by the core
//! task, its steps and records in the node's store through the same group commit as custody,
//! its messages on the `ledger/<peer>` tracks.

use std::collections::HashMap;
use std::sync::Arc;

use abhyasa_ledger::{
    AcceptanceState, Branch, BranchConfig, CreditId, Effect, Execute, Gateway, Keyring, Label,
    LedgerError, LedgerEvent, LedgerMessage, LedgerSigningKey, OpKey, OpState, OutgoingState,
    Permit, Receipt, Refusal, RootGrant, RootId, Signed, TransferId, Vector,
};
use abhyasa_machine::LedgerMachine;
use abhyasa_moq::Track;
use abhyasa_store::Store;
use abhyasa_wire::{encode, AgentId, UnixMillis};
use tokio::sync::oneshot;
use tracing::debug;

/// Runs the effects a gateway accepted. Called off the core task, after the acceptance is
/// durable; must be bounded by `run.max_charge` (the gateway clamps anything above it). With
/// `run.resume`, the effect may already have run before a crash: report its charge instead
/// of running it again (look it up by `run.payer` and `run.key`: keys are scoped per payer).
/// An executor that keeps a record of what ran for `abhyasa ledger check` keeps
/// `run.expires` too: after the gateway and the payer have both forgotten an operation, the
/// checker accepts its effect only if its permit expired behind both horizons.
pub trait Executor: Send + Sync + 'static {
    /// Runs (or, resumed, looks up) the effect `run` names; returns its actual charge.
    fn execute(&self, run: &Execute) -> Vector;
}

/// What a node needs to take part in the ledger. Its ledger messages are signed with its
/// certificate's key (the node's identity), so a ledger key is always bound to the
/// certificate that names its agent.
#[derive(Clone)]
pub struct LedgerSetup {
    /// Verifying keys of every agent (issuers, branches, gateways) it trusts: their
    /// certificate keys ([`abhyasa_moq::certified_keys`], [`abhyasa_moq::certificate_key`]).
    pub keys: Keyring,
    /// When set, the node is also a gateway that runs effects with this executor.
    pub executor: Option<Arc<dyn Executor>>,
    /// How often undecided transfers and dispatches are sent again, in ms.
    pub resend_ms: u64,
    /// Journal steps past which the branch takes no new work
    /// ([`BranchConfig::max_journal_steps`](abhyasa_ledger::BranchConfig)).
    pub max_journal_steps: u64,
    /// Journal steps after which the branch checkpoints and the store drops the journal
    /// before it ([`BranchConfig::checkpoint_steps`](abhyasa_ledger::BranchConfig)); 0: never.
    pub checkpoint_steps: u64,
    /// How long a permit this branch signs stays valid, in ms; 0: for ever
    /// ([`BranchConfig::permit_ttl_ms`](abhyasa_ledger::BranchConfig)).
    pub permit_ttl_ms: u64,
    /// As a gateway: how long a settled acceptance is kept after its permit expired, in ms
    /// ([`Gateway::retaining`](abhyasa_ledger::Gateway::retaining)); `None`: for ever.
    pub gateway_retain_ms: Option<u64>,
}

impl std::fmt::Debug for LedgerSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerSetup")
            .field("gateway", &self.executor.is_some())
            .field("resend_ms", &self.resend_ms)
            .finish_non_exhaustive()
    }
}

/// A ledger request to a running node.
#[derive(Clone, Debug)]
pub enum LedgerCommand {
    /// Take a root grant (signed by its issuer) as the credit `credit`.
    Grant {
        /// The signed grant.
        grant: Signed<RootGrant>,
        /// The root credit's id.
        credit: CreditId,
    },
    /// Delegate: seal a transfer of `amount` from `credit` to `to`.
    Delegate {
        /// The paying credit.
        credit: CreditId,
        /// The transfer id (unique per root).
        transfer: TransferId,
        /// How much.
        amount: Vector,
        /// The receiving branch.
        to: AgentId,
        /// The child's label.
        label: Label,
        /// Seal it reclaimable ([`abhyasa_ledger::Branch::transfer_reclaimable`]): the child
        /// takes it only once this node confirms its claim, and until then
        /// [`LedgerCommand::ReclaimTransfer`] takes it back.
        reclaimable: bool,
    },
    /// Take back a reclaimable transfer whose destination has had no claim confirmed (a
    /// child that is lost): its atoms are available here again, and the child can never take
    /// them.
    ReclaimTransfer {
        /// The transfer.
        transfer: TransferId,
    },
    /// Spend: reserve `effect`'s maximum from `credit` and dispatch it to `gateway`.
    Spend {
        /// The paying credit.
        credit: CreditId,
        /// What to run.
        effect: Effect,
        /// The gateway.
        gateway: AgentId,
        /// The operation key.
        key: OpKey,
    },
    /// Fence the epoch of `credit` at the gateways holding its quarantined dispatches.
    Reclaim {
        /// The credit.
        credit: CreditId,
    },
    /// Evidence that reached this node on a binding rather than on the ledger track (a
    /// receipt on an MCP tool result), from `gateway`: handled exactly as if the gateway had
    /// sent it. Answered with the operation's state after the step.
    Receipt {
        /// The gateway that signed it (the binding's authenticated peer).
        gateway: AgentId,
        /// The receipt.
        receipt: Box<Signed<Receipt>>,
    },
    /// Terminal rollover (paper §5.7): close `credit`'s generation, which must have nothing
    /// in progress, and move its available atoms into a fresh generation. Answered with the
    /// successor ([`LedgerReply::Credit`]); asking again names the same one. (A credit
    /// fenced by [`LedgerCommand::Reclaim`] rolls over by itself once its last operation ends.)
    Reissue {
        /// The credit.
        credit: CreditId,
    },
    /// Retire a quarantined operation for good: its atoms stay charged (Forfeited); a late
    /// receipt only annotates it.
    Forfeit {
        /// The operation.
        key: OpKey,
    },
    /// Split `amount` of `parent`'s available atoms into a new local credit `child`, with a
    /// label within the parent's.
    Split {
        /// The parent credit.
        parent: CreditId,
        /// The new credit's id.
        child: CreditId,
        /// How much.
        amount: Vector,
        /// The child's label.
        label: Label,
    },
    /// Join operation-free credits of one root (split apart, or received) into `output`.
    Join {
        /// The credits joined (each closes).
        inputs: Vec<CreditId>,
        /// The credit they become.
        output: CreditId,
    },
    /// Return everything available in `credit` — rights received by transfer — to the agent
    /// they came from, as the sealed transfer `transfer` (asking again is answered as done).
    ReturnRights {
        /// The credit.
        credit: CreditId,
        /// The return's transfer id.
        transfer: TransferId,
    },
    /// Reserve `effect`'s maximum from `credit` for `gateway` under `key`, without
    /// dispatching it: the permit is signed and kept; [`LedgerCommand::ReleaseUnsent`] gives
    /// the atoms back, [`LedgerCommand::Dispatch`] sends it.
    Reserve {
        /// The paying credit.
        credit: CreditId,
        /// What it would pay for.
        effect: Effect,
        /// The gateway.
        gateway: AgentId,
        /// The operation key.
        key: OpKey,
    },
    /// Dispatch a reserved operation to its gateway (Reserved → Quarantined).
    Dispatch {
        /// The operation.
        key: OpKey,
    },
    /// Give back a reservation whose permit was never dispatched (Reserved → Available).
    ReleaseUnsent {
        /// The operation.
        key: OpKey,
    },
    /// The six buckets per root, credits, operations and transfers.
    Status,
}

/// A credit, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreditStatus {
    /// The credit.
    pub id: CreditId,
    /// Its root.
    pub root: RootId,
    /// Available atoms' size.
    pub available: Vector,
    /// Its generation (one more than the credit it was reissued from).
    pub generation: u32,
    /// Its epoch.
    pub epoch: u64,
    /// Fenced: it takes no new work and closes once its last operation ends.
    pub fenced: bool,
    /// Joined away or reissued.
    pub closed: bool,
    /// The generation it was reissued to.
    pub successor: Option<CreditId>,
}

/// An operation, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationStatus {
    /// The key.
    pub key: OpKey,
    /// The paying credit.
    pub credit: CreditId,
    /// The gateway.
    pub gateway: AgentId,
    /// Reserved maximum.
    pub max_charge: Vector,
    /// `reserved`, `quarantined`, `settled`, `no_effect`, `released`, `forfeited`.
    pub state: &'static str,
    /// The committed charge, once settled.
    pub charged: Option<Vector>,
}

/// The names of the six buckets, in [`LedgerStatus::roots`] order, as every face of the
/// node writes them (status JSON, metrics labels, the console).
pub const BUCKETS: [&str; 6] = [
    "available",
    "in_transit",
    "reserved",
    "quarantined",
    "committed",
    "forfeited",
];

/// The ledger as one node holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LedgerStatus {
    /// Per root: (Available, InTransit, Reserved, Quarantined, Committed, Forfeited).
    pub roots: Vec<(RootId, [Vector; 6])>,
    /// Credits.
    pub credits: Vec<CreditStatus>,
    /// Operations.
    pub operations: Vec<OperationStatus>,
    /// Transfers sealed here: (id, destination, amount,
    /// `sealed`/`accepted`/`cancelled`/`reclaimed`).
    pub transfers: Vec<(TransferId, AgentId, Vector, &'static str)>,
    /// Transfers to this node: (id, source, amount, `accepted`/`refused`/`claimed` — waiting
    /// for the source's confirmation — /`reclaimed` by the source before it confirmed).
    pub incoming: Vec<(TransferId, AgentId, Vector, &'static str)>,
    /// Effects this node accepted as a gateway (key, receipted) and still remembers.
    pub accepted: Vec<(OpKey, bool)>,
    /// Journal steps since the checkpoint the journal starts with (or since the start).
    pub journal_steps: u64,
    /// Steps folded into that checkpoint.
    pub folded_steps: u64,
    /// Operations a checkpoint folded to summaries (not listed in `operations`).
    pub ended_operations: u64,
    /// As a gateway: bindings expiring before this may have been forgotten (Unix ms; 0:
    /// nothing forgotten), and log records folded into its checkpoint.
    pub gateway: Option<(UnixMillis, u64)>,
}

/// A ledger reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerReply {
    /// Done: the step is durable (and what it releases is on its way).
    Done,
    /// The status.
    Status(Box<LedgerStatus>),
    /// A credit the step made (a reissue's successor).
    Credit {
        /// The credit.
        credit: CreditId,
    },
    /// An operation's state after the step (`settled`, `quarantined`, …).
    Operation {
        /// The operation.
        key: OpKey,
        /// Its state.
        state: &'static str,
    },
}

/// Whether a binding carries `effect` itself ([`Effect::carried_by`]; an MCP tool call):
/// the permit rides the call and the receipt its result, so its dispatch is never sent on
/// the ledger track — not at first, not on a resend, not after a restart (fences and
/// queries still are).
pub fn carried(effect: &Effect) -> bool {
    effect.carried_by.is_some()
}

/// What this node's gateway answered a dispatch handed in by a binding (MCP carries the
/// permit in the tool call itself, and the effect is the call).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GatewayAnswer {
    /// The first acceptance is durable: run the effect now, once, and report its charge with
    /// [`Node::gateway_executed`](crate::Node::gateway_executed).
    Run(Execute),
    /// Decided before: the receipt (a replayed permit gets the first decision).
    Receipt(Signed<Receipt>),
    /// Accepted before and not receipted yet (running, or its receipt still being written):
    /// ask again with the same permit.
    Pending,
    /// Refused: nothing runs.
    Refused(Refusal),
}

/// A binding's caller waiting on the gateway for one (payer, key).
enum Bound {
    /// Waits for the acceptance to be durable (or anything else decided for the key).
    Dispatch(oneshot::Sender<GatewayAnswer>),
    /// Waits for the receipt to be durable.
    Receipt(oneshot::Sender<Signed<Receipt>>),
}

/// The driver's side of the ledger: the callers waiting on the machine's branch and gateway
/// (bound dispatches, carried permits) and the executor. The branch and the gateway are in
/// the node machine ([`LedgerMachine`]).
pub(crate) struct LedgerPart {
    me: AgentId,
    setup: LedgerSetup,
    /// Callers of [`Self::bound_dispatch`] and [`Self::bound_executed`], by (payer, key).
    bound: HashMap<(AgentId, OpKey), Bound>,
    /// Gateway messages drained early while answering a bound dispatch; sent first.
    early: Vec<(AgentId, LedgerMessage)>,
    /// Callers of [`Self::carried_permit`] waiting for their dispatch to be durable.
    permits: HashMap<OpKey, oneshot::Sender<Signed<Permit>>>,
}

/// The operation a gateway's reply to a payer is about.
fn reply_key(m: &LedgerMessage) -> Option<OpKey> {
    match m {
        LedgerMessage::Refused { key, .. } | LedgerMessage::Pending { key } => Some(*key),
        LedgerMessage::Receipt(r) => r.peek().ok().map(|r| r.key),
        _ => None,
    }
}

impl LedgerPart {
    pub(crate) fn recover(
        me: &AgentId,
        key: LedgerSigningKey,
        setup: LedgerSetup,
        store: &Store,
    ) -> Result<(Self, LedgerMachine), crate::NodeError> {
        // The keyring must hold this node's own certificate key, or every peer that shares
        // it would refuse what this node signs.
        if let Some(listed) = setup.keys.get(me) {
            if listed != key.verifying_key() {
                return Err(crate::NodeError::Identity(
                    abhyasa_moq::IdentityError::KeyType(format!(
                        "{me}: the ledger keyring holds another key for this agent than its certificate's"
                    )),
                ));
            }
        }
        // `..default()` fills the `mutation` field the `mutants` feature adds (none otherwise).
        #[allow(clippy::needless_update)]
        let config = BranchConfig {
            resend_ms: setup.resend_ms,
            max_journal_steps: setup.max_journal_steps,
            checkpoint_steps: setup.checkpoint_steps,
            permit_ttl_ms: setup.permit_ttl_ms,
            ..BranchConfig::default()
        };
        let (branch, rejected) = Branch::recover(
            me.clone(),
            key.clone(),
            setup.keys.clone(),
            config,
            store.ledger_journal()?,
        );
        // Fail closed: a journal that does not replay is not trusted with a budget.
        if let Some((step, error)) = rejected.into_iter().next() {
            return Err(crate::NodeError::LedgerJournal {
                step: format!("{step:?}"),
                error,
            });
        }
        let gateway = match setup.executor {
            Some(_) => {
                // Fail closed here too: a checkpoint that does not verify or match.
                let g = Gateway::recover_checked(
                    me.clone(),
                    key.clone(),
                    setup.keys.clone(),
                    store.gateway_log()?,
                )
                .map_err(|error| crate::NodeError::LedgerJournal {
                    step: "the gateway log's checkpoint".into(),
                    error,
                })?
                .checkpointing(setup.checkpoint_steps);
                Some(match setup.gateway_retain_ms {
                    Some(ms) => g.retaining(ms),
                    None => g,
                })
            }
            None => None,
        };
        Ok((
            Self {
                me: me.clone(),
                setup,
                bound: HashMap::new(),
                early: Vec::new(),
                permits: HashMap::new(),
            },
            LedgerMachine { branch, gateway },
        ))
    }

    /// Reserves `effect` (one a binding carries: [`carried`]) from `credit` for
    /// `gateway` under `key` and dispatches it; the signed permit is answered once the
    /// dispatch is durable, for the caller to carry. The same request again (a retried call)
    /// is answered with the same permit.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn carried_permit(
        &mut self,
        l: &mut LedgerMachine,
        now: UnixMillis,
        credit: CreditId,
        effect: Effect,
        gateway: &AgentId,
        key: OpKey,
        reply: oneshot::Sender<Signed<Permit>>,
    ) -> Result<(), crate::NodeError> {
        if !carried(&effect) {
            return Err(crate::NodeError::NotCarried);
        }
        if self.permits.contains_key(&key) {
            return Err(crate::NodeError::IssueAgain {
                cause: "this operation's permit is still being made".into(),
            });
        }
        l.branch.reserve(now, credit, effect, gateway, key)?;
        let op = l
            .branch
            .operation(key)
            .ok_or(LedgerError::UnknownOperation(key))?;
        if op.dispatched {
            // Dispatched by an earlier request whose permit was answered: durable.
            let _ = reply.send(op.permit.clone());
            return Ok(());
        }
        l.branch.dispatch(now, key)?;
        self.permits.insert(key, reply);
        Ok(())
    }

    /// A dispatch `from` a binding's authenticated caller: the gateway decides as for one on
    /// the ledger track; what it answers at once is answered now, an acceptance once durable.
    pub(crate) fn bound_dispatch(
        &mut self,
        l: &mut LedgerMachine,
        now: UnixMillis,
        from: &AgentId,
        permit: Signed<Permit>,
        effect: Effect,
        reply: oneshot::Sender<GatewayAnswer>,
    ) -> Result<(), crate::NodeError> {
        let g = l.gateway.as_mut().ok_or(crate::NodeError::NotAGateway)?;
        let key = permit
            .peek()
            .map(|p| p.binding.key)
            .unwrap_or(OpKey::from_u128(0));
        g.handle_message(now, from, LedgerMessage::Dispatch { permit, effect });
        let mut answer = None;
        while let Some((to, m)) = g.poll_transmit() {
            if answer.is_none() && &to == from && reply_key(&m) == Some(key) {
                answer = Some(match m {
                    LedgerMessage::Receipt(r) => GatewayAnswer::Receipt(r),
                    LedgerMessage::Refused { reason, .. } => GatewayAnswer::Refused(reason),
                    _ => GatewayAnswer::Pending,
                });
            } else {
                self.early.push((to, m));
            }
        }
        match answer {
            Some(a) => {
                let _ = reply.send(a);
            }
            // Accepted now: answered with the effect to run once the acceptance is durable.
            None => {
                self.bound
                    .insert((from.clone(), key), Bound::Dispatch(reply));
            }
        }
        Ok(())
    }

    /// The effect of a bound dispatch ran and charged `charge`: answered with the receipt
    /// once its record is durable.
    pub(crate) fn bound_executed(
        &mut self,
        l: &mut LedgerMachine,
        payer: &AgentId,
        key: OpKey,
        charge: Vector,
        reply: oneshot::Sender<Signed<Receipt>>,
    ) -> Result<(), crate::NodeError> {
        let g = l.gateway.as_mut().ok_or(crate::NodeError::NotAGateway)?;
        let Some(a) = g.acceptance(payer, key) else {
            return Err(crate::NodeError::NotAccepted(key));
        };
        match &a.state {
            AcceptanceState::Done(r) if a.receipt_durable => {
                let _ = reply.send(r.clone());
                return Ok(());
            }
            AcceptanceState::Done(_) => {}
            AcceptanceState::Accepted => g.handle_executed(payer, key, charge),
        }
        self.bound
            .insert((payer.clone(), key), Bound::Receipt(reply));
        Ok(())
    }

    pub(crate) fn command(
        &mut self,
        l: &mut LedgerMachine,
        now: UnixMillis,
        cmd: LedgerCommand,
    ) -> Result<LedgerReply, LedgerError> {
        match cmd {
            LedgerCommand::Grant { grant, credit } => l.branch.grant(grant, credit)?,
            LedgerCommand::Delegate {
                credit,
                transfer,
                amount,
                to,
                label,
                reclaimable,
            } => {
                let seal = match reclaimable {
                    false => Branch::transfer,
                    true => Branch::transfer_reclaimable,
                };
                seal(&mut l.branch, credit, transfer, &amount, &to, label)?
            }
            LedgerCommand::ReclaimTransfer { transfer } => l.branch.reclaim_transfer(transfer)?,
            LedgerCommand::Spend {
                credit,
                effect,
                gateway,
                key,
            } => {
                l.branch.reserve(now, credit, effect, &gateway, key)?;
                l.branch.dispatch(now, key)?;
            }
            LedgerCommand::Reclaim { credit } => l.branch.request_fence(credit)?,
            LedgerCommand::Reissue { credit } => {
                let credit = l.branch.reissue(credit)?;
                return Ok(LedgerReply::Credit { credit });
            }
            LedgerCommand::Forfeit { key } => l.branch.forfeit(key)?,
            LedgerCommand::Split {
                parent,
                child,
                amount,
                label,
            } => l.branch.split(parent, child, amount, label)?,
            LedgerCommand::Join { inputs, output } => l.branch.join(inputs, output)?,
            LedgerCommand::ReturnRights { credit, transfer } => {
                l.branch.return_rights(credit, transfer)?
            }
            LedgerCommand::Reserve {
                credit,
                effect,
                gateway,
                key,
            } => l.branch.reserve(now, credit, effect, &gateway, key)?,
            LedgerCommand::Dispatch { key } => l.branch.dispatch(now, key)?,
            LedgerCommand::ReleaseUnsent { key } => l.branch.release_unsent(key)?,
            LedgerCommand::Receipt { gateway, receipt } => {
                let key = receipt.peek()?.key;
                l.branch
                    .handle_message(now, &gateway, LedgerMessage::Receipt(*receipt));
                let state = l
                    .branch
                    .operation(key)
                    .ok_or(LedgerError::UnknownOperation(key))?
                    .state
                    .name();
                return Ok(LedgerReply::Operation { key, state });
            }
            LedgerCommand::Status => return Ok(LedgerReply::Status(Box::new(status(l)))),
        }
        Ok(LedgerReply::Done)
    }
}

fn status(l: &LedgerMachine) -> LedgerStatus {
    let b = &l.branch;
    let mut roots: Vec<RootId> = b.credits().map(|c| c.root).collect();
    roots.sort();
    roots.dedup();
    LedgerStatus {
        roots: roots.into_iter().map(|r| (r, b.buckets(r))).collect(),
        credits: b
            .credits()
            .map(|c| CreditStatus {
                id: c.id,
                root: c.root,
                available: c.available.size(),
                generation: c.generation,
                epoch: c.epoch,
                fenced: c.fenced,
                closed: c.closed,
                successor: c.successor,
            })
            .collect(),
        operations: b
            .operations()
            .map(|o| OperationStatus {
                key: o.binding.key,
                credit: o.binding.credit,
                gateway: o.binding.receiver.clone(),
                max_charge: o.binding.max_charge.clone(),
                state: o.state.name(),
                charged: match &o.state {
                    OpState::Settled { charged, .. } => Some(charged.size()),
                    _ => None,
                },
            })
            .collect(),
        transfers: b
            .outgoing()
            .map(|o| {
                (
                    o.body.transfer,
                    o.body.destination.clone(),
                    o.body.footprint.size(),
                    match o.state {
                        OutgoingState::Sealed => "sealed",
                        OutgoingState::Accepted(_) => "accepted",
                        OutgoingState::Cancelled(_) => "cancelled",
                        OutgoingState::Reclaimed(_) => "reclaimed",
                    },
                )
            })
            .collect(),
        incoming: b
            .incoming()
            .filter_map(|s| {
                let (cert, state) = match s {
                    abhyasa_ledger::Step::Accept { cert, .. } => (cert, "accepted"),
                    abhyasa_ledger::Step::Refuse { cert, .. } => (cert, "refused"),
                    abhyasa_ledger::Step::Claim { cert, .. } => (cert, "claimed"),
                    abhyasa_ledger::Step::Reclaimed { cert, .. } => (cert, "reclaimed"),
                    _ => return None,
                };
                let c = cert.peek().ok()?;
                Some((c.transfer, c.source, c.footprint.size(), state))
            })
            .collect(),
        accepted: l
            .gateway
            .iter()
            .flat_map(|g| {
                g.log().map(|((_, k), a)| {
                    (
                        *k,
                        matches!(a.state, abhyasa_ledger::AcceptanceState::Done(_)),
                    )
                })
            })
            .collect(),
        journal_steps: b.journal_len(),
        folded_steps: b.folded_steps(),
        ended_operations: b.ended().count() as u64,
        gateway: l
            .gateway
            .as_ref()
            .map(|g| (g.horizon(), g.folded_records())),
    }
}

impl LedgerPart {
    /// Sends what was released; hands accepted effects to the executor. Returns the messages
    /// to this node itself (it is its own gateway), for the caller to deliver in place.
    pub(crate) fn release(
        &mut self,
        l: &mut LedgerMachine,
        sessions: &HashMap<AgentId, crate::link::Link>,
        mut executed: impl FnMut(Execute, Arc<dyn Executor>),
        events: &mut Vec<LedgerEvent>,
    ) -> Vec<LedgerMessage> {
        let mut out: Vec<(AgentId, LedgerMessage)> =
            std::iter::from_fn(|| l.branch.poll_transmit()).collect();
        out.append(&mut self.early);
        if let Some(g) = &mut l.gateway {
            out.extend(std::iter::from_fn(|| g.poll_transmit()));
            if let Some(x) = &self.setup.executor {
                while let Some(e) = g.poll_execute() {
                    // A bound caller runs its own effect; one that went away leaves it to the
                    // executor (which, never having run it, runs it).
                    let e = match self.bound.remove(&(e.payer.clone(), e.key)) {
                        Some(Bound::Dispatch(tx)) => match tx.send(GatewayAnswer::Run(e)) {
                            Ok(()) => continue,
                            Err(GatewayAnswer::Run(e)) => e,
                            Err(_) => continue,
                        },
                        Some(other) => {
                            self.bound.insert((e.payer.clone(), e.key), other);
                            e
                        }
                        None => e,
                    };
                    executed(e, x.clone());
                }
            }
        }
        // A dispatch a binding carries never goes on the track; its permit goes to the caller
        // that asked for it, now that it is durable.
        out.retain(|(_, m)| match m {
            LedgerMessage::Dispatch { permit, effect } if carried(effect) => {
                if let Ok(key) = permit.peek().map(|p| p.binding.key) {
                    if let Some(tx) = self.permits.remove(&key) {
                        let _ = tx.send(permit.clone());
                    }
                }
                false
            }
            _ => true,
        });
        // Replies to bound callers go to them, not on the ledger track.
        out.retain_mut(|(to, m)| {
            let Some(key) = reply_key(m) else {
                return true;
            };
            let Some(waiter) = self.bound.remove(&(to.clone(), key)) else {
                return true;
            };
            match (waiter, m) {
                (Bound::Receipt(tx), LedgerMessage::Receipt(r)) => {
                    let _ = tx.send(r.clone());
                }
                (Bound::Dispatch(tx), LedgerMessage::Receipt(r)) => {
                    let _ = tx.send(GatewayAnswer::Receipt(r.clone()));
                }
                (Bound::Dispatch(tx), LedgerMessage::Refused { reason, .. }) => {
                    let _ = tx.send(GatewayAnswer::Refused(*reason));
                }
                (w, _) => {
                    self.bound.insert((to.clone(), key), w);
                    return true;
                }
            }
            false
        });
        let mut local = Vec::new();
        for (to, m) in out {
            if to == self.me {
                local.push(m);
                continue;
            }
            let Some(s) = sessions.get(&to).cloned() else {
                continue; // Resent on the next timeout.
            };
            let bytes = encode(&m);
            tokio::spawn(async move {
                if let Err(e) = s.send_group(Track::Ledger, &[bytes], false).await {
                    debug!(%e, "ledger object not sent");
                }
            });
        }
        events.extend(std::iter::from_fn(|| l.branch.poll_event()));
        // A node that is its own gateway: delivered in place by the caller.
        local
    }

    pub(crate) fn executed(l: &mut LedgerMachine, payer: &AgentId, key: OpKey, charge: Vector) {
        if let Some(g) = &mut l.gateway {
            g.handle_executed(payer, key, charge);
        }
    }
}
