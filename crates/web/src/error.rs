//! Errors of the HTTP API, and their one mapping to HTTP status codes and the JSON error body
//! `{"error": {"code": "...", "message": "..."}}` (the table in docs/http-api.md).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bs_imageio::ImageIoError;
use bs_imaging::ImagingError;
use bs_store::StoreError;
use thiserror::Error;

/// Why a request failed.
#[derive(Debug, Error)]
pub enum WebError {
    #[error("{0}")]
    BadRequest(String),
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },
    #[error("authentication required: send `Authorization: Bearer <token>` or log in")]
    Unauthorized,
    #[error(
        "too many wrong tokens from this address: token checks are refused for {retry_after} s"
    )]
    TooManyRequests { retry_after: u64 },
    #[error("no blob named {0:?}")]
    NotFound(String),
    /// Something other than a blob is not there (a study, a frame); the message says what.
    #[error("{0}")]
    Missing(String),
    #[error("no such resource: {0}")]
    NoRoute(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PreconditionFailed(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The `Accept` header takes nothing this resource can answer with.
    #[error("{0}")]
    NotAcceptable(String),
    #[error("range not satisfiable: {reason}")]
    RangeNotSatisfiable { size: u64, reason: String },
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Busy(String),
    #[error("storage full: {0}")]
    StorageFull(String),
    /// The blob or catalogue backend is out of reach (503 with `Retry-After`).
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// The server could not start: its address cannot be listened on (in use, not this
    /// host's). Never an answer to a request.
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: std::net::SocketAddr, source: std::io::Error },
}

impl WebError {
    /// HTTP status and the stable `code` string of the JSON body.
    pub fn status(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            Self::BadRequest(_) => (S::BAD_REQUEST, "bad_request"),
            Self::InvalidKey { .. } => (S::BAD_REQUEST, "invalid_key"),
            Self::Unauthorized => (S::UNAUTHORIZED, "unauthorized"),
            Self::TooManyRequests { .. } => (S::TOO_MANY_REQUESTS, "too_many_requests"),
            Self::NotFound(_) | Self::Missing(_) | Self::NoRoute(_) => (S::NOT_FOUND, "not_found"),
            Self::MethodNotAllowed { .. } => (S::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::Conflict(_) => (S::CONFLICT, "conflict"),
            Self::PreconditionFailed(_) => (S::PRECONDITION_FAILED, "precondition_failed"),
            Self::TooLarge(_) => (S::PAYLOAD_TOO_LARGE, "too_large"),
            Self::UnsupportedMediaType(_) => (S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            Self::NotAcceptable(_) => (S::NOT_ACCEPTABLE, "not_acceptable"),
            Self::RangeNotSatisfiable { .. } => (S::RANGE_NOT_SATISFIABLE, "range_not_satisfiable"),
            Self::Unprocessable(_) => (S::UNPROCESSABLE_ENTITY, "unprocessable"),
            Self::Forbidden(_) => (S::FORBIDDEN, "forbidden"),
            Self::Busy(_) => (S::SERVICE_UNAVAILABLE, "busy"),
            Self::StorageFull(_) => (S::INSUFFICIENT_STORAGE, "insufficient_storage"),
            Self::Unavailable(_) => (S::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Internal(_) | Self::Listen { .. } => (S::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    pub fn internal(e: impl std::fmt::Display) -> Self {
        Self::Internal(e.to_string())
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let (status, code) = self.status();
        if status.is_server_error() {
            tracing::error!("{self}");
        }
        let body = serde_json::json!({ "error": { "code": code, "message": self.to_string() } });
        let mut resp = (status, Json(body)).into_response();
        let h = resp.headers_mut();
        match &self {
            Self::RangeNotSatisfiable { size, .. } => {
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    h.insert(header::CONTENT_RANGE, v);
                }
            }
            Self::Unauthorized => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::Busy(_) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Unavailable(_) => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            Self::TooManyRequests { retry_after } => {
                h.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
            }
            _ => {}
        }
        resp
    }
}

impl From<StoreError> for WebError {
    fn from(e: StoreError) -> Self {
        let msg = e.client_message();
        match e {
            StoreError::NotFound(name) => Self::NotFound(name),
            StoreError::InvalidName { name, reason } => {
                Self::InvalidKey { key: name, reason: reason.to_string() }
            }
            // Only conditional writes meet these: `If-None-Match` refusing to replace, or
            // `If-Match` finding its version gone.
            StoreError::AlreadyExists(_) | StoreError::ConditionFailed(_) => {
                Self::PreconditionFailed(msg)
            }
            StoreError::Busy(name) => {
                Self::Conflict(format!("another upload is writing {name:?} right now; try again"))
            }
            StoreError::StorageFull(_) => Self::StorageFull(msg),
            StoreError::Unavailable(_) => Self::Unavailable(msg),
            StoreError::Incomplete { .. }
            | StoreError::InvalidMetadata(_)
            | StoreError::BeyondSize { .. }
            | StoreError::Unsupported(_) => Self::BadRequest(msg),
            StoreError::OutOfRange { size, .. } => Self::RangeNotSatisfiable { size, reason: msg },
            StoreError::NoUpload(_)
            | StoreError::Gap { .. }
            | StoreError::Corrupt { .. }
            | StoreError::Io(_)
            | StoreError::IoAt { .. }
            | StoreError::Config(_)
            | StoreError::Meta(_) => Self::Internal(msg),
        }
    }
}

impl From<ImagingError> for WebError {
    fn from(e: ImagingError) -> Self {
        match e {
            ImagingError::TooLarge { .. } => Self::TooLarge(e.to_string()),
            ImagingError::Io(_) => Self::Internal(e.to_string()),
            _ => Self::Unprocessable(e.to_string()),
        }
    }
}

impl From<ImageIoError> for WebError {
    fn from(e: ImageIoError) -> Self {
        match e {
            ImageIoError::TooLarge { .. } | ImageIoError::TooManyBytes { .. } => {
                Self::TooLarge(e.to_string())
            }
            ImageIoError::Io { .. } => Self::Internal(e.to_string()),
            _ => Self::Unprocessable(e.to_string()),
        }
    }
}

impl From<bs_meta::MetaError> for WebError {
    fn from(e: bs_meta::MetaError) -> Self {
        Self::Internal(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_the_documented_statuses() {
        let cases = [
            (StoreError::NotFound("a".into()), 404),
            (StoreError::InvalidName { name: "..".into(), reason: "dots" }, 400),
            (StoreError::AlreadyExists("a".into()), 412),
            (StoreError::Busy("a".into()), 409),
            (StoreError::StorageFull("disk".into()), 507),
            (StoreError::Incomplete { name: "a".into(), received: 1, size: 2 }, 400),
            (StoreError::OutOfRange { name: "a".into(), offset: 9, len: 1, size: 2 }, 416),
            (StoreError::Unavailable("bucket down".into()), 503),
        ];
        for (e, code) in cases {
            assert_eq!(WebError::from(e).status().0.as_u16(), code);
        }
    }
}
