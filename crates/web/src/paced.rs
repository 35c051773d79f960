//! An upload body held to a pace: it fails once nothing has arrived for the idle time, or —
//! past the first idle time — once less than the minimum rate has arrived on average. Every
//! upload's body goes through it before anything parses it (a multipart body before its first
//! boundary, a STOW-RS part, a PUT), so no client holds an upload slot by sending nothing.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;

/// Why a paced body stopped.
#[derive(Debug, thiserror::Error)]
pub enum PaceError<E> {
    #[error("upload stalled: nothing arrived for {secs} s after {total} bytes")]
    Stalled { secs: u64, total: u64 },
    #[error(
        "upload too slow: {total} bytes in {secs} s, under the {rate} bytes/s an upload must \
         keep to"
    )]
    TooSlow { total: u64, secs: u64, rate: u64 },
    /// The body itself failed (the client went away, a malformed chunk).
    #[error("{0}")]
    Body(E),
}

/// How a request body's pace fails.
pub type BodyPaceError = PaceError<axum::Error>;

/// `req` with its body paced by `st`'s upload limits (idle time, minimum rate).
pub fn paced_request(st: &crate::AppState, req: axum::extract::Request) -> axum::extract::Request {
    let (parts, body) = req.into_parts();
    let body = Paced::new(body.into_data_stream(), st.cfg.idle_timeout, st.cfg.min_upload_rate);
    axum::extract::Request::from_parts(parts, axum::body::Body::from_stream(body))
}

/// `inner`, failing with [`PaceError`] when the client falls behind.
pub struct Paced<S> {
    inner: S,
    idle: Duration,
    min_rate: u64,
    started: Instant,
    total: u64,
    /// `None`: not paced here (the body around it is).
    timer: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl<S> Paced<S> {
    /// `inner` given `idle` between chunks and, after the first `idle`, at least `min_rate`
    /// bytes a second on average (0: no floor).
    pub fn new(inner: S, idle: Duration, min_rate: u64) -> Self {
        let started = Instant::now();
        let timer = Some(Box::pin(tokio::time::sleep_until(started + idle)));
        Self { inner, idle, min_rate, started, total: 0, timer, done: false }
    }

    /// `inner` as it comes: a part of a body paced as a whole (one clock, not two counting
    /// the same bytes).
    pub fn unpaced(inner: S) -> Self {
        let (idle, started) = (Duration::ZERO, Instant::now());
        Self { inner, idle, min_rate: 0, started, total: 0, timer: None, done: false }
    }
}

impl<S, E> Stream for Paced<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, PaceError<E>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                let now = Instant::now();
                self.total += chunk.len() as u64;
                let deadline = now + self.idle;
                let Some(timer) = self.timer.as_mut() else {
                    return Poll::Ready(Some(Ok(chunk)));
                };
                timer.as_mut().reset(deadline);
                let spent = now - self.started;
                let secs = spent.as_secs();
                if self.min_rate > 0
                    && spent > self.idle
                    && self.total < self.min_rate.saturating_mul(secs)
                {
                    self.done = true;
                    let (total, rate) = (self.total, self.min_rate);
                    return Poll::Ready(Some(Err(PaceError::TooSlow { total, secs, rate })));
                }
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(PaceError::Body(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.timer.as_mut().map(|t| t.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => {
                    self.done = true;
                    let (secs, total) = (self.idle.as_secs(), self.total);
                    Poll::Ready(Some(Err(PaceError::Stalled { secs, total })))
                }
                Some(Poll::Pending) | None => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    type Chunk = Result<Bytes, std::io::Error>;

    /// A body that sends `chunks`, each after its delay, then stays silent.
    fn body(chunks: Vec<(u64, &'static [u8])>) -> impl Stream<Item = Chunk> + Unpin {
        Box::pin(async_stream(chunks))
    }

    fn async_stream(chunks: Vec<(u64, &'static [u8])>) -> impl Stream<Item = Chunk> {
        tokio_stream::iter(chunks)
            .then(|(ms, b)| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(Bytes::from_static(b))
            })
            .chain(tokio_stream::pending())
    }

    #[tokio::test(start_paused = true)]
    async fn silence_after_some_bytes_is_a_stall_naming_them() {
        let mut p = Paced::new(body(vec![(10, b"abc"), (500, b"de")]), Duration::from_secs(1), 0);
        assert_eq!(&p.next().await.unwrap().unwrap()[..], b"abc");
        assert_eq!(&p.next().await.unwrap().unwrap()[..], b"de");
        let e = p.next().await.unwrap().unwrap_err();
        assert!(matches!(e, PaceError::Stalled { secs: 1, total: 5 }), "{e}");
        assert_eq!(e.to_string(), "upload stalled: nothing arrived for 1 s after 5 bytes");
        assert!(p.next().await.is_none(), "ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_under_the_floor_is_stopped_once_past_the_first_idle_time() {
        // A byte every 900 ms: never idle for 1 s, but 1 byte/s under a 100 bytes/s floor.
        let drip: Vec<(u64, &'static [u8])> = (0..5).map(|_| (900, &b"x"[..])).collect();
        let mut p = Paced::new(body(drip), Duration::from_secs(1), 100);
        assert!(p.next().await.unwrap().is_ok(), "within the first idle time");
        let e = p.next().await.unwrap().unwrap_err();
        assert!(matches!(e, PaceError::TooSlow { total: 2, secs: 1, rate: 100 }), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_pace_is_passed_through_whole() {
        let chunks = vec![(400, &b"ab"[..]), (400, b"cd"), (400, b"ef")];
        let p = Paced::new(body(chunks).take(3), Duration::from_secs(1), 1);
        let got: Vec<_> = p.map(|c| c.unwrap()).collect().await;
        assert_eq!(got.concat(), b"abcdef");
    }
}
