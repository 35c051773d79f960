//! The one middleware every request passes through, the fallback's included: checked by
//! [`crate::auth`] and counted in [`crate::metrics`] (refused ones too, under their route).
//!
//! Written as a tower layer rather than two `axum::middleware::from_fn`s: each of those cloned
//! the route's service stack and boxed three futures per request, about a tenth of the web
//! server's CPU time for a cached tile (`blobstream bench dpss`, warm tiles against nginx).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::AppState;
use crate::metrics::{RouteMemo, Seen};

/// Wraps each route's service (and the fallback's) in an [`Edge`].
#[derive(Clone)]
pub struct EdgeLayer {
    state: Arc<AppState>,
}

impl EdgeLayer {
    pub fn new(state: Arc<AppState>) -> Self {
        Self { state }
    }
}

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge { inner, state: self.state.clone(), route: Arc::default() }
    }
}

/// A route's service behind the auth check, its answers counted.
#[derive(Clone)]
pub struct Edge<S> {
    inner: S,
    state: Arc<AppState>,
    /// The metrics of the route this service answers for.
    route: Arc<RouteMemo>,
}

impl<S> Service<Request> for Edge<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = EdgeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let seen = Seen::new(&req);
        let (inner, refused) = match crate::auth::admit(&self.state, &req) {
            Ok(()) => (Some(self.inner.call(req)), None),
            Err(e) => (None, Some(e.into_response())),
        };
        EdgeFuture { inner, refused, seen, state: self.state.clone(), route: self.route.clone() }
    }
}

pin_project_lite::pin_project! {
    /// The route's answer (or the refusal), counted when it is ready.
    pub struct EdgeFuture<F> {
        #[pin]
        inner: Option<F>,
        refused: Option<Response>,
        seen: Seen,
        state: Arc<AppState>,
        route: Arc<RouteMemo>,
    }
}

impl<F> Future for EdgeFuture<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = match (this.refused.take(), this.inner.as_pin_mut()) {
            (Some(r), _) => r,
            (None, Some(f)) => match f.poll(cx) {
                Poll::Ready(Ok(r)) => r,
                Poll::Pending => return Poll::Pending,
            },
            (None, None) => panic!("EdgeFuture polled after it completed"),
        };
        this.state.metrics.count(this.route, this.seen, &resp);
        Poll::Ready(Ok(resp))
    }
}
