//! Source addresses as the per-address limits count them: an IPv4 address, or the /64
//! network of an IPv6 one (one host usually holds a whole /64, so counting its addresses one
//! by one would multiply its share).

use std::net::{IpAddr, Ipv6Addr};

/// The key a per-address limit counts `ip` under.
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
        let key = |s: &str| source_key(s.parse().unwrap());
        assert_eq!(key("192.0.2.7"), key("::ffff:192.0.2.7"));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }
}
