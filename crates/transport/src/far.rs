//! Send buffers for far peers. Kernel autotuning caps a TCP send buffer at the third value of
//! `net.ipv4.tcp_wmem` (4 MiB by default), and a sender keeps at most about that much data in
//! flight: one stream of a 50 ms path then stops near 420 Mbit/s whatever the link can carry.
//! A data connection whose shortest round trip so far is [`FAR_RTT`] or more therefore asks for
//! the largest `SO_SNDBUF` the host allows (`net.core.wmem_max`, which the kernel doubles for
//! its own bookkeeping, capped at [`MAX_SEND_BUFFER`]) when that is more than autotuning would
//! reach; near peers, and a buffer size the user chose, are left as they are. The shortest
//! round trip, not the smoothed one, so that a near peer behind a queue stays near (a kept
//! connection is looked at again for each transfer). The receive side needs nothing: receive
//! autotuning goes up to `net.ipv4.tcp_rmem`'s maximum (6 MiB on older kernels, 32 MiB on
//! newer ones).

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Duration;

/// A peer this far away (round trip) or farther is far.
pub const FAR_RTT: Duration = Duration::from_millis(5);

/// The most `SO_SNDBUF` asked for, whatever the host allows (the kernel grants twice this):
/// enough for 1 Gbit/s over 250 ms, and a bound on what one connection can queue.
pub const MAX_SEND_BUFFER: usize = 64 << 20;

/// The shortest round trip the kernel has measured on `s` (`TCP_INFO`'s `tcpi_min_rtt`;
/// right after the handshake, the handshake's own), if it has one.
pub fn rtt(s: &TcpStream) -> Option<Duration> {
    // SAFETY: `tcp_info` is plain old data, and getsockopt writes at most `len` bytes of it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0 && info.tcpi_min_rtt > 0 && info.tcpi_min_rtt != u32::MAX)
        .then(|| Duration::from_micros(u64::from(info.tcpi_min_rtt)))
}

/// The `SO_SNDBUF` to ask for on a path with round trip `rtt`, given the host's
/// `net.core.wmem_max` and autotuning's cap (`net.ipv4.tcp_wmem`'s maximum): `None` when the
/// peer is near or asking would not give more than autotuning does.
pub fn send_buffer_for(rtt: Duration, wmem_max: usize, autotune_max: usize) -> Option<usize> {
    // The kernel grants twice what is asked (half of it for its own bookkeeping, as
    // autotuning's cap counts it too).
    let ask = wmem_max.min(MAX_SEND_BUFFER);
    (rtt >= FAR_RTT && ask.saturating_mul(2) > autotune_max).then_some(ask)
}

/// The host's limits: (`net.core.wmem_max`, the maximum of `net.ipv4.tcp_wmem`), read once.
fn limits() -> Option<(usize, usize)> {
    static LIMITS: OnceLock<Option<(usize, usize)>> = OnceLock::new();
    *LIMITS.get_or_init(|| {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let wmem_max = read("/proc/sys/net/core/wmem_max")?.trim().parse().ok()?;
        let autotune =
            read("/proc/sys/net/ipv4/tcp_wmem")?.split_whitespace().nth(2)?.parse().ok()?;
        Some((wmem_max, autotune))
    })
}

/// Raise the send buffer of the connected socket `s` if its peer is far (see the top of this
/// file); the size asked for, if it did. Best effort: a socket the kernel refuses this keeps
/// autotuning.
pub fn size_for_path(s: &TcpStream) -> Option<usize> {
    let (rtt, (wmem_max, autotune)) = (rtt(s)?, limits()?);
    let n = send_buffer_for(rtt, wmem_max, autotune)?;
    socket2::SockRef::from(s).set_send_buffer_size(n).ok()?;
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    const MIB: usize = 1 << 20;

    #[test]
    fn only_far_peers_get_more_than_autotuning() {
        let far = Duration::from_millis(50);
        assert_eq!(send_buffer_for(far, 4 * MIB, 4 * MIB), Some(4 * MIB));
        assert_eq!(send_buffer_for(FAR_RTT, 4 * MIB, 4 * MIB), Some(4 * MIB));
        // Near: autotuning is enough.
        assert_eq!(send_buffer_for(Duration::from_micros(4999), 4 * MIB, 4 * MIB), None);
        // A host whose autotuning already goes further than SO_SNDBUF may: left alone.
        assert_eq!(send_buffer_for(far, 4 * MIB, 8 * MIB), None);
        assert_eq!(send_buffer_for(far, 208 * 1024, 4 * MIB), None);
        // A host allowing more than the cap gets the cap.
        assert_eq!(send_buffer_for(far, 1 << 30, 4 * MIB), Some(MAX_SEND_BUFFER));
    }

    #[test]
    fn a_loopback_peer_is_near_and_keeps_autotuning() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // The handshake's round trip (the kernel may report none at all for loopback). A
        // loaded machine can delay one handshake past FAR_RTT: then the pair is made again.
        let near = |s: &TcpStream| rtt(s).is_none_or(|r| r < FAR_RTT);
        let (c, a) = (0..20)
            .map(|_| {
                let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
                (c, l.accept().unwrap().0)
            })
            .find(|(c, a)| near(c) && near(a))
            .expect("no loopback handshake under 5 ms in 20 tries");
        for s in [&c, &a] {
            let before = socket2::SockRef::from(s).send_buffer_size().unwrap();
            assert_eq!(size_for_path(s), None);
            assert_eq!(socket2::SockRef::from(s).send_buffer_size().unwrap(), before);
        }
    }
}
