//! The receiving side of a flow: runs arrive as `on_start`, `on_data`…, then `on_stop` once
//! the exact total and digest check out — or `on_error` with the reason.

use std::time::Duration;

use bs_binding::Binding;
use bs_wire::{DigestAlgo, Hasher};

use crate::error::DistribError;
use crate::msg::{self, Message, Params};
use crate::sender::join;
use crate::target::Target;

/// What a receiver does with a flow.
pub trait FlowHandler {
    /// A run begins, with the sender's parameters.
    fn on_start(&mut self, _params: &Params) {}
    /// The next bytes of the run, at `offset` (always the end of the previous ones).
    fn on_data(&mut self, offset: u64, data: &[u8]);
    /// Every byte arrived and matches the sender's total and digest. An `Err` (e.g. the
    /// archive could not commit) is reported to the sender as this receiver's failure.
    fn on_stop(&mut self, _total: u64) -> Result<(), String> {
        Ok(())
    }
    /// The run ended without a verified stop (sender gone, this receiver dropped, bytes that
    /// do not check out). Nothing of it should be kept as complete.
    fn on_error(&mut self, reason: &str);
}

/// How a run ended, for the caller of [`Receiver::run_once`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Verified and confirmed: this many bytes.
    Stopped(u64),
    /// Ended early for this reason (`on_error` was called with it).
    Failed(String),
    /// The distributer closed the connection between runs.
    Closed,
}

/// One receiver of one flow.
pub struct Receiver {
    b: Binding,
    welcome: msg::Welcome,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").field("policy", &self.welcome.policy).finish()
    }
}

impl Receiver {
    /// Join `stream`/`flow` on the distributer at `target` (an address, or a [`Target`] with
    /// TLS) as `name` (reported to the sender).
    pub fn connect(
        target: impl Into<Target>,
        stream: &str,
        flow: &str,
        name: &str,
        token: Option<&str>,
    ) -> Result<Self, DistribError> {
        let j = msg::Join {
            stream: stream.into(),
            flow: flow.into(),
            name: name.into(),
            token: token.unwrap_or_default().into(),
        };
        let (b, welcome) = join(&target.into(), msg::ROLE_RECEIVER, &j)?;
        Ok(Self { b, welcome })
    }

    pub fn policy(&self) -> &str {
        &self.welcome.policy
    }

    /// Receive runs until the distributer closes the connection.
    pub fn run(mut self, h: &mut impl FlowHandler) -> Result<(), DistribError> {
        loop {
            if self.run_once(h, None)? == RunEnd::Closed {
                return Ok(());
            }
        }
    }

    /// Receive one run (waiting at most `wait` for it to start, if given).
    pub fn run_once(
        &mut self,
        h: &mut impl FlowHandler,
        wait: Option<Duration>,
    ) -> Result<RunEnd, DistribError> {
        let first = match wait {
            Some(w) => self.b.recv_within(w),
            None => self.b.recv(),
        };
        let Some(first) = first.map_err(DistribError::from_binding)? else {
            return Ok(RunEnd::Closed);
        };
        match Message::parse(first.payload())? {
            Message::Start(p) => h.on_start(&p),
            Message::Abort(_) => return Ok(RunEnd::Closed),
            other => return Err(DistribError::Malformed(format!("expected START, got {other:?}"))),
        }
        let mut got = 0u64;
        let mut hasher: Hasher = DigestAlgo::Xxh3_128.hasher();
        loop {
            let m = match self.b.recv() {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(fail(h, "the distributer closed the connection mid-flow")),
                Err(e) => {
                    let e = DistribError::from_binding(e);
                    return Ok(fail(h, &format!("the connection failed mid-flow: {e}")));
                }
            };
            match Message::parse(m.payload())? {
                Message::Data { offset, .. } if offset == got => {
                    let data = msg::data_payload(m.payload());
                    hasher.update(data);
                    h.on_data(offset, data);
                    got += data.len() as u64;
                }
                Message::Data { offset, .. } => {
                    let why = format!("DATA at offset {offset}, expected {got}");
                    let _ = self.b.send(&msg::confirm(got, false, &why));
                    return Ok(fail(h, &why));
                }
                Message::Stop { total, digest } => {
                    let ours = msg::digest_bytes(&hasher.finish());
                    let verdict = if total != got {
                        Err(format!("the stop announces {total} bytes, {got} arrived"))
                    } else if ours != digest {
                        Err("the bytes that arrived do not match the sender's digest".into())
                    } else {
                        Ok(())
                    };
                    let verdict = match verdict {
                        Ok(()) => h.on_stop(total),
                        Err(why) => {
                            h.on_error(&why);
                            Err(why)
                        }
                    };
                    let (ok, why) = match &verdict {
                        Ok(()) => (true, ""),
                        Err(w) => (false, w.as_str()),
                    };
                    self.b.send(&msg::confirm(got, ok, why)).map_err(DistribError::from_binding)?;
                    return Ok(match verdict {
                        Ok(()) => RunEnd::Stopped(total),
                        Err(w) => RunEnd::Failed(w),
                    });
                }
                Message::Abort(reason) => return Ok(fail(h, &reason)),
                other => {
                    return Err(DistribError::Malformed(format!("unexpected {other:?} in a run")));
                }
            }
        }
    }

    /// Leave the flow.
    pub fn close(self) {
        self.b.close();
    }
}

fn fail(h: &mut impl FlowHandler, reason: &str) -> RunEnd {
    h.on_error(reason);
    RunEnd::Failed(reason.to_string())
}
