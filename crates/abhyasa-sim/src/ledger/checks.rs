//! Checking the durable states as recovery would rebuild them, with the independent checker
//! and both history auditors.

use super::*;

impl Sim {
    pub(super) fn branches_for_check(&self) -> Vec<Branch> {
        let config = branch_config(&self.p, self.mutation);
        self.branches
            .iter()
            .map(|(name, n)| {
                // The durable state: what recovery would rebuild.
                Branch::recover(
                    agent(name),
                    key_of(name),
                    self.keys.clone(),
                    config.clone(),
                    n.durable.clone(),
                )
                .0
            })
            .collect()
    }

    pub(super) fn check_now(&mut self) {
        let branches = self.branches_for_check();
        let gateways: Vec<Gateway> = self
            .gateways
            .iter()
            .map(|(name, n)| {
                Gateway::recover_with_mutation(
                    agent(name),
                    key_of(name),
                    self.keys.clone(),
                    self.mutation,
                    n.durable.clone(),
                )
            })
            .collect();
        let b: Vec<&Branch> = branches.iter().collect();
        let g: Vec<&Gateway> = gateways.iter().collect();
        let history = self
            .branches
            .iter()
            .flat_map(|(name, n)| audit(&agent(name), &n.durable, &self.keys))
            .chain(
                self.archives
                    .iter()
                    .flat_map(|(name, steps)| audit(&agent(name), steps, &self.keys)),
            )
            .chain(
                self.gateways
                    .iter()
                    .flat_map(|(name, n)| audit_gateway(&agent(name), &n.durable, &self.keys)),
            )
            .chain(
                self.gateway_archives
                    .iter()
                    .flat_map(|(name, log)| audit_gateway(&agent(name), log, &self.keys)),
            );
        let laws: Vec<_> = check(&World {
            branches: &b,
            gateways: &g,
            effects: &self.effects,
            keys: &self.keys,
        })
        .into_iter()
        .chain(history)
        .collect();
        for v in laws {
            if self.report.violations.len() < 5 {
                self.report.violations.push(format!("t={}ms {v}", self.now));
            }
        }
    }
}
