//! Who may join the mesh: a node that holds the deployment's cluster key. Once Noise has
//! authenticated both peer ids (and encrypts what follows), each side sends a tag only a
//! holder of the key can make, bound to its own and the other's peer id, and checks the
//! other's; a connection that fails it ends before anything else runs on it: no stream, no
//! gossip, no identify.
//!
//! One encryption of the link (Noise's ChaCha20-Poly1305) does the work that a second,
//! keyed stream cipher under it (libp2p's private networks) would repeat for every byte.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use hmac::{Hmac, Mac};
use libp2p::PeerId;
use libp2p::core::upgrade::{InboundConnectionUpgrade, OutboundConnectionUpgrade, UpgradeInfo};
use libp2p::noise;
use libp2p::pnet::PreSharedKey;
use sha2::Sha256;

/// What the tags are made for, so that a tag made with the key for anything else never
/// passes for one.
const CONTEXT: &[u8] = b"meridian cluster member 1";
const TAG_LEN: usize = 32;

/// Why a connection was not let in.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    #[error("noise handshake: {0}")]
    Noise(#[from] noise::Error),
    #[error("no proof of the cluster key: not a member of this deployment")]
    NotAMember,
    #[error("proof of the cluster key: {0}")]
    Io(#[from] std::io::Error),
}

/// Noise, then the proof of the cluster key: the authentication step of the mesh's TCP
/// transport.
#[derive(Clone)]
pub struct NoiseMember {
    noise: noise::Config,
    /// The key file's canonical text, which holds the key's 32 random bytes.
    key: Arc<str>,
    local: PeerId,
}

impl NoiseMember {
    pub fn new(noise: noise::Config, key: &PreSharedKey, local: PeerId) -> Self {
        Self {
            noise,
            key: key.to_string().into(),
            local,
        }
    }
}

/// The tag `from` sends `to`.
fn tag(key: &str, from: &PeerId, to: &PeerId) -> Result<Hmac<Sha256>, MemberError> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(key.as_bytes()).map_err(|_| MemberError::NotAMember)?;
    mac.update(CONTEXT);
    for id in [from, to] {
        let bytes = id.to_bytes();
        mac.update(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
        mac.update(&bytes);
    }
    Ok(mac)
}

/// Send this side's tag and check the other's (both sides send first: no round trip more).
async fn prove<C: AsyncRead + AsyncWrite + Unpin>(
    key: &str,
    local: &PeerId,
    remote: &PeerId,
    io: &mut C,
) -> Result<(), MemberError> {
    let mine = tag(key, local, remote)?.finalize().into_bytes();
    io.write_all(&mine).await?;
    io.flush().await?;
    let mut theirs = [0u8; TAG_LEN];
    io.read_exact(&mut theirs).await?;
    tag(key, remote, local)?
        .verify_slice(&theirs)
        .map_err(|_| MemberError::NotAMember)
}

type Upgraded<C> =
    Pin<Box<dyn Future<Output = Result<(PeerId, noise::Output<C>), MemberError>> + Send + 'static>>;

/// The Noise handshake `noise`, then the proof of the key over what it gives.
fn then_prove<C: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    key: Arc<str>,
    local: PeerId,
    noise: impl Future<Output = Result<(PeerId, noise::Output<C>), noise::Error>> + Send + 'static,
) -> Upgraded<C> {
    Box::pin(async move {
        let (remote, mut io) = noise.await?;
        prove(&key, &local, &remote, &mut io).await?;
        Ok((remote, io))
    })
}

impl UpgradeInfo for NoiseMember {
    type Info = <noise::Config as UpgradeInfo>::Info;
    type InfoIter = <noise::Config as UpgradeInfo>::InfoIter;

    fn protocol_info(&self) -> Self::InfoIter {
        self.noise.protocol_info()
    }
}

impl<C> InboundConnectionUpgrade<C> for NoiseMember
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = (PeerId, noise::Output<C>);
    type Error = MemberError;
    type Future = Upgraded<C>;

    fn upgrade_inbound(self, socket: C, info: Self::Info) -> Self::Future {
        then_prove(
            self.key,
            self.local,
            self.noise.upgrade_inbound(socket, info),
        )
    }
}

impl<C> OutboundConnectionUpgrade<C> for NoiseMember
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = (PeerId, noise::Output<C>);
    type Error = MemberError;
    type Future = Upgraded<C>;

    fn upgrade_outbound(self, socket: C, info: Self::Info) -> Self::Future {
        then_prove(
            self.key,
            self.local,
            self.noise.upgrade_outbound(socket, info),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::compat::TokioAsyncReadCompatExt;

    fn peer() -> PeerId {
        libp2p::identity::Keypair::generate_ed25519()
            .public()
            .to_peer_id()
    }

    fn key(byte: u8) -> String {
        PreSharedKey::new([byte; 32]).to_string()
    }

    /// Both ends of a pipe prove themselves: (what a, then b, concluded).
    async fn meet(
        (key_a, a, a_thinks_b): (&str, PeerId, PeerId),
        (key_b, b, b_thinks_a): (&str, PeerId, PeerId),
    ) -> (Result<(), MemberError>, Result<(), MemberError>) {
        let (x, y) = tokio::io::duplex(1024);
        let (mut x, mut y) = (x.compat(), y.compat());
        tokio::join!(
            prove(key_a, &a, &a_thinks_b, &mut x),
            prove(key_b, &b, &b_thinks_a, &mut y)
        )
    }

    #[tokio::test]
    async fn holders_of_the_key_are_let_in_and_others_are_not() {
        let (a, b, c) = (peer(), peer(), peer());
        let (one, other) = (key(1), key(2));
        let (at_a, at_b) = meet((&one, a, b), (&one, b, a)).await;
        assert!(at_a.is_ok() && at_b.is_ok(), "{at_a:?} {at_b:?}");

        let (at_a, at_b) = meet((&one, a, b), (&other, b, a)).await;
        assert!(matches!(at_a, Err(MemberError::NotAMember)), "{at_a:?}");
        assert!(matches!(at_b, Err(MemberError::NotAMember)), "{at_b:?}");

        // A tag is good between its two peer ids only: one made for c does not pass at b.
        let (at_a, at_b) = meet((&one, a, c), (&one, b, a)).await;
        assert!(matches!(at_b, Err(MemberError::NotAMember)), "{at_b:?}");
        assert!(matches!(at_a, Err(MemberError::NotAMember)), "{at_a:?}");
    }

    #[tokio::test]
    async fn a_peer_that_sends_nothing_and_goes_is_an_error() {
        let (a, b) = (peer(), peer());
        let (x, y) = tokio::io::duplex(1024);
        drop(y);
        let got = prove(&key(1), &a, &b, &mut x.compat()).await;
        assert!(matches!(got, Err(MemberError::Io(_))), "{got:?}");
    }
}
