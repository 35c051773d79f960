//! A long fat network in user space: two TUN devices joined by a delay line that does what
//! `tc netem` would (one-way delay, a rate limit with a bounded queue, random loss), for
//! kernels built without netem (this machine's: `CONFIG_NET_SCH_NETEM` is not set, and no
//! other qdisc delays packets). The namespace scripts (`scripts/lfn-hosts.py`) create the two
//! devices through `blobstream bench delay-line`, move one into each namespace and route
//! through them, so TCP between the namespaces sees a real bottleneck, a real RTT and real
//! losses.
//!
//! Each direction is modelled as a link: a packet arriving at `t` starts on the wire when the
//! link is free (`max(t, free)`), takes `len × 8 / rate`, then travels for `delay`. A packet
//! that would wait longer than the queue allows is dropped at the tail, as a router's full
//! queue drops it; `loss` drops packets at random (from a fixed seed, so a run is repeatable).
//!
//! The TUN devices are opened with one `ioctl(TUNSETIFF)` each, written here rather than
//! through a crate: the `tun` crates wrap the same call in an async, cross-platform API this
//! two-thread forwarder has no use for.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One direction's link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkShape {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Bottleneck rate in bits per second; 0: unlimited.
    pub rate_bps: u64,
    /// Longest a packet may wait in the bottleneck's queue before it is dropped.
    pub queue: Duration,
    /// Packets dropped at random, in parts per million.
    pub loss_ppm: u32,
    /// Seed of the loss pattern.
    pub seed: u64,
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Create (or attach to) the TUN device `name`: IP packets, no packet-information header.
/// The device lives as long as the returned file is open.
pub fn open_tun(name: &str) -> std::io::Result<File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("interface name {name:?} must be 1 to {} bytes", libc::IFNAMSIZ - 1),
        ));
    }
    let file = OpenOptions::new().read(true).write(true).open("/dev/net/tun")?;
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: IFF_TUN | IFF_NO_PI, _pad: [0; 22] };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: the descriptor is open; `req` is a properly sized, initialised `struct ifreq`
    // the kernel reads the name and flags from and writes the name back into.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

/// The schedule of one direction: when each packet leaves, or that it is dropped.
#[derive(Debug)]
pub struct Link {
    shape: LinkShape,
    free: Option<Instant>,
    rng: u64,
    pub dropped_queue: u64,
    pub dropped_loss: u64,
}

impl Link {
    pub fn new(shape: LinkShape) -> Self {
        Self { shape, free: None, rng: shape.seed | 1, dropped_queue: 0, dropped_loss: 0 }
    }

    /// When a packet of `len` bytes arriving at `now` is delivered at the far end, or `None`
    /// when it is lost.
    pub fn admit(&mut self, now: Instant, len: usize) -> Option<Instant> {
        if self.shape.loss_ppm > 0 && self.next_random() % 1_000_000 < self.shape.loss_ppm as u64 {
            self.dropped_loss += 1;
            return None;
        }
        let start = self.free.map_or(now, |f| f.max(now));
        if start - now > self.shape.queue {
            self.dropped_queue += 1;
            return None;
        }
        let wire = match self.shape.rate_bps {
            0 => Duration::ZERO,
            r => Duration::from_nanos((len as u64 * 8).saturating_mul(1_000_000_000) / r),
        };
        let done = start + wire;
        self.free = Some(done);
        Some(done + self.shape.delay)
    }

    /// xorshift64*: a fixed, seeded loss pattern.
    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Forward packets from `from` to `to` through `link`, until either device fails (the devices
/// close when the process ends). Two threads: one reads and schedules, one waits and writes.
fn forward(mut from: File, mut to: File, shape: LinkShape) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        for (due, pkt) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            // A packet the kernel refuses (the device is down for a moment) is a lost packet.
            let _ = to.write(&pkt);
        }
        Ok(())
    });
    let mut link = Link::new(shape);
    let mut buf = vec![0u8; 65536];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if let Some(due) = link.admit(Instant::now(), n)
            && tx.send((due, buf[..n].to_vec())).is_err()
        {
            break;
        }
    }
    drop(tx);
    writer.join().unwrap_or(Ok(()))
}

/// Create TUN devices `a` and `b`, call `ready` (the caller moves them into namespaces and
/// configures them), then forward both ways until the process is stopped.
pub fn run(
    a: &str,
    b: &str,
    a_to_b: LinkShape,
    b_to_a: LinkShape,
    ready: impl FnOnce(),
) -> std::io::Result<()> {
    let (ta, tb) = (open_tun(a)?, open_tun(b)?);
    let (ta2, tb2) = (ta.try_clone()?, tb.try_clone()?);
    ready();
    let back = std::thread::spawn(move || forward(tb2, ta2, b_to_a));
    let res = forward(ta, tb, a_to_b);
    back.join().unwrap_or(Ok(()))?;
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(rate_bps: u64, loss_ppm: u32) -> LinkShape {
        LinkShape {
            delay: Duration::from_millis(25),
            rate_bps,
            queue: Duration::from_millis(10),
            loss_ppm,
            seed: 7,
        }
    }

    #[test]
    fn packets_queue_behind_the_bottleneck_then_travel() {
        let mut link = Link::new(shape(8_000_000, 0)); // 1 byte per µs
        let t = Instant::now();
        let first = link.admit(t, 1000).unwrap();
        assert_eq!(first - t, Duration::from_micros(1000) + Duration::from_millis(25));
        // Arriving together, the second waits for the first to leave the wire.
        let second = link.admit(t, 1000).unwrap();
        assert_eq!(second - first, Duration::from_micros(1000));
        // An idle link does not bank credit.
        let later = t + Duration::from_secs(1);
        assert_eq!(link.admit(later, 500).unwrap() - later, Duration::from_micros(25_500));
    }

    #[test]
    fn a_full_queue_drops_at_the_tail() {
        let mut link = Link::new(shape(8_000_000, 0));
        let t = Instant::now();
        // 10 ms of queue at 1 byte/µs holds 10 packets of 1000 bytes behind the first.
        let admitted = (0..20).filter(|_| link.admit(t, 1000).is_some()).count();
        assert_eq!(admitted, 11);
        assert_eq!(link.dropped_queue, 9);
    }

    #[test]
    fn loss_follows_the_seed_at_about_the_rate_asked() {
        let run = || {
            let mut link = Link::new(shape(0, 10_000)); // 1 %
            let t = Instant::now();
            (0..100_000).map(|_| link.admit(t, 100).is_some()).collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b, "the same seed loses the same packets");
        let lost = a.iter().filter(|kept| !**kept).count();
        assert!((800..1200).contains(&lost), "{lost} of 100000 lost at 1 %");
    }
}
