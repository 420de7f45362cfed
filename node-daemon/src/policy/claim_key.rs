//! Claim keys: how a node shows the others that a client logged in there as its user, so that
//! the node holding that user's session ships it (`docs/geo.md`, "Sessions that follow their
//! clients").
//!
//! A user's password derives an Ed25519 key (Argon2id of the password, salted with the user's
//! name; [`derive`]); `meridian ctl --operator-key ... user add` puts its public half in the
//! user's entry of the signed policy document. A node that checks a client's password derives
//! the key too and signs [`statement`]: this client id, this user, claimed by this node. The
//! proof travels with the claim; the node holding the session checks it against the user's
//! public key ([`verify`]). A node that does not know the password cannot make a proof, and a
//! proof names its claiming node, so no other node can use it. Only deployments with operator
//! keys ask for proofs (without them, any node could write a user's key into the document).

use argon2::{Algorithm, Argon2, Params, Version};
use libp2p::identity::ed25519;
use sha2::{Digest, Sha256};

/// What precedes the fields of a claim statement.
const STATEMENT: &[u8] = b"meridian claim v1\0";
/// What precedes a user's name in the salt of its key.
const SALT: &[u8] = b"meridian claim key v1\0";

/// The key `password` derives for `user`: Argon2id with the parameters `meridian passwd`
/// uses (19 MiB, 2 passes), salted with the user's name.
pub fn derive(password: &[u8], user: &str) -> anyhow::Result<ed25519::Keypair> {
    let mut salt = Sha256::new();
    salt.update(SALT);
    salt.update(user.as_bytes());
    let salt = salt.finalize();
    let params = Params::new(19_456, 2, 1, Some(32))
        .map_err(|e| anyhow::anyhow!("claim key parameters: {e}"))?;
    let mut seed = [0u8; 32];
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password_into(password, &salt[..16], &mut seed)
        .map_err(|e| anyhow::anyhow!("deriving the claim key: {e}"))?;
    let secret = ed25519::SecretKey::try_from_bytes(&mut seed)
        .map_err(|e| anyhow::anyhow!("claim key: {e}"))?;
    Ok(ed25519::Keypair::from(secret))
}

/// The public half of `key`, 64 hex digits (as user entries hold it).
pub fn public_hex(key: &ed25519::Keypair) -> String {
    hex::encode(key.public().to_bytes())
}

/// What a proof signs: the client id, the user and the claiming node (each length-prefixed).
fn statement(client_id: &str, user: &str, claimer: &str) -> Vec<u8> {
    let mut s = STATEMENT.to_vec();
    for field in [client_id, user, claimer] {
        s.extend_from_slice(&u32::try_from(field.len()).unwrap_or(u32::MAX).to_be_bytes());
        s.extend_from_slice(field.as_bytes());
    }
    s
}

/// The proof that `user`'s client `client_id` logged in at `claimer`.
pub fn prove(key: &ed25519::Keypair, client_id: &str, user: &str, claimer: &str) -> Vec<u8> {
    key.sign(&statement(client_id, user, claimer))
}

/// Whether `proof` shows that `user` (whose key's public half is `public_hex`) logged in as
/// client `client_id` at `claimer`.
pub fn verify(public_hex: &str, client_id: &str, user: &str, claimer: &str, proof: &[u8]) -> bool {
    let Ok(bytes) = hex::decode(public_hex) else {
        return false;
    };
    let Ok(public) = ed25519::PublicKey::try_from_bytes(&bytes) else {
        return false;
    };
    public.verify(&statement(client_id, user, claimer), proof)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_holds_for_its_client_user_and_node_only() {
        let key = derive(b"secret", "alice").unwrap();
        let public = public_hex(&key);
        assert_eq!(public_hex(&derive(b"secret", "alice").unwrap()), public);
        assert_ne!(public_hex(&derive(b"secret", "bob").unwrap()), public);
        assert_ne!(public_hex(&derive(b"other", "alice").unwrap()), public);
        let proof = prove(&key, "dev", "alice", "node-a");
        assert!(verify(&public, "dev", "alice", "node-a", &proof));
        assert!(
            !verify(&public, "dev", "alice", "node-r", &proof),
            "another node"
        );
        assert!(
            !verify(&public, "dev2", "alice", "node-a", &proof),
            "another client"
        );
        assert!(!verify(&public, "dev", "mallory", "node-a", &proof));
        let wrong = derive(b"guess", "alice").unwrap();
        assert!(!verify(
            &public,
            "dev",
            "alice",
            "node-a",
            &prove(&wrong, "dev", "alice", "node-a")
        ));
        assert!(!verify("zz", "dev", "alice", "node-a", &proof));
    }
}
