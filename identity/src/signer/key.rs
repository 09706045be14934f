//! Reading the CA's private key.

use rcgen::KeyPair;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use super::CaLoadError;

/// A private key from PEM: PKCS#8, or SEC1 (which rcgen's ring backend cannot read, so it is
/// wrapped in PKCS#8 here).
pub(super) fn parse_key(pem: &str) -> Result<KeyPair, CaLoadError> {
    let der = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(CaLoadError::KeyPem)?;
    if let PrivateKeyDer::Sec1(sec1) = &der {
        // The curve is not known before parsing; ring checks it against the one named here.
        for curve in [oid::P256, oid::P384] {
            let pkcs8 = PrivatePkcs8KeyDer::from(sec1_to_pkcs8(sec1.secret_sec1_der(), curve));
            if let Ok(key) = KeyPair::try_from(&PrivateKeyDer::Pkcs8(pkcs8)) {
                return Ok(key);
            }
        }
    }
    KeyPair::try_from(&der).map_err(CaLoadError::UnsupportedKey)
}

/// DER encodings of the object identifiers a PKCS#8 EC key names.
mod oid {
    /// id-ecPublicKey (1.2.840.10045.2.1).
    pub(super) const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    /// prime256v1 (1.2.840.10045.3.1.7).
    pub(super) const P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    /// secp384r1 (1.3.132.0.34).
    pub(super) const P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
}

/// RFC 5208 PrivateKeyInfo { version 0, { id-ecPublicKey, curve }, OCTET STRING { sec1 } }.
fn sec1_to_pkcs8(sec1: &[u8], curve: &[u8]) -> Vec<u8> {
    let algorithm = der_tlv(0x30, &[oid::EC_PUBLIC_KEY, curve].concat());
    let version = [0x02, 0x01, 0x00];
    der_tlv(
        0x30,
        &[&version[..], &algorithm, &der_tlv(0x04, sec1)].concat(),
    )
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}
