//! A run of a flow as its sender drives it: `START`, `DATA` and `STOP` into every receiver's
//! queue under the flow's policy, then each receiver's outcome. One [`Forwarder`] serves
//! both kinds of sender: one on a connection (the distributer's forwarder thread reads its
//! messages and hands them over as they came), and one in the distributer's own process
//! ([`crate::Distributer::sender`]), whose bytes go into the queues without crossing a socket
//! first — no hop between sender and distributer, as ZeroMQ's publisher or ACS BulkDataNT's
//! sender writes to its subscribers itself.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use bs_binding::{Binding, BindingError, Msg};
use bytes::Bytes;

use crate::config::Policy;
use crate::distributer::{Flow, Item, QUEUE_DEPTH, Rcv, STOP_PATIENCE, key};
use crate::error::DistribError;
use crate::msg;

/// A message as the receivers' writers send it.
pub(crate) enum Wire {
    /// As a sender sent it over its connection: forwarded as it is.
    Received(Msg),
    /// A `DATA` of a sender in this process: its kind and offset, and its bytes (shared).
    Data { head: [u8; msg::DATA_HEAD], body: Bytes },
    /// Any other message of a sender in this process (`START`, `STOP`).
    Built(Vec<u8>),
}

impl Wire {
    /// Its bytes on the wire, in two parts (the second empty but for a local `DATA`).
    fn parts(&self) -> (&[u8], &[u8]) {
        match self {
            Wire::Received(m) => (m.payload(), &[]),
            Wire::Data { head, body } => (head, body),
            Wire::Built(v) => (v, &[]),
        }
    }

    /// Its kind (the first byte).
    pub(crate) fn kind(&self) -> Option<u8> {
        self.parts().0.first().copied()
    }

    /// Its length on the wire.
    pub(crate) fn wire_len(&self) -> usize {
        let (a, b) = self.parts();
        a.len() + b.len()
    }

    /// A `DATA`'s offset and bytes.
    pub(crate) fn data(&self) -> Option<(u64, &[u8])> {
        let (head, body) = self.parts();
        if head.first() != Some(&msg::DATA) || head.len() < msg::DATA_HEAD {
            return None;
        }
        let at = u64::from_be_bytes(head[1..msg::DATA_HEAD].try_into().ok()?);
        let bytes = match self {
            Wire::Data { .. } => body,
            _ => msg::data_payload(head),
        };
        Some((at, bytes))
    }

    /// Write it as one binding message (gathered from its parts, not copied together).
    pub(crate) fn send(&self, b: &mut Binding) -> Result<(), BindingError> {
        let (head, body) = self.parts();
        b.send_parts(head, body)
    }
}

/// A flow's sender, as the distributer sees it: while it lives the flow has its sender (no
/// other may join as one); dropped (or [`Forwarder::finish`]ed), the place is free again and
/// a run it left unfinished ends for its receivers with an `ABORT`.
pub(crate) struct Forwarder {
    flow: Arc<Flow>,
    /// The receivers of the run going on.
    run: Vec<Arc<Rcv>>,
    /// The offset the next `DATA` must have.
    expected: u64,
    running: bool,
    finished: bool,
}

impl Forwarder {
    /// Become `flow`'s sender, unless it has one.
    pub(crate) fn claim(flow: Arc<Flow>) -> Result<Self, DistribError> {
        {
            let mut st = flow.state.lock().unwrap_or_else(PoisonError::into_inner);
            if st.sender {
                return Err(DistribError::SenderTaken(key(&flow.stream, &flow.spec.name)));
            }
            st.sender = true;
        }
        Ok(Self { flow, run: Vec::new(), expected: 0, running: false, finished: false })
    }

    /// The flow's settings.
    pub(crate) fn flow(&self) -> &Flow {
        &self.flow
    }

    /// Refused once the distributer has stopped (a sender in its process would otherwise send
    /// on into receivers it has let go).
    fn open(&self) -> Result<(), DistribError> {
        if self.flow.closed.load(Ordering::SeqCst) {
            return Err(DistribError::Remote(
                "the distributer was stopped: the run is lost for every receiver".into(),
            ));
        }
        Ok(())
    }

    /// A run begins: every receiver joined by now is in it and gets `START` first.
    pub(crate) fn start(&mut self, m: Wire) -> Result<(), DistribError> {
        self.open()?;
        if self.running {
            return Err(DistribError::Order("START while the flow runs".into()));
        }
        let flow = &self.flow;
        self.run = flow.state.lock().unwrap_or_else(PoisonError::into_inner).receivers.clone();
        self.run.retain(|r| r.q.lock().unwrap_or_else(PoisonError::into_inner).gone.is_none());
        // Running from here: whatever happens next, a receiver given START is given its end.
        (self.running, self.expected) = (true, 0);
        let m = Arc::new(m);
        for r in &self.run {
            let mut q = r.q.lock().unwrap_or_else(PoisonError::into_inner);
            (q.confirm, q.reported, q.stopped) = (None, false, false);
            (q.run_started, q.last_progress) = (Instant::now(), Instant::now());
            let start = Item::Forward { m: m.clone(), len: 0, stop: false };
            q.held += start.cost();
            q.items.push_back(start);
            r.cv.notify_all();
        }
        flow.state.lock().unwrap_or_else(PoisonError::into_inner).running = true;
        Ok(())
    }

    /// The run's next `len` bytes, at `offset`, to every receiver in it (waiting as the
    /// flow's policy says).
    pub(crate) fn data(&mut self, offset: u64, len: u64, m: Wire) -> Result<(), DistribError> {
        self.open()?;
        if !self.running {
            return Err(DistribError::Order("DATA before START".into()));
        }
        if offset != self.expected {
            let want = self.expected;
            return Err(DistribError::Order(format!("DATA at offset {offset}, expected {want}")));
        }
        // An empty one moves nothing and would still take a slot in every receiver's queue.
        if len == 0 {
            return Err(DistribError::Order("an empty DATA (no bytes)".into()));
        }
        let chunk = self.flow.spec.chunk;
        if len > chunk {
            return Err(DistribError::Order(format!(
                "DATA of {len} bytes, above the flow's chunk of {chunk}"
            )));
        }
        self.expected += len;
        let m = Arc::new(m);
        for r in &self.run {
            push(&self.flow, r, Item::Forward { m: m.clone(), len, stop: false });
        }
        Ok(())
    }

    /// The run ends at `total` bytes: `STOP` to every receiver, then each one's confirmation
    /// (or its end). Returns the receivers out of the run not told of yet (see
    /// [`Forwarder::newly_gone`]) and how the run went for each.
    pub(crate) fn stop(
        &mut self,
        total: u64,
        m: Wire,
    ) -> Result<(Vec<msg::Outcome>, msg::Stopped), DistribError> {
        self.open()?;
        if !self.running {
            return Err(DistribError::Order("STOP before START".into()));
        }
        if total != self.expected {
            let sent = self.expected;
            return Err(DistribError::Order(format!(
                "STOP announces {total} bytes, {sent} were sent"
            )));
        }
        let m = Arc::new(m);
        for r in &self.run {
            push(&self.flow, r, Item::Forward { m: m.clone(), len: 0, stop: true });
        }
        let receivers = self.run.iter().map(|r| settle(&self.flow, r, total)).collect();
        let gone = self.newly_gone();
        // The run is over before the sender hears so: status read after its `stop` returned
        // never shows it still running.
        self.running = false;
        self.flow.state.lock().unwrap_or_else(PoisonError::into_inner).running = false;
        self.run.clear();
        Ok((gone, msg::Stopped { total, receivers }))
    }

    /// Receivers that left the run since the last call, before confirming it: for the
    /// sender's reports (`DROPPED`).
    pub(crate) fn newly_gone(&mut self) -> Vec<msg::Outcome> {
        let mut out = Vec::new();
        for r in &self.run {
            let mut q = r.q.lock().unwrap_or_else(PoisonError::into_inner);
            if q.confirm.is_some() || q.reported {
                continue;
            }
            let Some(o) = q.outcome(&r.name, q.sent) else { continue };
            q.reported = true;
            out.push(o);
        }
        out
    }

    /// The sender is done: the flow takes a new one from here on (before any receiver hears
    /// of this end), and a run still going ends for its receivers with `why` — queued while
    /// the flow is still held, so a new sender's `START` cannot get in ahead of it.
    pub(crate) fn finish(&mut self, why: &str) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let mut st = self.flow.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.sender = false;
        st.running = false;
        if self.running {
            for r in &self.run {
                let mut q = r.q.lock().unwrap_or_else(PoisonError::into_inner);
                if q.gone.is_none() {
                    q.items.push_back(Item::Abort(why.to_string()));
                    r.cv.notify_all();
                }
            }
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.finish("the sender left mid-flow");
    }
}

/// Queue `item` for `r` as the flow's policy says.
pub(crate) fn push(flow: &Flow, r: &Rcv, item: Item) {
    let len = item.len();
    let mut q = r.q.lock().unwrap_or_else(PoisonError::into_inner);
    match flow.spec.policy {
        Policy::Hold => {
            while q.items.len() >= QUEUE_DEPTH && q.gone.is_none() {
                q = r.cv.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        }
        Policy::Buffer(bound) => {
            // A message always goes in when no payload waits before it: a receiver keeping up
            // is never dropped for one message larger than the bound (its bookkeeping
            // included, a START not yet written ahead of it), nor for the message its writer
            // is still finishing when the receiver already has it.
            if q.gone.is_none() && q.queued_bytes > 0 && q.held + item.cost() > bound {
                let behind = q.held + item.cost();
                let why = format!("fell {behind} bytes behind (the bound is {bound})");
                r.dropped_locked(&mut q, why);
            }
        }
        Policy::Timeout(t) => {
            while q.items.len() >= QUEUE_DEPTH && q.gone.is_none() {
                let idle = q.last_progress.elapsed();
                if idle >= t {
                    let ms = t.as_millis();
                    r.dropped_locked(&mut q, format!("took nothing for {ms} ms"));
                    break;
                }
                q = r.cv.wait_timeout(q, t - idle).unwrap_or_else(PoisonError::into_inner).0;
            }
        }
    }
    if q.gone.is_none() {
        q.held += item.cost();
        q.items.push_back(item);
        q.queued_bytes += len;
        r.cv.notify_all();
    }
}

/// After `STOP` was queued for `r`: wait for its confirmation (or its end) and say how it went.
fn settle(flow: &Flow, r: &Rcv, total: u64) -> msg::Outcome {
    let patience = match flow.spec.policy {
        Policy::Timeout(t) => t,
        _ => STOP_PATIENCE,
    };
    let mut q = r.q.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if let Some(o) = q.outcome(&r.name, total) {
            return o;
        }
        // Before its STOP is written, the policy's patience with a receiver not keeping up;
        // after, the time a confirmation (a commit, an fsync) may take.
        let (patience, why) = if q.stopped {
            let p = patience.max(STOP_PATIENCE);
            (p, format!("had every byte but did not confirm the stop within {} ms", p.as_millis()))
        } else {
            (patience, format!("made no progress for {} ms before the stop", patience.as_millis()))
        };
        let idle = q.last_progress.elapsed();
        if idle >= patience {
            r.dropped_locked(&mut q, why);
            continue;
        }
        q = r.cv.wait_timeout(q, patience - idle).unwrap_or_else(PoisonError::into_inner).0;
    }
}
