//! The two secrets of a mesh node: its identity key (kept in the data dir, created once; its
//! peer id is the node's id in the deployment) and the deployment's cluster key (32 random
//! bytes in libp2p's pre-shared key file format, shared by every node, in a file the operator
//! distributes; [`super::member`] says what it is for).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use libp2p::identity::Keypair;
use libp2p::pnet::PreSharedKey;

use crate::secret_file::write_secret;

/// File name of the identity key inside the data directory.
pub const IDENTITY_FILE: &str = "p2p-identity.key";

/// The node's identity key: read from `data_dir`, or created there on first use.
pub fn load_or_create_identity(data_dir: &Path) -> anyhow::Result<Keypair> {
    let path = data_dir.join(IDENTITY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Keypair::from_protobuf_encoding(&bytes)
            .with_context(|| format!("{}: not a libp2p identity key", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(data_dir)
                .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;
            let key = Keypair::generate_ed25519();
            let bytes = key
                .to_protobuf_encoding()
                .context("cannot encode the identity key")?;
            write_secret(&path, &bytes)?;
            tracing::info!(path = %path.display(), peer_id = %key.public().to_peer_id(), "created the node's identity key");
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Read a cluster key file (`/key/swarm/psk/1.0.0/`, `/base16/`, 64 hex digits).
pub fn load_cluster_key(path: &Path) -> anyhow::Result<PreSharedKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the cluster key {}", path.display()))?;
    text.parse::<PreSharedKey>().map_err(|e| {
        anyhow::anyhow!(
            "{}: not a cluster key ({e}); create one with `meridian keygen --cluster-key FILE`",
            path.display()
        )
    })
}

/// `meridian keygen --cluster-key FILE`: write a new random cluster key; refuses to overwrite.
pub fn keygen_command(path: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    if path.exists() {
        bail!(
            "{} exists already; a new key would lock every node using it out of the deployment",
            path.display()
        );
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
    let key = PreSharedKey::new(bytes);
    write_secret(path, key.to_string().as_bytes())?;
    writeln!(
        out,
        "wrote {} (fingerprint {}); give this file to every node of the deployment",
        path.display(),
        key.fingerprint()
    )?;
    Ok(())
}

/// `meridian peer-id --data-dir DIR`: the node's peer id, creating its identity if needed.
pub fn peer_id_command(data_dir: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    let key = load_or_create_identity(data_dir)?;
    writeln!(out, "{}", key.public().to_peer_id())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create_identity(dir.path()).unwrap();
        let b = load_or_create_identity(dir.path()).unwrap();
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
    }

    #[test]
    fn cluster_key_round_trips_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let mut out = Vec::new();
        keygen_command(&path, &mut out).unwrap();
        let key = load_cluster_key(&path).unwrap();
        let printed = String::from_utf8(out).unwrap();
        assert!(
            printed.contains(&key.fingerprint().to_string()),
            "{printed}"
        );
        assert!(keygen_command(&path, &mut Vec::new()).is_err());
        assert_eq!(
            load_cluster_key(&path).unwrap().fingerprint().to_string(),
            key.fingerprint().to_string()
        );
    }

    #[test]
    fn a_bad_cluster_key_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.key");
        std::fs::write(&path, "not a key\n").unwrap();
        let e = load_cluster_key(&path).unwrap_err().to_string();
        assert!(e.contains("bad.key") && e.contains("keygen"), "{e}");
    }
}
