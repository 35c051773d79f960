//! The three steps of negotiation (GOPI): the initiator proposes a [`Profile`], the peer
//! answers with what it can meet — the proposal, each field at most as demanding, naming what it
//! lowered and why ([`counter`]) — or refuses with a reason, and the initiator takes the offer or
//! refuses it ([`judge`], against its [`Floor`]). The same rules serve opening a binding (over
//! the control plane) and renegotiating a live one (in `RENEG` frames).

use crate::error::Refusal;
use crate::qos::{Codec, Flow, LayerSpec, Profile, TransportKind};

/// What a peer can meet. Built from its configuration.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most bytes per second this peer gives one binding; 0: no limit.
    pub max_throughput_bps: u64,
    /// Tightest latency bound this peer promises, µs.
    pub min_latency_us: u32,
    /// Tightest jitter bound this peer promises, µs.
    pub min_jitter_us: u32,
    /// Highest priority this peer grants.
    pub max_priority: u8,
    /// Largest message this peer takes (and the default when none is asked).
    pub max_message: u32,
    /// Transports this peer has an address for.
    pub transports: Vec<TransportKind>,
    /// The peer has a TLS certificate, so "encrypt" can be met.
    pub tls: bool,
    /// Highest zstd level this peer spends CPU on.
    pub max_zstd_level: i32,
    /// Smallest and largest fragment size.
    pub fragment_range: (u32, u32),
    /// Bulk transfers: chunk size range and default, largest socket buffer.
    pub chunk_range: (u32, u32),
    pub default_chunk: u32,
    pub max_socket_buffer: u32,
    /// Digest algorithms this peer computes, preferred first.
    pub digests: Vec<String>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_throughput_bps: 0,
            min_latency_us: 0,
            min_jitter_us: 0,
            max_priority: 7,
            max_message: 16 << 20,
            transports: vec![TransportKind::Tcp],
            tls: false,
            max_zstd_level: 9,
            fragment_range: (512, 16 << 20),
            chunk_range: (4 << 10, 64 << 20),
            default_chunk: 1 << 20,
            max_socket_buffer: 64 << 20,
            digests: vec!["xxh3-128".into(), "blake3".into()],
        }
    }
}

/// The peer's answer: the profile it can meet and, per lowered field, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub profile: Profile,
    pub lowered: Vec<String>,
}

/// Step two: what `limits` can meet of `proposal`, or why nothing can be.
pub fn counter(proposal: &Profile, limits: &Limits) -> Result<Offer, Refusal> {
    let mut p = proposal.clone();
    let mut lowered = Vec::new();

    // Transport: the first the initiator accepts that this peer has and the flow allows.
    let asked =
        if p.transports.is_empty() { vec![TransportKind::Tcp] } else { p.transports.clone() };
    let usable = |t: &TransportKind| {
        limits.transports.contains(t)
            && (*t != TransportKind::Unix || !p.wants_encryption())
            && (*t != TransportKind::Udp
                || (p.loss_ppm > 0 && p.flow == Flow::Stream && !p.wants_encryption()))
    };
    let Some(chosen) = asked.iter().copied().find(usable) else {
        if asked.contains(&TransportKind::Udp) && limits.transports.contains(&TransportKind::Udp) {
            return Err(Refusal::Unmeetable(
                "udp carries only one-way streams that tolerate loss (loss_ppm > 0), without \
                 encryption"
                    .into(),
            ));
        }
        return Err(Refusal::NoTransport {
            asked: asked.iter().map(|t| t.name().into()).collect(),
            offered: limits.transports.iter().map(|t| t.name().into()).collect(),
        });
    };
    p.transports = vec![chosen];
    if chosen != TransportKind::Udp {
        // A reliable transport delivers everything: no loss to tolerate.
        p.loss_ppm = 0;
    }

    if limits.max_throughput_bps > 0
        && (p.throughput_bps == 0 || p.throughput_bps > limits.max_throughput_bps)
    {
        lowered.push(format!(
            "throughput {} → {} B/s: this peer's per-binding limit",
            show(p.throughput_bps),
            limits.max_throughput_bps
        ));
        p.throughput_bps = limits.max_throughput_bps;
    }
    if p.latency_us > 0 && p.latency_us < limits.min_latency_us {
        lowered.push(format!(
            "latency bound {} → {} µs: the tightest this peer promises",
            p.latency_us, limits.min_latency_us
        ));
        p.latency_us = limits.min_latency_us;
    }
    if p.jitter_us > 0 && p.jitter_us < limits.min_jitter_us {
        lowered.push(format!(
            "jitter bound {} → {} µs: the tightest this peer promises",
            p.jitter_us, limits.min_jitter_us
        ));
        p.jitter_us = limits.min_jitter_us;
    }
    if p.priority > limits.max_priority {
        lowered.push(format!(
            "priority {} → {}: the highest this peer grants",
            p.priority, limits.max_priority
        ));
        p.priority = limits.max_priority;
    }
    if p.max_message == 0 {
        p.max_message = limits.max_message;
    } else if p.max_message > limits.max_message {
        lowered.push(format!(
            "largest message {} → {} bytes: this peer's limit",
            p.max_message, limits.max_message
        ));
        p.max_message = limits.max_message;
    }

    let mut layers = Vec::with_capacity(p.layers.len());
    for l in &p.layers {
        match *l {
            LayerSpec::Encrypt if !limits.tls => return Err(Refusal::EncryptionUnavailable),
            LayerSpec::Compress(Codec::Zstd(level)) if level > limits.max_zstd_level => {
                lowered.push(format!(
                    "zstd level {level} → {}: the highest this peer spends CPU on",
                    limits.max_zstd_level
                ));
                layers.push(LayerSpec::Compress(Codec::Zstd(limits.max_zstd_level)));
            }
            LayerSpec::Fragment(n) => {
                let (lo, hi) = limits.fragment_range;
                let m = n.clamp(lo, hi);
                if m != n {
                    lowered.push(format!("fragment size {n} → {m}: this peer takes {lo}..={hi}"));
                }
                layers.push(LayerSpec::Fragment(m));
            }
            LayerSpec::Pace(rate)
                if limits.max_throughput_bps > 0 && rate > limits.max_throughput_bps =>
            {
                lowered.push(format!(
                    "pace {rate} → {} B/s: this peer's per-binding limit",
                    limits.max_throughput_bps
                ));
                layers.push(LayerSpec::Pace(limits.max_throughput_bps));
            }
            other => layers.push(other),
        }
    }
    p.layers = layers;

    if chosen == TransportKind::Udp {
        // One message, one datagram: pieces of a message would be lost independently.
        if p.layers.iter().any(|l| matches!(l, LayerSpec::Fragment(_))) {
            lowered.push("fragment layer dropped: over udp one message is one datagram".into());
            p.layers.retain(|l| !matches!(l, LayerSpec::Fragment(_)));
        }
        let headers: usize =
            crate::layers::Stack::new(&p.layers, 0, Default::default()).wire_qos().max_message;
        let fit = (crate::udp::MAX_DATAGRAM - bs_wire::HEADER_LEN - headers) as u32;
        if p.max_message > fit {
            lowered.push(format!(
                "largest message {} → {fit} bytes: one udp datagram with its headers",
                p.max_message
            ));
            p.max_message = fit;
        }
    }

    // Bulk-transfer parameters (what `Negotiate` took on its own before bindings).
    let (lo, hi) = limits.chunk_range;
    let chunk = if p.chunk_size == 0 { limits.default_chunk } else { p.chunk_size.clamp(lo, hi) };
    if p.chunk_size != 0 && chunk != p.chunk_size {
        lowered.push(format!("chunk size {} → {chunk}: this peer takes {lo}..={hi}", p.chunk_size));
    }
    p.chunk_size = chunk;
    for (what, v) in [("send buffer", &mut p.send_buffer), ("receive buffer", &mut p.recv_buffer)] {
        if *v > limits.max_socket_buffer {
            lowered.push(format!(
                "{what} {v} → {}: this peer's largest socket buffer",
                limits.max_socket_buffer
            ));
            *v = limits.max_socket_buffer;
        }
    }
    let digest = if p.digests.is_empty() {
        limits.digests.first().cloned()
    } else {
        p.digests.iter().find(|d| limits.digests.contains(d)).cloned()
    };
    match digest {
        Some(d) => p.digests = vec![d],
        None => return Err(Refusal::NoCommonDigest(p.digests.clone())),
    }

    Ok(Offer { profile: p, lowered })
}

fn show(bps: u64) -> String {
    if bps == 0 { "unlimited".into() } else { bps.to_string() }
}

/// The least the initiator takes; an offer below it is refused in step three.
#[derive(Debug, Clone, Default)]
pub struct Floor {
    /// Least throughput acceptable (B/s); 0: anything.
    pub min_throughput_bps: u64,
    /// Loosest latency bound acceptable (µs); 0: anything.
    pub max_latency_us: u32,
    /// Loosest jitter bound acceptable (µs); 0: anything.
    pub max_jitter_us: u32,
    /// Least priority acceptable.
    pub min_priority: u8,
    /// Every asked-for layer must be in the offer (parameters may be lowered).
    pub all_layers: bool,
}

/// Step three: take the `offer` for `proposal`, or say why not. An offer that is more
/// demanding than the proposal in any field is refused too: a peer may only lower.
pub fn judge(proposal: &Profile, offer: &Profile, floor: &Floor) -> Result<(), Refusal> {
    if proposal.throughput_bps > 0 && offer.throughput_bps > proposal.throughput_bps {
        return Err(Refusal::Raised("throughput"));
    }
    if offer.priority > proposal.priority {
        return Err(Refusal::Raised("priority"));
    }
    if proposal.max_message > 0 && offer.max_message > proposal.max_message {
        return Err(Refusal::Raised("largest message"));
    }
    if proposal.latency_us > 0 && offer.latency_us < proposal.latency_us {
        return Err(Refusal::Raised("latency bound"));
    }
    if offer.layers.len() > proposal.layers.len() {
        return Err(Refusal::Raised("layers"));
    }
    if proposal.wants_encryption() && !offer.wants_encryption() {
        return Err(Refusal::BelowFloor("encryption was asked for and is not offered".into()));
    }
    if floor.min_throughput_bps > 0
        && offer.throughput_bps != 0
        && offer.throughput_bps < floor.min_throughput_bps
    {
        return Err(Refusal::BelowFloor(format!(
            "throughput {} B/s offered, at least {} required",
            offer.throughput_bps, floor.min_throughput_bps
        )));
    }
    if floor.max_latency_us > 0 && offer.latency_us > floor.max_latency_us {
        return Err(Refusal::BelowFloor(format!(
            "latency bound {} µs offered, at most {} µs required",
            offer.latency_us, floor.max_latency_us
        )));
    }
    if floor.max_jitter_us > 0 && offer.jitter_us > floor.max_jitter_us {
        return Err(Refusal::BelowFloor(format!(
            "jitter bound {} µs offered, at most {} µs required",
            offer.jitter_us, floor.max_jitter_us
        )));
    }
    if offer.priority < floor.min_priority {
        return Err(Refusal::BelowFloor(format!(
            "priority {} offered, at least {} required",
            offer.priority, floor.min_priority
        )));
    }
    if floor.all_layers {
        let kind = |l: &LayerSpec| std::mem::discriminant(l);
        if let Some(missing) =
            proposal.layers.iter().find(|l| !offer.layers.iter().any(|o| kind(o) == kind(l)))
        {
            return Err(Refusal::BelowFloor(format!("layer {missing} is not offered")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::SumAlgo;
    use std::time::Duration;

    fn limits() -> Limits {
        Limits {
            max_throughput_bps: 100 << 20,
            min_latency_us: 500,
            max_priority: 5,
            max_message: 1 << 20,
            transports: vec![TransportKind::Tcp, TransportKind::Udp],
            ..Limits::default()
        }
    }

    #[test]
    fn a_modest_proposal_is_offered_back_unchanged() {
        let p = Profile::builder()
            .throughput(10 << 20)
            .latency(Duration::from_millis(2))
            .priority(3)
            .max_message(4096)
            .layer(LayerSpec::Checksum(SumAlgo::Xxh3))
            .build()
            .unwrap();
        let o = counter(&p, &limits()).unwrap();
        assert!(o.lowered.is_empty(), "{:?}", o.lowered);
        assert_eq!(o.profile.throughput_bps, p.throughput_bps);
        assert_eq!(o.profile.layers, p.layers);
        assert_eq!(o.profile.transports, vec![TransportKind::Tcp]);
        judge(&p, &o.profile, &Floor::default()).unwrap();
    }

    #[test]
    fn what_the_peer_cannot_meet_is_lowered_and_named() {
        let p = Profile::builder()
            .throughput(1 << 30)
            .latency(Duration::from_micros(50))
            .priority(7)
            .max_message(64 << 20)
            .layer(LayerSpec::Compress(Codec::Zstd(19)))
            .layer(LayerSpec::Fragment(64))
            .build()
            .unwrap();
        let o = counter(&p, &limits()).unwrap();
        assert_eq!(o.profile.throughput_bps, 100 << 20);
        assert_eq!(o.profile.latency_us, 500);
        assert_eq!(o.profile.priority, 5);
        assert_eq!(o.profile.max_message, 1 << 20);
        assert_eq!(
            o.profile.layers,
            vec![LayerSpec::Compress(Codec::Zstd(9)), LayerSpec::Fragment(512)]
        );
        assert_eq!(o.lowered.len(), 6, "{:#?}", o.lowered);
        assert!(o.lowered.iter().any(|l| l.starts_with("priority 7 → 5")));
        // An initiator without a floor takes it; one that needs 500 MB/s does not.
        judge(&p, &o.profile, &Floor::default()).unwrap();
        let floor = Floor { min_throughput_bps: 500 << 20, ..Floor::default() };
        let e = judge(&p, &o.profile, &floor).unwrap_err();
        assert!(matches!(e, Refusal::BelowFloor(_)), "{e}");
    }

    #[test]
    fn unmeetable_profiles_are_refused_with_the_reason() {
        let enc = Profile::builder().layer(LayerSpec::Encrypt).build().unwrap();
        assert_eq!(counter(&enc, &limits()), Err(Refusal::EncryptionUnavailable));
        let unix = Profile::builder().transport(TransportKind::Unix).build().unwrap();
        assert!(matches!(counter(&unix, &limits()), Err(Refusal::NoTransport { .. })));
        let reliable_udp = Profile::builder().transport(TransportKind::Udp).build().unwrap();
        assert!(matches!(counter(&reliable_udp, &limits()), Err(Refusal::Unmeetable(_))));
        let digest = Profile::builder().digest("md5").build().unwrap();
        assert!(matches!(counter(&digest, &limits()), Err(Refusal::NoCommonDigest(_))));
    }

    #[test]
    fn udp_is_chosen_only_for_lossy_streams() {
        let p = Profile::builder()
            .loss_ppm(1000)
            .transport(TransportKind::Udp)
            .transport(TransportKind::Tcp)
            .build()
            .unwrap();
        assert_eq!(counter(&p, &limits()).unwrap().profile.transports, vec![TransportKind::Udp]);
        let rr = Profile { flow: Flow::RequestReply, ..p };
        let o = counter(&rr, &limits()).unwrap();
        assert_eq!(o.profile.transports, vec![TransportKind::Tcp]);
        assert_eq!(o.profile.loss_ppm, 0, "tcp loses nothing");
    }

    #[test]
    fn encryption_is_never_offered_over_a_unix_socket() {
        let l = Limits {
            tls: true,
            transports: vec![TransportKind::Unix, TransportKind::Tcp],
            ..limits()
        };
        let p = Profile::builder()
            .transport(TransportKind::Unix)
            .transport(TransportKind::Tcp)
            .layer(LayerSpec::Encrypt)
            .build()
            .unwrap();
        assert_eq!(counter(&p, &l).unwrap().profile.transports, vec![TransportKind::Tcp]);
        let only_unix = Profile { transports: vec![TransportKind::Unix], ..p };
        assert!(matches!(counter(&only_unix, &l), Err(Refusal::NoTransport { .. })));
    }

    #[test]
    fn over_udp_a_message_fits_one_datagram() {
        let p = Profile::builder()
            .loss_ppm(100)
            .transport(TransportKind::Udp)
            .layer(LayerSpec::Checksum(SumAlgo::Xxh3))
            .layer(LayerSpec::Fragment(1000))
            .build()
            .unwrap();
        let o = counter(&p, &limits()).unwrap();
        assert_eq!(o.profile.layers, vec![LayerSpec::Checksum(SumAlgo::Xxh3)]);
        assert_eq!(o.profile.max_message as usize, crate::udp::MAX_DATAGRAM - 24 - 9);
        assert_eq!(o.lowered.len(), 3, "rate, fragment, size: {:?}", o.lowered);
    }

    #[test]
    fn an_offer_that_raises_anything_is_refused() {
        let p = Profile::builder().throughput(1000).priority(2).build().unwrap();
        let raised = Profile { throughput_bps: 2000, ..p.clone() };
        assert_eq!(judge(&p, &raised, &Floor::default()), Err(Refusal::Raised("throughput")));
        let prio = Profile { priority: 3, ..p.clone() };
        assert_eq!(judge(&p, &prio, &Floor::default()), Err(Refusal::Raised("priority")));
    }

    #[test]
    fn a_floor_can_insist_on_every_layer() {
        let p = Profile::builder()
            .layer(LayerSpec::Checksum(SumAlgo::Blake3))
            .layer(LayerSpec::Compress(Codec::Lz4))
            .build()
            .unwrap();
        let without = Profile { layers: vec![LayerSpec::Checksum(SumAlgo::Blake3)], ..p.clone() };
        let floor = Floor { all_layers: true, ..Floor::default() };
        assert!(judge(&p, &without, &floor).is_err());
        assert!(judge(&p, &without, &Floor::default()).is_ok());
    }
}
