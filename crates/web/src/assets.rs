//! The browser client's static files, compiled into the binary so a user never runs a separate
//! web server or build step.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Path, media type and contents of every asset.
pub const ASSETS: &[(&str, &str, &[u8])] = &[
    ("/", "text/html; charset=utf-8", include_bytes!("../assets/index.html")),
    ("/app.js", "text/javascript; charset=utf-8", include_bytes!("../assets/app.js")),
    ("/app.css", "text/css; charset=utf-8", include_bytes!("../assets/app.css")),
    ("/stack.js", "text/javascript; charset=utf-8", include_bytes!("../assets/stack.js")),
    ("/worklist.js", "text/javascript; charset=utf-8", include_bytes!("../assets/worklist.js")),
    ("/favicon.svg", "image/svg+xml", include_bytes!("../assets/favicon.svg")),
    ("/dpss.html", "text/html; charset=utf-8", include_bytes!("../assets/dpss.html")),
    ("/dpss.js", "text/javascript; charset=utf-8", include_bytes!("../assets/dpss.js")),
];

/// The page may only talk to its own origin.
const PAGE_CSP: &str = "default-src 'self'; img-src 'self' blob: data:; \
    style-src 'self' 'unsafe-inline'; script-src 'self'; connect-src 'self'; \
    frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The asset at `path`.
pub fn serve(path: &str) -> Response {
    let Some((_, mime, body)) = ASSETS.iter().find(|(p, _, _)| *p == path) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut r = (*body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(PAGE_CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    r
}
