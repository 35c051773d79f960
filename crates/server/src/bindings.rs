//! The server's side of bindings: the table of live bindings (for the `Bindings` status call
//! and metrics), the limits negotiation counters proposals against, and the three test
//! endpoints a binding can be opened to — echo (request/reply), sink and source (streams).
//! Each binding runs on a thread of its own with its own connection, as transfers do.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bs_binding::{Binding, BindingError, Counters, Floor, Profile, Role, Scheduler, Session};
use bs_proto as pb;
use bs_transport::{Conn, TransportError};

/// Which endpoint a binding was opened to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Echo,
    Sink,
    Source,
    /// A blob push or pull (bindings with no message layers).
    Push,
    Pull,
}

impl Endpoint {
    pub fn name(self) -> &'static str {
        match self {
            Self::Echo => "echo",
            Self::Sink => "sink",
            Self::Source => "source",
            Self::Push => "push",
            Self::Pull => "pull",
        }
    }
}

/// What a binding's token allows.
#[derive(Debug, Clone)]
pub struct BindGrant {
    pub id: u64,
    pub endpoint: Endpoint,
    pub profile: Profile,
    pub label: String,
    /// A datagram binding's UDP socket, connected to the initiator's port.
    pub udp: Option<Arc<std::net::UdpSocket>>,
}

struct Entry {
    label: String,
    endpoint: Endpoint,
    transport: &'static str,
    counters: Arc<Counters>,
}

/// Live bindings and transfers.
#[derive(Default)]
pub(crate) struct BindingTable {
    next: AtomicU64,
    live: Mutex<BTreeMap<u64, Entry>>,
}

/// Removes its binding from the table when dropped.
pub(crate) struct Registered<'a> {
    table: &'a BindingTable,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.table.live.lock().unwrap().remove(&self.id);
    }
}

impl BindingTable {
    pub(crate) fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn register(
        &self,
        id: u64,
        label: String,
        endpoint: Endpoint,
        transport: &'static str,
        counters: Arc<Counters>,
    ) -> Registered<'_> {
        let e = Entry { label, endpoint, transport, counters };
        self.live.lock().unwrap().insert(id, e);
        Registered { table: self, id }
    }

    pub(crate) fn status(&self) -> Vec<pb::BindingStatus> {
        let live = self.live.lock().unwrap();
        live.iter()
            .map(|(id, e)| {
                let c = e.counters.snapshot();
                pb::BindingStatus {
                    id: *id,
                    label: e.label.clone(),
                    endpoint: e.endpoint.name().into(),
                    transport: e.transport.into(),
                    profile: Some(e.counters.profile().to_pb()),
                    bytes_in: c.bytes_in,
                    bytes_out: c.bytes_out,
                    messages_in: c.messages_in,
                    messages_out: c.messages_out,
                    lost: c.lost,
                    reordered: c.reordered,
                    renegotiations: c.renegotiations,
                    age_ms: c.age_ms,
                    wire_in: c.wire_in,
                    wire_out: c.wire_out,
                }
            })
            .collect()
    }
}

impl BindingTable {
    /// The live bindings' counters as OpenMetrics families (for `/metrics`).
    pub(crate) fn render_metrics(&self) -> String {
        let st = self.status();
        let mut out = String::new();
        type Family = (&'static str, &'static str, &'static str, fn(&pb::BindingStatus) -> u64);
        let families: [Family; 9] = [
            ("bytes_in", "counter", "Application bytes received", |b| b.bytes_in),
            ("bytes_out", "counter", "Application bytes sent", |b| b.bytes_out),
            ("wire_in", "counter", "Bytes received on the wire, after every layer", |b| b.wire_in),
            ("wire_out", "counter", "Bytes sent on the wire, after every layer", |b| b.wire_out),
            ("messages_in", "counter", "Messages received", |b| b.messages_in),
            ("messages_out", "counter", "Messages sent", |b| b.messages_out),
            ("lost", "counter", "Datagrams lost (udp)", |b| b.lost),
            ("reordered", "counter", "Datagrams that arrived late (udp)", |b| b.reordered),
            ("renegotiations", "counter", "Renegotiations applied", |b| b.renegotiations),
        ];
        for (name, kind, help, get) in families {
            out.push_str(&format!(
                "# HELP blobstream_binding_{name} {help}, per live binding.\n\
                 # TYPE blobstream_binding_{name} {kind}\n"
            ));
            for b in &st {
                out.push_str(&format!(
                    "blobstream_binding_{name}_total{{id=\"{}\",label=\"{}\",endpoint=\"{}\",transport=\"{}\"}} {}\n",
                    b.id,
                    escape(&b.label),
                    b.endpoint,
                    b.transport,
                    get(b)
                ));
            }
        }
        out.push_str(
            "# HELP blobstream_bindings Live bindings (transfers included).\n\
             # TYPE blobstream_bindings gauge\n",
        );
        out.push_str(&format!("blobstream_bindings {}\n", st.len()));
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// How soon an endpoint gives up on a peer whose host stopped answering (a live peer may stay
/// idle as long as it likes).
const DEAD_PEER: Duration = Duration::from_secs(60);

/// Run a binding to one of the test endpoints until the peer closes it. Blocks.
pub(crate) fn serve(
    table: &BindingTable,
    sched: &Arc<Scheduler>,
    limits: bs_binding::Limits,
    conn: Conn,
    g: BindGrant,
) {
    let transport = match (&g.udp, conn.is_unix()) {
        (Some(_), _) => "udp",
        (None, true) => "unix",
        (None, false) => "tcp",
    };
    // Renegotiation keeps the transport the binding runs on.
    let mut limits = limits;
    for t in &g.profile.transports {
        if !limits.transports.contains(t) {
            limits.transports.push(*t);
        }
    }
    let session = Session::new(Role::Responder, g.profile.clone(), limits, Floor::default());
    let _reg =
        table.register(g.id, g.label.clone(), g.endpoint, transport, session.counters().clone());
    let _ = conn.watch_for_dead_peer(DEAD_PEER);
    // This thread serves this binding alone: let the OS favour high-priority bindings.
    bs_binding::sched::lower_thread_priority(g.profile.priority);
    let mut b = Binding::new(conn, session, g.id).with_scheduler(sched.clone());
    if let Some(sock) = g.udp.as_ref().and_then(|s| s.try_clone().ok()) {
        b = b.with_datagrams(sock);
    }
    let res = match g.endpoint {
        Endpoint::Sink if b.is_datagram() => b.receive_datagrams(drop).map(|r| {
            tracing::info!(
                id = g.id,
                received = r.count,
                lost = r.lost,
                reordered = r.reordered,
                "datagram binding ended"
            );
        }),
        Endpoint::Echo => echo(&mut b),
        Endpoint::Sink => sink(&mut b),
        Endpoint::Source => source(&mut b),
        Endpoint::Push | Endpoint::Pull => Ok(()),
    };
    match res {
        Ok(()) => b.close(),
        Err(e) => {
            tracing::info!(id = g.id, endpoint = g.endpoint.name(), error = %e, "binding failed");
            b.fail(&e);
        }
    }
}

fn echo(b: &mut Binding) -> Result<(), BindingError> {
    while let Some(m) = b.recv()? {
        // The received buffer goes back down this side's stack as it is: with no layers it
        // leaves uncopied; layers that push headers move it once to a buffer with headroom.
        b.send_msg(m)?;
    }
    Ok(())
}

fn sink(b: &mut Binding) -> Result<(), BindingError> {
    while b.recv()?.is_some() {}
    Ok(())
}

fn source(b: &mut Binding) -> Result<(), BindingError> {
    let mut fill = 0u8;
    loop {
        // Renegotiation frames and the peer's close arrive between messages.
        match b.poll() {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(BindingError::Transport(TransportError::Io(e))) if gone(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut m = b.alloc(b.max_message());
        m.payload_mut().fill(fill);
        fill = fill.wrapping_add(1);
        match b.send_msg(m) {
            Ok(()) => {}
            Err(BindingError::Transport(TransportError::Io(e))) if gone(&e) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

fn gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted)
}
