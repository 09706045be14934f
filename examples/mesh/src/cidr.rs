//! Address ranges: the IP blocks of authorization policies, a gateway's trusted proxies.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IP address range in CIDR notation (`10.0.0.0/8`, `fd00::/8`), or one address
/// (`192.0.2.7`, the same as `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Why a [`Cidr`] did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// The part before the `/` is not an IP address.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// The prefix length is not a number up to 32 (IPv4) or 128 (IPv6).
    #[error("{0:?} is not a prefix length for this address family")]
    Prefix(String),
}

// === impl Cidr ===

impl Cidr {
    /// The range of `prefix` leading bits of `addr` (the other bits are ignored).
    ///
    /// # Errors
    ///
    /// When `prefix` is longer than the address (32 bits for IPv4, 128 for IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let bits = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > bits {
            return Err(CidrError::Prefix(prefix.to_string()));
        }
        Ok(Self {
            network: mask(addr, prefix),
            prefix,
        })
    }

    /// The first address of the range.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `addr` is in the range. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) counts
    /// as its IPv4 address.
    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = addr.to_canonical();
        match (self.network, addr) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                mask(addr, self.prefix) == self.network
            }
            _ => false,
        }
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let keep = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((u32::from(a) & keep).to_be_bytes())
        }
        IpAddr::V6(a) => {
            let keep = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((u128::from(a) & keep).to_be_bytes())
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| CidrError::Address(addr.to_owned()))?;
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .map_err(|_| CidrError::Prefix(p.to_owned()))?,
            None if addr.is_ipv4() => 32,
            None => 128,
        };
        Self::new(addr, prefix)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_single_addresses() {
        let net: Cidr = "10.1.0.0/16".parse().expect("cidr");
        assert!(net.contains("10.1.200.3".parse().expect("ip")));
        assert!(!net.contains("10.2.0.1".parse().expect("ip")));
        assert!(net.contains("::ffff:10.1.0.9".parse().expect("ip")));
        let one: Cidr = "192.0.2.7".parse().expect("cidr");
        assert_eq!(one.to_string(), "192.0.2.7/32");
        assert!(one.contains("192.0.2.7".parse().expect("ip")));
        assert!(!one.contains("192.0.2.8".parse().expect("ip")));
        let v6: Cidr = "fd00::/8".parse().expect("cidr");
        assert!(v6.contains("fd12::1".parse().expect("ip")));
        assert!(!v6.contains("10.0.0.1".parse().expect("ip")));
        let all: Cidr = "0.0.0.0/0".parse().expect("cidr");
        assert!(all.contains("203.0.113.1".parse().expect("ip")));
        assert!(matches!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::Prefix(_))
        ));
        assert!(matches!(
            "ten/8".parse::<Cidr>(),
            Err(CidrError::Address(_))
        ));
    }
}
