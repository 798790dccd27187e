//! Crashes: commits that land (or not) before a crash, and restarts from the journal.

use super::*;

impl Sim {
    pub(super) fn crash_branch(&mut self, name: &str) {
        let up_at = self.crash_until();
        let node = self.branches.get_mut(name).expect("known branch");
        node.machine = None;
        node.writing.clear(); // Never landed.
        node.up_at = up_at;
    }

    /// Branch steps whose write lands now become durable (a crash may come just before one
    /// lands, or right after), and what waited for them is released.
    pub(super) fn branch_commits_due(&mut self) {
        for name in BRANCHES {
            let node = self.branches.get_mut(name).expect("known branch");
            let archive = self.archives.get_mut(name).expect("known branch");
            let report = &mut self.report;
            let (crashed, landed) = node.land_due(
                self.now,
                &mut self.rng,
                (self.p.branch_crash_writing, self.p.crash_after_step),
                |durable, step| land(report, durable, archive, step),
                Branch::handle_persisted,
            );
            if crashed {
                self.crash_branch(name);
            } else if landed {
                self.drain_branch(name);
            }
        }
    }

    /// Counts a crash and draws when the crashed component comes back.
    pub(super) fn crash_until(&mut self) -> u64 {
        self.report.crashes += 1;
        self.now + self.rng.random_range(self.p.downtime.0..=self.p.downtime.1)
    }

    pub(super) fn crash_gateway(&mut self, name: &str) {
        let up_at = self.crash_until();
        let node = self.gateways.get_mut(name).expect("known gateway");
        node.machine = None;
        node.writing.clear(); // Never landed.
        node.up_at = up_at;
    }

    /// Gateway records whose write lands now become durable (a crash may come just before
    /// one lands, or right after), and what waited for them is released.
    pub(super) fn gateway_commits_due(&mut self) {
        let names: Vec<String> = self.gateways.keys().cloned().collect();
        for name in names {
            let node = self.gateways.get_mut(&name).expect("known gateway");
            let archive = self.gateway_archives.get_mut(&name).expect("known gateway");
            let (crashed, landed) = node.land_due(
                self.now,
                &mut self.rng,
                (self.p.gateway_crash_writing, self.p.crash_after_step),
                |durable, record| land_record(durable, archive, record),
                Gateway::handle_persisted,
            );
            if crashed {
                self.crash_gateway(&name);
            } else if landed {
                self.drain_gateway(&name);
            }
        }
    }

    pub(super) fn restart_due(&mut self) {
        let config = branch_config(&self.p, self.mutation);
        for (name, node) in &mut self.branches {
            if node.machine.is_none() && self.now >= node.up_at {
                let (b, rejected) = Branch::recover(
                    agent(name),
                    key_of(name),
                    self.keys.clone(),
                    config.clone(),
                    node.durable.clone(),
                );
                if !rejected.is_empty() {
                    self.report.violations.push(format!(
                        "{name}: journal steps rejected at recovery: {rejected:?}"
                    ));
                }
                node.machine = Some(b);
            }
        }
        for (name, node) in &mut self.gateways {
            if node.machine.is_none() && self.now >= node.up_at {
                let g = Gateway::recover_checked_with_mutation(
                    agent(name),
                    key_of(name),
                    self.keys.clone(),
                    self.mutation,
                    node.durable.clone(),
                )
                .unwrap_or_else(|e| {
                    self.report
                        .violations
                        .push(format!("{name}: gateway log rejected at recovery: {e}"));
                    Gateway::new(agent(name), key_of(name), self.keys.clone())
                        .with_mutation(self.mutation)
                });
                node.machine = Some(gateway_setup(g, &self.p));
            }
        }
        let names: Vec<String> = self.gateways.keys().cloned().collect();
        for n in names {
            self.drain_gateway(&n);
        }
    }
}
