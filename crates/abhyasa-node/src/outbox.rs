//! The operator's outbox as the node feeds it. Escalations, declines and ended leases are
//! recorded by the store itself, in the commit that writes them ([`abhyasa_store::Op`]); what
//! only the node can name goes in beside the records of the same commit: a forfeit's
//! operation, and a gateway's refusal, which leaves the operation's atoms quarantined.

use abhyasa_ledger::{Branch, LedgerEvent, Operation, Step};
use abhyasa_store::{Op, OperatorEvent};
use abhyasa_wire::UnixMillis;

/// The event a ledger step makes in `branch` (which has taken it): a forfeit.
pub(crate) fn of_step(step: &Step, branch: &Branch, at: UnixMillis) -> Option<Op> {
    let Step::Forfeit { key } = step else {
        return None;
    };
    let op = branch.operation(*key)?;
    Some(Op::Event {
        event: OperatorEvent::BudgetForfeited {
            key: *key,
            gateway: op.binding.receiver.clone(),
            credit: op.binding.credit,
            max_charge: op.binding.max_charge.clone(),
        },
        at,
    })
}

/// The event a ledger event makes: a gateway's refusal of an operation still quarantined
/// (the branch resends an undecided dispatch, so a refusal lost in a crash comes again, and
/// is recorded then under the same key).
pub(crate) fn of_ledger_event(e: &LedgerEvent, branch: &Branch, at: UnixMillis) -> Option<Op> {
    let LedgerEvent::Refused { key, reason } = e else {
        return None;
    };
    let op: &Operation = branch.operation(*key)?;
    if op.state != abhyasa_ledger::OpState::Quarantined {
        return None;
    }
    Some(Op::Event {
        event: OperatorEvent::BudgetQuarantined {
            key: *key,
            gateway: op.binding.receiver.clone(),
            credit: op.binding.credit,
            max_charge: op.binding.max_charge.clone(),
            refusal: *reason,
        },
        at,
    })
}
