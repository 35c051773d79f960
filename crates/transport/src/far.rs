//! Send buffers for far peers. Kernel autotuning caps a TCP send buffer at the third value of
//! `net.ipv4.tcp_wmem` (4 MiB by default), and a sender keeps at most about that much data in
//! flight: one stream of a 50 ms path then stops near 420 Mbit/s whatever the link can carry.
//! A data connection whose shortest round trip so far is [`FAR_RTT`] or more is therefore
//! given a larger send buffer; near peers, and a buffer size the user chose, are left as they
//! are. The shortest round trip, not the smoothed one, so that a near peer behind a queue stays
//! near (a kept connection is looked at again for each transfer).
//!
//! How large: [`MAX_SEND_BUFFER`] (enough for 10 Gbit/s over 50 ms) when the process may go
//! past the host's `net.core.wmem_max` (`SO_SNDBUFFORCE`, which needs `CAP_NET_ADMIN`, as root
//! has), else `net.core.wmem_max` when that is more than autotuning would reach. The kernel
//! grants twice the size asked, half of it for its own bookkeeping. So that a large buffer
//! holds data in flight and not a queue of unsent bytes (memory, and a late error frame stuck
//! behind them), a far connection also sets `TCP_NOTSENT_LOWAT` to [`FAR_UNSENT`]: a writer
//! waits while that much is written but not yet sent, and the buffer's memory follows what the
//! path really has in flight. The receive side needs nothing: receive autotuning goes up to
//! `net.ipv4.tcp_rmem`'s maximum (6 MiB on older kernels, 32 MiB on newer ones).

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Duration;

/// A peer this far away (round trip) or farther is far.
pub const FAR_RTT: Duration = Duration::from_millis(5);

/// The most `SO_SNDBUF` asked for, whatever the host allows (the kernel grants twice this):
/// enough for 10 Gbit/s over 50 ms, or 1 Gbit/s over 500 ms, and a bound on what one
/// connection can have in flight.
pub const MAX_SEND_BUFFER: usize = 64 << 20;

/// Bytes a far connection keeps written but not yet sent (`TCP_NOTSENT_LOWAT`): a few
/// milliseconds of a fast link, so the sender never runs dry, and no more — bytes queued on
/// one connection of a copy over several cannot move to another that is done early (with
/// 4 MiB, 8 connections of a 1 Gbit/s link ended up to a quarter of a second apart).
pub const FAR_UNSENT: usize = 512 << 10;

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

/// The `SO_SNDBUF` a far connection may ask for without privileges, given the host's
/// `net.core.wmem_max` and autotuning's cap (`net.ipv4.tcp_wmem`'s maximum): `None` when
/// asking would not give more than autotuning does.
pub fn allowed_send_buffer(wmem_max: usize, autotune_max: usize) -> Option<usize> {
    // The kernel grants twice what is asked (half of it for its own bookkeeping, as
    // autotuning's cap counts it too).
    let ask = wmem_max.min(MAX_SEND_BUFFER);
    (ask.saturating_mul(2) > autotune_max).then_some(ask)
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

/// How a far connection's send buffer was sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FarBuffer {
    /// Past `net.core.wmem_max` (`SO_SNDBUFFORCE`): this many bytes asked for.
    Forced(usize),
    /// Within `net.core.wmem_max` (`SO_SNDBUF`): this many bytes asked for.
    Allowed(usize),
}

/// Raise the send buffer of the connected socket `s` if its peer is far (see the top of this
/// file); how, if it did. Best effort: a socket the kernel refuses this keeps autotuning.
pub fn size_for_path(s: &TcpStream) -> Option<FarBuffer> {
    if rtt(s)? < FAR_RTT {
        return None;
    }
    let (wmem_max, autotune) = limits()?;
    size_as_far(s, wmem_max, autotune)
}

/// Give `s` a far connection's send buffer whatever its round trip; `None` when autotuning
/// already goes as far (or the kernel refused).
fn size_as_far(s: &TcpStream, wmem_max: usize, autotune: usize) -> Option<FarBuffer> {
    let sized = if MAX_SEND_BUFFER * 2 > autotune
        && crate::sockopt::set_int(s, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, MAX_SEND_BUFFER)
            .is_ok()
    {
        FarBuffer::Forced(MAX_SEND_BUFFER)
    } else {
        let n = allowed_send_buffer(wmem_max, autotune)?;
        socket2::SockRef::from(s).set_send_buffer_size(n).ok()?;
        FarBuffer::Allowed(n)
    };
    // Best effort too: without it the buffer still works, only holds unsent bytes as well.
    let _ = crate::sockopt::set_int(s, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, FAR_UNSENT);
    Some(sized)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    const MIB: usize = 1 << 20;

    #[test]
    fn without_privilege_a_far_peer_gets_what_the_host_allows_past_autotuning() {
        assert_eq!(allowed_send_buffer(4 * MIB, 4 * MIB), Some(4 * MIB));
        // A host whose autotuning already goes further than SO_SNDBUF may: left alone.
        assert_eq!(allowed_send_buffer(4 * MIB, 8 * MIB), None);
        assert_eq!(allowed_send_buffer(208 * 1024, 4 * MIB), None);
        // A host allowing more than the cap gets the cap.
        assert_eq!(allowed_send_buffer(1 << 30, 4 * MIB), Some(MAX_SEND_BUFFER));
    }

    #[test]
    fn a_far_connection_gets_a_large_buffer_and_a_bound_on_unsent_bytes() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (wmem_max, autotune) = (4 * MIB, 4 * MIB);
        let sized = size_as_far(&c, wmem_max, autotune).expect("a far buffer");
        let got = socket2::SockRef::from(&c).send_buffer_size().unwrap();
        // The kernel grants twice the size asked for.
        match sized {
            // Privileged (CAP_NET_ADMIN, as root has): past the host's limit.
            FarBuffer::Forced(n) => assert_eq!((n, got), (MAX_SEND_BUFFER, 2 * MAX_SEND_BUFFER)),
            // Not: what the host allows, no more.
            FarBuffer::Allowed(n) => {
                let host = std::fs::read_to_string("/proc/sys/net/core/wmem_max").unwrap();
                assert_eq!(n, wmem_max);
                assert_eq!(got, 2 * n.min(host.trim().parse().unwrap()));
            }
        }
        assert_eq!(
            crate::sockopt::get_int(&c, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT).unwrap(),
            FAR_UNSENT
        );
        // Autotuning that already goes past the cap is left alone.
        let d = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let before = socket2::SockRef::from(&d).send_buffer_size().unwrap();
        assert_eq!(size_as_far(&d, 1 << 30, 4 * MAX_SEND_BUFFER), None);
        assert_eq!(socket2::SockRef::from(&d).send_buffer_size().unwrap(), before);
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
