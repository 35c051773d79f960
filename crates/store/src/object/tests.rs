//! The object store's upload path against a bucket that refuses to start multipart uploads
//! when told to (the in-memory backend otherwise): a failure the receiver cannot be told of
//! when it happens (a part filled in place) reaches it from the next write, and nothing lands;
//! and the retry budget outlasts a timed-out request.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartId, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use super::*;
use crate::store::RouteSpec;
use bytes::Bytes;

/// The in-memory bucket, refusing `create_multipart` while `refuse` is set.
#[derive(Debug, Default)]
struct Refusing {
    inner: InMemory,
    refuse: AtomicBool,
    /// Multipart uploads: their parts so far, by upload id.
    uploads: std::sync::Mutex<HashMap<String, Vec<Option<Bytes>>>>,
    next_id: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Display for Refusing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Refusing({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Refusing {
    async fn put_opts(
        &self,
        p: &Path,
        b: PutPayload,
        o: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(p, b, o).await
    }
    async fn put_multipart_opts(
        &self,
        p: &Path,
        o: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(p, o).await
    }
    async fn get_opts(&self, p: &Path, o: GetOptions) -> object_store::Result<GetResult> {
        self.inner.get_opts(p, o).await
    }
    async fn delete(&self, p: &Path) -> object_store::Result<()> {
        self.inner.delete(p).await
    }
    fn list(&self, p: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(p)
    }
    async fn list_with_delimiter(&self, p: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(p).await
    }
    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }
    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

// Multipart uploads are kept here rather than in `InMemory`, whose `put_part` (0.12.5)
// indexes past its parts when a later part arrives first, as parts sent at once may.
#[async_trait]
impl MultipartStore for Refusing {
    async fn create_multipart(&self, _: &Path) -> object_store::Result<MultipartId> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "Refusing",
                source: "no multipart uploads today".into(),
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst).to_string();
        self.uploads().insert(id.clone(), Vec::new());
        Ok(id)
    }
    async fn put_part(
        &self,
        _: &Path,
        id: &MultipartId,
        idx: usize,
        data: PutPayload,
    ) -> object_store::Result<PartId> {
        let mut uploads = self.uploads();
        let parts = uploads.get_mut(id).ok_or_else(|| no_upload(id))?;
        if parts.len() <= idx {
            parts.resize(idx + 1, None);
        }
        parts[idx] = Some(data.into());
        Ok(PartId { content_id: idx.to_string() })
    }
    async fn complete_multipart(
        &self,
        p: &Path,
        id: &MultipartId,
        _: Vec<PartId>,
    ) -> object_store::Result<PutResult> {
        let parts = self.uploads().remove(id).ok_or_else(|| no_upload(id))?;
        let whole: Option<Vec<Bytes>> = parts.into_iter().collect();
        let whole = whole.ok_or_else(|| no_upload(id))?.concat();
        self.inner.put(p, whole.into()).await
    }
    async fn abort_multipart(&self, _: &Path, id: &MultipartId) -> object_store::Result<()> {
        self.uploads().remove(id);
        Ok(())
    }
}

impl Refusing {
    fn uploads(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Option<Bytes>>>> {
        self.uploads.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn no_upload(id: &str) -> object_store::Error {
    object_store::Error::Generic { store: "Refusing", source: format!("no upload {id}").into() }
}

#[test]
fn a_part_filled_in_place_that_cannot_go_up_fails_the_next_write_and_nothing_lands() {
    let bucket = Arc::new(Refusing::default());
    bucket.refuse.store(true, Ordering::SeqCst);
    let cat = bs_meta::Catalogue::open_in_memory().unwrap();
    let s = ObjStore::open(bucket.clone(), "t", cat, "refusing".into()).unwrap();
    let body: Vec<u8> = (0..PART_SIZE + 10).map(|i| (i % 251) as u8).collect();
    let spec = RouteSpec { name: "b".into(), size: Some(body.len() as u64), ..Default::default() };
    s.route(&spec).unwrap();
    let mut w = s.open_upload("b").unwrap();
    // The first part, filled in place: sending it fails where nobody can be told.
    w.lend(0, PART_SIZE as u64).unwrap().copy_from_slice(&body[..PART_SIZE]);
    w.filled(0, PART_SIZE as u64);
    assert!(w.lend(PART_SIZE as u64, 10).is_none(), "nothing more is lent after a failure");
    // Reported by the next write even when the bucket is back by then: the writer hears of
    // every failure (and resumes).
    bucket.refuse.store(false, Ordering::SeqCst);
    let e = w.write_at(PART_SIZE as u64, &body[PART_SIZE..]).unwrap_err();
    assert!(e.to_string().contains("no multipart uploads today"), "{e}");
    drop(w);
    assert!(matches!(s.stat("b"), Err(StoreError::NotFound(_))), "nothing partial is visible");
    // Routed again, the upload goes on from what it holds and lands whole.
    let routed = s.route(&spec).unwrap();
    let mut w = s.open_upload("b").unwrap();
    let from = routed.received as usize;
    w.write_at(from as u64, &body[from..]).unwrap();
    w.commit(None).unwrap();
    assert_eq!(&s.open_read("b").unwrap().all().unwrap()[..], &body[..]);
}

/// Retries outlast one request's timeout, whatever it is set to: a request that timed out is
/// tried again (`s3http`'s `a_put_the_server_never_answers_is_sent_again_after_the_timeout`
/// shows the retry itself).
#[test]
fn the_retry_budget_outlasts_a_timed_out_request() {
    for secs in [1, 30, 300] {
        let t = std::time::Duration::from_secs(secs);
        let r = retry_for(t);
        assert!(r.retry_timeout > t, "{secs} s: {:?}", r.retry_timeout);
        assert!(r.max_retries >= 1);
    }
}
