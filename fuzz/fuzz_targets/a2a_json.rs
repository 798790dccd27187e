//! The A2A binding's JSON bodies as they land: an obligation (turned into the wire object the
//! custody machine takes), an ack, and a peer's agent card with its Abhyasa parameters.
#![no_main]

use abhyasa_a2a::json::{from_json, JsonAck, JsonObligation};
use abhyasa_a2a::AgentCard;
use abhyasa_wire::AgentId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(j) = from_json::<JsonObligation>("obligation", data) {
        if let Ok(o) = j.to_wire(&AgentId::new("peer").expect("a valid name")) {
            let _ = o.validate();
        }
    }
    if let Ok(j) = from_json::<JsonAck>("ack", data) {
        let _ = j.to_wire();
    }
    if let Ok(card) = AgentCard::from_json(data) {
        let _ = card.abhyasa();
    }
});
