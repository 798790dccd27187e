//! The checks of the targets that read the wire's own objects (CBOR, MOQT): a value that
//! decodes re-encodes to bytes that decode to it, and an error is typed, never a panic.

use abhyasa_wire::ledger::LedgerMessage;
use abhyasa_wire::moqt::{Control, ObjectDatagram, StreamObject, SubgroupHeader};
use abhyasa_wire::{decode, encode, CustodyAck};
use abhyasa_wire::{Escalation, ReconciliationNote, SafeAction, TerminalRecord};

/// `fuzz.kind`: a kind registered the way an embedder registers one, so that the
/// [`obligation`] check reaches the registered read path (the kind's own reader and check,
/// the payload written again in one encoding). Only its wire side: reading needs no rules.
pub struct FuzzKind;

/// `fuzz.kind`'s payload: a few field types, and a check of its own.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct FuzzPayload {
    name: String,
    n: u64,
    #[serde(default)]
    items: Vec<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flag: Option<bool>,
}

impl abhyasa_wire::WireKind for FuzzKind {
    const NAME: &'static str = "fuzz.kind";
    type Payload = FuzzPayload;

    fn check(p: &FuzzPayload) -> Result<(), String> {
        if p.name.is_empty() || p.items.len() > 64 {
            return Err("an empty name, or over 64 items".into());
        }
        Ok(())
    }

    fn words(p: &FuzzPayload) -> String {
        format!("{} {}", p.name, p.n)
    }
}

abhyasa_wire::inventory::submit! { abhyasa_wire::KindEntry::of::<FuzzKind>() }

/// An obligation as it arrives on a `to/<agent>` track: decoded strictly, or a typed error
/// (keeping the envelope when only the kind or payload was unreadable). What decodes
/// re-encodes to bytes that decode to the same value, and validates or not without
/// panicking.
pub fn obligation(data: &[u8]) {
    match abhyasa_wire::decode_obligation(data) {
        Ok(o) => {
            let _ = o.validate();
            let _ = abhyasa_wire::words::obligation(&o);
            let again = encode(&o);
            assert_eq!(abhyasa_wire::decode_obligation(&again).ok(), Some(o));
        }
        Err(e) => {
            // An error that kept the envelope names a decline reason, and only then.
            assert_eq!(e.envelope().is_some(), e.decline_reason().is_some());
        }
    }
}

/// A custody ack as it arrives on an `acks/<agent>` track.
pub fn ack(data: &[u8]) {
    round_trip::<CustodyAck>(data);
}

/// Escalations, terminal records, reconciliation notes and safe actions: what the store and
/// `abhyasa check` read back and what an escalation carries.
pub fn escalation(data: &[u8]) {
    round_trip::<Escalation>(data);
    round_trip::<TerminalRecord>(data);
    round_trip::<ReconciliationNote>(data);
    round_trip::<SafeAction>(data);
}

fn round_trip<T>(data: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = decode::<T>(data) {
        assert_eq!(decode::<T>(&encode(&v)).ok(), Some(v));
    }
}

/// Everything on a `ledger/<peer>` track: a `LedgerMessage`, and inside it every signed
/// certificate opened for its body (the canonical-CBOR check included) as a branch or a
/// gateway does before it looks at a signature.
pub fn ledger(data: &[u8]) {
    let Ok(m) = decode::<LedgerMessage>(data) else {
        return;
    };
    assert_eq!(decode::<LedgerMessage>(&encode(&m)).ok().as_ref(), Some(&m));
    match &m {
        LedgerMessage::Transfer(s) => drop(s.decode_checked()),
        LedgerMessage::Decision(s) => drop(s.decode_checked()),
        LedgerMessage::SourceDecision(s) => drop(s.decode_checked()),
        LedgerMessage::Dispatch { permit, .. } => drop(permit.decode_checked()),
        LedgerMessage::Receipt(s) => drop(s.decode_checked()),
        LedgerMessage::NoEffect(s) => drop(s.decode_checked()),
        LedgerMessage::Fence(s) => drop(s.decode_checked()),
        LedgerMessage::Fenced(s) => drop(s.decode_checked()),
        _ => {}
    }
}

/// The MOQT control stream: framed messages read one after another from the front of the
/// buffer, as the session reads them. Each decoded message re-encodes to a frame that
/// decodes to the same message.
pub fn moqt_control(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some((msg, used))) = Control::decode(rest) {
        assert!(used > 0 && used <= rest.len());
        let mut again = Vec::new();
        msg.encode(&mut again);
        assert_eq!(Control::decode(&again).ok(), Some(Some((msg, again.len()))));
        rest = &rest[used..];
    }
}

/// A MOQT subgroup stream: a header, then objects until the bytes run out, as the session
/// reads an incoming unidirectional stream.
pub fn moqt_subgroup(data: &[u8]) {
    let Ok(Some((header, used))) = SubgroupHeader::decode(data) else {
        return;
    };
    let mut again = Vec::new();
    header.encode(&mut again);
    assert_eq!(
        SubgroupHeader::decode(&again).ok(),
        Some(Some((header.clone(), again.len())))
    );
    let mut rest = &data[used..];
    while let Ok(Some((object, used))) = StreamObject::decode(rest, header.extensions) {
        assert!(used > 0 && used <= rest.len());
        let mut again = Vec::new();
        object.encode(header.extensions, &mut again);
        assert_eq!(
            StreamObject::decode(&again, header.extensions).ok(),
            Some(Some((object, again.len())))
        );
        rest = &rest[used..];
    }
}

/// A MOQT object datagram (the first attempt of an obligation may travel as one).
pub fn moqt_datagram(data: &[u8]) {
    if let Ok(d) = ObjectDatagram::decode(data) {
        assert_eq!(ObjectDatagram::decode(&d.encode()).ok(), Some(d));
    }
}
