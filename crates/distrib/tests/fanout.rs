//! The distributer end to end on loopback (port 0): byte-exact delivery to every receiver
//! (digest per flow per receiver), each slow-receiver policy, receivers joining and leaving
//! mid-stream, and the bad input that must fail alone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bs_distrib::{
    Config, DistribError, Distributer, FlowHandler, Params, Receiver, RunEnd, Sender, Target,
};
use bs_transport::{TlsClient, TlsServer};
use bs_wire::DigestAlgo;

const CONFIG: &str = r#"
[[stream]]
name = "obs"
token = "t0k"

[[stream.flow]]
name = "hold"
policy = "hold"
chunk = "256k"

[[stream.flow]]
name = "buffer"
policy = "buffer"
buffer = "4m"

[[stream.flow]]
name = "tight"
policy = "buffer"
chunk = "256k"
buffer = "256k"

[[stream.flow]]
name = "timeout"
policy = "timeout"
timeout_ms = 1000

[[stream.flow]]
name = "paced"
pace = "64m"
socket_buffer = "3m"
"#;

fn distributer() -> (Distributer, String) {
    let cfg = Config::parse(CONFIG, "test.toml").unwrap();
    let d = Distributer::start(cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = d.addr().to_string();
    (d, addr)
}

fn data(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Keeps what it receives and what happened.
#[derive(Default)]
struct Keep {
    params: Option<Params>,
    bytes: Vec<u8>,
    stopped: Option<u64>,
    error: Option<String>,
    delay: Option<Duration>,
    /// Bytes received so far, for a sender that keeps pace with this receiver.
    progress: Arc<AtomicU64>,
}

impl FlowHandler for Keep {
    fn on_start(&mut self, p: &Params) {
        let (delay, progress) = (self.delay, self.progress.clone());
        *self = Keep { params: Some(p.clone()), delay, progress, ..Keep::default() };
    }
    fn on_data(&mut self, offset: u64, d: &[u8]) {
        assert_eq!(offset, self.bytes.len() as u64);
        self.bytes.extend_from_slice(d);
        self.progress.fetch_add(d.len() as u64, Ordering::SeqCst);
        if let Some(t) = self.delay {
            thread::sleep(t);
        }
    }
    fn on_stop(&mut self, total: u64) -> Result<(), String> {
        self.stopped = Some(total);
        Ok(())
    }
    fn on_error(&mut self, reason: &str) {
        self.error = Some(reason.to_string());
    }
}

/// A receiver on its own thread that reports each run's end and what it kept.
fn receiver(
    addr: impl Into<Target>,
    flow: &str,
    name: &str,
    delay: Option<Duration>,
) -> mpsc::Receiver<(RunEnd, Keep)> {
    watched_receiver(addr, flow, name, delay, Arc::default())
}

fn watched_receiver(
    addr: impl Into<Target>,
    flow: &str,
    name: &str,
    delay: Option<Duration>,
    progress: Arc<AtomicU64>,
) -> mpsc::Receiver<(RunEnd, Keep)> {
    let mut r = Receiver::connect(addr, "obs", flow, name, Some("t0k")).unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        loop {
            let mut k = Keep { delay, progress: progress.clone(), ..Keep::default() };
            let end = r.run_once(&mut k, None).unwrap();
            let closed = end == RunEnd::Closed;
            if tx.send((end, k)).is_err() || closed {
                return;
            }
        }
    });
    rx
}

fn params(obs: &str) -> Params {
    let mut p = Params::new();
    p.insert("observation".into(), serde_json::json!(obs));
    p.insert("scan".into(), serde_json::json!(3));
    p
}

/// A receiver spoken by hand: connected and its JOIN to `flow` as `name` sent (its answer not
/// read yet).
fn raw_receiver(addr: &str, flow: &str, name: &str) -> bs_binding::Binding {
    raw_peer(addr, bs_distrib::msg::ROLE_RECEIVER, flow, name)
}

/// A peer of `role` spoken by hand, its JOIN sent (its answer not read yet).
fn raw_peer(addr: &str, role: u8, flow: &str, name: &str) -> bs_binding::Binding {
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    let mut b = bs_distrib::distributer::binding(
        bs_transport::Conn::new(tcp),
        bs_binding::Role::Initiator,
        0,
    );
    let j = bs_distrib::msg::Join {
        stream: "obs".into(),
        flow: flow.into(),
        name: name.into(),
        token: "t0k".into(),
    };
    b.send(&bs_distrib::msg::join(role, &j)).unwrap();
    b
}

/// The peer spoken by hand through `b` is refused with an error saying `told`, leaves the
/// flow's receivers, and the flow still serves (a run of `bytes` reaches a new receiver).
fn told_and_flow_serves(
    b: &mut bs_binding::Binding,
    d: &Distributer,
    addr: &str,
    flow: &str,
    told: &str,
    bytes: &[u8],
) {
    let e = b.recv_within(WAIT).unwrap_err().to_string();
    assert!(e.contains(told), "{e}");
    wait_names(d, flow, &[]);
    a_run_reaches(d, addr, flow, "proper", bytes);
}

/// A run of `bytes` on `flow` reaches `name`, a receiver joining now: the flow still serves.
fn a_run_reaches(d: &Distributer, addr: &str, flow: &str, name: &str, bytes: &[u8]) {
    let rx = receiver(addr, flow, name, None);
    wait_names(d, flow, &[name]);
    let mut s = Sender::connect(addr, "obs", flow, Some("t0k")).unwrap();
    s.start(&params("uid://after")).unwrap();
    s.send(bytes).unwrap();
    assert!(s.stop().unwrap().all_delivered());
    assert_eq!(rx.recv_timeout(WAIT).unwrap().0, RunEnd::Stopped(bytes.len() as u64));
}

/// Wait until the distributer lists exactly these receivers on `flow` (they join and leave
/// asynchronously).
fn wait_names(d: &Distributer, flow: &str, names: &[&str]) {
    for _ in 0..2000 {
        let st = d.status();
        let f = st.iter().find(|f| f.flow == flow).unwrap();
        let live = f.receivers.iter().filter(|r| r.connected);
        let mut have: Vec<&str> = live.map(|r| r.name.as_str()).collect();
        have.sort();
        let mut want = names.to_vec();
        want.sort();
        if have == want {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
    panic!("{flow} never had exactly {names:?}: {:?}", d.status());
}

/// Wait until a receiver has taken in `n` bytes.
fn wait_progress(p: &AtomicU64, n: u64) {
    for _ in 0..12_000 {
        if p.load(Ordering::SeqCst) >= n {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
    panic!("the receiver stayed at {} of {n} bytes", p.load(Ordering::SeqCst));
}

/// The next run of the receiver behind `rx` ended with every byte of `bytes`, in order.
fn got_all(rx: &mpsc::Receiver<(RunEnd, Keep)>, bytes: &[u8]) {
    let (end, k) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!(end, RunEnd::Stopped(bytes.len() as u64));
    assert!(k.bytes == bytes, "every byte, in order");
}

/// A receiver on its own thread (as [`receiver`]) whose bytes so far are counted, for a sender
/// that keeps pace with it.
fn counted_receiver(
    addr: &str,
    flow: &str,
    name: &str,
) -> (mpsc::Receiver<(RunEnd, Keep)>, Arc<AtomicU64>) {
    let progress = Arc::new(AtomicU64::new(0));
    (watched_receiver(addr, flow, name, None, progress.clone()), progress)
}

/// Send `bytes` in pieces of `piece` bytes, each once the receiver counting `progress` has had
/// the ones before: a sender keeping pace with that receiver.
fn send_in_step(s: &mut Sender, bytes: &[u8], piece: usize, progress: &AtomicU64) {
    let mut sent = 0;
    for p in bytes.chunks(piece) {
        s.send(p).unwrap();
        sent += p.len() as u64;
        wait_progress(progress, sent);
    }
}

const WAIT: Duration = Duration::from_secs(60);

/// The flow's sender: over a connection, or (`near`) in the distributer's own process.
fn sender(d: &Distributer, addr: &str, flow: &str, near: bool) -> Sender {
    if near {
        d.sender("obs", flow).unwrap()
    } else {
        Sender::connect(addr, "obs", flow, Some("t0k")).unwrap()
    }
}

/// Wait until `flow` has no sender (one that closed its connection is noticed a moment later).
fn wait_no_sender(d: &Distributer, flow: &str) {
    for _ in 0..2000 {
        if d.status().iter().any(|f| f.flow == flow && !f.sender) {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
    panic!("{flow} kept its sender: {:?}", d.status());
}

#[test]
fn every_receiver_gets_every_byte_of_every_run() {
    let (d, addr) = distributer();
    let rx: Vec<_> = ["archive", "pipeline", "quicklook"]
        .iter()
        .map(|n| receiver(&addr, "hold", n, None))
        .collect();
    wait_names(&d, "hold", &["archive", "pipeline", "quicklook"]);
    // A sender over a connection, then one in the distributer's process.
    for (run, size, near) in [(1, 5_000_000usize, false), (2, 777, false), (3, 3_000_001, true)] {
        wait_no_sender(&d, "hold");
        let mut s = sender(&d, &addr, "hold", near);
        assert_eq!(s.policy(), "hold");
        let bytes = data(size, run);
        s.start(&params(&format!("uid://X{run}"))).unwrap();
        // Uneven sends, split again into the flow's 256 KiB chunks; every other one shared.
        for (i, piece) in bytes.chunks(333_333).enumerate() {
            if i % 2 == 0 {
                s.send(piece).unwrap();
            } else {
                s.send_bytes(&bytes::Bytes::copy_from_slice(piece)).unwrap();
            }
        }
        let report = s.stop().unwrap();
        assert_eq!(report.total, size as u64);
        assert!(report.all_delivered(), "{report:?}");
        assert_eq!(report.receivers.len(), 3);
        let want = DigestAlgo::Xxh3_128.digest(&bytes);
        for r in &rx {
            let (end, k) = r.recv_timeout(WAIT).unwrap();
            assert_eq!(end, RunEnd::Stopped(size as u64));
            assert_eq!(DigestAlgo::Xxh3_128.digest(&k.bytes), want, "byte-exact");
            assert_eq!(k.params.unwrap()["observation"], format!("uid://X{run}"));
            assert_eq!((k.stopped, k.error), (Some(size as u64), None));
        }
        s.close();
    }
}

/// A flow has one sender, whichever kind: one in the distributer's process keeps a connected
/// one out and the other way round, and each leaves the place free when it goes.
#[test]
fn a_flow_has_one_sender_near_or_far() {
    let (d, addr) = distributer();
    let taken = "already has a sender";
    let near = d.sender("obs", "hold").unwrap();
    let e = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap_err().to_string();
    assert!(e.contains(taken), "{e}");
    assert!(d.status().iter().any(|f| f.flow == "hold" && f.sender));
    near.close();
    let far = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
    let e = d.sender("obs", "hold").unwrap_err().to_string();
    assert!(e.contains(taken), "{e}");
    far.close();
    wait_no_sender(&d, "hold");
    let _again = d.sender("obs", "hold").unwrap();
    let e = d.sender("obs", "nope").unwrap_err().to_string();
    assert!(e.contains("no flow \"nope\""), "{e}");
    assert_eq!(d.sender("nope", "hold").unwrap_err().to_string(), "unknown stream \"nope\"");
}

#[test]
fn hold_waits_for_the_slowest_receiver_and_loses_nothing() {
    let (d, addr) = distributer();
    let fast = receiver(&addr, "hold", "fast", None);
    let slow = receiver(&addr, "hold", "slow", Some(Duration::from_millis(2)));
    wait_names(&d, "hold", &["fast", "slow"]);
    let mut s = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
    let bytes = data(8 << 20, 9);
    s.start(&Params::new()).unwrap();
    s.send(&bytes).unwrap();
    let report = s.stop().unwrap();
    assert!(report.all_delivered(), "{report:?}");
    for r in [fast, slow] {
        got_all(&r, &bytes);
    }
}

/// A receiver that never reads: under `buffer` and `timeout` it is dropped and reported by
/// name; the others receive everything.
#[test]
fn a_stalled_receiver_is_dropped_and_reported_under_buffer_and_timeout() {
    let cases = [("buffer", "bytes behind"), ("timeout", "took nothing for 1000 ms")];
    for ((flow, reason), near) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
        let (d, addr) = distributer();
        let (ok, progress) = counted_receiver(&addr, flow, "healthy");
        let stalled = Receiver::connect(&addr, "obs", flow, "stalled", Some("t0k")).unwrap();
        wait_names(&d, flow, &["healthy", "stalled"]);
        let mut s = sender(&d, &addr, flow, near);
        let bytes = data(64 << 20, 5);
        s.start(&Params::new()).unwrap();
        // Keep pace with the healthy receiver, so only the stalled one falls behind.
        send_in_step(&mut s, &bytes, 1 << 20, &progress);
        let report = s.stop().unwrap();
        let mut dropped = s.take_dropped();
        dropped.retain(|o| o.name == "stalled");
        assert_eq!(dropped.len(), 1, "{flow}: reported once while it ran: {report:?}");
        assert!(dropped[0].reason.contains(reason), "{flow}: {:?}", dropped[0]);
        assert!(dropped[0].delivered < bytes.len() as u64);
        let by = |n: &str| report.receivers.iter().find(|o| o.name == n).unwrap().clone();
        assert!(by("healthy").ok, "{flow}: {report:?}");
        assert!(!by("stalled").ok && by("stalled").reason.contains(reason), "{report:?}");
        got_all(&ok, &bytes);
        // The dropped receiver is out of the table; the healthy one stays.
        wait_names(&d, flow, &["healthy"]);
        drop(stalled);
        s.close();
    }
}

/// A receiver that reads, but too slowly for the `buffer` flow's bound, is dropped; it is told
/// why (after what was already on its way to it), not left with a closed connection to guess
/// at, and the sender is told the same.
#[test]
fn a_receiver_dropped_by_the_policy_is_told_why() {
    let (d, addr) = distributer();
    let slow = receiver(&addr, "buffer", "slow", Some(Duration::from_millis(20)));
    wait_names(&d, "buffer", &["slow"]);
    let mut s = Sender::connect(&addr, "obs", "buffer", Some("t0k")).unwrap();
    s.start(&Params::new()).unwrap();
    for piece in data(32 << 20, 8).chunks(1 << 20) {
        s.send(piece).unwrap();
    }
    let report = s.stop().unwrap();
    let o = report.receivers.iter().find(|o| o.name == "slow").unwrap();
    assert!(!o.ok && o.reason.contains("bytes behind"), "{report:?}");
    let (end, k) = slow.recv_timeout(WAIT).unwrap();
    let RunEnd::Failed(why) = end else { panic!("the slow receiver's run: {end:?}") };
    assert!(why.contains("dropped: fell") && why.contains("bytes behind"), "{why}");
    assert_eq!(k.error.as_deref(), Some(why.as_str()), "its handler heard the same");
    assert!((k.bytes.len() as u64) < 32 << 20);
    s.close();
}

/// A `buffer` bound of one chunk: a receiver that keeps up (the sender waits for it after each
/// chunk) is never dropped, though each message with its header and bookkeeping is a little
/// over the bound.
#[test]
fn a_receiver_keeping_up_is_never_dropped_by_a_bound_of_one_chunk() {
    let (d, addr) = distributer();
    let (rx, progress) = counted_receiver(&addr, "tight", "steady");
    wait_names(&d, "tight", &["steady"]);
    let mut s = Sender::connect(&addr, "obs", "tight", Some("t0k")).unwrap();
    let bytes = data(8 << 20, 12);
    s.start(&Params::new()).unwrap();
    send_in_step(&mut s, &bytes, 256 << 10, &progress);
    let report = s.stop().unwrap();
    assert!(report.all_delivered(), "{report:?}");
    got_all(&rx, &bytes);
}

/// The `buffer` bound counts what a queued message costs, not only its payload: a flood of
/// one-byte messages to a receiver that never reads drops it long before 4 MB of payload.
#[test]
fn a_flood_of_tiny_messages_is_bounded_as_large_ones_are() {
    let (d, addr) = distributer();
    let stalled = Receiver::connect(&addr, "obs", "buffer", "stalled", Some("t0k")).unwrap();
    wait_names(&d, "buffer", &["stalled"]);
    let mut s = Sender::connect(&addr, "obs", "buffer", Some("t0k")).unwrap();
    s.start(&Params::new()).unwrap();
    // 500,000 messages of one byte, about 17 MB on the wire: more than the kernel's socket
    // buffers can take off the queue, even at their largest.
    for i in 0..500_000u32 {
        s.send(&[i as u8]).unwrap();
    }
    let report = s.stop().unwrap();
    let o = report.receivers.iter().find(|o| o.name == "stalled").unwrap();
    assert!(!o.ok && o.reason.contains("bytes behind"), "{report:?}");
    assert!(o.delivered < 500_000, "{report:?}");
    drop(stalled);
    s.close();
}

/// A receiver that leaves mid-run is reported; one that joins mid-run waits for the next
/// start and then gets all of it.
#[test]
fn receivers_join_and_leave_while_the_stream_runs() {
    let (d, addr) = distributer();
    let (stays, progress) = counted_receiver(&addr, "hold", "stays");
    let leaver = Receiver::connect(&addr, "obs", "hold", "leaver", Some("t0k")).unwrap();
    wait_names(&d, "hold", &["stays", "leaver"]);
    let mut s = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
    let first = data(6 << 20, 1);
    s.start(&params("first")).unwrap();
    s.send(&first[..1 << 20]).unwrap();
    // The run has started at the distributer (its bytes reach a receiver) before the one
    // leaves and the other joins: `send` returns once the bytes are in the sender's socket,
    // and a receiver joining before the distributer reads the start would be in this run.
    wait_progress(&progress, 1);
    leaver.close();
    let late = receiver(&addr, "hold", "late", None);
    wait_names(&d, "hold", &["stays", "late"]);
    s.send(&first[1 << 20..]).unwrap();
    let report = s.stop().unwrap();
    let names: Vec<_> = report.receivers.iter().map(|o| (o.name.as_str(), o.ok)).collect();
    assert_eq!(names, [("stays", true), ("leaver", false)], "the late one was not in this run");
    let (_, k) = stays.recv_timeout(WAIT).unwrap();
    assert!(k.bytes == first);
    // Status still lists the one that left, not connected, and why.
    let st = d.status();
    let hold = st.iter().find(|f| f.flow == "hold").unwrap();
    let gone = hold.receivers.iter().find(|r| r.name == "leaver").expect("listed after leaving");
    assert!(!gone.connected && gone.queued_bytes == 0, "{gone:?}");
    let told = &report.receivers[1].reason;
    assert_eq!(gone.last_error.as_ref(), Some(told), "what the sender was told: {gone:?}");
    assert!(hold.receivers.iter().filter(|r| r.name != "leaver").all(|r| r.connected));

    let second = data(1 << 20, 2);
    s.start(&params("second")).unwrap();
    s.send(&second).unwrap();
    assert!(s.stop().unwrap().all_delivered());
    for r in [&stays, &late] {
        let (end, k) = r.recv_timeout(WAIT).unwrap();
        assert_eq!(end, RunEnd::Stopped(second.len() as u64));
        assert!(k.bytes == second);
        assert_eq!(k.params.unwrap()["observation"], "second");
    }
}

#[test]
fn a_sender_that_dies_mid_flow_ends_the_run_with_an_error_never_a_stop() {
    let (d, addr) = distributer();
    let r = receiver(&addr, "hold", "archive", None);
    wait_names(&d, "hold", &["archive"]);
    // Over a connection (closed), then in the distributer's process (dropped, not closed).
    for near in [false, true] {
        wait_no_sender(&d, "hold");
        let mut s = sender(&d, &addr, "hold", near);
        s.start(&params("doomed")).unwrap();
        s.send(&data(3 << 20, 4)).unwrap();
        if near {
            drop(s)
        } else {
            s.close()
        }
        let (end, k) = r.recv_timeout(WAIT).unwrap();
        let left = matches!(&end, RunEnd::Failed(why) if why.contains("sender left mid-flow"));
        assert!(left, "{end:?}");
        assert_eq!(k.stopped, None);
        assert!(k.error.is_some());
        // The flow takes a new sender, and the receiver the next run.
        let mut s = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
        s.start(&params("again")).unwrap();
        s.send(b"fine").unwrap();
        assert!(s.stop().unwrap().all_delivered());
        assert_eq!(r.recv_timeout(WAIT).unwrap().0, RunEnd::Stopped(4));
        s.close();
    }
}

/// A run under way from a sender in the distributer's process to one receiver ("archive").
fn a_run_in_the_process() -> (Distributer, mpsc::Receiver<(RunEnd, Keep)>, Sender) {
    let (d, addr) = distributer();
    let r = receiver(&addr, "hold", "archive", None);
    wait_names(&d, "hold", &["archive"]);
    let mut s = d.sender("obs", "hold").unwrap();
    s.start(&params("under way")).unwrap();
    s.send(&data(1 << 20, 3)).unwrap();
    (d, r, s)
}

/// A sender in the distributer's process is told when the distributer stops: its next call
/// fails, saying so, rather than sending on into receivers it has let go.
#[test]
fn a_sender_in_the_process_is_told_when_its_distributer_stops() {
    let (d, r, mut s) = a_run_in_the_process();
    drop(d);
    let e = s.send(b"more").unwrap_err().to_string();
    assert!(e.contains("the distributer was stopped"), "{e}");
    let e = s.stop().unwrap_err().to_string();
    assert!(e.contains("the distributer was stopped"), "{e}");
    let (end, k) = r.recv_timeout(WAIT).unwrap();
    assert!(matches!(end, RunEnd::Failed(_)), "{end:?}");
    assert_eq!(k.stopped, None);
}

/// Stopped with a grace, the distributer first writes the receivers of a run its sender in
/// this process left why it ended, rather than just closing their connections.
#[test]
fn stopped_with_a_grace_the_distributer_tells_the_receivers_why() {
    let (d, r, s) = a_run_in_the_process();
    drop(s);
    d.stop(Duration::from_secs(10));
    let (end, _) = r.recv_timeout(WAIT).unwrap();
    let told = matches!(&end, RunEnd::Failed(why) if why.contains("sender left mid-flow"));
    assert!(told, "{end:?}");
}

/// A stream with a sender token of its own: the receivers' token admits no sender (a receiver
/// cannot feed its own bytes to the others), the sender's admits no receiver, each its own.
#[test]
fn a_sender_token_keeps_receivers_from_sending() {
    let cfg = "[[stream]]\nname = \"obs\"\ntoken = \"r-t0k\"\nsender_token = \"s-t0k\"\n\n\
               [[stream.flow]]\nname = \"f\"\n";
    let cfg = Config::parse(cfg, "roles.toml").unwrap();
    let d = Distributer::start(cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = d.addr().to_string();
    let wrong = |e: DistribError| assert!(e.to_string().contains("wrong token"), "{e}");
    wrong(Sender::connect(&addr, "obs", "f", Some("r-t0k")).unwrap_err());
    wrong(Receiver::connect(&addr, "obs", "f", "rx", Some("s-t0k")).unwrap_err());
    let _r = Receiver::connect(&addr, "obs", "f", "rx", Some("r-t0k")).unwrap();
    let mut s = Sender::connect(&addr, "obs", "f", Some("s-t0k")).unwrap();
    s.start(&params("roles")).unwrap();
}

/// Where no stream needs a token there is nothing to guard: an unknown stream is named so.
#[test]
fn without_tokens_an_unknown_stream_is_named_as_unknown() {
    let cfg =
        Config::parse("[[stream]]\nname = \"open\"\n\n[[stream.flow]]\nname = \"f\"\n", "o.toml");
    let d = Distributer::start(cfg.unwrap(), "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = d.addr().to_string();
    let e = Sender::connect(&addr, "nope", "f", None).unwrap_err();
    assert!(e.to_string().contains("unknown stream \"nope\""), "{e}");
    let e = Sender::connect(&addr, "open", "g", None).unwrap_err();
    assert!(e.to_string().contains("has no flow \"g\""), "{e}");
    Sender::connect(&addr, "open", "f", None).unwrap();
}

/// Peers that have proven nothing hold little: a first message announcing more than a JOIN can
/// be is refused before its body is read; past `MAX_JOINING` connections that have not joined,
/// further ones are closed at once (no thread each); once they go, peers join again.
#[test]
fn peers_that_have_not_joined_hold_little() {
    use std::io::{Read, Write};
    let (_d, addr) = distributer();
    let mut big = std::net::TcpStream::connect(&addr).unwrap();
    let head = bs_wire::Header { kind: bs_wire::FrameKind::Msg, body_len: 0, a: 0, b: 16 << 20 };
    big.write_all(&head.encode()).unwrap();
    let mut conn = bs_transport::Conn::new(big);
    match conn.read_frame().unwrap() {
        bs_wire::Frame::Error { message, .. } => {
            assert!(message.contains("a greeting is at most"), "{message}")
        }
        other => panic!("expected ERROR, got {other:?}"),
    }

    let silent: Vec<_> = (0..bs_distrib::distributer::MAX_JOINING)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // One more: closed without a word (not held until the JOIN wait ends, then told).
    let mut extra = std::net::TcpStream::connect(&addr).unwrap();
    extra.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(extra.read(&mut buf).unwrap_or(0), 0, "closed at once, no ERROR frame");
    drop(silent);
    let give_up = std::time::Instant::now() + WAIT;
    loop {
        match Receiver::connect(&addr, "obs", "hold", "after", Some("t0k")) {
            Ok(_) => break,
            Err(e) => assert!(std::time::Instant::now() < give_up, "cannot join again: {e}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn bad_input_gets_a_clear_error_and_the_distributer_keeps_serving() {
    let (d, addr) = distributer();
    let err = |r: Result<Sender, DistribError>| r.unwrap_err().to_string();
    // Streams here need tokens: an unknown stream is answered as a wrong token is, so names
    // cannot be probed without one; a flow is looked up only once the token is right.
    let unknown = err(Sender::connect(&addr, "nope", "hold", Some("t0k")));
    let wrong = err(Sender::connect(&addr, "obs", "hold", Some("wrong")));
    assert!(unknown.contains("wrong token") && unknown.contains("or no such stream"), "{unknown}");
    assert_eq!(unknown.replace("\"nope\"", "\"obs\""), wrong);
    assert!(err(Sender::connect(&addr, "obs", "nope", Some("wrong"))).contains("wrong token"));
    assert!(err(Sender::connect(&addr, "obs", "nope", Some("t0k"))).contains("has no flow"));
    assert!(err(Sender::connect(&addr, "obs", "hold", None)).contains("wrong token"));

    let mut s = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
    assert!(
        err(Sender::connect(&addr, "obs", "hold", Some("t0k"))).contains("already has a sender")
    );
    assert!(s.send(b"x").unwrap_err().to_string().contains("send before start"));
    assert!(s.stop().unwrap_err().to_string().contains("stop before start"));

    // The receiver joins before START, so it is in the run (a join racing the START could be
    // either in it or waiting for the next one); it receives the run on a thread of its own.
    let mut a = Receiver::connect(&addr, "obs", "hold", "same", Some("t0k")).unwrap();
    let e = Receiver::connect(&addr, "obs", "hold", "same", Some("t0k")).unwrap_err();
    assert!(e.to_string().contains("already on flow"), "{e}");
    let a_run = thread::spawn(move || {
        let mut keep = Keep::default();
        let end = a.run_once(&mut keep, Some(WAIT)).unwrap();
        (a, end, keep.bytes)
    });
    s.start(&Params::new()).unwrap();
    assert!(s.start(&Params::new()).unwrap_err().to_string().contains("already running"));

    // Garbage instead of a JOIN: refused with the reason; nothing else is disturbed.
    let mut raw = std::net::TcpStream::connect(&addr).unwrap();
    use std::io::{Read, Write};
    raw.write_all(b"GET / HTTP/1.1\r\nHost: distributer\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let _ = raw.read_to_end(&mut buf);
    let (f, _) = bs_wire::Frame::parse(&buf).unwrap().expect("an ERROR frame");
    let bs_wire::Frame::Error { code, message } = f else { panic!("{f:?}") };
    assert_eq!(code, bs_wire::ErrorCode::BadFrame, "{message}");
    assert!(message.contains("expected JOIN"), "{message}");

    // A sender spoken by hand whose DATA carries nothing: refused (it would only take a slot
    // in every receiver's queue). The flow's sender is busy, so it joins another flow.
    let mut empty = raw_peer(&addr, bs_distrib::msg::ROLE_SENDER, "buffer", "");
    empty.recv().unwrap().expect("WELCOME");
    empty.send(&bs_distrib::msg::start(&Params::new())).unwrap();
    empty.send(&bs_distrib::msg::data_head(0)).unwrap();
    let e = loop {
        match empty.recv() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("closed without a word"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(e.contains("an empty DATA"), "{e}");

    s.send(b"still fine").unwrap();
    let report = s.stop().unwrap();
    assert_eq!(report.total, 10);
    assert!(report.all_delivered() && report.receivers.len() == 1, "{report:?}");
    let (_a, end, bytes) = a_run.join().unwrap();
    assert_eq!((end, bytes), (RunEnd::Stopped(10), b"still fine".to_vec()));
    // The status call over the network says what the distributer itself says, and /metrics
    // has the same counters.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let status_addr = listener.local_addr().unwrap().to_string();
    rt.spawn(bs_distrib::service::serve(listener, d.status_source(), Default::default()));
    let remote = rt.block_on(bs_distrib::service::fetch(&status_addr, &Default::default()));
    let remote = remote.unwrap();
    let hold = remote.iter().find(|f| f.flow == "hold").unwrap();
    assert!(hold.sender && !hold.running);
    assert_eq!(hold.receivers.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["same"]);
    assert_eq!(remote.len(), d.status().len());
    let mut http = std::net::TcpStream::connect(&status_addr).unwrap();
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n").unwrap();
    let mut page = String::new();
    http.read_to_string(&mut page).unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let line =
        "blobstream_distributer_delivered_bytes{stream=\"obs\",flow=\"hold\",receiver=\"same\"}";
    assert!(page.contains(line), "{page}");
    assert!(
        page.contains("blobstream_distributer_flow_running{stream=\"obs\",flow=\"hold\"} 0"),
        "{page}"
    );
    assert!(page.trim_end().ends_with("# EOF"));
    // Any other path is a plain 404 saying what the port serves, not an empty gRPC answer.
    let mut http = std::net::TcpStream::connect(&status_addr).unwrap();
    http.write_all(b"GET /status HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n").unwrap();
    let mut page = String::new();
    http.read_to_string(&mut page).unwrap();
    assert!(page.starts_with("HTTP/1.1 404"), "{page}");
    assert!(page.contains("no /status here") && page.contains("GET /metrics"), "{page}");
}

/// A distributer that stops mid-run (as a process restart would): the sender's next call and
/// the receiver's run fail with a clear error, and both connect again to its successor.
#[test]
fn a_distributer_restart_is_a_clear_error_and_everyone_reconnects() {
    let (d, addr) = distributer();
    let (r, progress) = counted_receiver(&addr, "hold", "archive");
    wait_names(&d, "hold", &["archive"]);
    let mut s = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
    s.start(&params("interrupted")).unwrap();
    s.send(&data(1 << 20, 8)).unwrap();
    // The run has reached the receiver (`send` returns once the bytes are in the sender's
    // socket: stopped before the distributer forwards the start, the receiver would see a
    // connection closed between runs, not a run cut short).
    wait_progress(&progress, 1);
    drop(d);
    let (end, k) = r.recv_timeout(WAIT).unwrap();
    assert!(matches!(&end, RunEnd::Failed(why) if why.contains("mid-flow")), "{end:?}");
    assert_eq!(k.stopped, None);
    let mut failed = None;
    for _ in 0..100 {
        if let Err(e) = s.send(&data(1 << 20, 8)).and_then(|()| s.stop().map(drop)) {
            failed = Some(e);
            break;
        }
    }
    let e = failed.expect("the sender notices the distributer is gone");
    assert!(matches!(e, DistribError::Remote(_)), "{e}");
    let said = e.to_string();
    assert!(said.contains(&format!("the distributer at {addr} closed the connection")), "{said}");
    assert!(said.contains("the run is lost for every receiver"), "{said}");

    // Its successor on the same address: a test running alongside may hold the port a
    // moment (as a connection's own port), so the bind is tried again until a deadline.
    let deadline = Instant::now() + Duration::from_secs(30);
    let d = loop {
        let cfg = Config::parse(CONFIG, "test.toml").unwrap();
        match Distributer::start(cfg, addr.parse().unwrap()) {
            Ok(d) => break d,
            Err(e) if Instant::now() < deadline => {
                eprintln!("restarting on {addr}: {e}; again");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the distributer does not start again on {addr}: {e}"),
        }
    };
    let r = receiver(&addr, "hold", "archive", None);
    wait_names(&d, "hold", &["archive"]);
    let mut s = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
    s.start(&params("again")).unwrap();
    s.send(b"after the restart").unwrap();
    assert!(s.stop().unwrap().all_delivered());
    assert_eq!(r.recv_timeout(WAIT).unwrap().1.bytes, b"after the restart");
}

/// A receiver that confirms its last run and leaves at once, while a slower one is still
/// receiving, delivered that run: the report says so.
#[test]
fn a_receiver_that_confirms_and_leaves_is_reported_delivered() {
    let (d, addr) = distributer();
    // The slow one first, so the stop waits on it while the other has long left.
    let slow = receiver(&addr, "hold", "slow", Some(Duration::from_millis(80)));
    wait_names(&d, "hold", &["slow"]);
    let mut once = Receiver::connect(&addr, "obs", "hold", "once", Some("t0k")).unwrap();
    wait_names(&d, "hold", &["once", "slow"]);
    let leaver = thread::spawn(move || {
        let mut k = Keep::default();
        let end = once.run_once(&mut k, None).unwrap();
        once.close();
        end
    });
    let mut s = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
    s.start(&Params::new()).unwrap();
    s.send(&data(4 << 20, 6)).unwrap();
    let report = s.stop().unwrap();
    assert_eq!(leaver.join().unwrap(), RunEnd::Stopped(4 << 20));
    assert!(report.all_delivered(), "{report:?}");
    assert!(s.take_dropped().is_empty());
    assert_eq!(slow.recv_timeout(WAIT).unwrap().0, RunEnd::Stopped(4 << 20));
}

/// A flow's pace reaches its sender, which keeps to it (or to its own), and the bytes arrive
/// exactly as unpaced ones do.
#[test]
fn a_paced_flow_tells_its_sender_the_pace() {
    let (d, addr) = distributer();
    let r = receiver(&addr, "paced", "archive", None);
    wait_names(&d, "paced", &["archive"]);
    let mut s = Sender::connect(&addr, "obs", "paced", Some("t0k")).unwrap();
    assert_eq!(s.pace(), Some(64 << 20));
    let bytes = data(1 << 20, 11);
    s.start(&Params::new()).unwrap();
    s.send(&bytes).unwrap();
    assert!(s.stop().unwrap().all_delivered());
    assert!(r.recv_timeout(WAIT).unwrap().1.bytes == bytes);
    s.set_pace(Some(1 << 30));
    assert_eq!(s.pace(), Some(1 << 30));
    s.set_pace(None);
    assert_eq!(s.pace(), None);
    let hold = Sender::connect(&addr, "obs", "hold", Some("t0k")).unwrap();
    assert_eq!(hold.pace(), None, "an unpaced flow");
    // The flow's socket buffer reaches the sender's socket: Linux keeps twice the value set,
    // capped at net.core.wmem_max.
    let wmem_max: usize =
        std::fs::read_to_string("/proc/sys/net/core/wmem_max").unwrap().trim().parse().unwrap();
    assert_eq!(s.socket_buffer(), Some(2 * (3usize << 20).min(wmem_max)));
    assert_ne!(hold.socket_buffer(), s.socket_buffer(), "a flow without one keeps the kernel's");
}

/// A distributer speaking TLS with a self-signed certificate naming localhost, its address by
/// that name (the certificate is checked against the host of the address), and a client's
/// trust in the certificate.
fn tls_distributer() -> (Distributer, String, TlsClient) {
    let id = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (id.cert.pem(), id.signing_key.serialize_pem());
    let server = TlsServer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let cfg = Config::parse(CONFIG, "test.toml").unwrap();
    let d = Distributer::start_with_tls(cfg, "127.0.0.1:0".parse().unwrap(), Some(server)).unwrap();
    let addr = format!("localhost:{}", d.addr().port());
    let trust = TlsClient::from_pem(cert.as_bytes(), None).unwrap();
    (d, addr, trust)
}

/// A distributer started with a certificate speaks only TLS: a sender and receivers that trust
/// its CA run a flow byte-exact; a plain client, a client trusting another CA, and a TLS client
/// facing a plain distributer are each refused with an error, and the run goes on.
#[test]
fn over_tls_every_byte_arrives_and_untrusting_peers_are_refused() {
    let (d, addr, trust) = tls_distributer();
    let tls = || Target::from(&addr).with_tls(trust.clone());

    let e = Receiver::connect(&addr, "obs", "hold", "plain", Some("t0k")).unwrap_err();
    assert!(e.to_string().contains("TLS"), "a plain client is told why: {e}");
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let wrong = TlsClient::from_pem(other.cert.pem().as_bytes(), None).unwrap();
    let e = Receiver::connect(Target::from(&addr).with_tls(wrong), "obs", "hold", "x", Some("t0k"))
        .unwrap_err();
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    let (plain, plain_addr) = distributer();
    let e = Sender::connect(Target::from(&plain_addr).with_tls(trust.clone()), "obs", "hold", None)
        .unwrap_err();
    assert!(e.to_string().contains("TLS"), "{e}");
    drop(plain);

    let rx: Vec<_> =
        ["archive", "quicklook"].iter().map(|n| receiver(tls(), "hold", n, None)).collect();
    wait_names(&d, "hold", &["archive", "quicklook"]);
    let mut s = Sender::connect(tls(), "obs", "hold", Some("t0k")).unwrap();
    let bytes = data(3_000_000, 9);
    s.start(&params("uid://tls")).unwrap();
    s.send(&bytes).unwrap();
    let report = s.stop().unwrap();
    assert!(report.all_delivered(), "{report:?}");
    let want = DigestAlgo::Xxh3_128.digest(&bytes);
    for r in &rx {
        let (end, k) = r.recv_timeout(WAIT).unwrap();
        assert_eq!(end, RunEnd::Stopped(bytes.len() as u64));
        assert_eq!(DigestAlgo::Xxh3_128.digest(&k.bytes), want, "byte-exact over TLS");
    }
}

/// The status service with TLS and a token: answered only to a client that trusts the
/// certificate and presents the token; the others are told why.
#[test]
fn the_status_service_answers_only_trusted_tls_with_the_token() {
    let id = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (id.cert.pem(), id.signing_key.serialize_pem());
    let cfg = Config::parse(CONFIG, "test.toml").unwrap();
    let d = Distributer::start(cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = format!("localhost:{}", listener.local_addr().unwrap().port());
    let secure = bs_plane::Secure {
        tls: Some(TlsServer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap()),
        token: Some("status-t0k".into()),
        ..Default::default()
    };
    rt.spawn(bs_distrib::service::serve(listener, d.status_source(), secure));
    let trust = TlsClient::from_pem(cert.as_bytes(), None).unwrap();
    let good = bs_plane::Credentials { tls: Some(trust), token: Some("status-t0k".into()) };
    let fetch = |c: &bs_plane::Credentials| rt.block_on(bs_distrib::service::fetch(&addr, c));
    assert_eq!(fetch(&good).unwrap().len(), d.status().len());
    let e = fetch(&bs_plane::Credentials { token: None, ..good.clone() }).unwrap_err();
    assert!(e.to_string().contains("requires a token"), "{e}");
    let e = fetch(&bs_plane::Credentials { token: Some("guess".into()), ..good.clone() });
    assert!(e.unwrap_err().to_string().contains("wrong token"));
    let e = fetch(&bs_plane::Credentials { tls: None, ..good.clone() }).unwrap_err();
    assert!(e.to_string().contains("if it speaks TLS"), "a plain client is told why: {e}");
}

const UDP_CONFIG: &str = r#"
[[stream]]
name = "obs"
token = "t0k"

[[stream.flow]]
name = "display"
transport = "udp"
datagram = "8k"
chunk = "256k"
socket_buffer = "8m"

[[stream.flow]]
name = "lossy"
transport = "udp"
"#;

fn udp_distributer() -> (Distributer, String) {
    let cfg = Config::parse(UDP_CONFIG, "udp.toml").unwrap();
    let d = Distributer::start(cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = d.addr().to_string();
    (d, addr)
}

/// A udp flow with room for every datagram: each receiver gets every byte in order, run
/// after run, and the sender's report counts no loss.
#[test]
fn a_udp_flow_delivers_every_byte_in_order_when_nothing_is_lost() {
    let (d, addr) = udp_distributer();
    let rx: Vec<_> =
        ["display", "pipeline"].iter().map(|n| receiver(&addr, "display", n, None)).collect();
    wait_names(&d, "display", &["display", "pipeline"]);
    let st = d.status();
    assert_eq!(st.iter().find(|f| f.flow == "display").unwrap().transport, "udp");
    // The whole run fits in each receiver's 8 MiB socket buffer, however late it reads. A
    // sender over a connection, then one in the distributer's process.
    let runs = [(1, 1_500_000usize, false), (2, 8193, false), (3, 1, false), (4, 700_001, true)];
    let mut s = Sender::connect(&addr, "obs", "display", Some("t0k")).unwrap();
    for (run, size, near) in runs {
        if near {
            s.close();
            wait_no_sender(&d, "display");
            s = d.sender("obs", "display").unwrap();
        }
        let bytes = data(size, run);
        s.start(&params(&format!("uid://U{run}"))).unwrap();
        s.send(&bytes).unwrap();
        let report = s.stop().unwrap();
        assert!(report.all_delivered(), "{report:?}");
        assert!(report.receivers.iter().all(|r| r.lost == 0 && r.delivered == size as u64));
        let want = DigestAlgo::Xxh3_128.digest(&bytes);
        for r in &rx {
            let (end, k) = r.recv_timeout(WAIT).unwrap();
            assert_eq!(end, RunEnd::Stopped(size as u64));
            assert_eq!(DigestAlgo::Xxh3_128.digest(&k.bytes), want, "byte-exact over udp");
            assert_eq!((k.stopped, k.error), (Some(size as u64), None));
        }
    }
}

/// What a udp receiver was handed: bytes at their offsets and the losses between them.
#[derive(Default)]
struct Holes {
    pieces: Vec<(u64, Vec<u8>)>,
    lost: Vec<(u64, u64)>,
    stopped: Option<u64>,
    error: Option<String>,
    /// Held in `on_start` until this says go.
    gate: Option<mpsc::Receiver<()>>,
}

impl FlowHandler for Holes {
    fn on_start(&mut self, _p: &Params) {
        if let Some(g) = self.gate.take() {
            g.recv_timeout(WAIT).unwrap();
        }
    }
    fn on_data(&mut self, offset: u64, d: &[u8]) {
        self.pieces.push((offset, d.to_vec()));
    }
    fn on_loss(&mut self, offset: u64, len: u64) {
        self.lost.push((offset, len));
    }
    fn on_stop(&mut self, total: u64) -> Result<(), String> {
        self.stopped = Some(total);
        Ok(())
    }
    fn on_error(&mut self, reason: &str) {
        self.error = Some(reason.to_string());
    }
}

/// A receiver that cannot keep up with a udp flow (it reads nothing while a run four times
/// its socket buffer is sent) loses datagrams: the losses are handed to it in place,
/// its run ends in `on_error` naming them, the sender's report names it with what it lost,
/// and its next run arrives whole.
#[test]
fn a_udp_receiver_that_loses_datagrams_is_reported_with_what_it_lost() {
    let (d, addr) = udp_distributer();
    let mut r = Receiver::connect(&addr, "obs", "lossy", "slow", Some("t0k")).unwrap();
    assert_eq!(r.transport(), "udp");
    let (go, gate) = mpsc::channel();
    let run = thread::spawn(move || {
        let mut h = Holes { gate: Some(gate), ..Holes::default() };
        let end = r.run_once(&mut h, Some(WAIT)).unwrap();
        (r, end, h)
    });
    wait_names(&d, "lossy", &["slow"]);
    let mut s = Sender::connect(&addr, "obs", "lossy", Some("t0k")).unwrap();
    // The receiver's socket holds 4 MiB (8 MiB of kernel accounting, about 3,600 datagrams).
    let bytes = data(16 << 20, 5);
    s.start(&params("uid://lossy")).unwrap();
    s.send(&bytes).unwrap();
    // Every datagram is out of the distributer before the receiver reads one.
    let all_out = || {
        let st = d.status();
        let f = st.iter().find(|f| f.flow == "lossy").unwrap();
        f.receivers.iter().any(|r| r.delivered == bytes.len() as u64)
    };
    for _ in 0..12_000 {
        if all_out() {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert!(all_out(), "the distributer never sent the whole run: {:?}", d.status());
    go.send(()).unwrap();
    let report = s.stop().unwrap();
    let o = &report.receivers[0];
    assert!(!o.ok && o.lost > 0 && o.delivered < bytes.len() as u64, "{report:?}");
    assert!(o.reason.contains("lost") && o.reason.contains("udp flow"), "{report:?}");
    let (mut r, end, h) = run.join().unwrap();
    let RunEnd::Failed(why) = end else { panic!("{end:?}") };
    assert!(why.contains("datagrams never arrived"), "{why}");
    assert_eq!((h.stopped, h.error.as_deref()), (None, Some(why.as_str())));
    // The pieces and losses tile the run exactly, in order, and every byte handed on is right.
    let mut spans: Vec<(u64, u64, bool)> =
        h.pieces.iter().map(|(o, b)| (*o, b.len() as u64, true)).collect();
    spans.extend(h.lost.iter().map(|&(o, n)| (o, n, false)));
    spans.sort();
    let mut at = 0;
    for &(o, n, _) in &spans {
        assert_eq!(o, at, "no overlap and no hole: {spans:?}");
        at += n;
    }
    assert_eq!(at, bytes.len() as u64);
    for (o, b) in &h.pieces {
        assert_eq!(&bytes[*o as usize..*o as usize + b.len()], &b[..], "the byte at {o}");
    }
    let delivered: u64 = h.pieces.iter().map(|(_, b)| b.len() as u64).sum();
    assert_eq!(delivered, o.delivered, "the report says what the receiver got");
    assert!(r.lost_datagrams() == o.lost);
    let st = d.status();
    assert_eq!(st.iter().find(|f| f.flow == "lossy").unwrap().receivers[0].lost, o.lost);

    // A run that fits its buffer is whole.
    let small = data(1000, 6);
    let next = thread::spawn(move || {
        let mut h = Holes::default();
        let end = r.run_once(&mut h, Some(WAIT)).unwrap();
        (end, h)
    });
    s.start(&params("uid://small")).unwrap();
    s.send(&small).unwrap();
    let report = s.stop().unwrap();
    assert!(report.all_delivered(), "{report:?}");
    let (end, h) = next.join().unwrap();
    assert_eq!(end, RunEnd::Stopped(1000));
    assert_eq!(h.pieces, [(0, small)]);
}

/// udp flows refuse what they cannot do safely: TLS (the datagrams would go in clear), and a
/// receiver that does not say where its datagrams go.
#[test]
fn udp_flows_refuse_tls_and_a_receiver_without_a_port() {
    let id = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let server =
        TlsServer::from_pem(id.cert.pem().as_bytes(), id.signing_key.serialize_pem().as_bytes())
            .unwrap();
    let cfg = Config::parse(UDP_CONFIG, "udp.toml").unwrap();
    let e = Distributer::start_with_tls(cfg, "127.0.0.1:0".parse().unwrap(), Some(server))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("obs/display is udp"), "{e}");

    let (d, addr) = udp_distributer();
    let mut b = raw_receiver(&addr, "display", "portless");
    let w = b.recv_within(WAIT).unwrap().unwrap();
    let bs_distrib::msg::Message::Welcome(w) =
        bs_distrib::msg::Message::parse(w.payload()).unwrap()
    else {
        panic!("no WELCOME")
    };
    assert_eq!((w.transport.as_str(), w.datagram), ("udp", 8192));
    assert_ne!(w.udp_port, 0);
    b.send(&bs_distrib::msg::confirm(0, true, "")).unwrap();
    told_and_flow_serves(&mut b, &d, &addr, "display", "expected PORT", b"after the portless one");
}

/// Datagrams of an aborted udp run that arrive after its end are an earlier run's: the
/// distributer's `SENT` before the next `START` says how many came before, and the receiver
/// drops them, so the next run arrives whole. (A distributer played by the test, to put the
/// stragglers exactly there.)
#[test]
fn stragglers_of_an_aborted_udp_run_do_not_leak_into_the_next() {
    use bs_distrib::msg::{self, Message};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (ended, first_end) = mpsc::channel();
    let rx = thread::spawn(move || {
        let mut r = Receiver::connect(&addr, "obs", "display", "r", None).unwrap();
        let mut h = Holes::default();
        let end = r.run_once(&mut h, Some(WAIT)).unwrap();
        ended.send(()).unwrap();
        let mut h2 = Holes::default();
        let end2 = r.run_once(&mut h2, Some(WAIT)).unwrap();
        (end, end2, h2)
    });
    let (tcp, peer) = l.accept().unwrap();
    let mut b = bs_distrib::distributer::binding(
        bs_transport::Conn::new(tcp),
        bs_binding::Role::Responder,
        1,
    );
    let join = b.recv_within(WAIT).unwrap().unwrap();
    assert!(matches!(Message::parse(join.payload()).unwrap(), Message::Join(..)));
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let w = msg::Welcome {
        policy: "hold".into(),
        chunk: 1 << 20,
        pace: 0,
        socket_buffer: 0,
        transport: "udp".into(),
        datagram: 1000,
        udp_port: udp.local_addr().unwrap().port(),
    };
    b.send(&msg::welcome(&w)).unwrap();
    let port = b.recv_within(WAIT).unwrap().unwrap();
    let Message::Port(p) = Message::parse(port.payload()).unwrap() else { panic!("no PORT") };
    udp.connect((peer.ip(), p)).unwrap();

    // Run 1: half its datagrams, then the sender's death (ABORT).
    let mut seq = 0;
    let one = data(10_000, 1);
    b.send(&msg::sent(seq)).unwrap();
    b.send(&msg::start(&params("uid://one"))).unwrap();
    bs_distrib::udp::send(&udp, &mut seq, 0, &one[..5000], 1000).unwrap();
    b.send(&msg::abort("the sender left mid-flow")).unwrap();
    first_end.recv_timeout(WAIT).unwrap();
    // The rest of run 1 arrives late, while the receiver waits for run 2.
    bs_distrib::udp::send(&udp, &mut seq, 5000, &one[5000..], 1000).unwrap();

    // Run 2, whole.
    let two = data(10_000, 2);
    b.send(&msg::sent(seq)).unwrap();
    b.send(&msg::start(&params("uid://two"))).unwrap();
    bs_distrib::udp::send(&udp, &mut seq, 0, &two, 1000).unwrap();
    b.send(&msg::sent(seq)).unwrap();
    let digest = msg::digest_bytes(&DigestAlgo::Xxh3_128.digest(&two));
    b.send(&msg::stop(two.len() as u64, &digest)).unwrap();
    let lost = b.recv_within(WAIT).unwrap().unwrap();
    assert_eq!(Message::parse(lost.payload()).unwrap(), Message::Lost(0));
    let confirm = b.recv_within(WAIT).unwrap().unwrap();
    let Message::Confirm { total, ok, reason } = Message::parse(confirm.payload()).unwrap() else {
        panic!("no CONFIRM")
    };
    assert!(ok && total == 10_000, "{reason}");
    let (end, end2, h2) = rx.join().unwrap();
    assert!(matches!(end, RunEnd::Failed(ref w) if w.contains("sender left")), "{end:?}");
    assert_eq!(end2, RunEnd::Stopped(10_000));
    let got: Vec<u8> = h2.pieces.iter().flat_map(|(_, b)| b.clone()).collect();
    assert_eq!((got, h2.lost), (two, vec![]), "run 2 exactly, nothing of run 1");
}

/// A receiver sends a few messages after each STOP and nothing else: one that sends without
/// end, with no run going, is dropped and told why (not read into memory without end).
#[test]
fn a_receiver_that_sends_unasked_is_dropped() {
    let (d, addr) = distributer();
    let mut b = raw_receiver(&addr, "hold", "chatty");
    b.recv_within(WAIT).unwrap().expect("WELCOME");
    wait_names(&d, "hold", &["chatty"]);
    let junk = vec![7u8; 64 << 10];
    for _ in 0..32 {
        b.send(&junk).unwrap();
    }
    told_and_flow_serves(&mut b, &d, &addr, "hold", "16 messages unasked", b"after the chatty one");
}

/// A receiver that had every byte and takes a while to commit at the stop (an fsync, a
/// store's commit) is not a stalled one: under `timeout`, the policy's patience is with
/// receivers that do not keep up, and a confirmation may take longer.
#[test]
fn under_timeout_a_slow_commit_after_the_stop_is_no_stall() {
    struct SlowCommit(Keep);
    impl FlowHandler for SlowCommit {
        fn on_start(&mut self, p: &Params) {
            self.0.on_start(p)
        }
        fn on_data(&mut self, offset: u64, d: &[u8]) {
            self.0.on_data(offset, d)
        }
        fn on_stop(&mut self, total: u64) -> Result<(), String> {
            // Longer than the flow's 1000 ms timeout.
            thread::sleep(Duration::from_millis(1500));
            self.0.on_stop(total)
        }
        fn on_error(&mut self, reason: &str) {
            self.0.on_error(reason)
        }
    }
    let (d, addr) = distributer();
    let mut r = Receiver::connect(&addr, "obs", "timeout", "archive", Some("t0k")).unwrap();
    let run = thread::spawn(move || {
        let mut h = SlowCommit(Keep::default());
        let end = r.run_once(&mut h, None).unwrap();
        (end, h.0)
    });
    wait_names(&d, "timeout", &["archive"]);
    let mut s = Sender::connect(&addr, "obs", "timeout", Some("t0k")).unwrap();
    s.start(&params("slow-commit")).unwrap();
    let bytes = data(1 << 20, 5);
    s.send(&bytes).unwrap();
    let report = s.stop().unwrap();
    assert!(report.all_delivered(), "{report:?}");
    let (end, kept) = run.join().unwrap();
    assert_eq!(end, RunEnd::Stopped(1 << 20));
    assert!(kept.bytes == bytes);
}

/// A receiver started again at once under its name (after a crash, say) takes the name back
/// from its predecessor, whose connection has closed, instead of being told the name is taken
/// until the distributer notices; a live receiver's name stays taken.
#[test]
fn a_receiver_started_again_at_once_takes_its_name_back() {
    let (d, addr) = distributer();
    let first = Receiver::connect(&addr, "obs", "hold", "archive", Some("t0k")).unwrap();
    wait_names(&d, "hold", &["archive"]);
    let e = Receiver::connect(&addr, "obs", "hold", "archive", Some("t0k")).err().unwrap();
    assert!(e.to_string().contains("already on flow"), "{e}");
    first.close();
    a_run_reaches(&d, &addr, "hold", "archive", b"to the one started again");
}

/// The same over TLS, where a receiver's close arrives as bytes (its close_notify) before the
/// end of its stream: the name is taken back all the same.
#[test]
fn over_tls_a_receiver_started_again_at_once_takes_its_name_back() {
    let (d, addr, trust) = tls_distributer();
    let tls = || Target::from(&addr).with_tls(trust.clone());
    let first = Receiver::connect(tls(), "obs", "hold", "archive", Some("t0k")).unwrap();
    wait_names(&d, "hold", &["archive"]);
    let e = Receiver::connect(tls(), "obs", "hold", "archive", Some("t0k")).err().unwrap();
    assert!(e.to_string().contains("already on flow"), "{e}");
    first.close();
    // Joined on the first try, right after the close.
    let again = receiver(tls(), "hold", "archive", None);
    let mut s = Sender::connect(tls(), "obs", "hold", Some("t0k")).unwrap();
    s.start(&params("uid://tls-again")).unwrap();
    s.send(b"to the one started again").unwrap();
    assert!(s.stop().unwrap().all_delivered());
    let (end, k) = again.recv_timeout(WAIT).unwrap();
    assert_eq!((end, k.bytes), (RunEnd::Stopped(24), b"to the one started again".to_vec()));
}
