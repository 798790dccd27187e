//! The gateway: the one place an effect paid from a credit can happen.

use std::collections::{BTreeMap, VecDeque};

use abhyasa_wire::ledger::*;
use abhyasa_wire::{AgentId, UnixMillis};
use serde::{Deserialize, Serialize};

use crate::{Keyring, LedgerError, LedgerMutation, PersistToken};

pub(crate) mod checkpoint;

/// A durable gateway record, stored as deterministic CBOR.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum GatewayRecord {
    /// First acceptance of a key, written before the effect runs.
    Accepted {
        /// The binding accepted.
        binding: Box<Binding>,
        /// The permit as signed (evidence for audits).
        permit: Signed<Permit>,
        /// The effect.
        effect: Effect,
    },
    /// The effect ran; the signed receipt.
    Receipt {
        /// The receipt.
        receipt: Signed<Receipt>,
        /// The payer whose key it settles (older records without it are matched by the
        /// receipt's binding digest).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payer: Option<AgentId>,
    },
    /// A fence raised.
    Fence {
        /// The credit.
        credit: CreditId,
        /// Permits below this epoch are refused.
        epoch: u64,
    },
    /// Settled acceptances forgotten: each was receipted (durably) and its permit expired
    /// before `horizon`. From here on a binding that expired before `horizon` is refused
    /// (`Expired`) and never proven without effect (`Forgotten`): its record may be gone.
    Pruned {
        /// Every binding expiring before this instant may have been forgotten.
        horizon: UnixMillis,
        /// The (payer, key)s forgotten.
        keys: Vec<(AgentId, OpKey)>,
    },
    /// The gateway's whole state, signed by it ([`Gateway::checkpoint`]). First in a log,
    /// recovery starts from it; the records before it may be deleted.
    Checkpoint(Box<SignedRecord>),
}

/// Most keys one `Pruned` record names.
const PRUNE_BATCH: usize = 1024;

/// What the gateway knows of an accepted key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acceptance {
    /// The binding accepted.
    pub binding: Binding,
    /// The permit.
    pub permit: Signed<Permit>,
    /// The effect.
    pub effect: Effect,
    /// How far it got.
    pub state: AcceptanceState,
    /// How many times it was accepted (1; more only under the `GatewayAcceptsKeyTwice`
    /// mutant).
    pub accepted: u32,
    /// Whether the receipt's record is durable (evidence is released only then).
    pub receipt_durable: bool,
}

/// How far an accepted key got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptanceState {
    /// Accepted; the effect may be running.
    Accepted,
    /// Ran; receipt signed. `durable`: its record is written, so it may be shown.
    Done(Signed<Receipt>),
}

/// An effect to run: handed out only after its acceptance is durable. `resume` marks one
/// found accepted without a receipt at recovery: the executor must first look up whether it
/// already ran (by key) and report that instead of running it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Execute {
    /// The payer (keys are scoped per payer).
    pub payer: AgentId,
    /// The operation.
    pub key: OpKey,
    /// What to run.
    pub effect: Effect,
    /// The hard limit on its charge.
    pub max_charge: Vector,
    /// When its permit expires (`Binding::expires`): an executor's record of the effect
    /// keeps it, so a checker can tell an effect whose records were forgotten in time.
    pub expires: Option<UnixMillis>,
    /// Found accepted at recovery.
    pub resume: bool,
}

/// The gateway state machine (sans-IO).
#[derive(Clone, Debug)]
pub struct Gateway {
    me: AgentId,
    key: LedgerSigningKey,
    keys: Keyring,
    #[cfg(feature = "mutants")]
    mutation: Option<LedgerMutation>,
    /// Fences as applied in memory (what new permits are checked against).
    fences: BTreeMap<CreditId, u64>,
    /// Fences whose record is durable: the only ones evidence may rest on.
    durable_fences: BTreeMap<CreditId, u64>,
    /// The record of the latest fence of each credit still being written.
    fence_in_flight: BTreeMap<CreditId, PersistToken>,
    /// Acceptances by (payer, key): one payer cannot squat another's key.
    log: BTreeMap<(AgentId, OpKey), Acceptance>,
    next_token: u64,
    persists: VecDeque<(PersistToken, GatewayRecord)>,
    gated: BTreeMap<PersistToken, Vec<Gated>>,
    transmits: VecDeque<(AgentId, LedgerMessage)>,
    executes: VecDeque<Execute>,
    /// The latest time seen (`handle_timeout`), never below `horizon`.
    clock: UnixMillis,
    /// Bindings expiring before this may have been forgotten (the latest `Pruned` record,
    /// applied; durable once `prune_in_flight` is clear).
    horizon: UnixMillis,
    /// How long a settled acceptance is kept after its permit expired, in ms; `None`: for
    /// ever.
    retain_ms: Option<u64>,
    /// When to look for prunable acceptances next.
    next_prune: u64,
    /// Acceptances forgotten so far (this process).
    pruned: u64,
    /// Records written since the checkpoint the log starts with (or since the start).
    records: u64,
    /// Records folded into that checkpoint.
    folded_records: u64,
    /// Records after which to checkpoint (0: never).
    checkpoint_records: u64,
    /// Checkpoints that did not apply at recovery (the gateway must not be trusted).
    rejected: Vec<LedgerError>,
}

#[derive(Clone, Debug)]
enum Gated {
    Execute(Execute),
    Send(AgentId, LedgerMessage),
    /// The receipt of this payer's key is durable.
    ReceiptDurable(AgentId, OpKey),
    /// This fence is durable.
    FenceDurable(CreditId, u64),
}

impl Gateway {
    /// A gateway `me`, signing with `key`, trusting payers in `keys`.
    pub fn new(me: AgentId, key: LedgerSigningKey, keys: Keyring) -> Self {
        Self {
            me,
            key,
            keys,
            #[cfg(feature = "mutants")]
            mutation: None,
            fences: BTreeMap::new(),
            durable_fences: BTreeMap::new(),
            fence_in_flight: BTreeMap::new(),
            log: BTreeMap::new(),
            next_token: 0,
            persists: VecDeque::new(),
            gated: BTreeMap::new(),
            transmits: VecDeque::new(),
            executes: VecDeque::new(),
            clock: UnixMillis(0),
            horizon: UnixMillis(0),
            retain_ms: None,
            next_prune: 0,
            pruned: 0,
            records: 0,
            folded_records: 0,
            checkpoint_records: 0,
            rejected: Vec::new(),
        }
    }

    /// Forget settled acceptances `ms` after their permits expired ([`handle_timeout`]
    /// prunes them): the log stays bounded by the rate of settlements times the permits'
    /// lifetime plus `ms`. Such a gateway accepts only permits that expire (a permit without
    /// one is refused, `Refusal::NoExpiry`); an acceptance without expiry from a log written
    /// before retention was on is kept for ever.
    ///
    /// [`handle_timeout`]: Self::handle_timeout
    pub fn retaining(mut self, ms: u64) -> Self {
        self.retain_ms = Some(ms);
        self
    }

    /// Advances the gateway's clock (permits expire against it) and forgets settled
    /// acceptances whose permits expired more than the retention ago, in a durable `Pruned`
    /// record.
    pub fn handle_timeout(&mut self, now: UnixMillis) {
        self.clock = self.clock.max(now);
        let Some(retain) = self.retain_ms else {
            return;
        };
        if now.0 < self.next_prune {
            return;
        }
        self.next_prune = now.0.saturating_add((retain / 4).max(50));
        let horizon = UnixMillis(self.clock.0.saturating_sub(retain));
        let early = self.mutation() == Some(LedgerMutation::PruneBeforeExpiry);
        let keys: Vec<(AgentId, OpKey)> = self
            .log
            .iter()
            .filter(|(_, a)| {
                matches!(a.state, AcceptanceState::Done(_))
                    && a.receipt_durable
                    && (early || a.binding.expires.is_some_and(|e| e < horizon))
            })
            .map(|(k, _)| k.clone())
            .take(PRUNE_BATCH)
            .collect();
        if keys.is_empty() {
            return;
        }
        let payers: std::collections::BTreeSet<AgentId> =
            keys.iter().map(|(p, _)| p.clone()).collect();
        let record = GatewayRecord::Pruned {
            horizon: horizon.max(self.horizon),
            keys,
        };
        self.apply(&record);
        let token = self.persist(record);
        // Each payer learns, once the record is durable, the instant before which nothing of
        // its own is left here: the horizon, or the earliest expiry of what is left of it (a
        // batch may leave some behind). Acceptances from now on expire after the clock, which
        // is past the horizon, so the instant stays true.
        for payer in payers {
            let left = self
                .log
                .range((payer.clone(), OpKey::from_u128(0))..)
                .take_while(|((p, _), _)| *p == payer)
                .filter_map(|(_, a)| a.binding.expires)
                .min();
            let horizon = left.map_or(self.horizon, |e| e.min(self.horizon));
            self.gate(
                token,
                Gated::Send(payer, LedgerMessage::Horizon { horizon }),
            );
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the next look for
    /// prunable acceptances while retention is on and the log holds any; `None` otherwise
    /// (permits are judged at arrival, so nothing else waits on a timer). A deadline: only
    /// `handle_timeout` moves it.
    pub fn poll_timeout(&self) -> Option<UnixMillis> {
        (self.retain_ms.is_some() && !self.log.is_empty()).then_some(UnixMillis(self.next_prune))
    }

    /// Bindings expiring before this may have been forgotten.
    pub fn horizon(&self) -> UnixMillis {
        self.horizon
    }

    /// Acceptances forgotten by this process so far.
    pub fn pruned(&self) -> u64 {
        self.pruned
    }

    /// Rebuilds a gateway from its records; accepted keys without a receipt are handed out
    /// again as `Execute { resume: true }`.
    pub fn recover(
        me: AgentId,
        key: LedgerSigningKey,
        keys: Keyring,
        records: impl IntoIterator<Item = GatewayRecord>,
    ) -> Self {
        Self::new(me, key, keys).recovered(records)
    }

    /// The gateway with a deliberately broken rule (the simulator's mutants).
    #[cfg(feature = "mutants")]
    #[doc(hidden)]
    pub fn with_mutation(mut self, mutation: Option<LedgerMutation>) -> Self {
        self.mutation = mutation;
        self
    }

    /// [`recover`](Self::recover) with a deliberately broken rule (the simulator's mutants).
    #[cfg(feature = "mutants")]
    #[doc(hidden)]
    pub fn recover_with_mutation(
        me: AgentId,
        key: LedgerSigningKey,
        keys: Keyring,
        mutation: Option<LedgerMutation>,
        records: impl IntoIterator<Item = GatewayRecord>,
    ) -> Self {
        Self::new(me, key, keys)
            .with_mutation(mutation)
            .recovered(records)
    }

    /// The mutant this gateway runs (see [`crate::BranchConfig::mutation`]).
    #[inline]
    fn mutation(&self) -> Option<LedgerMutation> {
        #[cfg(feature = "mutants")]
        return self.mutation;
        #[cfg(not(feature = "mutants"))]
        None
    }

    fn recovered(self, records: impl IntoIterator<Item = GatewayRecord>) -> Self {
        let mut g = self;
        for r in records {
            if let GatewayRecord::Checkpoint(c) = &r {
                match g.apply_checkpoint(c) {
                    Ok(()) => g.records += 1,
                    Err(e) => g.rejected.push(e),
                }
                continue;
            }
            g.apply(&r);
            g.records += 1;
        }
        // Everything read back is durable.
        g.durable_fences = g.fences.clone();
        g.clock = g.horizon;
        g.pruned = 0;
        for a in g.log.values_mut() {
            a.receipt_durable = matches!(a.state, AcceptanceState::Done(_));
        }
        let resumed: Vec<Execute> = g
            .log
            .iter()
            .filter(|(_, a)| a.state == AcceptanceState::Accepted)
            .map(|((payer, k), a)| Execute {
                payer: payer.clone(),
                key: *k,
                effect: a.effect.clone(),
                max_charge: g.limit_for(&a.binding, &a.effect),
                expires: a.binding.expires,
                resume: true,
            })
            .collect();
        g.executes.extend(resumed);
        g
    }

    /// [`recover`](Self::recover), failing closed: a checkpoint in the log that does not
    /// verify or does not match the records before it is an error, not a gateway.
    pub fn recover_checked(
        me: AgentId,
        key: LedgerSigningKey,
        keys: Keyring,
        records: impl IntoIterator<Item = GatewayRecord>,
    ) -> Result<Self, LedgerError> {
        Self::recover(me, key, keys, records).checked()
    }

    /// [`recover_checked`](Self::recover_checked) with a deliberately broken rule (the
    /// simulator's mutants).
    #[cfg(feature = "mutants")]
    #[doc(hidden)]
    pub fn recover_checked_with_mutation(
        me: AgentId,
        key: LedgerSigningKey,
        keys: Keyring,
        mutation: Option<LedgerMutation>,
        records: impl IntoIterator<Item = GatewayRecord>,
    ) -> Result<Self, LedgerError> {
        Self::recover_with_mutation(me, key, keys, mutation, records).checked()
    }

    /// `Err` with the first checkpoint recovery rejected, if any.
    fn checked(mut self) -> Result<Self, LedgerError> {
        match std::mem::take(&mut self.rejected).into_iter().next() {
            Some(e) => Err(e),
            None => Ok(self),
        }
    }

    /// Rebuilds a gateway from its records for an audit, with public keys only (it holds an
    /// inert key and must not be used to sign).
    pub fn replay(
        me: AgentId,
        keys: Keyring,
        records: impl IntoIterator<Item = GatewayRecord>,
    ) -> Self {
        Self::recover(me, crate::branch::inert_key(), keys, records)
    }

    /// This gateway.
    pub fn agent(&self) -> &AgentId {
        &self.me
    }

    /// The keyring this gateway trusts; a clone shares its memory of verified signatures, so
    /// messages verified together through it ([`Keyring::verify_together`]) are not verified
    /// again when handled.
    pub fn keyring(&self) -> &Keyring {
        &self.keys
    }

    /// Handles a message from `from` arriving at `now`: the clock moves to `now` first
    /// (never back), so a permit is judged against the time it arrives — also by a gateway
    /// that has not had a timeout yet, or whose timeouts are held up by steady traffic.
    pub fn handle_message(&mut self, now: UnixMillis, from: &AgentId, msg: LedgerMessage) {
        self.clock = self.clock.max(now);
        match msg {
            LedgerMessage::Dispatch { permit, effect } => self.on_dispatch(from, permit, effect),
            LedgerMessage::Query { key, binding } => self.on_query(from, key, &binding),
            LedgerMessage::Fence(fence) => self.on_fence(from, fence),
            _ => {} // Branch-bound messages are not for a gateway.
        }
    }

    fn refuse(&mut self, to: &AgentId, key: OpKey, reason: Refusal) {
        self.transmits
            .push_back((to.clone(), LedgerMessage::Refused { key, reason }));
    }

    fn on_dispatch(&mut self, from: &AgentId, permit: Signed<Permit>, effect: Effect) {
        // Strict verification: the signer must be the payer the binding names.
        let p = match self.keys.open(&permit, from) {
            Ok(p) => p,
            Err(_) => {
                let key = permit
                    .peek()
                    .map(|p| p.binding.key)
                    .unwrap_or(OpKey::from_u128(0));
                return self.refuse(from, key, Refusal::BadSignature);
            }
        };
        let b = &p.binding;
        let key = b.key;
        // Recompute the binding from what is actually asked for: the payer is the sender, the
        // effect is the one bound, and the escrow covers its maximum charge exactly.
        let trusting = self.mutation() == Some(LedgerMutation::GatewayTrustsBinding);
        if !trusting
            && (&b.payer != from
                || b.receiver != self.me
                || b.effect != effect.digest()
                || b.max_charge != effect.max_charge
                || p.footprint.size() != b.max_charge)
        {
            return self.refuse(from, key, Refusal::BindingMismatch);
        }
        if let Some(prior) = self.log.get(&(b.payer.clone(), key)) {
            // A reused key with different content is refused, never a silent no-op.
            if prior.binding != *b {
                return self.refuse(from, key, Refusal::KeyConflict);
            }
            if self.mutation() != Some(LedgerMutation::GatewayAcceptsKeyTwice) {
                // A repeat: the prior decision, once it is durable (the receipt follows its
                // record by itself otherwise).
                let reply = match &prior.state {
                    AcceptanceState::Done(r) if prior.receipt_durable => {
                        LedgerMessage::Receipt(r.clone())
                    }
                    _ => LedgerMessage::Pending { key },
                };
                self.transmits.push_back((from.clone(), reply));
                return;
            }
        }
        // Expired against the clock, and never below the horizon (a restarted gateway has
        // not seen the time yet, but what it forgot expired before its durable horizon).
        let now = self.clock.max(self.horizon);
        let lax = self.mutation() == Some(LedgerMutation::GatewayAcceptsExpired);
        if b.expires.is_some_and(|e| e < now) && !lax {
            return self.refuse(from, key, Refusal::Expired);
        }
        // A gateway that forgets keeps its log bounded only if every acceptance can expire.
        if b.expires.is_none() && self.retain_ms.is_some() {
            return self.refuse(from, key, Refusal::NoExpiry);
        }
        let fence = self.fences.get(&b.credit).copied().unwrap_or(0);
        if b.epoch < fence && self.mutation() != Some(LedgerMutation::GatewayWithoutFence) {
            return self.refuse(from, key, Refusal::Fenced);
        }
        let record = GatewayRecord::Accepted {
            binding: Box::new(b.clone()),
            permit,
            effect: effect.clone(),
        };
        self.apply(&record);
        let token = self.persist(record);
        let max_charge = self.limit_for(b, &effect);
        self.gate(
            token,
            Gated::Execute(Execute {
                payer: b.payer.clone(),
                key,
                effect,
                max_charge,
                expires: b.expires,
                resume: false,
            }),
        );
    }

    /// The hard limit handed to the executor: the binding's maximum charge. The mutants hand
    /// the effect's own (`GatewayTrustsBinding`) or none at all (`GatewayWithoutClamp`).
    fn limit_for(&self, b: &Binding, effect: &Effect) -> Vector {
        match self.mutation() {
            Some(LedgerMutation::GatewayTrustsBinding) => effect.max_charge.clone(),
            Some(LedgerMutation::GatewayWithoutClamp) => unlimited(&b.max_charge),
            _ => b.max_charge.clone(),
        }
    }

    fn gate(&mut self, token: PersistToken, g: Gated) {
        self.gated.entry(token).or_default().push(g);
    }

    fn on_query(&mut self, from: &AgentId, key: OpKey, binding: &Binding) {
        let reply = match self.log.get(&(binding.payer.clone(), key)) {
            Some(a) if a.binding != *binding => LedgerMessage::Refused {
                key,
                reason: Refusal::KeyConflict,
            },
            Some(a) => match &a.state {
                AcceptanceState::Done(r) if a.receipt_durable => LedgerMessage::Receipt(r.clone()),
                _ => LedgerMessage::Pending { key },
            },
            None if binding.expires.is_some_and(|e| e < self.horizon) => {
                // It may have been accepted, settled and forgotten: nothing can be proven.
                LedgerMessage::Refused {
                    key,
                    reason: Refusal::Forgotten,
                }
            }
            None => {
                // Only a durable fence proves that the binding can never be accepted: one
                // still being written may be lost to a crash, and the permit accepted after.
                let fences = if self.mutation() == Some(LedgerMutation::NoEffectBeforeDurableFence)
                {
                    &self.fences
                } else {
                    &self.durable_fences
                };
                let fence = fences.get(&binding.credit).copied().unwrap_or(0);
                if binding.receiver == self.me && binding.epoch < fence {
                    // Never accepted, and the fence makes sure it never will be.
                    let proof = NoEffect {
                        key,
                        binding: binding.digest(),
                        gateway: self.me.clone(),
                        fence,
                    };
                    LedgerMessage::NoEffect(Signed::sign(&proof, &self.me, &self.key))
                } else {
                    LedgerMessage::Pending { key }
                }
            }
        };
        self.transmits.push_back((from.clone(), reply));
    }

    fn on_fence(&mut self, from: &AgentId, fence: Signed<Fence>) {
        let Ok(body) = fence.peek() else {
            return;
        };
        // Only the credit's holder may fence it: the fence is signed by the holder it names,
        // and every permit seen for the credit came from that same payer.
        let any = self.mutation() == Some(LedgerMutation::EvidenceFromAnyMember);
        if &body.holder != from && !any {
            return;
        }
        let Ok(f) = self.keys.open(&fence, from) else {
            return;
        };
        let other_payer = self
            .log
            .values()
            .any(|a| a.binding.credit == f.credit && a.binding.payer != f.holder);
        if other_payer && !any {
            return;
        }
        let current = self.fences.get(&f.credit).copied().unwrap_or(0);
        let durable = self.durable_fences.get(&f.credit).copied().unwrap_or(0);
        let reply = |g: &Self, epoch| {
            let fenced = Fenced {
                credit: f.credit,
                epoch,
                gateway: g.me.clone(),
            };
            LedgerMessage::Fenced(Signed::sign(&fenced, &g.me, &g.key))
        };
        if f.epoch <= durable {
            let msg = reply(self, durable);
            self.transmits.push_back((from.clone(), msg));
            return;
        }
        if f.epoch <= current {
            // Covered by a fence still being written: answer once it is durable.
            if let Some(&token) = self.fence_in_flight.get(&f.credit) {
                let msg = reply(self, current);
                self.gate(token, Gated::Send(from.clone(), msg));
            }
            return;
        }
        let record = GatewayRecord::Fence {
            credit: f.credit,
            epoch: f.epoch,
        };
        self.apply(&record);
        let token = self.persist(record);
        self.fence_in_flight.insert(f.credit, token);
        self.gate(token, Gated::FenceDurable(f.credit, f.epoch));
        let msg = reply(self, f.epoch);
        self.gate(token, Gated::Send(from.clone(), msg));
    }

    /// The effect of `payer`'s `key` ran (or, for a resumed one, was found to have run) and
    /// charged `actual`. The receipt never exceeds the maximum: the executor is bound by it,
    /// and a higher report is clamped and recorded as the maximum.
    pub fn handle_executed(&mut self, payer: &AgentId, key: OpKey, actual: Vector) {
        let Some(a) = self.log.get(&(payer.clone(), key)) else {
            return;
        };
        if a.state != AcceptanceState::Accepted {
            return;
        }
        let unclamped = self.mutation() == Some(LedgerMutation::GatewayWithoutClamp);
        let actual = if actual.le(&a.binding.max_charge) || unclamped {
            actual
        } else {
            a.binding.max_charge.clone()
        };
        let receipt = Receipt {
            key,
            binding: a.binding.digest(),
            gateway: self.me.clone(),
            actual,
        };
        let signed = Signed::sign(&receipt, &self.me, &self.key);
        let record = GatewayRecord::Receipt {
            receipt: signed.clone(),
            payer: Some(payer.clone()),
        };
        self.apply(&record);
        let token = self.persist(record);
        self.gate(token, Gated::ReceiptDurable(payer.clone(), key));
        self.gate(
            token,
            Gated::Send(payer.clone(), LedgerMessage::Receipt(signed)),
        );
    }

    fn apply(&mut self, r: &GatewayRecord) {
        match r {
            GatewayRecord::Accepted {
                binding,
                permit,
                effect,
            } => {
                let twice = self.mutation() == Some(LedgerMutation::GatewayAcceptsKeyTwice);
                let e = self
                    .log
                    .entry((binding.payer.clone(), binding.key))
                    .or_insert_with(|| Acceptance {
                        binding: (**binding).clone(),
                        permit: permit.clone(),
                        effect: effect.clone(),
                        state: AcceptanceState::Accepted,
                        accepted: 0,
                        receipt_durable: false,
                    });
                e.accepted += 1;
                if twice {
                    e.state = AcceptanceState::Accepted;
                }
            }
            GatewayRecord::Receipt { receipt, payer } => {
                let Ok(body) = receipt.peek() else {
                    return;
                };
                let entry = match payer {
                    Some(p) => self.log.get_mut(&(p.clone(), body.key)),
                    None => self
                        .log
                        .iter_mut()
                        .find(|((_, k), a)| *k == body.key && a.binding.digest() == body.binding)
                        .map(|(_, a)| a),
                };
                if let Some(a) = entry {
                    a.state = AcceptanceState::Done(receipt.clone());
                }
            }
            GatewayRecord::Fence { credit, epoch } => {
                let f = self.fences.entry(*credit).or_insert(0);
                *f = (*f).max(*epoch);
            }
            GatewayRecord::Pruned { horizon, keys } => {
                for k in keys {
                    if self.log.remove(k).is_some() {
                        self.pruned += 1;
                    }
                }
                self.horizon = self.horizon.max(*horizon);
            }
            // Made by `checkpoint` (nothing to apply) or read by `recover`.
            GatewayRecord::Checkpoint(_) => {}
        }
    }

    fn persist(&mut self, r: GatewayRecord) -> PersistToken {
        let t = PersistToken(self.next_token);
        self.next_token += 1;
        self.persists.push_back((t, r));
        self.records += 1;
        t
    }

    /// The next record to make durable.
    pub fn poll_persist(&mut self) -> Option<(PersistToken, GatewayRecord)> {
        if self.checkpoint_due() {
            self.checkpoint();
        }
        self.persists.pop_front()
    }

    /// `token` is durable: release what waited for it.
    pub fn handle_persisted(&mut self, token: PersistToken) {
        for g in self.gated.remove(&token).unwrap_or_default() {
            match g {
                Gated::Execute(e) => self.executes.push_back(e),
                Gated::Send(to, m) => self.transmits.push_back((to, m)),
                Gated::ReceiptDurable(payer, key) => {
                    if let Some(a) = self.log.get_mut(&(payer, key)) {
                        a.receipt_durable = true;
                    }
                }
                Gated::FenceDurable(credit, epoch) => {
                    let f = self.durable_fences.entry(credit).or_insert(0);
                    *f = (*f).max(epoch);
                    if self.fence_in_flight.get(&credit) == Some(&token) {
                        self.fence_in_flight.remove(&credit);
                    }
                }
            }
        }
    }

    /// The next effect to run.
    pub fn poll_execute(&mut self) -> Option<Execute> {
        self.executes.pop_front()
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<(AgentId, LedgerMessage)> {
        self.transmits.pop_front()
    }

    /// What this gateway accepted for `payer`'s `key`.
    pub fn acceptance(&self, payer: &AgentId, key: OpKey) -> Option<&Acceptance> {
        self.log.get(&(payer.clone(), key))
    }

    /// The acceptance log, keyed by (payer, key).
    pub fn log(&self) -> impl Iterator<Item = (&(AgentId, OpKey), &Acceptance)> {
        self.log.iter()
    }

    /// Fences in force.
    pub fn fences(&self) -> impl Iterator<Item = (&CreditId, &u64)> {
        self.fences.iter()
    }
}

/// No limit in any of `max`'s dimensions (the `GatewayWithoutClamp` mutant).
fn unlimited(max: &Vector) -> Vector {
    let pairs: Vec<(&str, u64)> = max.iter().map(|(d, _)| (d.as_str(), u64::MAX)).collect();
    Vector::of(&pairs).unwrap_or_else(|_| max.clone())
}
