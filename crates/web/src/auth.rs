//! Optional bearer-token authentication for the HTTP plane (the same token as the gRPC
//! control plane). A request is let through when it carries `Authorization: Bearer TOKEN` or
//! the `blobstream_token` cookie that `POST /api/session` sets after checking the token (so
//! the browser's `<img>` requests authenticate too). The page itself, its static files,
//! `/api/health`, `/api/openapi.json` and `/api/session` are open, so the login form can load.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::error::WebError;

pub const COOKIE: &str = "blobstream_token";

fn open_path(path: &str) -> bool {
    crate::assets::ASSETS.iter().any(|(p, _, _)| *p == path)
        || matches!(path, "/api/health" | "/api/openapi.json" | "/api/session")
}

fn matches(expected: &str, given: &str) -> bool {
    bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

/// The token a request presents, from the header or the cookie.
fn presented(req: &Request) -> Option<String> {
    let h = req.headers();
    if let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
        && let Some(t) = v.strip_prefix("Bearer ")
    {
        return Some(t.trim().to_string());
    }
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// Middleware: refuse requests without the token when one is configured.
pub async fn check(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Result<Response, WebError> {
    if let Some(expected) = &st.cfg.auth_token
        && !open_path(req.uri().path())
        && !presented(&req).is_some_and(|t| matches(expected, &t))
    {
        return Err(WebError::Unauthorized);
    }
    Ok(next.run(req).await)
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

/// `GET /api/session`: whether this client is authenticated (and whether it needs to be).
pub async fn status(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let required = st.cfg.auth_token.is_some();
    let ok = match &st.cfg.auth_token {
        None => true,
        Some(expected) => presented(&req).is_some_and(|t| matches(expected, &t)),
    };
    axum::Json(serde_json::json!({ "auth_required": required, "authenticated": ok }))
        .into_response()
}

/// `POST /api/session` `{"token": "..."}`: check the token and set the session cookie.
pub async fn login(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let l: Login = crate::api::read_json(req).await?;
    let Some(expected) = &st.cfg.auth_token else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    if !matches(expected, &l.token) {
        return Err(WebError::Unauthorized);
    }
    let secure = if st.cfg.tls.is_some() { "; Secure" } else { "" };
    let cookie = format!("{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/{secure}", l.token);
    let mut r = StatusCode::NO_CONTENT.into_response();
    let v = HeaderValue::from_str(&cookie)
        .map_err(|_| WebError::BadRequest("token has characters a cookie cannot carry".into()))?;
    r.headers_mut().insert(header::SET_COOKIE, v);
    Ok(r)
}
