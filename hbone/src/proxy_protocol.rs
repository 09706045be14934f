//! PROXY protocol version 2 headers, sent to the local application before the tunnel's bytes
//! so it learns the original client address and the client's verified SPIFFE ID.

use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use meshkit_identity::SpiffeId;

/// The 12-byte signature that starts every version 2 header.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// TLV type carrying the peer's SPIFFE ID (an application-specific type, 0xD0).
pub const TLV_PEER_SPIFFE_ID: u8 = 0xD0;

/// Builds a PROXY v2 header (command PROXY, stream transport) for a connection from `source`
/// to `destination`, with the SPIFFE ID of the peer in TLV 0xD0.
///
/// When the two addresses are of different families the IPv4 one is written as an IPv4-mapped
/// IPv6 address, since a header carries one family.
pub fn header(source: SocketAddr, destination: SocketAddr, peer: &SpiffeId) -> Bytes {
    let id = peer.as_str().as_bytes();
    // SPIFFE IDs are at most 2,048 bytes, far below the u16 TLV length.
    let tlv_len = 3 + id.len();
    let mut out = BytesMut::with_capacity(16 + 36 + tlv_len);
    out.put_slice(&SIGNATURE);
    out.put_u8(0x21); // version 2, command PROXY
    match (source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            out.put_u8(0x11); // AF_INET, STREAM
            out.put_u16((12 + tlv_len) as u16);
            out.put_slice(&s.ip().octets());
            out.put_slice(&d.ip().octets());
        }
        (s, d) => {
            out.put_u8(0x21); // AF_INET6, STREAM
            out.put_u16((36 + tlv_len) as u16);
            out.put_slice(&v6(s).octets());
            out.put_slice(&v6(d).octets());
        }
    }
    out.put_u16(source.port());
    out.put_u16(destination.port());
    out.put_u8(TLV_PEER_SPIFFE_ID);
    out.put_u16(id.len() as u16);
    out.put_slice(id);
    out.freeze()
}

fn v6(addr: SocketAddr) -> std::net::Ipv6Addr {
    match addr {
        SocketAddr::V4(a) => a.ip().to_ipv6_mapped(),
        SocketAddr::V6(a) => *a.ip(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_layout() {
        let peer: SpiffeId = "spiffe://td/ns/a/sa/b".parse().unwrap();
        let h = header(
            "10.0.0.1:1234".parse().unwrap(),
            "127.0.0.1:80".parse().unwrap(),
            &peer,
        );
        assert_eq!(&h[..12], &SIGNATURE);
        assert_eq!(h[12], 0x21);
        assert_eq!(h[13], 0x11);
        let len = u16::from_be_bytes([h[14], h[15]]) as usize;
        assert_eq!(h.len(), 16 + len);
        assert_eq!(&h[16..20], &[10, 0, 0, 1]);
        assert_eq!(&h[20..24], &[127, 0, 0, 1]);
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 1234);
        assert_eq!(u16::from_be_bytes([h[26], h[27]]), 80);
        assert_eq!(h[28], TLV_PEER_SPIFFE_ID);
        assert_eq!(
            u16::from_be_bytes([h[29], h[30]]) as usize,
            peer.as_str().len()
        );
        assert_eq!(&h[31..], peer.as_str().as_bytes());
    }

    #[test]
    fn mixed_families_use_ipv6() {
        let peer: SpiffeId = "spiffe://td/x".parse().unwrap();
        let h = header(
            "[::1]:5".parse().unwrap(),
            "127.0.0.1:6".parse().unwrap(),
            &peer,
        );
        assert_eq!(h[13], 0x21);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]) as usize, 36 + 3 + 13);
        assert_eq!(
            &h[32..48],
            &std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets()
        );
    }
}
