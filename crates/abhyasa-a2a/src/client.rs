//! A custodian reaching a peer over the A2A binding.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use abhyasa_moq::Identity;
use abhyasa_node::Node;
use abhyasa_wire::{AgentId, CustodyAck, Kind};
use reqwest::StatusCode;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::card::{AgentCard, KindProfile};
use crate::A2aError;

/// A peer reached over A2A.
#[derive(Clone, Debug)]
pub struct A2aPeer {
    /// Its agent id (the name its certificate must carry).
    pub agent: AgentId,
    /// Its card, e.g. `https://agent-1:8443/.well-known/agent-card.json`.
    pub card_url: String,
    /// Where the card URL's host is, when it is not in DNS (it is usually the agent id).
    pub addr: Option<SocketAddr>,
}

/// Most POSTs in flight to one peer.
const IN_FLIGHT: usize = crate::server::MAX_CONNECTIONS_PER_MEMBER;

/// The HTTPS client for `peer`: trusts the deployment CA only, presents `identity`'s
/// certificate, and checks that the server's certificate names the URL's host (the agent).
pub fn http_client(identity: &Identity, peer: &A2aPeer) -> Result<reqwest::Client, A2aError> {
    let mut b = reqwest::Client::builder()
        .use_preconfigured_tls(crate::tls::client(identity)?)
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2));
    if let Some(addr) = peer.addr {
        b = b.resolve(peer.agent.as_str(), addr);
    }
    Ok(b.build()?)
}

/// Fetches and validates `peer`'s card: its Abhyasa profiles by kind.
pub async fn fetch_profiles(
    client: &reqwest::Client,
    peer: &A2aPeer,
) -> Result<BTreeMap<Kind, KindProfile>, A2aError> {
    let body = client
        .get(&peer.card_url)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    let card = AgentCard::from_json(&body)?;
    Ok(card.abhyasa()?.1)
}

/// Reaches `peer` over A2A for `node`'s custodian: fetches its card (again until it answers),
/// validates every profile, then carries what custody sends the peer to the endpoint of each
/// object's kind and hands the acks back. Ends when the node stops, or at once when the card
/// is refused (its error is logged; obligations to the peer then escalate at their deadline).
pub fn spawn_peer(
    node: Node,
    identity: &Identity,
    peer: A2aPeer,
) -> Result<JoinHandle<()>, A2aError> {
    let client = http_client(identity, &peer)?;
    Ok(tokio::spawn(async move {
        let profiles = loop {
            match fetch_profiles(&client, &peer).await {
                Ok(p) => break p,
                Err(A2aError::Card(e)) => {
                    error!(peer = %peer.agent, "a2a: card of {} refused: {e}", peer.card_url);
                    return;
                }
                Err(e) => {
                    debug!(peer = %peer.agent, "a2a: card not fetched yet: {e}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        };
        info!(peer = %peer.agent, kinds = profiles.len(), "a2a: card read; attaching");
        // From now on, obligations to the peer are checked against its profiles at issue.
        let profile = abhyasa_node::PeerProfile {
            kinds: profiles
                .iter()
                .map(|(k, p)| {
                    (
                        *k,
                        (
                            crate::card::seconds_to_ms(p.backoff_base_seconds),
                            p.backoff_cap_seconds.saturating_mul(1_000),
                        ),
                    )
                })
                .collect(),
        };
        if node
            .set_profile(peer.agent.clone(), Some(profile))
            .await
            .is_err()
        {
            return;
        }
        let endpoints: Arc<BTreeMap<Kind, String>> = Arc::new(
            profiles
                .into_iter()
                .map(|(k, p)| (k, p.obligation_endpoint))
                .collect(),
        );
        let mut objects = match node.attach(peer.agent.clone()).await {
            Ok(rx) => rx,
            Err(e) => {
                warn!(peer = %peer.agent, "a2a: attach: {e}");
                return;
            }
        };
        let limit = Arc::new(Semaphore::new(IN_FLIGHT));
        while let Some(object) = objects.recv().await {
            let kind = match abhyasa_wire::decode_obligation(&object) {
                Ok(o) => o.kind(),
                Err(e) => {
                    warn!(peer = %peer.agent, "a2a: custody handed an unreadable object: {e}");
                    continue;
                }
            };
            let Some(url) = endpoints.get(&kind).cloned() else {
                // The card takes no such kind: nothing is posted; custody escalates it.
                warn!(peer = %peer.agent, "a2a: the card has no endpoint for {}", kind.as_str());
                continue;
            };
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let (client, node, agent) = (client.clone(), node.clone(), peer.agent.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match post(&client, &url, object).await {
                    Ok(Some(ack)) => {
                        let _ = node.acks_in(agent, vec![ack]).await;
                    }
                    Ok(None) => {}
                    // Custody retries on its own schedule; nothing to do here.
                    Err(e) => debug!(peer = %agent, "a2a: POST {url}: {e}"),
                }
            });
        }
    }))
}

/// POSTs one obligation object; the ack when the answer carries one.
async fn post(
    client: &reqwest::Client,
    url: &str,
    object: Vec<u8>,
) -> Result<Option<CustodyAck>, String> {
    let r = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/cbor")
        .header(reqwest::header::ACCEPT, "application/cbor")
        .body(object)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    match r.status() {
        StatusCode::OK => {
            let body = r.bytes().await.map_err(|e| e.to_string())?;
            abhyasa_wire::decode::<CustodyAck>(&body)
                .map(Some)
                .map_err(|e| format!("the answer is not a CustodyAck: {e}"))
        }
        StatusCode::ACCEPTED => Ok(None),
        s => {
            let body = r.text().await.unwrap_or_default();
            Err(format!("{s}: {body}"))
        }
    }
}
