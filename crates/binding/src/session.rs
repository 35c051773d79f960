//! One binding's protocol core, without I/O: messages down and up the layer stack with their
//! sequence numbers, and live renegotiation. A driver feeds it frames and bytes and writes
//! out what it returns; tests drive two sessions against each other with no socket at all.
//!
//! Renegotiation (frames in `bs_wire::frame`, `RENEG`):
//!
//! ```text
//!  proposer                         answerer
//!  PROPOSE(id, profile)  ───────▶   counter() against its Limits
//!                        ◀───────   COUNTER(id, offer)   or REFUSE(id, reason)
//!  judge() against its Floor
//!  ACCEPT(id)            ───────▶   proposer's messages after ACCEPT use the offer
//!  (its own sends switch here)      APPLIED(id); its own sends switch here
//!                        ◀───────
//!  answerer's messages after APPLIED use the offer
//!  — or REFUSE(id, reason): nothing changes
//! ```
//!
//! Each direction switches at a frame its sender marks, so no message is ever decoded with
//! the other profile's layers. A `RENEG` that arrives while a fragmented message is half
//! assembled breaks that rule and fails the binding; so does any step out of order. The
//! transport and encryption cannot change on a live binding (they are the connection).
//! Ids: the initiator's proposals are odd, the responder's even; when both propose at once,
//! the initiator's proposal wins and the responder's is withdrawn.

use std::sync::Arc;

use bs_wire::{Frame, RenegStep, SizedPools};
use bytes::Bytes;

use crate::counters::Counters;
use crate::error::{BindingError, Refusal};
use crate::layers::Stack;
use crate::msg::Msg;
use crate::negotiate::{self, Floor, Limits};
use crate::qos::Profile;

/// Which end opened the binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Initiator,
    Responder,
}

/// What a renegotiation step means for the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenegEvent {
    /// The peer proposed; we answered with this offer (and are waiting for its decision).
    Countered { offer: Profile, lowered: Vec<String> },
    /// The peer proposed something we cannot meet; we refused.
    RefusedPeer(String),
    /// The peer refused our proposal (or our counter-offer).
    PeerRefused(String),
    /// We refused the peer's counter-offer (below our floor).
    WeRefused(Refusal),
    /// Our pending proposal was withdrawn in favour of the initiator's.
    Withdrawn,
    /// The new profile is in force both ways.
    Applied(Profile),
}

/// Frames to send (in order) and what happened.
#[derive(Debug, Default)]
pub struct Step {
    pub frames: Vec<Frame>,
    pub event: Option<RenegEvent>,
}

#[derive(Debug, Clone)]
enum Reneg {
    Idle,
    /// We proposed; waiting for COUNTER or REFUSE.
    Proposed {
        id: u64,
        proposal: Profile,
    },
    /// We countered; waiting for ACCEPT or REFUSE.
    Countered {
        id: u64,
        offer: Profile,
    },
    /// We accepted (and switched our sends); waiting for APPLIED to switch our receives.
    Accepted {
        id: u64,
        offer: Profile,
    },
}

/// One wire message ready to go: its `MSG` header's `a` (epoch and sequence number) and bytes.
#[derive(Debug)]
pub struct Outgoing {
    pub seq: u64,
    pub wire: Msg,
}

/// Bits of a `MSG` header's `a` that hold the sequence number; the epoch is above them.
pub const SEQ_BITS: u32 = 48;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const EPOCH_MASK: u64 = 0xffff;

/// Split a `MSG` header's `a` into (epoch, sequence number).
pub fn split_seq(a: u64) -> (u64, u64) {
    (a >> SEQ_BITS, a & SEQ_MASK)
}

/// What became of a datagram.
#[derive(Debug)]
pub enum Datagram {
    /// Decoded (a message, or `None` for a piece of one).
    Decoded(Option<Msg>),
    /// Encoded under a profile older than the one before the current: dropped (counted lost).
    Stale,
    /// Encoded under the next profile, whose `ACCEPT` has not been read yet: read the control
    /// connection, then offer it (handed back here) again.
    Ahead(Msg),
}

/// The protocol state of one binding.
pub struct Session {
    role: Role,
    profile: Profile,
    limits: Limits,
    floor: Floor,
    pools: SizedPools,
    tx: Stack,
    rx: Stack,
    /// The receive stack before the last switch, for datagrams that were overtaken.
    rx_prev: Option<Stack>,
    seq_out: u64,
    seq_in: u64,
    epoch_out: u64,
    epoch_in: u64,
    reneg: Reneg,
    next_id: u64,
    withdrawn: Option<u64>,
    counters: Arc<Counters>,
    scratch: Vec<Msg>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("role", &self.role)
            .field("profile", &self.profile.to_string())
            .field("reneg", &self.reneg)
            .finish()
    }
}

/// Up `stack`, counting the wire bytes in and the message that completes.
fn counted_decode(
    stack: &mut Stack,
    counters: &Counters,
    wire: Msg,
) -> Result<Option<Msg>, BindingError> {
    Counters::add(&counters.wire_in, wire.len() as u64);
    let out = stack.decode(wire)?;
    if let Some(m) = &out {
        Counters::add(&counters.bytes_in, m.len() as u64);
        Counters::add(&counters.messages_in, 1);
    }
    Ok(out)
}

fn stack(p: &Profile, pools: &SizedPools) -> Stack {
    Stack::new(&p.layers, p.max_message as usize, pools.clone())
}

impl Session {
    /// A session running `profile` (already agreed). `limits` answer the peer's proposals,
    /// `floor` judges the peer's counter-offers to ours.
    pub fn new(role: Role, profile: Profile, limits: Limits, floor: Floor) -> Self {
        let pools = SizedPools::default();
        let counters = Arc::new(Counters::default());
        counters.set_profile(&profile);
        Self {
            role,
            tx: stack(&profile, &pools),
            rx: stack(&profile, &pools),
            rx_prev: None,
            profile,
            limits,
            floor,
            pools,
            seq_out: 0,
            seq_in: 0,
            epoch_out: 0,
            epoch_in: 0,
            reneg: Reneg::Idle,
            next_id: if role == Role::Initiator { 1 } else { 2 },
            withdrawn: None,
            counters,
            scratch: Vec::new(),
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Count into `c` from now on (e.g. a transfer's counters, listed before it started).
    pub fn count_into(&mut self, c: Arc<Counters>) {
        c.set_profile(&self.profile);
        self.counters = c;
    }

    /// Judge the peer's counter-offers against `floor` from now on.
    pub fn set_floor(&mut self, floor: Floor) {
        self.floor = floor;
    }

    /// An application message with room for every header of the current send stack.
    pub fn message(&self, data: &[u8]) -> Msg {
        self.tx.message(data)
    }

    /// An application message whose payload is `body`, shared rather than copied.
    pub fn shared(&self, body: bytes::Bytes) -> Msg {
        self.tx.shared(body)
    }

    /// An empty application message of `len` bytes, to be filled in place.
    pub fn alloc(&self, len: usize) -> Msg {
        self.tx.alloc(len)
    }

    /// A buffer for `len` wire bytes of an incoming `MSG`, after checking `len` against what
    /// the receive stack can produce (so an absurd length allocates nothing).
    pub fn wire_buffer(&self, len: u64) -> Result<Msg, BindingError> {
        self.check_wire_len(len)?;
        Ok(self.rx.wire_buffer(len as usize))
    }

    /// Refuse a wire length the receive stack could never have produced.
    pub fn check_wire_len(&self, len: u64) -> Result<(), BindingError> {
        let max = self.rx.wire_qos().max_message as u64;
        if len > max {
            return Err(BindingError::WireTooLarge { len, max });
        }
        Ok(())
    }

    /// Largest application message.
    pub fn max_message(&self) -> usize {
        self.tx.app_qos().max_message
    }

    /// Down the send stack: the wire messages for `msg`, numbered.
    pub fn encode(&mut self, msg: Msg, out: &mut Vec<Outgoing>) -> Result<(), BindingError> {
        let len = msg.len() as u64;
        let mut wire = std::mem::take(&mut self.scratch);
        self.tx.encode(msg, &mut wire)?;
        for w in wire.drain(..) {
            let seq = self.number_wire(w.len());
            out.push(Outgoing { seq, wire: w });
        }
        self.scratch = wire;
        Counters::add(&self.counters.bytes_out, len);
        Counters::add(&self.counters.messages_out, 1);
        Ok(())
    }

    /// The next wire message's `MSG` header `a` (epoch and sequence number), counted.
    fn number_wire(&mut self, wire_len: usize) -> u64 {
        Counters::add(&self.counters.wire_out, wire_len as u64);
        Counters::add(&self.counters.wire_messages_out, 1);
        let a = (self.epoch_out << SEQ_BITS) | (self.seq_out & SEQ_MASK);
        self.seq_out += 1;
        a
    }

    /// With a transparent send stack (see [`Stack::is_transparent`]), number one message of
    /// `len` bytes that the driver sends as it is, from the caller's memory: its `MSG`
    /// header's `a`. `None` when a layer must see the message (use [`Session::encode`]).
    pub fn encode_in_place(&mut self, len: usize) -> Result<Option<u64>, BindingError> {
        if !self.tx.is_transparent() {
            return Ok(None);
        }
        self.tx.check_len(len)?;
        let a = self.number_wire(len);
        Counters::add(&self.counters.bytes_out, len as u64);
        Counters::add(&self.counters.messages_out, 1);
        Ok(Some(a))
    }

    /// Up the receive stack: the application message, once complete. On a reliable
    /// transport every sequence number must be the next one.
    pub fn decode(&mut self, a: u64, wire: Msg) -> Result<Option<Msg>, BindingError> {
        let (epoch, seq) = split_seq(a);
        if seq != self.seq_in & SEQ_MASK {
            return Err(BindingError::Sequence { expected: self.seq_in, got: seq });
        }
        if epoch != self.epoch_in {
            return Err(BindingError::Renegotiation(format!(
                "message {seq} encoded under profile epoch {epoch}, this side is at {}",
                self.epoch_in
            )));
        }
        self.seq_in += 1;
        counted_decode(&mut self.rx, &self.counters, wire)
    }

    /// Decode a datagram whose sequence number was already accounted for (UDP: gaps are
    /// losses, counted by the window, not errors), with the stack of the epoch it names.
    pub fn decode_datagram(&mut self, a: u64, wire: Msg) -> Result<Datagram, BindingError> {
        let (epoch, _) = split_seq(a);
        let cur = self.epoch_in;
        let stack = if epoch == cur {
            &mut self.rx
        } else if epoch == cur.wrapping_sub(1) & EPOCH_MASK {
            match &mut self.rx_prev {
                Some(s) => s,
                None => return Ok(Datagram::Stale),
            }
        } else if epoch == (cur + 1) & EPOCH_MASK {
            return Ok(Datagram::Ahead(wire));
        } else {
            return Ok(Datagram::Stale);
        };
        counted_decode(stack, &self.counters, wire).map(Datagram::Decoded)
    }

    /// A renegotiation is under way.
    pub fn renegotiating(&self) -> bool {
        !matches!(self.reneg, Reneg::Idle)
    }

    /// Step one: propose `p` for this binding. Returns the `PROPOSE` frame to send.
    pub fn propose(&mut self, mut p: Profile) -> Result<Frame, BindingError> {
        p.validate()?;
        if self.renegotiating() {
            return Err(Refusal::Busy.into());
        }
        self.keep_connection_fields(&mut p).map_err(BindingError::Refused)?;
        let id = self.next_id;
        self.next_id += 2;
        let body = p.encode();
        self.reneg = Reneg::Proposed { id, proposal: p };
        Ok(Frame::Reneg { id, step: RenegStep::Propose, body })
    }

    /// What cannot change on a live binding: fill it in from the current profile, or refuse.
    fn keep_connection_fields(&self, p: &mut Profile) -> Result<(), Refusal> {
        if p.wants_encryption() != self.profile.wants_encryption() {
            return Err(Refusal::Unmeetable(
                "encryption cannot be switched on or off on a live binding (it is the \
                 connection's TLS); open a new binding"
                    .into(),
            ));
        }
        if !p.transports.is_empty() && p.transports != self.profile.transports {
            return Err(Refusal::Unmeetable(
                "the transport cannot change on a live binding; open a new binding".into(),
            ));
        }
        p.transports = self.profile.transports.clone();
        if p.digests.is_empty() {
            p.digests = self.profile.digests.clone();
        }
        Ok(())
    }

    fn switch_tx(&mut self, p: &Profile) {
        self.tx = stack(p, &self.pools);
        self.epoch_out = (self.epoch_out + 1) & EPOCH_MASK;
    }

    fn switch_rx(&mut self, p: &Profile) {
        let old = std::mem::replace(&mut self.rx, stack(p, &self.pools));
        self.rx_prev = Some(old);
        self.epoch_in = (self.epoch_in + 1) & EPOCH_MASK;
    }

    fn applied(&mut self, p: Profile) -> Option<RenegEvent> {
        self.profile = p.clone();
        self.counters.set_profile(&p);
        self.reneg = Reneg::Idle;
        Counters::add(&self.counters.renegotiations, 1);
        Some(RenegEvent::Applied(p))
    }

    /// A `RENEG` frame from the peer.
    pub fn on_reneg(
        &mut self,
        id: u64,
        step: RenegStep,
        body: &Bytes,
    ) -> Result<Step, BindingError> {
        if self.rx.pending() {
            return Err(BindingError::Renegotiation(
                "RENEG in the middle of a fragmented message".into(),
            ));
        }
        let violation = |what: String| Err(BindingError::Renegotiation(what));
        let refuse = |id, why: String| Frame::Reneg {
            id,
            step: RenegStep::Refuse,
            body: Bytes::from(why.into_bytes()),
        };
        let mut out = Step::default();
        match (step, self.reneg.clone()) {
            (RenegStep::Propose, state) => {
                if let Reneg::Proposed { id: ours, .. } = state {
                    if self.role == Role::Initiator {
                        // Ours goes first; the responder withdraws its own.
                        out.frames.push(refuse(id, Refusal::Busy.to_string()));
                        return Ok(out);
                    }
                    self.withdrawn = Some(ours);
                    out.event = Some(RenegEvent::Withdrawn);
                } else if !matches!(state, Reneg::Idle) {
                    return violation(format!("PROPOSE {id} while renegotiation is under way"));
                }
                let answer = Profile::decode(body)
                    .map_err(|e| Refusal::Unmeetable(e.to_string()))
                    .and_then(|mut p| {
                        self.keep_connection_fields(&mut p)?;
                        negotiate::counter(&p, &self.limits)
                    });
                match answer {
                    Ok(offer) => {
                        out.frames.push(Frame::Reneg {
                            id,
                            step: RenegStep::Counter,
                            body: offer.profile.encode(),
                        });
                        self.reneg = Reneg::Countered { id, offer: offer.profile.clone() };
                        out.event.get_or_insert(RenegEvent::Countered {
                            offer: offer.profile,
                            lowered: offer.lowered,
                        });
                    }
                    Err(r) => {
                        out.frames.push(refuse(id, r.to_string()));
                        self.reneg = Reneg::Idle;
                        out.event = Some(RenegEvent::RefusedPeer(r.to_string()));
                    }
                }
            }
            (RenegStep::Counter, Reneg::Proposed { id: ours, proposal }) if id == ours => {
                let offer = Profile::decode(body).map_err(|e| {
                    BindingError::Renegotiation(format!("undecodable counter-offer: {e}"))
                })?;
                match negotiate::judge(&proposal, &offer, &self.floor) {
                    Ok(()) => {
                        out.frames.push(Frame::Reneg {
                            id,
                            step: RenegStep::Accept,
                            body: Bytes::new(),
                        });
                        self.switch_tx(&offer);
                        self.reneg = Reneg::Accepted { id, offer };
                    }
                    Err(r) => {
                        out.frames.push(refuse(id, r.to_string()));
                        self.reneg = Reneg::Idle;
                        out.event = Some(RenegEvent::WeRefused(r));
                    }
                }
            }
            (RenegStep::Accept, Reneg::Countered { id: ours, offer }) if id == ours => {
                // The peer's messages after its ACCEPT use the offer; ours after APPLIED.
                self.switch_rx(&offer);
                out.frames.push(Frame::Reneg { id, step: RenegStep::Applied, body: Bytes::new() });
                self.switch_tx(&offer);
                out.event = self.applied(offer);
            }
            (RenegStep::Applied, Reneg::Accepted { id: ours, offer }) if id == ours => {
                self.switch_rx(&offer);
                out.event = self.applied(offer);
            }
            (
                RenegStep::Refuse,
                Reneg::Proposed { id: ours, .. } | Reneg::Countered { id: ours, .. },
            ) if id == ours => {
                self.reneg = Reneg::Idle;
                out.event = Some(RenegEvent::PeerRefused(String::from_utf8_lossy(body).into()));
            }
            (RenegStep::Refuse, _) if self.withdrawn == Some(id) => {
                self.withdrawn = None;
            }
            (step, state) => {
                return violation(format!("{step:?} {id} does not fit the state {state:?}"));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::{Codec, LayerSpec, SumAlgo, TransportKind};

    fn pair(p: Profile) -> (Session, Session) {
        let limits = Limits { max_priority: 5, ..Limits::default() };
        (
            Session::new(Role::Initiator, p.clone(), limits.clone(), Floor::default()),
            Session::new(Role::Responder, p, limits, Floor::default()),
        )
    }

    fn base() -> Profile {
        Profile::builder()
            .max_message(1 << 20)
            .transport(TransportKind::Tcp)
            .layer(LayerSpec::Checksum(SumAlgo::Xxh3))
            .build()
            .unwrap()
    }

    /// Send `data` from `a` to `b` through both stacks, as bytes.
    fn carry(a: &mut Session, b: &mut Session, data: &[u8]) -> Result<Vec<u8>, BindingError> {
        let mut out = Vec::new();
        a.encode(a.message(data), &mut out)?;
        let mut got = None;
        for o in out {
            let mut w = b.wire_buffer(o.wire.len() as u64)?;
            w.payload_mut().copy_from_slice(&o.wire);
            got = b.decode(o.seq, w)?;
        }
        Ok(got.expect("complete").to_vec())
    }

    /// Deliver `frames` from one session to the other; returns the answer frames and event.
    fn deliver(to: &mut Session, frames: Vec<Frame>) -> (Vec<Frame>, Vec<RenegEvent>) {
        let mut back = Vec::new();
        let mut events = Vec::new();
        for f in frames {
            let Frame::Reneg { id, step, body } = f else { panic!("{f:?}") };
            let s = to.on_reneg(id, step, &body).unwrap();
            back.extend(s.frames);
            events.extend(s.event);
        }
        (back, events)
    }

    #[test]
    fn renegotiation_switches_both_directions_at_marked_frames() {
        let (mut a, mut b) = pair(base());
        assert_eq!(carry(&mut a, &mut b, b"before").unwrap(), b"before");
        let want = Profile {
            layers: vec![LayerSpec::Compress(Codec::Lz4), LayerSpec::Checksum(SumAlgo::Blake3)],
            priority: 7,
            ..base()
        };
        let propose = a.propose(want).unwrap();
        // A message sent before the answer still travels under the old profile.
        assert_eq!(carry(&mut a, &mut b, b"in flight").unwrap(), b"in flight");
        let (counter, ev) = deliver(&mut b, vec![propose]);
        assert!(matches!(&ev[..], [RenegEvent::Countered { lowered, .. }] if lowered.len() == 1));
        // The answerer still sends under the old profile until it sees ACCEPT.
        assert_eq!(carry(&mut b, &mut a, b"old way").unwrap(), b"old way");
        let (accept, ev) = deliver(&mut a, counter);
        assert!(ev.is_empty());
        // After ACCEPT, a's sends use the new stack: b must have switched its receive side.
        let (applied, ev) = deliver(&mut b, accept);
        let RenegEvent::Applied(p) = &ev[0] else { panic!("{ev:?}") };
        assert_eq!(p.priority, 5, "lowered to the responder's limit");
        assert_eq!(carry(&mut a, &mut b, &[9u8; 5000]).unwrap(), vec![9u8; 5000]);
        let (none, ev) = deliver(&mut a, applied);
        assert!(none.is_empty());
        assert!(matches!(&ev[..], [RenegEvent::Applied(_)]));
        assert_eq!(carry(&mut b, &mut a, &[1u8; 5000]).unwrap(), vec![1u8; 5000]);
        assert_eq!(a.profile(), b.profile());
        assert_eq!(a.counters().snapshot().renegotiations, 1);
    }

    #[test]
    fn the_responder_can_propose_too() {
        let (mut a, mut b) = pair(base());
        let propose = b.propose(Profile { max_message: 4096, ..base() }).unwrap();
        let (counter, _) = deliver(&mut a, vec![propose]);
        let (accept, _) = deliver(&mut b, counter);
        let (applied, _) = deliver(&mut a, accept);
        deliver(&mut b, applied);
        assert_eq!(a.max_message(), 4096);
        assert_eq!(b.max_message(), 4096);
        assert!(carry(&mut a, &mut b, &[0u8; 5000]).is_err(), "over the new cap");
    }

    #[test]
    fn a_counter_below_the_floor_is_refused_and_nothing_changes() {
        let (_, mut b) = pair(base());
        let mut a = Session::new(
            Role::Initiator,
            base(),
            Limits::default(),
            Floor { min_priority: 7, ..Floor::default() },
        );
        let propose = a.propose(Profile { priority: 7, ..base() }).unwrap();
        let (counter, _) = deliver(&mut b, vec![propose]);
        let (refuse, ev) = deliver(&mut a, counter);
        assert!(matches!(&ev[..], [RenegEvent::WeRefused(Refusal::BelowFloor(_))]), "{ev:?}");
        let (_, ev) = deliver(&mut b, refuse);
        assert!(matches!(&ev[..], [RenegEvent::PeerRefused(_)]));
        assert_eq!(a.profile(), &base());
        assert_eq!(carry(&mut a, &mut b, b"still fine").unwrap(), b"still fine");
    }

    #[test]
    fn an_unmeetable_proposal_is_refused_with_its_reason() {
        let (mut a, mut b) = pair(base());
        let e = a.propose(Profile { layers: vec![LayerSpec::Encrypt], ..base() }).unwrap_err();
        assert!(e.to_string().contains("encryption cannot be switched"), "{e}");
        let propose = a.propose(Profile { digests: vec!["md5".into()], ..base() }).unwrap();
        let (refuse, ev) = deliver(&mut b, vec![propose]);
        assert!(matches!(&ev[..], [RenegEvent::RefusedPeer(r)] if r.contains("md5")));
        let (_, ev) = deliver(&mut a, refuse);
        assert!(matches!(&ev[..], [RenegEvent::PeerRefused(r)] if r.contains("md5")));
    }

    #[test]
    fn renegotiation_during_a_fragmented_message_fails_the_binding() {
        let p = Profile { layers: vec![LayerSpec::Fragment(1000)], ..base() };
        let (mut a, mut b) = pair(p);
        let mut out = Vec::new();
        a.encode(a.message(&[5u8; 3000]), &mut out).unwrap();
        let first = out.remove(0);
        let mut w = b.wire_buffer(first.wire.len() as u64).unwrap();
        w.payload_mut().copy_from_slice(&first.wire);
        assert!(b.decode(first.seq, w).unwrap().is_none());
        let propose = a.propose(base()).unwrap();
        let Frame::Reneg { id, step, body } = propose else { unreachable!() };
        let e = b.on_reneg(id, step, &body).unwrap_err();
        assert!(matches!(e, BindingError::Renegotiation(_)), "{e}");
        assert_eq!(e.code(), bs_wire::ErrorCode::BadRenegotiation);
    }

    #[test]
    fn steps_out_of_order_are_violations() {
        let (mut a, _) = pair(base());
        let e = a.on_reneg(1, RenegStep::Accept, &Bytes::new()).unwrap_err();
        assert!(matches!(e, BindingError::Renegotiation(_)));
        let e = a.on_reneg(2, RenegStep::Counter, &base().encode()).unwrap_err();
        assert!(matches!(e, BindingError::Renegotiation(_)));
    }

    #[test]
    fn when_both_propose_at_once_the_initiators_proposal_wins() {
        let (mut a, mut b) = pair(base());
        let pa = a.propose(Profile { max_message: 2048, ..base() }).unwrap();
        let pb = b.propose(Profile { max_message: 8192, ..base() }).unwrap();
        let (from_a, _) = deliver(&mut a, vec![pb]); // a refuses b's
        let (from_b, ev) = deliver(&mut b, vec![pa]); // b withdraws its own, counters a's
        assert_eq!(ev[0], RenegEvent::Withdrawn);
        let (none, _) = deliver(&mut b, from_a); // the refusal of the withdrawn one
        assert!(none.is_empty());
        let (accept, _) = deliver(&mut a, from_b);
        let (applied, _) = deliver(&mut b, accept);
        deliver(&mut a, applied);
        assert_eq!(a.max_message(), 2048);
        assert_eq!(b.max_message(), 2048);
    }

    #[test]
    fn datagrams_name_their_epoch_and_late_ones_still_decode() {
        let (mut a, mut b) = pair(base());
        let mut old = Vec::new();
        a.encode(a.message(b"old profile"), &mut old).unwrap();
        let propose = a.propose(Profile { layers: vec![LayerSpec::Null], ..base() }).unwrap();
        let (counter, _) = deliver(&mut b, vec![propose]);
        let (accept, _) = deliver(&mut a, counter);
        let mut new = Vec::new();
        a.encode(a.message(b"new profile"), &mut new).unwrap();
        let n = new.pop().unwrap();
        // The new datagram overtakes the ACCEPT: b must read the control stream first.
        assert!(matches!(b.decode_datagram(n.seq, n.wire).unwrap(), Datagram::Ahead(_)));
        deliver(&mut b, accept);
        let mut again = Vec::new();
        a.encode(a.message(b"new profile"), &mut again).unwrap();
        let n = again.pop().unwrap();
        let Datagram::Decoded(Some(m)) = b.decode_datagram(n.seq, n.wire).unwrap() else {
            panic!()
        };
        assert_eq!(&m[..], b"new profile");
        // The old one arrives late: decoded with the previous stack.
        let o = old.pop().unwrap();
        let Datagram::Decoded(Some(m)) = b.decode_datagram(o.seq, o.wire).unwrap() else {
            panic!()
        };
        assert_eq!(&m[..], b"old profile");
    }

    #[test]
    fn messages_sent_in_place_are_numbered_and_counted_like_encoded_ones() {
        let plain = Profile { layers: vec![LayerSpec::Null], ..base() };
        let (mut a, mut b) = pair(plain);
        assert_eq!(carry(&mut a, &mut b, b"first").unwrap(), b"first");
        let seq = a.encode_in_place(6).unwrap().expect("a null stack is transparent");
        let mut w = b.wire_buffer(6).unwrap();
        w.payload_mut().copy_from_slice(b"second");
        assert_eq!(b.decode(seq, w).unwrap().unwrap().payload(), b"second");
        assert_eq!(carry(&mut a, &mut b, b"third").unwrap(), b"third");
        let s = a.counters().snapshot();
        assert_eq!((s.messages_out, s.bytes_out, s.wire_out), (3, 16, 16));
        assert!(matches!(a.encode_in_place(2 << 20), Err(BindingError::Layer(_))));

        // A layer that adds a header must see every message.
        let (mut a, _) = pair(base());
        assert_eq!(a.encode_in_place(6).unwrap(), None);
    }

    #[test]
    fn sequence_gaps_on_a_reliable_binding_are_errors() {
        let (mut a, mut b) = pair(base());
        let mut out = Vec::new();
        a.encode(a.message(b"one"), &mut out).unwrap();
        a.encode(a.message(b"two"), &mut out).unwrap();
        let second = out.pop().unwrap();
        let e = b.decode(second.seq, second.wire).unwrap_err();
        assert!(matches!(e, BindingError::Sequence { expected: 0, got: 1 }));
    }
}
