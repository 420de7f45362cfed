//! TLS for the `tls` and `wss` listeners, the edge-link listener and the admin API, and for
//! `meridian ctl`'s requests to it (rustls with PEM files).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};

use crate::config::ListenerConfig;

/// A TLS acceptor from the listener's `cert` (PEM chain) and `key` (PEM private key).
pub fn acceptor(l: &ListenerConfig) -> anyhow::Result<TlsAcceptor> {
    let cert_path = l.cert.as_ref().context("no cert configured")?;
    let key_path = l.key.as_ref().context("no key configured")?;
    let client_ca = l.client_ca.as_deref().filter(|p| !p.as_os_str().is_empty());
    build(cert_path, key_path, client_ca, l.require_client_cert)
}

/// The certificates of a PEM file, as trust anchors.
fn roots(ca_path: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_path)
        .with_context(|| format!("cannot read {}", ca_path.display()))?
    {
        let cert = cert.with_context(|| format!("bad PEM in {}", ca_path.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("bad CA certificate in {}", ca_path.display()))?;
    }
    anyhow::ensure!(!roots.is_empty(), "no certificate in {}", ca_path.display());
    Ok(roots)
}

/// A TLS client that trusts the certificates of `ca` (PEM): `meridian ctl --admin-ca`.
pub fn client_connector(ca: &Path) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots(ca)?)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A TLS acceptor that asks for no client certificate.
pub fn server_acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    build(cert, key, None, false)
}

fn build(
    cert_path: &Path,
    key_path: &Path,
    client_ca: Option<&Path>,
    require_client_cert: bool,
) -> anyhow::Result<TlsAcceptor> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .with_context(|| format!("cannot read {}", cert_path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("bad PEM in {}", cert_path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "no certificate in {}",
        cert_path.display()
    );
    let key = PrivateKeyDer::from_pem_file(key_path)
        .with_context(|| format!("cannot read a private key from {}", key_path.display()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca_path) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca_path)?), provider);
            let verifier = if require_client_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            builder
                .with_client_cert_verifier(verifier.build().context("client certificate verifier")?)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .context("certificate and key do not match")?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The subject Common Name of a DER certificate (the identity of a verified client
/// certificate), if it has one. A minimal DER walk: Certificate → TBSCertificate → subject.
pub fn common_name(cert: &[u8]) -> Option<String> {
    let (tag, cert, _) = tlv(cert)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, tbs, _) = tlv(cert)?;
    if tag != 0x30 {
        return None;
    }
    // [0] version (optional), serial, signature, issuer, validity, subject.
    let mut rest = tbs;
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xA0 {
        rest = after;
    }
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (tag, mut subject, _) = tlv(rest)?;
    if tag != 0x30 {
        return None;
    }
    while !subject.is_empty() {
        let (_, mut set, next) = tlv(subject)?;
        subject = next;
        while !set.is_empty() {
            let (_, attr, next) = tlv(set)?;
            set = next;
            let (tag, oid, value) = tlv(attr)?;
            if tag == 0x06 && oid == [0x55, 0x04, 0x03] {
                let (_, text, _) = tlv(value)?;
                return String::from_utf8(text.to_vec()).ok();
            }
        }
    }
    None
}

/// One DER tag-length-value: (tag, content, rest).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *input.first()?;
    let first = *input.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7F);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for b in input.get(2..2 + n)? {
            len = (len << 8) | usize::from(*b);
        }
        (len, 2 + n)
    };
    let content = input.get(header..header.checked_add(len)?)?;
    Some((tag, content, &input[header + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_name_of_a_generated_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Meridian");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "device-42");
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(common_name(cert.der()).as_deref(), Some("device-42"));
        assert_eq!(common_name(&cert.der()[..40]), None);
        assert_eq!(common_name(b"junk"), None);
    }
}
