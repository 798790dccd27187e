//! The checks of the targets that read what the bindings hand the node: MCP `_meta`, A2A
//! JSON bodies, the node config, and the end-to-end signature envelope. Built only with
//! `--features bindings` here (they link the whole node).

use std::sync::OnceLock;

use abhyasa_a2a::json::{from_json, JsonAck, JsonObligation};
use abhyasa_a2a::AgentCard;
use abhyasa_moq::{Identity, SignedKind, Signer, Verifier};
use abhyasa_wire::AgentId;
use serde_json::{Map, Value};

/// A tool call's or result's `_meta` as it lands in the MCP binding: obligations, acks, a
/// permit and a receipt, each base64 CBOR under its `org.abhyasa/…` key.
pub fn mcp_meta(data: &[u8]) {
    let Ok(meta) = serde_json::from_slice::<Map<String, Value>>(data) else {
        return;
    };
    if let Ok(objects) = abhyasa_mcp::obligations_from_meta(&meta) {
        // Every object it passes on reads as an obligation (or keeps its envelope).
        for o in objects {
            assert!(
                abhyasa_wire::decode_obligation(&o).is_ok()
                    || abhyasa_wire::decode_obligation(&o).is_err_and(|e| e.envelope().is_some())
            );
        }
    }
    let _ = abhyasa_mcp::acks_from_meta(&meta);
    let _ = abhyasa_mcp::permit_from_meta(&meta);
    let _ = abhyasa_mcp::receipt_from_meta(&meta);
}

/// The A2A binding's JSON bodies as they land: an obligation (turned into the wire object the
/// custody machine takes), an ack, and a peer's agent card with its Abhyasa parameters.
pub fn a2a_json(data: &[u8]) {
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
}

/// A node config (TOML), read and checked as `abhyasa node --config` does before it touches
/// the disk or the network.
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = abhyasa_cli::check_config_text(text);
    }
}

/// A fixed deployment (`fuzz/fixtures/signed`: a CA and the principal's certificate, made by
/// `abhyasa certs`), so an input means the same envelope in every run and a crash found in
/// one process replays in another — with a CA generated per process, an edit at a given
/// offset met other key and certificate bytes each time.
pub fn deployment() -> &'static (Signer, Verifier) {
    static D: OnceLock<(Signer, Verifier)> = OnceLock::new();
    D.get_or_init(|| {
        let dir = std::path::Path::new(super::FUZZ_DIR).join("fixtures/signed");
        let principal = AgentId::new("principal").expect("an agent id");
        // Git keeps no mode but the executable bit: a checkout writes the fixture key 0644,
        // which `Identity::load` refuses (a key others can read). It is a public test
        // fixture; made private here so it loads as any key does.
        {
            use std::os::unix::fs::PermissionsExt;
            let key = dir.join("principal.key");
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
                .expect("the fixture key's mode");
        }
        let identity = Identity::load(&dir, &principal).expect("the fixed identity");
        let signer = Signer::new(&identity).expect("an Ed25519 identity");
        let verifier = Verifier::new(identity.ca.clone());
        (signer, verifier)
    })
}

/// The end-to-end signature envelope (COSE_Sign1, `abhyasa_moq::signed`) as a receiver opens
/// it, in modes chosen by the first byte (bit 0: the kind; bit 1: raw or forged; bit 2: a lone
/// envelope or one of a group of `2 + (byte >> 5)` signed together, at place `(byte >> 3) & 3`):
///
/// - raw: the rest is handed to `Verifier::open` as it is — it must refuse or open, never panic;
/// - forged: the rest is `[payload length][payload][(offset u16, xor u8)…]`; the payload is
///   signed by a real agent of the deployment, the envelope altered at those offsets, then
///   opened. Whatever the alteration, an envelope that opens must say exactly what was signed
///   and by whom: no change to the bytes yields another payload, another signer, or the other
///   kind. Opened in a batch beside a good envelope (`Verifier::open_all`), it must get the
///   answer it gets alone, and the neighbour must still open.
pub fn signed(data: &[u8]) {
    let (signer, verifier) = deployment();
    let _ = signed_in(signer, verifier, data);
}

/// [`signed`]'s check in the deployment of `signer` and `verifier` (the workspace's
/// `tests/fuzz_corpora.rs` runs it over freshly generated deployments too: the one abort this
/// target reported came from a run whose deployment was generated per process).
///
/// Returns whether an edited envelope opened (the branch where payload, signer and the
/// batch's answer are compared).
pub fn signed_in(signer: &Signer, verifier: &Verifier, data: &[u8]) -> bool {
    let Some((&mode, rest)) = data.split_first() else {
        return false;
    };
    let kind = if mode & 1 == 0 {
        SignedKind::Obligation
    } else {
        SignedKind::Ack
    };
    if mode & 2 == 0 {
        let _ = verifier.open(kind, rest);
        return false;
    }
    let Some((&len, rest)) = rest.split_first() else {
        return false;
    };
    let len = usize::from(len).min(rest.len());
    let (payload, edits) = rest.split_at(len);
    // Group mode: the payload signed as one of a group (one signature over the group's Merkle
    // root, the envelope carrying its inclusion proof), at the place and in a group of the
    // size the mode byte names; its untouched siblings must still open beside it.
    let grouped = mode & 4 != 0;
    let (size, place) = (2 + usize::from(mode >> 5), usize::from((mode >> 3) & 3));
    let place = place % size;
    let siblings: Vec<Vec<u8>> = (0..size)
        .map(|i| {
            if i == place {
                payload.to_vec()
            } else {
                vec![i as u8; i]
            }
        })
        .collect();
    let group = if grouped {
        signer.sign_group(kind, &siblings)
    } else {
        Vec::new()
    };
    let mut envelope = if grouped {
        group[place].clone()
    } else {
        signer.sign(kind, payload)
    };
    for edit in edits.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([edit[0], edit[1]])) % envelope.len();
        envelope[at] ^= edit[2];
    }
    let other = if kind == SignedKind::Obligation {
        SignedKind::Ack
    } else {
        SignedKind::Obligation
    };
    assert!(
        verifier.open(other, &envelope).is_err(),
        "an envelope opened as the other kind"
    );
    let alone = verifier.open(kind, &envelope);
    if let Ok(opened) = &alone {
        assert_eq!(
            opened.payload, payload,
            "an altered envelope opened to another payload"
        );
        assert_eq!(
            &opened.signer,
            signer.agent(),
            "an altered envelope named another signer"
        );
    }
    // Verified in a batch beside an untouched envelope, it gets the answer it gets alone, and
    // so does its neighbour (the batch equation and each alone agree under ZIP 215).
    let good = signer.sign(kind, b"a neighbour");
    let together = verifier.open_all([(kind, envelope.as_slice()), (kind, good.as_slice())]);
    assert_eq!(
        together[0], alone,
        "a batch answered otherwise than the envelope alone"
    );
    assert!(together[1].is_ok(), "a good neighbour refused in a batch");
    if grouped {
        // Beside its own siblings (sharing their signature) it gets the answer it gets alone,
        // and they all open.
        let mut batch: Vec<&[u8]> = group.iter().map(Vec::as_slice).collect();
        batch[place] = &envelope;
        let together = verifier.open_all(batch.iter().map(|e| (kind, *e)));
        for (i, r) in together.iter().enumerate() {
            if i == place {
                assert_eq!(
                    *r, alone,
                    "a group answered otherwise than the envelope alone"
                );
            } else {
                assert_eq!(
                    r.as_ref().map(|o| &o.payload),
                    Ok(&siblings[i]),
                    "an untouched sibling refused or misread beside an edited one"
                );
            }
        }
    }
    alone.is_ok()
}
