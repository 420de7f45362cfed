//! Bearer tokens (admin API, edge links) as hashes: the files' tokens are hashed as they are
//! read, the policy document holds hashes only, and a presented token is hashed and compared
//! with every hash in a time that does not depend on which one it matches.
//!
//! Tokens are random strings of 16 characters or more, so one SHA-256 is enough: there is no
//! dictionary to guess from, unlike passwords (which are Argon2 hashes).
//!
//! Every token file (`admin.token_file`, `cluster.edge.token_file`, `meridian ctl
//! --token-file`) is read here ([`read_file`]): one token per line, `#` comments and blank
//! lines skipped.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::Snapshot;
use super::document::TokenKind;
use crate::passwd::constant_time_eq;

/// Shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// A token's hash as the document holds it: SHA-256, lower-case hex.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random token (32 bytes, hex).
pub fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(hex::encode(bytes))
}

/// A token seeded from a file: its name (`NAME-` and the start of its hash) and its hash.
pub fn seeded(name: &str, token: &str) -> (String, String) {
    let hash = token_hash(token);
    (format!("{name}-{}", &hash[..8]), hash)
}

/// Named token hashes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TokenSet(Vec<(String, String)>);

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenSet({} tokens)", self.0.len())
    }
}

impl TokenSet {
    /// Tokens by name and hash.
    pub fn from_hashes<'a>(hashes: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        Self(
            hashes
                .into_iter()
                .map(|(n, h)| (n.clone(), h.clone()))
                .collect(),
        )
    }

    /// The tokens of the file at `path`, each named `NAME-` and the start of its hash (nodes
    /// that seed one document from different files keep every token; the same token from
    /// two files is one); none when `path` is empty. `key` names the file's setting in
    /// errors.
    pub fn from_file(path: &Path, key: &str, name: &str) -> anyhow::Result<Self> {
        if path.as_os_str().is_empty() {
            return Ok(Self::default());
        }
        let tokens = read_file(path, key)?;
        Ok(Self(tokens.iter().map(|t| seeded(name, t)).collect()))
    }

    /// The name of the token `given` is, if any. Every hash is compared.
    pub fn admits(&self, given: &str) -> Option<&str> {
        let hash = token_hash(given);
        self.0.iter().fold(None, |found, (name, h)| {
            if constant_time_eq(hash.as_bytes(), h.as_bytes()) {
                Some(name.as_str())
            } else {
                found
            }
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The tokens by name and hash.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter().map(|(n, h)| (n, h))
    }
}

/// The tokens of a token file: one per line, `#` comments and blank lines skipped, each at
/// least [`MIN_TOKEN_LEN`] characters without spaces, at least one. `key` names the file's
/// setting in errors (`admin.token_file`).
pub fn read_file(path: &Path, key: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{key}: cannot read {}", path.display()))?;
    let tokens = parse(&text).map_err(|line| {
        anyhow::anyhow!(
            "{key} {}: line {line}: a token is {MIN_TOKEN_LEN} characters or more, without spaces",
            path.display()
        )
    })?;
    anyhow::ensure!(
        !tokens.is_empty(),
        "{key} {}: no token (one per line)",
        path.display()
    );
    Ok(tokens)
}

/// The tokens of a token file's text, or the number of the first line that is not one.
fn parse(text: &str) -> Result<Vec<String>, usize> {
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let token = line.trim();
        if token.is_empty() || token.starts_with('#') {
            continue;
        }
        if token.len() < MIN_TOKEN_LEN || token.chars().any(char::is_whitespace) {
            return Err(i + 1);
        }
        tokens.push(token.to_owned());
    }
    Ok(tokens)
}

/// Where a listener's tokens come from: fixed at start (files), or the policy document's of
/// one kind, as they are now.
#[derive(Debug, Clone)]
pub enum Tokens {
    Fixed(Arc<TokenSet>),
    Policy(watch::Receiver<Snapshot>, TokenKind),
}

impl Tokens {
    /// The name of the token `given` is, if any.
    pub fn admits(&self, given: &str) -> Option<String> {
        match self {
            Self::Fixed(set) => set.admits(given).map(str::to_owned),
            Self::Policy(rx, kind) => rx.borrow().tokens(*kind).admits(given).map(str::to_owned),
        }
    }

    /// Whether there is no token at all (so none is asked for, or nobody gets in).
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Fixed(set) => set.is_empty(),
            Self::Policy(rx, kind) => rx.borrow().tokens(*kind).is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_tokens_are_hashed_named_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(
            &path,
            "# edge objects\n\n0123456789abcdef0123\nfedcba9876543210fedc\n",
        )
        .unwrap();
        let set = TokenSet::from_file(&path, "tokens", "edge").unwrap();
        let first = seeded("edge", "0123456789abcdef0123").0;
        assert_eq!(set.admits("0123456789abcdef0123"), Some(first.as_str()));
        assert!(first.starts_with("edge-") && first.len() == 13, "{first}");
        let second = set.admits("fedcba9876543210fedc").unwrap();
        assert_ne!(second, first);
        assert_eq!(set.admits("0123456789abcdef012"), None);
        assert_eq!(set.admits(""), None);
        assert!(set.iter().all(|(_, h)| h.len() == 64));
        std::fs::write(&path, "0123456789abcdef\nshort\n").unwrap();
        let short = read_file(&path, "key").unwrap_err().to_string();
        assert!(
            short.starts_with("key ") && short.contains("line 2"),
            "{short}"
        );
        std::fs::write(&path, "# none\n").unwrap();
        let none = read_file(&path, "key").unwrap_err().to_string();
        assert!(none.contains("no token"), "{none}");
        let missing = read_file(&dir.path().join("absent"), "key").unwrap_err();
        assert!(
            missing.to_string().starts_with("key: cannot read"),
            "{missing}"
        );
        assert!(
            TokenSet::from_file(Path::new(""), "key", "t")
                .unwrap()
                .is_empty()
        );
    }
}
