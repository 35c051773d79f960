//! Control-plane authentication: a shared bearer token, compared in constant time. The data
//! plane needs none of its own: its connections are admitted by one-time tokens that only an
//! authenticated `Negotiate` hands out.

use subtle::ConstantTimeEq;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Checks `authorization: Bearer <token>` when a token is configured; lets everything through
/// otherwise.
#[derive(Clone)]
pub(crate) struct Auth {
    expected: Option<Vec<u8>>,
}

impl Auth {
    pub(crate) fn new(token: Option<&str>) -> Self {
        Self { expected: token.map(|t| format!("Bearer {t}").into_bytes()) }
    }
}

impl Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else { return Ok(req) };
        match req.metadata().get("authorization") {
            Some(v) if bool::from(v.as_bytes().ct_eq(expected)) => Ok(req),
            Some(_) => Err(Status::unauthenticated("wrong credentials")),
            None => Err(Status::unauthenticated(
                "this server requires a token (BLOBSTREAM_AUTH_TOKEN or --auth-token-file)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = v {
            r.metadata_mut().insert("authorization", v.parse().unwrap());
        }
        r
    }

    #[test]
    fn tokens_are_checked_only_when_configured() {
        assert!(Auth::new(None).call(with(None)).is_ok());
        let mut a = Auth::new(Some("s3cret"));
        assert!(a.call(with(Some("Bearer s3cret"))).is_ok());
        assert_eq!(
            a.call(with(Some("Bearer s3creT"))).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(a.call(with(None)).unwrap_err().code(), tonic::Code::Unauthenticated);
    }
}
