//! Optional bearer-token authentication for the HTTP plane (the same token as the gRPC
//! control plane). A request is let through when it carries `Authorization: Bearer TOKEN`, or
//! the `blobstream_session` cookie that `POST /api/session` sets after checking the token (so
//! the browser's `<img>` requests authenticate too). The cookie holds a random session id, not
//! the token: it expires, `DELETE /api/session` revokes it, and leaking it does not leak the
//! token (see [`crate::sessions`]). The page itself, its static files, `/api/health`,
//! `/api/openapi.json` and `/api/session` are open, so the login form can load.
//!
//! Wrong tokens are limited per source address ([`crate::throttle`]): past the allowance,
//! every token check from that address — `Authorization` headers anywhere, `POST` and `GET
//! /api/session` — is answered 429 with `Retry-After`, a correct token included (or guessing
//! would go on at full speed with only the right guess getting through). A browser session
//! is not a token check: valid sessions keep working from a throttled address, and unknown or
//! expired session ids are answered 401 without counting (a 256-bit id cannot be guessed,
//! and a browser holding a stale cookie must not lock its address out).
//!
//! Whatever the auth setting, two browser attacks are refused with 403:
//! - cross-site writes (CSRF): a PUT, POST or DELETE whose `Sec-Fetch-Site` says cross-site,
//!   or whose `Origin` is not this server — any web page could otherwise post a form here;
//! - DNS rebinding: without a token, a `Host` that is not an IP address or `localhost` (a
//!   hostile page whose name resolves to 127.0.0.1 would otherwise read the whole store).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::error::WebError;

/// The session cookie: a random session id.
pub const COOKIE: &str = "blobstream_session";

/// The cookie earlier versions set, holding the token itself: cleared on login and logout.
const OLD_COOKIE: &str = "blobstream_token";

fn open_path(path: &str) -> bool {
    crate::assets::ASSETS.iter().any(|(p, _, _)| *p == path)
        || matches!(path, "/api/health" | "/api/openapi.json" | "/api/session")
}

fn matches(expected: &str, given: &str) -> bool {
    bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

/// What a request presents to authenticate.
enum Credential {
    Bearer(String),
    Session(String),
    Nothing,
}

/// The bearer token if the request has one, else the session cookie.
fn credential(h: &HeaderMap) -> Credential {
    // The scheme's name is case-insensitive (RFC 9110 §11.1): `bearer` is `Bearer`.
    if let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
        && let Some((scheme, t)) = v.trim_start().split_once(' ')
        && scheme.eq_ignore_ascii_case("bearer")
    {
        return Credential::Bearer(t.trim().to_string());
    }
    match session_cookie(h) {
        Some(id) => Credential::Session(id),
        None => Credential::Nothing,
    }
}

fn session_cookie(h: &HeaderMap) -> Option<String> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// The address the request came from (absent when the router runs without a listener).
fn peer(req: &Request) -> Option<IpAddr> {
    req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())
}

/// Compare `token` with the configured one, within `peer`'s allowance of failures.
fn check_token(st: &AppState, peer: Option<IpAddr>, token: &str) -> Result<bool, WebError> {
    let Some(expected) = &st.cfg.auth_token else { return Ok(true) };
    st.throttle.attempt(peer, Instant::now(), || matches(expected, token)).map_err(|wait| {
        WebError::TooManyRequests { retry_after: crate::throttle::retry_after_secs(wait) }
    })
}

/// Whether the request is authenticated (always, when no token is configured); 429 when it
/// presents a token from an address that has used up its allowance of wrong ones.
fn authenticated(st: &AppState, req: &Request) -> Result<bool, WebError> {
    if st.cfg.auth_token.is_none() {
        return Ok(true);
    }
    match credential(req.headers()) {
        Credential::Bearer(t) => check_token(st, peer(req), &t),
        Credential::Session(id) => Ok(st.sessions.valid(&id, Instant::now())),
        Credential::Nothing => Ok(false),
    }
}

/// The request's host name (no port, as sent: compare it ignoring case), from `Host` or, for
/// HTTP/2, the URI authority. Borrowed: every request asks.
fn host_name(req: &Request) -> Option<&str> {
    let host = match req.headers().get(header::HOST) {
        Some(h) => h.to_str().ok()?,
        None => req.uri().authority()?.as_str(),
    };
    Some(match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    })
}

/// A host name that cannot be an attacker's rebound DNS name.
fn local_host_name(name: &str) -> bool {
    const LOCAL: &str = ".localhost";
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case(&LOCAL[1..])
        || (name.len() >= LOCAL.len()
            && name.is_char_boundary(name.len() - LOCAL.len())
            && name[name.len() - LOCAL.len()..].eq_ignore_ascii_case(LOCAL))
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

/// Refuse cross-site writes, rebound host names, and requests without the token when one is
/// configured (run on every request by [`crate::edge`]).
pub(crate) fn admit(st: &AppState, req: &Request) -> Result<(), WebError> {
    let writes = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if writes && cross_site(req) {
        return Err(WebError::Forbidden(
            "cross-site request refused: this API only takes writes from its own pages".into(),
        ));
    }
    if st.cfg.auth_token.is_none()
        && let Some(name) = host_name(req)
        && !local_host_name(name)
    {
        return Err(WebError::Forbidden(format!(
            "Host {name:?} refused: without an auth token this server answers only to IP \
             addresses and localhost (protection against DNS rebinding); start it with \
             --auth-token-file to serve other names"
        )));
    }
    // Without a token every request is authenticated: no need to look the path up.
    if st.cfg.auth_token.is_some() && !open_path(req.uri().path()) && !authenticated(st, req)? {
        return Err(WebError::Unauthorized);
    }
    Ok(())
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

/// `GET /api/session`: whether this client is authenticated (and whether it needs to be).
pub async fn status(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let required = st.cfg.auth_token.is_some();
    let ok = authenticated(&st, &req)?;
    Ok(axum::Json(serde_json::json!({ "auth_required": required, "authenticated": ok }))
        .into_response())
}

/// `POST /api/session` `{"token": "..."}`: check the token and start a session (its id in
/// the cookie). A session the request already had ends.
pub async fn login(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let (from, old) = (peer(&req), session_cookie(req.headers()));
    let l: Login = crate::api::read_json(req).await?;
    if st.cfg.auth_token.is_none() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    if !check_token(&st, from, &l.token)? {
        return Err(WebError::Unauthorized);
    }
    if let Some(old) = old {
        st.sessions.revoke(&old);
    }
    let id = st.sessions.create(Instant::now());
    let secure = if st.cfg.tls.is_some() { "; Secure" } else { "" };
    let max_age = st.sessions.ttl().as_secs();
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    set_cookie(
        h,
        &format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"),
    );
    set_cookie(h, &format!("{OLD_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"));
    Ok(r)
}

/// `DELETE /api/session`: log out — the session ends on the server and its cookie is cleared.
pub async fn logout(State(st): State<Arc<AppState>>, req: Request) -> Response {
    if let Some(id) = session_cookie(req.headers()) {
        st.sessions.revoke(&id);
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    for name in [COOKIE, OLD_COOKIE] {
        set_cookie(h, &format!("{name}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"));
    }
    r
}

fn set_cookie(h: &mut HeaderMap, cookie: &str) {
    if let Ok(v) = HeaderValue::from_str(cookie) {
        h.append(header::SET_COOKIE, v);
    }
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
        let name = |h: &str| host_name(&req("GET", &[("host", h)])).map(str::to_string).unwrap();
        assert_eq!(name("127.0.0.1:8080"), "127.0.0.1");
        assert_eq!(name("[::1]:8080"), "::1");
        assert_eq!(name("LocalHost"), "LocalHost");
        for ok in [
            "127.0.0.1",
            "::1",
            "10.1.2.3",
            "localhost",
            "app.localhost",
            "LocalHost",
            "A.LOCALHOST",
        ] {
            assert!(local_host_name(ok), "{ok}");
        }
        for bad in ["evil.example", "127.0.0.1.nip.io", "localhost.evil.example", "é.localhost.io"]
        {
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
