//! The simulated network: sends under the plan's loss, duplication, delay, partitions and
//! tampering, and the rogue acks of a peer that lies.

use super::*;

impl World {
    pub(super) fn deliver(&mut self, from: usize, to: usize, message: Message) {
        if self.nodes[to].machine.is_none() {
            return;
        }
        let s = message.signed();
        if s.tag != signature(s.signer, s.generation, &s.bytes) || s.signer != from {
            self.report.unverified += 1;
            if self.scenario.custodian.mutation != Some(Mutation::AcceptUnverified) {
                return;
            }
        }
        if let Some((lifetime, grace)) = self.scenario.node.cert_ms {
            // The signer's certificate of that generation was valid from the start of its
            // period until the end of it plus the rotation overlap; outside that (a copy in
            // flight over a rotation, a stale replay) it is refused like a bad signature.
            let (from_t, until) = (
                s.generation * lifetime,
                (s.generation + 1) * lifetime + grace,
            );
            if !(from_t..=until).contains(&self.now) {
                self.report.expired_certs += 1;
                return;
            }
        }
        let now = self.time(to);
        let from_agent = if from == usize::MAX {
            self.rogue.clone()
        } else {
            self.nodes[from].agent.clone()
        };
        let text_target = self.scenario.node.text_targets.contains(&to);
        let unsupported = self.nodes[to].unsupported.clone();
        let Some(m) = &mut self.nodes[to].machine else {
            return;
        };
        match message {
            Message::Obligation(Signed { bytes, .. }) => {
                let decoded = decode_obligation(&bytes).ok();
                match decoded {
                    // Its build lacks the kind: what it reads is an unknown kind.
                    Some(o) if unsupported.contains(&o.kind()) => {
                        let bytes = rewritten(&o, "kind", "x-unknown/kind");
                        m.handle_object(now, &from_agent, Track::Obligations, &bytes);
                    }
                    // Over a text binding: named by its text id, mapped by the node.
                    Some(o) if text_target && self.scenario.node.text_ids.contains_key(&o.id) => {
                        let text = self.scenario.node.text_ids[&o.id].clone();
                        m.deliver_text(now, &from_agent, &text, o);
                    }
                    _ => {
                        m.handle_object(now, &from_agent, Track::Obligations, &bytes);
                    }
                }
            }
            Message::Ack(Signed { bytes, .. }) => {
                m.handle_object(now, &from_agent, Track::Acks, &bytes);
            }
        }
        self.flush(to);
    }

    pub(super) fn rogue_ack(&mut self) {
        // A confused or hostile agent acks someone else's obligation. Its session proves it
        // is `rogue`; it claims to be the target.
        let ids: Vec<_> = self
            .issued
            .values()
            .map(|o| (o.id, o.target.clone()))
            .collect();
        if ids.is_empty() {
            return;
        }
        let (id, target) = ids[self.rng.random_range(0..ids.len())].clone();
        let issuer = self.issuer_of(&self.issued[&id].clone());
        // Forged (claims to be the target) or honest (labelled with its own identity, as a
        // confused agent would); `applied` or `declined`.
        let target = if self.rng.random_bool(0.5) {
            target
        } else {
            self.rogue.clone()
        };
        let status = if self.rng.random_bool(0.5) {
            AckStatus::Applied
        } else {
            AckStatus::Declined(DeclineReason::Refused)
        };
        let ack = CustodyAck {
            obligation_id: id,
            target,
            status,
            acked_at: UnixMillis(self.scenario.epoch + self.now),
            detail: None,
        };
        let at = self.now + 1;
        self.push(
            at,
            Event::Deliver {
                from: usize::MAX,
                to: issuer,
                message: Message::Ack(Signed::new(usize::MAX, encode(&ack))),
            },
        );
    }

    pub(super) fn send(&mut self, from: usize, to: usize, mut message: Message) {
        if let Some((lifetime, _)) = self.scenario.node.cert_ms {
            // Signed with the certificate of the current period (rotated every `lifetime`).
            let s = message.signed_mut();
            *s = s.clone().with_generation(self.now / lifetime.max(1));
        }
        let net = self.scenario.net.clone();
        if self.cut_off(from, to) {
            return;
        }
        if matches!(message, Message::Obligation(_))
            && self.nodes.len() > self.principals + 1
            && self.rng.random_bool(net.misroute)
        {
            // Misrouted: a copy also reaches a target it does not name (declined `refused`).
            let other = self.rng.random_range(self.principals..self.nodes.len());
            if other != to {
                self.deliver_at(self.now + net.delay, from, other, &message);
            }
        }
        if net.tamper > 0.0 && self.rng.random_bool(net.tamper) {
            self.tamper(from, to, &message);
        }
        if self.rng.random_bool(net.replay) {
            // A stale copy, long after the original.
            let at = self.now + self.rng.random_range(200..=MAX_REPLAY);
            self.deliver_at(at, from, to, &message);
        }
        let bad = self.burst.entry((from, to)).or_insert(false);
        if net.bursty {
            let flip = if *bad {
                net.burst_exit
            } else {
                net.burst_enter
            };
            if self.rng.random_bool(flip) {
                *bad = !*bad;
            }
        }
        let loss = if net.bursty && self.burst[&(from, to)] {
            net.burst_loss
        } else {
            net.loss
        };
        let copies = 1 + usize::from(self.rng.random_bool(net.duplicate));
        for _ in 0..copies {
            if self.rng.random_bool(loss) {
                continue;
            }
            let delay = net.delay + self.rng.random_range(0..=net.jitter);
            self.deliver_at(self.now + delay, from, to, &message);
        }
    }

    /// The relay on the path sends, beside `message`, a copy it altered, relabelled or replaced
    /// by a forgery of its own. Each must be dropped as unverified before a machine sees it.
    pub(super) fn tamper(&mut self, from: usize, to: usize, message: &Message) {
        self.report.tampered += 1;
        let at = self.now + self.scenario.net.delay;
        match self.rng.random_range(0..3u8) {
            0 => {
                // One bit of the signed bytes flipped.
                let mut m = message.clone();
                let bytes = &mut m.signed_mut().bytes;
                if !bytes.is_empty() {
                    let i = self.rng.random_range(0..bytes.len());
                    bytes[i] ^= 1 << self.rng.random_range(0..8u32);
                }
                self.deliver_at(at, from, to, &m);
            }
            1 => {
                // Claimed to come from another node (a namespace it does not own).
                let n = self.nodes.len();
                let other = (from.min(n - 1) + self.rng.random_range(1..n)) % n;
                if other != from {
                    self.deliver_at(at, other, to, message);
                }
            }
            _ => {
                // Forged: an `applied` ack for some obligation, signed by the relay and claimed
                // from the obligation's target.
                let issued: Vec<_> = self
                    .issued
                    .values()
                    .map(|o| (o.id, o.target.clone()))
                    .collect();
                if issued.is_empty() {
                    return;
                }
                let (id, target) = issued[self.rng.random_range(0..issued.len())].clone();
                let Some(t) = self.nodes.iter().position(|n| n.agent == target) else {
                    return;
                };
                let issuer = self.issuer_of(&self.issued[&id].clone());
                let ack = CustodyAck {
                    obligation_id: id,
                    target,
                    status: AckStatus::Applied,
                    acked_at: UnixMillis(self.scenario.epoch + self.now),
                    detail: None,
                };
                let forged = Message::Ack(Signed::new(RELAY, encode(&ack)));
                self.deliver_at(at, t, issuer, &forged);
            }
        }
    }

    pub(super) fn deliver_at(&mut self, at: u64, from: usize, to: usize, message: &Message) {
        let message = message.clone();
        self.push(at, Event::Deliver { from, to, message });
    }
}
