//! The simulated network: partitions, loss, duplication, delay, and delivery to the
//! branches and gateways (and what their machines send on).

use super::*;

impl Sim {
    pub(super) fn partitioned(&self, a: &AgentId, b: &AgentId) -> bool {
        // A partition isolates one component (branch or gateway, by index) from the rest.
        let names: Vec<&str> = BRANCHES.iter().chain(GATEWAYS.iter()).copied().collect();
        self.p.partitions.iter().any(|&(s, e, who)| {
            self.now >= s
                && self.now < e
                && ((a.as_str() == names[who]) != (b.as_str() == names[who]))
        })
    }

    pub(super) fn send(&mut self, from: AgentId, to: AgentId, msg: LedgerMessage) {
        if self.p.rogue_rate > 0.0 && matches!(msg, LedgerMessage::Dispatch { .. }) {
            // The rogue is on the path (as a relay would be), ahead of any loss: it keeps
            // every dispatch it sees, to replay later.
            if self.snooped.len() >= 256 {
                self.snooped.remove(0);
            }
            self.snooped.push((from.clone(), to.clone(), msg.clone()));
        }
        if let (true, LedgerMessage::Fence(f)) = (self.p.rogue_rate > 0.0, &msg) {
            // A fence on its way: the rogue asks the gateway, in the payer's name, about every
            // dispatch of that credit it saw — racing the fence's own record (queries carry
            // no authority; only the gateway's signed answer does).
            if let Ok(f) = f.peek() {
                self.fenced_seen.insert(f.credit);
                let asks: Vec<LedgerMessage> = self
                    .snooped
                    .iter()
                    .filter(|(_, gw, _)| *gw == to)
                    .filter_map(|(_, _, m)| match m {
                        LedgerMessage::Dispatch { permit, .. } => permit.peek().ok(),
                        _ => None,
                    })
                    .filter(|p| p.binding.credit == f.credit)
                    .map(|p| LedgerMessage::Query {
                        key: p.binding.key,
                        binding: Box::new(p.binding),
                    })
                    .collect();
                for q in asks {
                    self.report.forgeries += 1;
                    self.send_raw(from.clone(), to.clone(), q);
                }
            }
        }
        self.send_raw(from, to, msg);
    }

    /// Puts `msg` on the network (or loses it).
    pub(super) fn send_raw(&mut self, from: AgentId, to: AgentId, msg: LedgerMessage) {
        if self.rng.random_bool(self.p.loss) || self.partitioned(&from, &to) {
            return;
        }
        let copies = if self.rng.random_bool(self.p.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let at = self.now + self.rng.random_range(self.p.delay.0..=self.p.delay.1);
            self.seq += 1;
            self.net.insert(
                (at, self.seq),
                Msg {
                    from: from.clone(),
                    to: to.clone(),
                    msg: msg.clone(),
                },
            );
        }
    }

    /// Runs `f` on a live branch, then makes its steps durable (possibly crashing right
    /// after one) and sends what they released.
    pub(super) fn with_branch<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Branch, &mut SimRng) -> Result<T, abhyasa_ledger::LedgerError>,
    ) -> Option<T> {
        let node = self.branches.get_mut(name)?;
        let b = node.machine.as_mut()?;
        let out = f(b, &mut self.rng).ok();
        self.drain_branch(name);
        out
    }

    pub(super) fn drain_branch(&mut self, name: &str) {
        let mut sends = Vec::new();
        let mut crashed = false;
        {
            let node = self.branches.get_mut(name).expect("known branch");
            let Some(b) = node.machine.as_mut() else {
                return;
            };
            while let Some((token, step)) = b.poll_persist() {
                if self.rng.random_bool(self.p.crash_before_durable) {
                    // The write never lands. A driver sends what the branch releases as soon
                    // as it is released, so what is queued now went out before the crash.
                    while let Some(t) = b.poll_transmit() {
                        sends.push(t);
                    }
                    crashed = true;
                    break;
                }
                if self.p.branch_commit_ms > 0 {
                    // Written in order; lands later.
                    let after = self.rng.random_range(1..=self.p.branch_commit_ms);
                    let last = node.writing.back().map_or(0, |w| w.0);
                    node.writing
                        .push_back(((self.now + after).max(last), token, step));
                    continue;
                }
                land(
                    &mut self.report,
                    &mut node.durable,
                    self.archives.get_mut(name).expect("known branch"),
                    step,
                );
                if self.rng.random_bool(self.p.crash_after_step) {
                    crashed = true; // Durable, but nothing it released goes out.
                    break;
                }
                b.handle_persisted(token);
            }
            if !crashed {
                while let Some(t) = b.poll_transmit() {
                    sends.push(t);
                }
            }
        }
        let from = agent(name);
        for (to, m) in sends {
            self.send(from.clone(), to, m);
        }
        if crashed {
            self.crash_branch(name);
        }
    }

    pub(super) fn drain_gateway(&mut self, name: &str) {
        let mut sends = Vec::new();
        let mut crashed = false;
        let node = self.gateways.get_mut(name).expect("known gateway");
        let Some(g) = node.machine.as_mut() else {
            return;
        };
        loop {
            let mut progressed = false;
            while let Some((token, record)) = g.poll_persist() {
                progressed = true;
                if let GatewayRecord::Accepted { binding, .. } = &record {
                    if binding.expires.is_some_and(|e| self.now > e.0) {
                        self.report.violations.push(format!(
                            "{name} accepted {:?} at {} after its permit expired at {:?}",
                            binding.key, self.now, binding.expires
                        ));
                    }
                }
                if self.p.gateway_commit_ms > 0 {
                    // Written in order; lands later.
                    let after = self.rng.random_range(1..=self.p.gateway_commit_ms);
                    let last = node.writing.back().map_or(0, |w| w.0);
                    node.writing
                        .push_back(((self.now + after).max(last), token, record));
                    continue;
                }
                land_record(
                    &mut node.durable,
                    self.gateway_archives.get_mut(name).expect("known gateway"),
                    record,
                );
                if self.rng.random_bool(self.p.crash_after_step) {
                    crashed = true;
                    break;
                }
                g.handle_persisted(token);
            }
            if crashed {
                break;
            }
            while let Some(e) = g.poll_execute() {
                progressed = true;
                // The executor: looks up a resumed key in its own record first.
                let prior = self
                    .effects
                    .iter()
                    .find(|x| x.gateway.as_str() == name && x.key == e.key && x.payer == e.payer)
                    .map(|x| x.charge.clone());
                let report = match (e.resume, prior) {
                    (true, Some(c)) => c,
                    _ => {
                        // What the effect asks for (the effect as the gateway hands it over),
                        // now and then more than its maximum; it is held to the gateway's
                        // limit and reports what it asked for.
                        let asked = if self.rng.random_bool(self.p.overdraw) {
                            self.report.overdrawn += 1;
                            overdrawn(&mut self.rng, &e.effect.max_charge)
                        } else {
                            random_charge(&mut self.rng, &e.effect.max_charge)
                        };
                        let c = capped(&asked, &e.max_charge);
                        self.effects.push(EffectInstance {
                            gateway: agent(name),
                            payer: e.payer.clone(),
                            key: e.key,
                            charge: c.clone(),
                            expires: e.expires,
                        });
                        self.report.effects += 1;
                        asked
                    }
                };
                if self.rng.random_bool(self.p.crash_after_effect) {
                    crashed = true; // Ran, but the receipt was never recorded.
                    break;
                }
                g.handle_executed(&e.payer, e.key, report);
            }
            if crashed || !progressed {
                break;
            }
        }
        if !crashed {
            while let Some(t) = g.poll_transmit() {
                sends.push(t);
            }
        }
        let from = agent(name);
        for (to, m) in sends {
            self.send(from.clone(), to, m);
        }
        if crashed {
            self.crash_gateway(name);
        }
    }

    /// A message arrives: it crosses the wire as the node sends it (CBOR), and the node
    /// machine's routing picks the part it is for. A message routed to a part the node does
    /// not have is a violation: the sender addressed it by the same routing.
    pub(super) fn deliver(&mut self, m: Msg) {
        let to = m.to.as_str().to_owned();
        let msg = match abhyasa_wire::decode::<LedgerMessage>(&abhyasa_wire::encode(&m.msg)) {
            Ok(msg) => msg,
            Err(e) => {
                self.report.violations.push(format!(
                    "a ledger message to {to} does not survive the wire: {e}"
                ));
                return;
            }
        };
        let now = UnixMillis(self.now);
        match (
            abhyasa_machine::ledger_target(&msg, self.node_mutation),
            self.gateways.contains_key(&to),
        ) {
            (LedgerTarget::Gateway, true) => {
                if let Some(g) = self.gateways.get_mut(&to).and_then(|n| n.machine.as_mut()) {
                    // The node machine's decision: judged against the time it arrived.
                    abhyasa_machine::gateway_in(g, now, &m.from, msg, self.node_mutation);
                    self.drain_gateway(&to);
                }
            }
            (LedgerTarget::Branch, false) => {
                self.with_branch(&to, |b, _| {
                    b.handle_message(now, &m.from, msg);
                    Ok(())
                });
            }
            (target, _) => self.report.violations.push(format!(
                "{} sent {to} a ledger message routed to its {target:?}, which it does not have",
                m.from
            )),
        }
    }
}
