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
    ("/util.js", "text/javascript; charset=utf-8", include_bytes!("../assets/util.js")),
    ("/state.js", "text/javascript; charset=utf-8", include_bytes!("../assets/state.js")),
    ("/status.js", "text/javascript; charset=utf-8", include_bytes!("../assets/status.js")),
    ("/raster.js", "text/javascript; charset=utf-8", include_bytes!("../assets/raster.js")),
    ("/browse.js", "text/javascript; charset=utf-8", include_bytes!("../assets/browse.js")),
    ("/search.js", "text/javascript; charset=utf-8", include_bytes!("../assets/search.js")),
    ("/series.js", "text/javascript; charset=utf-8", include_bytes!("../assets/series.js")),
    ("/upload.js", "text/javascript; charset=utf-8", include_bytes!("../assets/upload.js")),
    ("/viewer.js", "text/javascript; charset=utf-8", include_bytes!("../assets/viewer.js")),
    ("/image.js", "text/javascript; charset=utf-8", include_bytes!("../assets/image.js")),
    ("/filters.js", "text/javascript; charset=utf-8", include_bytes!("../assets/filters.js")),
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

#[cfg(test)]
mod tests {
    use super::ASSETS;

    /// The served paths a script imports (`from './x.js'` gives `/x.js`).
    fn imports(script: &[u8]) -> Vec<String> {
        let text = std::str::from_utf8(script).unwrap();
        text.split("from './")
            .skip(1)
            .map(|p| format!("/{}", &p[..p.find('\'').unwrap()]))
            .collect()
    }

    /// Every module a served script imports (`from './x.js'`) is served too: the browser loads
    /// the whole module graph before it runs any of it, so one missing entry breaks the page.
    #[test]
    fn every_imported_module_is_served() {
        for (path, _, body) in ASSETS.iter().filter(|(p, _, _)| p.ends_with(".js")) {
            for want in imports(body) {
                assert!(
                    ASSETS.iter().any(|(p, _, _)| *p == want),
                    "{path} imports {want}, which is not served"
                );
            }
        }
    }

    #[test]
    fn the_page_preloads_exactly_the_modules_app_js_imports() {
        let served = |p: &str| ASSETS.iter().find(|(q, _, _)| *q == p).map(|(_, _, b)| *b);
        let page = std::str::from_utf8(served("/").unwrap()).unwrap();
        let mut preloaded: Vec<&str> = page
            .split("<link rel=\"modulepreload\" href=\"")
            .skip(1)
            .map(|part| &part[..part.find('"').unwrap()])
            .collect();
        // Every module reachable from app.js, by following the imports.
        let mut reachable = vec![];
        let mut todo = vec!["/app.js".to_string()];
        while let Some(path) = todo.pop() {
            for want in imports(served(&path).unwrap()) {
                if !reachable.contains(&want) {
                    reachable.push(want.clone());
                    todo.push(want);
                }
            }
        }
        preloaded.sort();
        reachable.sort();
        assert_eq!(preloaded, reachable);
    }
}
