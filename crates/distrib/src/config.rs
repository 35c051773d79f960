//! The distributer's configuration (the paper's configuration database): streams, their
//! flows, and each flow's policy for slow receivers. A TOML file:
//!
//! ```toml
//! [[stream]]
//! name = "correlator"
//! token = "s3cret"            # optional: senders and receivers must present it
//! sender_token = "0th3r"      # optional: a sender must present this one instead (the
//!                             # receivers' token then admits no sender)
//!
//! [[stream.flow]]
//! name = "spectra"
//! policy = "hold"             # hold | buffer | timeout
//! chunk = "1m"                # largest DATA message [1m]
//! pace = "100m"               # the sender sends at most this many bytes/s [unpaced]
//! socket_buffer = "8m"        # SO_SNDBUF/SO_RCVBUF of the flow's connections [kernel's]
//!
//! [[stream.flow]]
//! name = "quicklook"
//! policy = "buffer"
//! buffer = "64m"              # a receiver further behind than this is dropped [64m]
//!
//! [[stream.flow]]
//! name = "archive"
//! policy = "timeout"
//! timeout_ms = 2000           # a receiver with no progress for this long is dropped [5000]
//!
//! [[stream.flow]]
//! name = "display"
//! transport = "udp"           # tcp | udp: datagrams to the receivers, losses counted [tcp]
//! datagram = 1400             # udp: payload bytes per datagram, 512 to 64000 [1400]
//! pace = "50m"                # udp has no flow control: pace below the slowest link
//! ```
//!
//! On a `udp` flow the sender still sends to the distributer over TCP; the distributer sends
//! each receiver its bytes as datagrams, and each receiver reports what it lost (see
//! [`crate::udp`]). Datagrams larger than the path's MTU are fragmented by IP, and one lost
//! fragment loses the whole datagram: the default fits a 1500-byte Ethernet frame.
//!
//! A file that breaks a rule is refused with the line at fault.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::error::DistribError;

/// What a flow does about a receiver that cannot keep up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Lossless for everyone: the sender waits for the slowest receiver (as in the paper).
    Hold,
    /// A receiver may fall up to this many bytes behind; further, it is dropped and reported.
    Buffer(u64),
    /// A receiver that takes nothing for this long while data waits for it is dropped and
    /// reported; until then the others wait for it.
    Timeout(Duration),
}

impl Policy {
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Hold => "hold",
            Policy::Buffer(_) => "buffer",
            Policy::Timeout(_) => "timeout",
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Policy::Hold => f.write_str("hold"),
            Policy::Buffer(n) => write!(f, "buffer ({n} bytes)"),
            Policy::Timeout(t) => write!(f, "timeout ({} ms)", t.as_millis()),
        }
    }
}

/// How the distributer sends a flow to its receivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A TCP connection per receiver: every byte arrives, in order, or the receiver is
    /// reported.
    Tcp,
    /// Datagrams of up to this many payload bytes to each receiver (control messages stay
    /// on its TCP connection): what is lost is counted and reported, never resent.
    Udp { datagram: u64 },
}

impl Transport {
    pub fn name(&self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Udp { .. } => "udp",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSpec {
    pub name: String,
    pub policy: Policy,
    /// Largest `DATA` payload.
    pub chunk: u64,
    /// The rate senders of this flow keep to (bytes/s), as an instrument sends; `None`: as
    /// fast as the receivers (or the policy) allow.
    pub pace: Option<u64>,
    /// Socket buffer of the flow's TCP connections, both ends (the distributer's send
    /// buffers towards receivers and receive buffer from the sender, the receivers' receive
    /// and the sender's send buffer); `None`: the kernel's autotuning. The kernel caps it at
    /// `net.core.wmem_max`/`rmem_max`.
    pub socket_buffer: Option<u64>,
    pub transport: Transport,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    pub name: String,
    pub token: Option<String>,
    /// A sender's token, when senders need one of their own (receivers' `token` then admits
    /// no sender: a receiver cannot feed its own bytes to the others).
    pub sender_token: Option<String>,
    pub flows: Vec<FlowSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    pub streams: Vec<StreamSpec>,
}

pub const DEFAULT_CHUNK: u64 = 1 << 20;
pub const MAX_CHUNK: u64 = 16 << 20;
pub const DEFAULT_BUFFER: u64 = 64 << 20;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// A udp flow's datagram payload unless set: fits a 1500-byte Ethernet frame with the
/// datagram's own header and IP and UDP's.
pub const DEFAULT_DATAGRAM: u64 = 1400;
/// Bounds of a udp flow's datagram payload (the largest fits one 64 KiB IP datagram).
pub const MIN_DATAGRAM: u64 = 512;
pub const MAX_DATAGRAM: u64 = 64_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    stream: Vec<Spanned<RawStream>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStream {
    name: Spanned<String>,
    token: Option<Spanned<String>>,
    sender_token: Option<Spanned<String>>,
    #[serde(default)]
    flow: Vec<Spanned<RawFlow>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFlow {
    name: Spanned<String>,
    policy: Option<Spanned<String>>,
    buffer: Option<Spanned<toml::Value>>,
    timeout_ms: Option<Spanned<u64>>,
    chunk: Option<Spanned<toml::Value>>,
    pace: Option<Spanned<toml::Value>>,
    socket_buffer: Option<Spanned<toml::Value>>,
    transport: Option<Spanned<String>>,
    datagram: Option<Spanned<toml::Value>>,
}

impl Config {
    /// Read and check a configuration file.
    pub fn load(path: &std::path::Path) -> Result<Self, DistribError> {
        let text = std::fs::read_to_string(path).map_err(|e| DistribError::Config {
            file: path.display().to_string(),
            line: 0,
            reason: e.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parse and check configuration text (`file` names it in errors).
    pub fn parse(text: &str, file: &str) -> Result<Self, DistribError> {
        let line_of = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
        let err = |at: usize, reason: String| DistribError::Config {
            file: file.to_string(),
            line: line_of(at),
            reason,
        };
        let raw: File = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or(0, |s| s.start);
            err(at, e.message().trim().to_string())
        })?;
        let mut streams: Vec<StreamSpec> = Vec::new();
        for s in raw.stream {
            let at = s.span().start;
            let s = s.into_inner();
            let name = check_name(&s.name, "stream", &err)?;
            if streams.iter().any(|o| o.name == name) {
                return Err(err(s.name.span().start, format!("stream {name:?} is defined twice")));
            }
            if s.flow.is_empty() {
                return Err(err(at, format!("stream {name:?} has no [[stream.flow]]")));
            }
            let mut flows: Vec<FlowSpec> = Vec::new();
            for f in s.flow {
                let f = f.into_inner();
                let fname = check_name(&f.name, "flow", &err)?;
                if flows.iter().any(|o| o.name == fname) {
                    return Err(err(
                        f.name.span().start,
                        format!("flow {fname:?} is defined twice in stream {name:?}"),
                    ));
                }
                flows.push(flow(f, fname, &err)?);
            }
            // An empty token (a secret a template failed to fill in, say) would open the
            // stream to anyone: refused, not taken as "no token".
            let secret = |t: Option<Spanned<String>>, key: &str| match t {
                Some(t) if t.get_ref().trim().is_empty() => Err(err(
                    t.span().start,
                    format!(
                        "{key} of stream {name:?} is empty: give the secret, or leave {key} out"
                    ),
                )),
                t => Ok(t.map(Spanned::into_inner)),
            };
            let token = secret(s.token, "token")?;
            let sender_token = secret(s.sender_token, "sender_token")?;
            streams.push(StreamSpec { name, token, sender_token, flows });
        }
        if streams.is_empty() {
            return Err(DistribError::Config {
                file: file.to_string(),
                line: 0,
                reason: "no [[stream]] is defined: a distributer serves at least one".into(),
            });
        }
        Ok(Config { streams })
    }

    pub fn flow(&self, stream: &str, flow: &str) -> Result<(&StreamSpec, &FlowSpec), DistribError> {
        let s = self
            .streams
            .iter()
            .find(|s| s.name == stream)
            .ok_or_else(|| DistribError::UnknownStream(stream.to_string()))?;
        let f = s.flows.iter().find(|f| f.name == flow).ok_or_else(|| {
            DistribError::UnknownFlow { stream: stream.to_string(), flow: flow.to_string() }
        })?;
        Ok((s, f))
    }
}

fn check_name(
    n: &Spanned<String>,
    what: &str,
    err: &impl Fn(usize, String) -> DistribError,
) -> Result<String, DistribError> {
    let ok = !n.get_ref().is_empty()
        && n.get_ref().len() <= 128
        && n.get_ref().chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !ok {
        return Err(err(
            n.span().start,
            format!(
                "{what} name {:?} must be 1-128 characters of letters, digits, '-', '_', '.'",
                n.get_ref()
            ),
        ));
    }
    Ok(n.get_ref().clone())
}

/// A size: a number of bytes, or a string with a k/m/g suffix.
fn size(
    v: &Spanned<toml::Value>,
    err: &impl Fn(usize, String) -> DistribError,
) -> Result<u64, DistribError> {
    let parsed = match v.get_ref() {
        toml::Value::Integer(n) => u64::try_from(*n).ok(),
        toml::Value::String(s) => bs_binding::qos::parse_size(s),
        _ => None,
    };
    parsed.filter(|n| *n > 0).ok_or_else(|| {
        err(v.span().start, format!("{} is not a size (bytes, or e.g. \"64m\")", v.get_ref()))
    })
}

/// A [`size`] in `range`, else `why` at its line.
fn size_within(
    v: &Spanned<toml::Value>,
    range: std::ops::RangeInclusive<u64>,
    why: &str,
    err: &impl Fn(usize, String) -> DistribError,
) -> Result<u64, DistribError> {
    let n = size(v, err)?;
    if !range.contains(&n) {
        return Err(err(v.span().start, why.to_string()));
    }
    Ok(n)
}

fn flow(
    f: RawFlow,
    name: String,
    err: &impl Fn(usize, String) -> DistribError,
) -> Result<FlowSpec, DistribError> {
    let chunk = match &f.chunk {
        Some(c) => size(c, err)?,
        None => DEFAULT_CHUNK,
    };
    if chunk > MAX_CHUNK {
        let at = f.chunk.as_ref().map_or(0, |c| c.span().start);
        return Err(err(at, format!("chunk {chunk} is above the largest, {MAX_CHUNK}")));
    }
    let policy_name = f.policy.as_ref().map_or("hold", |p| p.get_ref().as_str());
    let policy_at = f.policy.as_ref().map_or(f.name.span().start, |p| p.span().start);
    let unused = |what: &str, at: Option<usize>| -> Result<(), DistribError> {
        match at {
            Some(at) => Err(err(at, format!("{what} has no meaning under policy {policy_name:?}"))),
            None => Ok(()),
        }
    };
    let policy = match policy_name {
        "hold" => {
            unused("buffer", f.buffer.as_ref().map(|b| b.span().start))?;
            unused("timeout_ms", f.timeout_ms.as_ref().map(|t| t.span().start))?;
            Policy::Hold
        }
        "buffer" => {
            unused("timeout_ms", f.timeout_ms.as_ref().map(|t| t.span().start))?;
            let n = match &f.buffer {
                Some(b) => size(b, err)?,
                None => DEFAULT_BUFFER,
            };
            Policy::Buffer(n)
        }
        "timeout" => {
            unused("buffer", f.buffer.as_ref().map(|b| b.span().start))?;
            let ms = f.timeout_ms.as_ref().map(|t| *t.get_ref());
            if ms == Some(0) {
                let at = f.timeout_ms.as_ref().map_or(0, |t| t.span().start);
                return Err(err(at, "timeout_ms must be above 0".into()));
            }
            Policy::Timeout(ms.map_or(DEFAULT_TIMEOUT, Duration::from_millis))
        }
        other => {
            return Err(err(
                policy_at,
                format!("unknown policy {other:?} (hold, buffer or timeout)"),
            ));
        }
    };
    let pace = match &f.pace {
        Some(p) => Some(size(p, err)?),
        None => None,
    };
    let socket_buffer = match &f.socket_buffer {
        Some(b) => Some(size_within(b, 4096..=1 << 30, "socket_buffer must be 4k to 1g", err)?),
        None => None,
    };
    let transport = match f.transport.as_ref().map(|t| (t.get_ref().as_str(), t.span().start)) {
        None | Some(("tcp", _)) => {
            if let Some(d) = &f.datagram {
                return Err(err(d.span().start, "datagram has no meaning on a tcp flow".into()));
            }
            Transport::Tcp
        }
        Some(("udp", _)) => {
            let datagram = match &f.datagram {
                Some(d) => {
                    let why = format!("datagram must be {MIN_DATAGRAM} to {MAX_DATAGRAM} bytes");
                    size_within(d, MIN_DATAGRAM..=MAX_DATAGRAM, &why, err)?
                }
                None => DEFAULT_DATAGRAM,
            };
            Transport::Udp { datagram }
        }
        Some((other, at)) => {
            return Err(err(at, format!("unknown transport {other:?} (tcp or udp)")));
        }
    };
    Ok(FlowSpec { name, policy, chunk, pace, socket_buffer, transport })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[stream]]
name = "correlator"
token = "s3cret"

[[stream.flow]]
name = "spectra"

[[stream.flow]]
name = "quicklook"
policy = "buffer"
buffer = "8m"
chunk = 65536
pace = "100m"
socket_buffer = "8m"

[[stream.flow]]
name = "archive"
policy = "timeout"
timeout_ms = 250

[[stream.flow]]
name = "display"
transport = "udp"

[[stream.flow]]
name = "jumbo"
transport = "udp"
datagram = "8k"
"#;

    #[test]
    fn a_good_file_reads_with_defaults() {
        let c = Config::parse(GOOD, "streams.toml").unwrap();
        let s = &c.streams[0];
        assert_eq!((s.name.as_str(), s.token.as_deref()), ("correlator", Some("s3cret")));
        assert_eq!(
            s.flows[0],
            FlowSpec {
                name: "spectra".into(),
                policy: Policy::Hold,
                chunk: 1 << 20,
                pace: None,
                socket_buffer: None,
                transport: Transport::Tcp,
            }
        );
        assert_eq!(s.flows[1].policy, Policy::Buffer(8 << 20));
        assert_eq!(s.flows[1].chunk, 65536);
        assert_eq!(s.flows[1].pace, Some(100 << 20));
        assert_eq!(s.flows[1].socket_buffer, Some(8 << 20));
        assert_eq!(s.flows[2].policy, Policy::Timeout(Duration::from_millis(250)));
        assert_eq!(s.flows[3].transport, Transport::Udp { datagram: DEFAULT_DATAGRAM });
        assert_eq!(s.flows[4].transport, Transport::Udp { datagram: 8192 });
        assert!(matches!(c.flow("correlator", "nope"), Err(DistribError::UnknownFlow { .. })));
        assert!(matches!(c.flow("nope", "spectra"), Err(DistribError::UnknownStream(_))));
    }

    fn fails(text: &str, line: usize, needle: &str) {
        let e = Config::parse(text, "s.toml").unwrap_err();
        let DistribError::Config { line: l, reason, .. } = &e else { panic!("{e}") };
        assert_eq!(*l, line, "{e}");
        assert!(reason.contains(needle), "{e}");
        assert!(e.to_string().starts_with(&format!("s.toml:{line}: ")), "{e}");
    }

    #[test]
    fn a_bad_file_is_refused_with_the_line_at_fault() {
        let bad_policy = GOOD.replace("policy = \"buffer\"", "policy = \"lossy\"");
        fails(&bad_policy, 11, "unknown policy \"lossy\"");
        let bad_size = GOOD.replace("buffer = \"8m\"", "buffer = \"eight\"");
        fails(&bad_size, 12, "is not a size");
        let twice = GOOD.replace("name = \"archive\"", "name = \"spectra\"");
        fails(&twice, 18, "defined twice");
        let unknown = GOOD.replace("timeout_ms = 250", "timeout_ms = 250\ncolour = 3");
        fails(&unknown, 21, "unknown field `colour`");
        let misplaced = GOOD.replace("timeout_ms = 250", "buffer = 5");
        fails(&misplaced, 20, "no meaning under policy \"timeout\"");
        fails("[[stream]]\nname = \"x y\"\n[[stream.flow]]\nname = \"f\"\n", 2, "stream name");
        fails("[[stream]]\nname = \"lonely\"\n", 1, "has no [[stream.flow]]");
        // A file with no stream (empty, or every line a comment) is no configuration.
        for empty in ["", "# streams go here\n"] {
            let e = Config::parse(empty, "streams.toml").unwrap_err().to_string();
            assert_eq!(
                e,
                "streams.toml: no [[stream]] is defined: a distributer serves at least one"
            );
        }
        fails("[[stream]\n", 1, "");
        let tiny = GOOD.replace("socket_buffer = \"8m\"", "socket_buffer = 100");
        fails(&tiny, 15, "socket_buffer must be 4k to 1g");
        let carrier = GOOD.replace("transport = \"udp\"", "transport = \"sctp\"");
        fails(&carrier, 24, "unknown transport \"sctp\" (tcp or udp)");
        let huge = GOOD.replace("datagram = \"8k\"", "datagram = \"1m\"");
        fails(&huge, 29, "datagram must be 512 to 64000 bytes");
        let on_tcp = GOOD.replace("timeout_ms = 250", "timeout_ms = 250\ndatagram = 2000");
        fails(&on_tcp, 21, "datagram has no meaning on a tcp flow");
        let open = GOOD.replace("token = \"s3cret\"", "token = \"\"");
        fails(&open, 4, "token of stream \"correlator\" is empty");
        let open = GOOD.replace("token = \"s3cret\"", "token = \"s\"\nsender_token = \" \"");
        fails(&open, 5, "sender_token of stream \"correlator\" is empty");
    }
}
