//! The deadline a gRPC client sends (`grpc-timeout`, gRPC over HTTP/2: an integer of at most 8
//! digits and a unit, `H` `M` `S` `m` `u` `n`), kept by the server: a call that has not
//! answered by then is ended with DEADLINE_EXCEEDED and its future dropped, as tonic's own
//! server does (work it handed to a blocking thread still runs to its end). Written here because tonic keeps its layer private to `tonic::transport::Server`,
//! which the planes do not use (they are served by [`crate::serve_http`]).

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;

/// `router` with every call bounded by the deadline its client sent, if any. Like tonic's, the
/// bound covers the call until its answer starts; a streamed answer then goes on.
pub fn grpc_deadlines(router: Router) -> Router {
    router.layer(axum::middleware::from_fn(|req: Request, next: Next| async move {
        let Some(deadline) = req.headers().get("grpc-timeout").and_then(parse) else {
            return next.run(req).await;
        };
        let path = req.uri().path().to_string();
        match tokio::time::timeout(deadline, next.run(req)).await {
            Ok(answer) => answer,
            Err(_) => {
                tracing::debug!(%path, ?deadline, "call ended at its client's deadline");
                let status = tonic::Status::deadline_exceeded(format!(
                    "{path} did not answer within the client's deadline of {deadline:?}"
                ));
                status.into_http::<axum::body::Body>()
            }
        }
    }))
}

/// The duration a `grpc-timeout` value says, or `None` for a malformed one (then ignored, as
/// tonic ignores it).
fn parse(value: &HeaderValue) -> Option<Duration> {
    let s = value.to_str().ok()?;
    let unit_at = s.len().checked_sub(1)?;
    let (digits, unit) = s.split_at(unit_at);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn values_as_grpc_over_http2_spells_them() {
        let p = |s: &str| parse(&HeaderValue::from_str(s).unwrap());
        assert_eq!(p("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(p("3M"), Some(Duration::from_secs(180)));
        assert_eq!(p("10S"), Some(Duration::from_secs(10)));
        assert_eq!(p("250m"), Some(Duration::from_millis(250)));
        assert_eq!(p("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(p("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "S", "123456789S", "10s", "1.5S", "-1S", "10"] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }

    /// A call that never answers, through the layer: ended at the deadline its client sent with
    /// DEADLINE_EXCEEDED; without one, or with room to spare, it is not cut.
    #[tokio::test]
    async fn a_call_past_its_deadline_is_ended_with_deadline_exceeded() {
        let app = grpc_deadlines(
            Router::new()
                .route("/pkg.Svc/Hang", axum::routing::post(std::future::pending::<String>))
                .route("/pkg.Svc/Quick", axum::routing::post(|| async { "answer" })),
        );
        let call = |path: &str, timeout: Option<&str>| {
            let mut req = Request::post(path);
            if let Some(t) = timeout {
                req = req.header("grpc-timeout", t);
            }
            app.clone().oneshot(req.body(axum::body::Body::empty()).unwrap())
        };
        let ended = call("/pkg.Svc/Hang", Some("50m")).await.unwrap();
        let status = tonic::Status::from_header_map(ended.headers()).expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("/pkg.Svc/Hang"), "{status:?}");
        let quick = call("/pkg.Svc/Quick", Some("10S")).await.unwrap();
        assert!(tonic::Status::from_header_map(quick.headers()).is_none());
        // No deadline sent: the call runs on (still pending after a while).
        let hang = call("/pkg.Svc/Hang", None);
        assert!(tokio::time::timeout(Duration::from_millis(200), hang).await.is_err());
    }
}
