//! Operator keys: what decides the policy when `policy.operator_keys` is set.
//!
//! An operator key is an Ed25519 key pair. Its secret stays with the operator
//! (`meridian keygen --operator FILE` writes it; `meridian ctl --operator-key FILE` signs with
//! it); nodes are given the public halves (`policy.operator_keys`, 64 hex digits each). Then a
//! change of the policy document counts only if one of those keys signed it
//! ([`super::document::signed::verify_change`]): admin tokens open a node's admin API, and
//! holding the cluster key makes a node a member, but neither makes policy.
//!
//! What is signed is [`DOMAIN`] followed by the change's digest: the automerge hash the change
//! would have with its message cut before the signature ([`SIGNATURE_MARK`]). The digest
//! covers the change's operations, its author's note, its time and its dependencies (and
//! through them the whole history before it, the epoch included), so a signature cannot be
//! moved to another change, another place in the history or another epoch.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use libp2p::identity::ed25519;
use meridian_core::broker::LeafScope;
use serde::{Deserialize, Serialize};

/// What precedes a change's digest in what an operator key signs.
pub const DOMAIN: &[u8] = b"meridian policy change v1\0";
/// What precedes a forget's node and incarnation in what an operator key signs
/// ([`OperatorKey::sign_forget`]).
pub const FORGET_DOMAIN: &[u8] = b"meridian forget v1\0";
/// What precedes a node's id and region in what an operator key signs
/// ([`OperatorKey::certify`]).
pub const NODE_DOMAIN: &[u8] = b"meridian node v1\0";
/// What precedes a leaf credential's body in what an operator key signs
/// ([`OperatorKey::certify_leaf`]).
pub const LEAF_DOMAIN: &[u8] = b"meridian leaf v1\0";
/// How a leaf credential's text starts.
pub const LEAF_CREDENTIAL_PREFIX: &str = "meridian-leaf-";
/// The most scope filters a leaf credential names.
pub const MAX_LEAF_SCOPE: usize = 64;
/// A signed statement (a forget, a node's certificate) as a frame carries it: the key's
/// public half, then the signature.
const STATEMENT_SIGNATURE_LEN: usize = 32 + 64;
/// What separates a signed change's note from its signature in the change's message.
pub const SIGNATURE_MARK: char = '\u{1e}';

/// The public halves of the operator keys a node takes changes from.
#[derive(Clone, Default)]
pub struct OperatorKeys(Vec<ed25519::PublicKey>);

impl std::fmt::Debug for OperatorKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|k| hex::encode(k.to_bytes())))
            .finish()
    }
}

impl OperatorKeys {
    /// Keys from `policy.operator_keys` (64 hex digits each); the error names the one that is
    /// not a key.
    pub fn parse(keys: &[String]) -> anyhow::Result<Self> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| {
                public_key(k).with_context(|| format!("policy.operator_keys[{i}] ({k:?})"))
            })
            .collect::<anyhow::Result<Vec<_>>>()
            .map(Self)
    }

    /// Whether no key is set: the policy is made by admin tokens, as without signatures.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `signature` is one of these keys' over `digest`.
    pub fn verify(&self, digest: &[u8], signature: &Signature) -> bool {
        let Ok(key) = public_key(&signature.key) else {
            return false;
        };
        let Ok(sig) = hex::decode(&signature.sig) else {
            return false;
        };
        self.0.contains(&key) && key.verify(&signed_bytes(digest), &sig)
    }

    /// Whether `signature` ([`OperatorKey::sign_forget`]) is one of these keys' over the
    /// forget of `node`'s `incarnation`.
    pub fn verify_forget(&self, node: &str, incarnation: u64, signature: &[u8]) -> bool {
        let statement = statement(FORGET_DOMAIN, node, &incarnation.to_be_bytes());
        self.verify_statement(&statement, signature)
    }

    /// Whether `certificate` ([`OperatorKey::certify`]) is one of these keys' over `node`
    /// running in `region`.
    pub fn verify_region(&self, node: &str, region: &str, certificate: &[u8]) -> bool {
        let statement = statement(NODE_DOMAIN, node, region.as_bytes());
        self.verify_statement(&statement, certificate)
    }

    /// The leaf credential `text` is ([`OperatorKey::certify_leaf`]), if one of these keys
    /// signed it.
    pub fn verify_leaf(&self, text: &str) -> Option<LeafCredential> {
        let bytes = hex::decode(text.trim().strip_prefix(LEAF_CREDENTIAL_PREFIX)?).ok()?;
        let split = bytes.len().checked_sub(STATEMENT_SIGNATURE_LEN)?;
        let (body, signed) = bytes.split_at(split);
        let mut statement = LEAF_DOMAIN.to_vec();
        statement.extend_from_slice(body);
        // Read only once signed: a stranger's bytes cost one signature check.
        if !self.verify_statement(&statement, signed) {
            return None;
        }
        LeafCredential::decode(body, signed)
    }

    fn verify_statement(&self, statement: &[u8], signed: &[u8]) -> bool {
        if signed.len() != STATEMENT_SIGNATURE_LEN {
            return false;
        }
        let (key, sig) = signed.split_at(32);
        let Ok(key) = ed25519::PublicKey::try_from_bytes(key) else {
            return false;
        };
        self.0.contains(&key) && key.verify(statement, sig)
    }
}

/// A signature as a signed change's message carries it, after [`SIGNATURE_MARK`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The public key, 64 hex digits.
    pub key: String,
    /// The signature, 128 hex digits.
    pub sig: String,
}

/// An operator's secret key.
pub struct OperatorKey(ed25519::Keypair);

impl OperatorKey {
    /// Read a key file written by `meridian keygen --operator`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the operator key {}", path.display()))?;
        let secret = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .unwrap_or("");
        let mut bytes = hex::decode(secret)
            .ok()
            .filter(|b| b.len() == 32)
            .with_context(|| {
                format!(
                    "{}: not an operator key (64 hex digits; `meridian keygen --operator FILE` \
                     writes one)",
                    path.display()
                )
            })?;
        let secret = ed25519::SecretKey::try_from_bytes(&mut bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(Self(ed25519::Keypair::from(secret)))
    }

    /// A new random key.
    pub fn generate() -> Self {
        Self(ed25519::Keypair::generate())
    }

    /// The public half, 64 hex digits (what `policy.operator_keys` lists).
    pub fn public_hex(&self) -> String {
        hex::encode(self.0.public().to_bytes())
    }

    /// Sign a change's digest.
    pub fn sign(&self, digest: &[u8]) -> Signature {
        Signature {
            key: self.public_hex(),
            sig: hex::encode(self.0.sign(&signed_bytes(digest))),
        }
    }

    /// Sign the forget of `node`'s `incarnation` (the one the nodes know: `GET /api/peers`),
    /// as a forget announcement carries it: the key's public half, then the signature.
    pub fn sign_forget(&self, node: &str, incarnation: u64) -> Vec<u8> {
        self.sign_statement(&statement(FORGET_DOMAIN, node, &incarnation.to_be_bytes()))
    }

    /// The certificate of `node` (its peer id) running in `region`, which the node presents
    /// in its hellos (`cluster.certificate`): the key's public half, then the signature.
    pub fn certify(&self, node: &str, region: &str) -> Vec<u8> {
        self.sign_statement(&statement(NODE_DOMAIN, node, region.as_bytes()))
    }

    /// A leaf credential (text, for `MERIDIAN_LINK_TOKEN`): the leaf `name` (a prefix when it
    /// ends with `*`) may link, held to `scope` and `max_filters` filters.
    pub fn certify_leaf(&self, name: &str, scope: &[String], max_filters: u32) -> String {
        let body = LeafCredential::encode(name, scope, max_filters);
        let mut statement = LEAF_DOMAIN.to_vec();
        statement.extend_from_slice(&body);
        let signed = self.sign_statement(&statement);
        format!(
            "{LEAF_CREDENTIAL_PREFIX}{}{}",
            hex::encode(&body),
            hex::encode(signed)
        )
    }

    fn sign_statement(&self, statement: &[u8]) -> Vec<u8> {
        let mut signed = self.0.public().to_bytes().to_vec();
        signed.extend_from_slice(&self.0.sign(statement));
        signed
    }

    fn secret_hex(&self) -> String {
        hex::encode(self.0.secret().as_ref())
    }
}

/// An edge-link credential the operator signed: which leaf names link with it, the topics
/// such a leaf may touch and how many filters it may bring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafCredential {
    /// The leaf's name, or a prefix of names when it ends with `*`.
    pub name: String,
    /// The topic filters its messages and subscriptions must lie within, and its filter
    /// bound: checked as the credential is read.
    pub scope: LeafScope,
    /// Who it is among credentials (its signature, short): one leaf name is linked by one
    /// credential at a time.
    pub id: String,
}

impl LeafCredential {
    /// Whether `leaf` may link with this credential.
    pub fn admits(&self, leaf: &str) -> bool {
        match self.name.strip_suffix('*') {
            Some(prefix) => leaf.starts_with(prefix),
            None => leaf == self.name,
        }
    }

    /// The body: the name, the filter bound, the scope's filters; each string with its
    /// length (u16) before it.
    fn encode(name: &str, scope: &[String], max_filters: u32) -> Vec<u8> {
        let mut body = Vec::new();
        let mut put = |s: &str| {
            body.extend_from_slice(&u16::try_from(s.len()).unwrap_or(u16::MAX).to_be_bytes());
            body.extend_from_slice(s.as_bytes());
        };
        put(name);
        for filter in scope {
            put(filter);
        }
        let mut out = max_filters.to_be_bytes().to_vec();
        out.extend_from_slice(&body);
        out
    }

    fn decode(body: &[u8], signed: &[u8]) -> Option<Self> {
        let (max, mut rest) = body.split_first_chunk::<4>()?;
        let mut strings = Vec::new();
        while !rest.is_empty() {
            let (len, tail) = rest.split_first_chunk::<2>()?;
            let len = usize::from(u16::from_be_bytes(*len));
            let s = std::str::from_utf8(tail.get(..len)?).ok()?;
            strings.push(s.to_owned());
            rest = &tail[len..];
        }
        let mut strings = strings.into_iter();
        let name = strings.next()?;
        let filters: Vec<String> = strings.collect();
        if filters.is_empty() || filters.len() > MAX_LEAF_SCOPE {
            return None;
        }
        let max_filters = usize::try_from(u32::from_be_bytes(*max)).unwrap_or(usize::MAX);
        Some(Self {
            name,
            scope: LeafScope::new(filters, max_filters).ok()?,
            id: hex::encode(signed.get(32..40)?),
        })
    }
}

fn public_key(hex_key: &str) -> anyhow::Result<ed25519::PublicKey> {
    let bytes = hex::decode(hex_key.trim()).context("not hex")?;
    ed25519::PublicKey::try_from_bytes(&bytes).map_err(|e| anyhow::anyhow!("not a key: {e}"))
}

/// What a statement about `node` signs: its domain, the node, a zero byte, then `what`.
fn statement(domain: &[u8], node: &str, what: &[u8]) -> Vec<u8> {
    let mut m = domain.to_vec();
    m.extend_from_slice(node.as_bytes());
    m.push(0);
    m.extend_from_slice(what);
    m
}

fn signed_bytes(digest: &[u8]) -> Vec<u8> {
    let mut m = DOMAIN.to_vec();
    m.extend_from_slice(digest);
    m
}

/// `meridian certify --operator-key FILE --peer-id ID --region NAME`: print the operator's
/// certificate of that node in that region (hex), for the node's `cluster.certificate` file.
pub fn certify_command(
    key: &Path,
    peer_id: &libp2p::PeerId,
    region: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if region.is_empty() {
        bail!("--region: a region name is needed");
    }
    let key = OperatorKey::load(key)?;
    writeln!(
        out,
        "{}",
        hex::encode(key.certify(&peer_id.to_string(), region))
    )?;
    Ok(())
}

/// `meridian certify-leaf --operator-key FILE --name NAME --scope FILTER... --max-filters N`:
/// print an edge-link credential for the leaf `name` (a prefix of names when it ends with `*`),
/// held to `scope`.
pub fn certify_leaf_command(
    key: &Path,
    name: &str,
    scope: &[String],
    max_filters: u32,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let prefix = name.strip_suffix('*').unwrap_or(name);
    if !prefix.starts_with(meridian_core::broker::LEAF_PREFIX) || prefix.contains('*') {
        bail!(
            "--name {name:?}: a leaf's name starts with {} (a prefix of names ends with *)",
            meridian_core::broker::LEAF_PREFIX
        );
    }
    if scope.is_empty() || scope.len() > MAX_LEAF_SCOPE {
        bail!("--scope: from 1 to {MAX_LEAF_SCOPE} topic filters (--scope '#' for every topic)");
    }
    if let Err(e) = LeafScope::new(scope, 0) {
        bail!("--scope: {e}");
    }
    let key = OperatorKey::load(key)?;
    writeln!(out, "{}", key.certify_leaf(name, scope, max_filters))?;
    Ok(())
}

/// `meridian keygen --operator FILE`: write a new operator key (mode 0600) and print its
/// public half; refuses to overwrite.
pub fn keygen_command(path: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    if path.exists() {
        bail!(
            "{} exists already; a new key would not be one the nodes take",
            path.display()
        );
    }
    let key = OperatorKey::generate();
    let text = format!(
        "# A Meridian operator key: keep it off the nodes. Its public half, for\n\
         # policy.operator_keys: {}\n{}\n",
        key.public_hex(),
        key.secret_hex()
    );
    crate::secret_file::write_secret(path, text.as_bytes())?;
    writeln!(out, "{}", key.public_hex())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_credential_counts_as_signed_for_its_names_and_scope_only() {
        let operator = OperatorKey::generate();
        let rogue = OperatorKey::generate();
        let keys = OperatorKeys::parse(&[operator.public_hex()]).unwrap();
        let scope = vec!["sensors/eu/#".to_owned(), "cmd/eu/+".to_owned()];
        let text = operator.certify_leaf("edge-eu", &scope, 500);
        let credential = keys.verify_leaf(&text).expect("signed by a listed key");
        assert_eq!(credential.name, "edge-eu");
        assert_eq!(credential.scope.filters(), scope);
        assert_eq!(credential.scope.max_filters(), 500);
        assert!(credential.admits("edge-eu"));
        assert!(!credential.admits("edge-eu2"), "a name is no prefix");
        let prefix = keys
            .verify_leaf(&operator.certify_leaf("edge-eu-*", &scope, 1))
            .unwrap();
        assert!(prefix.admits("edge-eu-fra") && !prefix.admits("edge-as"));
        assert_ne!(prefix.id, credential.id);
        // Another key's, a changed byte anywhere, a cut one: none counts.
        assert!(
            keys.verify_leaf(&rogue.certify_leaf("edge-eu", &scope, 500))
                .is_none()
        );
        let hex_body = text.strip_prefix(LEAF_CREDENTIAL_PREFIX).unwrap();
        for at in [0, 9, 20, hex_body.len() - 1] {
            let mut changed = hex_body.as_bytes().to_vec();
            changed[at] = if changed[at] == b'0' { b'1' } else { b'0' };
            let changed = format!(
                "{LEAF_CREDENTIAL_PREFIX}{}",
                String::from_utf8(changed).unwrap()
            );
            assert!(keys.verify_leaf(&changed).is_none(), "byte {at} changed");
        }
        assert!(keys.verify_leaf(&text[..text.len() - 2]).is_none());
        assert!(keys.verify_leaf(hex_body).is_none(), "without its prefix");
        assert!(
            OperatorKeys::default().verify_leaf(&text).is_none(),
            "no key listed"
        );
    }

    #[test]
    fn a_signed_forget_counts_for_its_node_and_incarnation_and_the_listed_keys_only() {
        let operator = OperatorKey::generate();
        let rogue = OperatorKey::generate();
        let keys = OperatorKeys::parse(&[operator.public_hex()]).unwrap();
        let signed = operator.sign_forget("12D3KooWa", 7);
        assert!(keys.verify_forget("12D3KooWa", 7, &signed));
        assert!(
            !keys.verify_forget("12D3KooWa", 8, &signed),
            "another incarnation"
        );
        assert!(!keys.verify_forget("12D3KooWb", 7, &signed), "another node");
        assert!(!keys.verify_forget("12D3KooWa", 7, &rogue.sign_forget("12D3KooWa", 7)));
        let mut moved = rogue.sign_forget("12D3KooWa", 7);
        moved[..32].copy_from_slice(&signed[..32]);
        assert!(
            !keys.verify_forget("12D3KooWa", 7, &moved),
            "the operator's key, the rogue's signature"
        );
        assert!(!keys.verify_forget("12D3KooWa", 7, &signed[..95]));
        // A policy change's signature is no forget's.
        let change = operator.sign(b"digest");
        let mut as_forget = operator.public_hex().into_bytes();
        as_forget.extend_from_slice(change.sig.as_bytes());
        assert!(!keys.verify_forget("12D3KooWa", 7, &as_forget));
        assert!(
            !OperatorKeys::default().verify_forget("12D3KooWa", 7, &signed),
            "no key listed"
        );
    }

    #[test]
    fn a_certificate_counts_for_its_node_and_region_and_the_listed_keys_only() {
        let operator = OperatorKey::generate();
        let rogue = OperatorKey::generate();
        let keys = OperatorKeys::parse(&[operator.public_hex()]).unwrap();
        let cert = operator.certify("12D3KooWa", "euc1");
        assert!(keys.verify_region("12D3KooWa", "euc1", &cert));
        assert!(
            !keys.verify_region("12D3KooWa", "use1", &cert),
            "another region"
        );
        assert!(
            !keys.verify_region("12D3KooWb", "euc1", &cert),
            "another node"
        );
        assert!(!keys.verify_region("12D3KooWa", "euc1", &rogue.certify("12D3KooWa", "euc1")));
        // A forget's signature is no certificate, and the other way round.
        let forget = operator.sign_forget("12D3KooWa", 7);
        assert!(!keys.verify_region("12D3KooWa", "euc1", &forget));
        assert!(!keys.verify_forget("12D3KooWa", 7, &cert));
    }

    #[test]
    fn a_signature_counts_for_its_digest_and_the_listed_keys_only() {
        let operator = OperatorKey::generate();
        let rogue = OperatorKey::generate();
        let keys = OperatorKeys::parse(&[operator.public_hex()]).unwrap();
        let sig = operator.sign(b"digest");
        assert!(keys.verify(b"digest", &sig));
        assert!(!keys.verify(b"another", &sig));
        assert!(!keys.verify(b"digest", &rogue.sign(b"digest")));
        // A rogue signature presented as the operator's.
        let mut forged = rogue.sign(b"digest");
        forged.key = operator.public_hex();
        assert!(!keys.verify(b"digest", &forged));
        let garbage = Signature {
            key: "zz".into(),
            sig: "00".into(),
        };
        assert!(!keys.verify(b"digest", &garbage));
    }

    #[test]
    fn key_files_round_trip_and_bad_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("operator.key");
        let mut out = Vec::new();
        keygen_command(&path, &mut out).unwrap();
        let printed = String::from_utf8(out).unwrap();
        let key = OperatorKey::load(&path).unwrap();
        assert_eq!(printed.trim(), key.public_hex());
        assert!(
            keygen_command(&path, &mut Vec::new()).is_err(),
            "no overwrite"
        );
        let e = OperatorKeys::parse(&[key.public_hex(), "abc".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("policy.operator_keys[1]"), "{e}");
        std::fs::write(&path, "not a key\n").unwrap();
        assert!(OperatorKey::load(&path).is_err());
    }
}
