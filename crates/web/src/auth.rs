//! Optional bearer-token authentication for the HTTP plane (the same token as the gRPC
//! control plane). A request is let through when it carries `Authorization: Bearer TOKEN` or
//! the `blobstream_token` cookie that `POST /api/session` sets after checking the token (so
//! the browser's `<img>` requests authenticate too). The page itself, its static files,
//! `/api/health`, `/api/openapi.json` and `/api/session` are open, so the login form can load.
//!
//! Whatever the auth setting, two browser attacks are refused with 403:
//! - cross-site writes (CSRF): a PUT, POST or DELETE whose `Sec-Fetch-Site` says cross-site,
//!   or whose `Origin` is not this server — any web page could otherwise post a form here;
//! - DNS rebinding: without a token, a `Host` that is not an IP address or `localhost` (a
//!   hostile page whose name resolves to 127.0.0.1 would otherwise read the whole store).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::error::WebError;

pub const COOKIE: &str = "blobstream_token";

/// How long a browser session lasts.
const SESSION_SECS: u64 = 12 * 3600;

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

/// The request's host name (no port), from `Host` or, for HTTP/2, the URI authority.
fn host_name(req: &Request) -> Option<String> {
    let host = match req.headers().get(header::HOST) {
        Some(h) => h.to_str().ok()?.to_string(),
        None => req.uri().authority()?.as_str().to_string(),
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default().to_string()
    } else {
        host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h).to_string()
    };
    Some(name.to_ascii_lowercase())
}

/// A host name that cannot be an attacker's rebound DNS name.
fn local_host_name(name: &str) -> bool {
    name.parse::<std::net::IpAddr>().is_ok() || name == "localhost" || name.ends_with(".localhost")
}

/// Whether a state-changing request comes from another site.
fn cross_site(req: &Request) -> bool {
    let h = req.headers();
    if h.get("sec-fetch-site").is_some_and(|v| v.as_bytes() == b"cross-site") {
        return true;
    }
    let Some(origin) = h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false; // not a browser, or a same-origin GET-like request
    };
    let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
    let host = h.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    origin == "null" || !origin_host.eq_ignore_ascii_case(host)
}

/// Middleware: refuse cross-site writes, rebound host names, and requests without the token
/// when one is configured.
pub async fn check(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Result<Response, WebError> {
    let writes = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if writes && cross_site(&req) {
        return Err(WebError::Forbidden(
            "cross-site request refused: this API only takes writes from its own pages".into(),
        ));
    }
    if st.cfg.auth_token.is_none()
        && let Some(name) = host_name(&req)
        && !local_host_name(&name)
    {
        return Err(WebError::Forbidden(format!(
            "Host {name:?} refused: without an auth token this server answers only to IP \
             addresses and localhost (protection against DNS rebinding); start it with \
             --auth-token-file to serve other names"
        )));
    }
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
        // Slow down guessing.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        return Err(WebError::Unauthorized);
    }
    let secure = if st.cfg.tls.is_some() { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/; Max-Age={SESSION_SECS}{secure}",
        l.token
    );
    let mut r = StatusCode::NO_CONTENT.into_response();
    let v = HeaderValue::from_str(&cookie)
        .map_err(|_| WebError::BadRequest("token has characters a cookie cannot carry".into()))?;
    r.headers_mut().insert(header::SET_COOKIE, v);
    Ok(r)
}

/// `DELETE /api/session`: log out (the cookie is cleared).
pub async fn logout() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let clear = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    if let Ok(v) = HeaderValue::from_str(&clear) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = axum::http::Request::builder().method(method).uri("/api/list");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn host_names() {
        let name = |h: &str| host_name(&req("GET", &[("host", h)])).unwrap();
        assert_eq!(name("127.0.0.1:8080"), "127.0.0.1");
        assert_eq!(name("[::1]:8080"), "::1");
        assert_eq!(name("LocalHost"), "localhost");
        for ok in ["127.0.0.1", "::1", "10.1.2.3", "localhost", "app.localhost"] {
            assert!(local_host_name(ok), "{ok}");
        }
        for bad in ["evil.example", "127.0.0.1.nip.io", "localhost.evil.example"] {
            assert!(!local_host_name(bad), "{bad}");
        }
    }

    #[test]
    fn cross_site_writes() {
        let h = ("host", "127.0.0.1:8080");
        assert!(!cross_site(&req("PUT", &[h])));
        assert!(!cross_site(&req("PUT", &[h, ("origin", "http://127.0.0.1:8080")])));
        assert!(cross_site(&req("PUT", &[h, ("origin", "http://evil.example")])));
        assert!(cross_site(&req("POST", &[h, ("origin", "null")])));
        assert!(cross_site(&req("POST", &[h, ("sec-fetch-site", "cross-site")])));
        assert!(!cross_site(&req("POST", &[h, ("sec-fetch-site", "same-origin")])));
    }
}
