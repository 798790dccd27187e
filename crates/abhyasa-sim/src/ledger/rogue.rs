//! The ledger's adversary: forged, replayed and misaddressed objects, and a member that
//! signs what it should not.

use super::*;

impl Sim {
    /// The rogue member snoops one message in flight and forges from it.
    pub(super) fn rogue(&mut self) {
        if !self.snooped.is_empty() && self.rng.random_bool(0.3) {
            // An old dispatch replayed on the path, in its payer's name, long after — one of
            // a fenced credit when there is one (the fence was meant to shut it out).
            let fenced: Vec<usize> = (0..self.snooped.len())
                .filter(|&i| match &self.snooped[i].2 {
                    LedgerMessage::Dispatch { permit, .. } => permit
                        .peek()
                        .is_ok_and(|p| self.fenced_seen.contains(&p.binding.credit)),
                    _ => false,
                })
                .collect();
            let i = if fenced.is_empty() {
                self.rng.random_range(0..self.snooped.len())
            } else {
                fenced[self.rng.random_range(0..fenced.len())]
            };
            let (payer, gateway, m) = self.snooped[i].clone();
            self.report.forgeries += 1;
            self.send(payer, gateway, m);
            return;
        }
        if self.net.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.net.len());
        let Some((&at, m)) = self.net.iter().nth(i) else {
            return;
        };
        let (from, to, msg) = (m.from.clone(), m.to.clone(), m.msg.clone());
        if matches!(msg, LedgerMessage::Dispatch { .. }) && self.rng.random_bool(0.5) {
            // On the path, a dispatch held back (to be replayed much later, below).
            self.net.remove(&at);
        }
        let me = agent(ROGUE);
        let sign =
            |body: &dyn Fn(&AgentId, &LedgerSigningKey) -> LedgerMessage| body(&me, &key_of(ROGUE));
        let mut forged: Vec<(AgentId, LedgerMessage)> = Vec::new();
        let mut on_path: Vec<(AgentId, AgentId, LedgerMessage)> = Vec::new();
        match msg {
            LedgerMessage::Dispatch { permit, effect } => {
                let Ok(p) = permit.peek() else { return };
                let b = p.binding;
                let payer = b.payer.clone();
                // On the path: the payer's own signed permit, with a larger effect attached.
                let mut larger = effect.clone();
                larger.operation.push_str("+tampered");
                larger.max_charge = doubled(&effect.max_charge);
                on_path.push((
                    payer.clone(),
                    b.receiver.clone(),
                    LedgerMessage::Dispatch {
                        permit: permit.clone(),
                        effect: larger,
                    },
                ));
                // A no-effect proof and a zero receipt "from" the gateway, to the payer.
                forged.push((
                    payer.clone(),
                    sign(&|a, k| {
                        LedgerMessage::NoEffect(Signed::sign(
                            &NoEffect {
                                key: b.key,
                                binding: b.digest(),
                                gateway: b.receiver.clone(),
                                fence: b.epoch.saturating_add(1),
                            },
                            a,
                            k,
                        ))
                    }),
                ));
                forged.push((
                    payer.clone(),
                    sign(&|a, k| {
                        LedgerMessage::Receipt(Signed::sign(
                            &Receipt {
                                key: b.key,
                                binding: b.digest(),
                                gateway: b.receiver.clone(),
                                actual: Vector::zero(),
                            },
                            a,
                            k,
                        ))
                    }),
                ));
                // A fence of the payer's credit, in the payer's name, to the gateway.
                forged.push((
                    b.receiver.clone(),
                    sign(&|a, k| {
                        LedgerMessage::Fence(Signed::sign(
                            &Fence {
                                root: b.root,
                                credit: b.credit,
                                epoch: b.epoch.saturating_add(1),
                                holder: payer.clone(),
                            },
                            a,
                            k,
                        ))
                    }),
                ));
                // A fenced reply in the gateway's name, at the last epoch there is.
                let epoch = if self.rng.random_bool(0.5) {
                    u64::MAX
                } else {
                    b.epoch.saturating_add(1)
                };
                forged.push((
                    payer,
                    sign(&|a, k| {
                        LedgerMessage::Fenced(Signed::sign(
                            &Fenced {
                                credit: b.credit,
                                epoch,
                                gateway: b.receiver.clone(),
                            },
                            a,
                            k,
                        ))
                    }),
                ));
            }
            LedgerMessage::Receipt(r) => {
                // A real receipt replayed with its charge changed.
                let Ok(mut body) = r.peek() else { return };
                body.actual = Vector::zero();
                forged.push((
                    to,
                    sign(&|a, k| LedgerMessage::Receipt(Signed::sign(&body, a, k))),
                ));
            }
            LedgerMessage::Transfer(cert) => {
                let Ok(c) = cert.peek() else { return };
                // A refusal in the destination's name, to the source.
                let refusal = TransferDecision {
                    root: c.root,
                    transfer: c.transfer,
                    cert: c.digest(),
                    source: c.source.clone(),
                    destination: c.destination.clone(),
                    credit: None,
                };
                forged.push((
                    from,
                    sign(&|a, k| LedgerMessage::Decision(Signed::sign(&refusal, a, k))),
                ));
                // The same atoms again, in the source's name, under a new transfer id.
                let mut again = c;
                again.transfer = TransferId::from_u128(self.fresh());
                forged.push((
                    to,
                    sign(&|a, k| LedgerMessage::Transfer(Signed::sign(&again, a, k))),
                ));
            }
            LedgerMessage::Decision(d) => {
                // The decision turned into a refusal.
                let Ok(mut body) = d.peek() else { return };
                let claimed = body.credit;
                body.credit = None;
                forged.push((
                    to,
                    sign(&|a, k| LedgerMessage::Decision(Signed::sign(&body, a, k))),
                ));
                // To the claimant, in the source's name: its claim confirmed (and another
                // credit confirmed), and the transfer reclaimed.
                for credit in [claimed, Some(CreditId::from_u128(self.fresh())), None] {
                    let d = SourceDecision {
                        root: body.root,
                        transfer: body.transfer,
                        cert: body.cert,
                        source: body.source.clone(),
                        destination: body.destination.clone(),
                        credit,
                    };
                    forged.push((
                        from.clone(),
                        sign(&|a, k| LedgerMessage::SourceDecision(Signed::sign(&d, a, k))),
                    ));
                }
            }
            LedgerMessage::SourceDecision(d) => {
                // The source's decision turned around: a confirmation into a reclaim and back.
                let Ok(mut body) = d.peek() else { return };
                body.credit = match body.credit {
                    Some(_) => None,
                    None => Some(CreditId::from_u128(self.fresh())),
                };
                forged.push((
                    to,
                    sign(&|a, k| LedgerMessage::SourceDecision(Signed::sign(&body, a, k))),
                ));
            }
            _ => return,
        }
        self.report.forgeries += (forged.len() + on_path.len()) as u64;
        for (victim, m) in forged {
            self.send(me.clone(), victim, m);
        }
        for (as_from, to, m) in on_path {
            self.send(as_from, to, m);
        }
    }
}
