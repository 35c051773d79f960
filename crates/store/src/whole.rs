//! Storing a blob held whole in memory in one call: route, write, commit — and abort on
//! failure, so nothing pending is left behind.

use bs_meta::BlobRecord;

use crate::error::StoreError;
use crate::store::{RouteSpec, Store, open_routed};

/// Store `data` as `spec` describes (its `size` is set from `data`).
pub fn put_bytes(
    store: &dyn Store,
    spec: &RouteSpec,
    data: &[u8],
) -> Result<BlobRecord, StoreError> {
    let spec = RouteSpec { size: Some(data.len() as u64), ..spec.clone() };
    store.route(&spec)?;
    write_routed(store, &spec, data)
}

/// Write and commit `data` into the upload `spec` routed, aborting it on failure unless
/// the upload turned out to be another transfer's.
fn write_routed(
    store: &dyn Store,
    spec: &RouteSpec,
    data: &[u8],
) -> Result<BlobRecord, StoreError> {
    let written = open_routed(store, spec).and_then(|mut sink| {
        sink.write_at(0, data)?;
        sink.commit(None)
    });
    if written.as_ref().is_err_and(|e| !e.upload_is_anothers()) {
        let _ = store.abort(&spec.name);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemStore;

    #[test]
    fn a_put_whose_upload_another_route_took_over_is_told_busy_and_leaves_it_alone() {
        let s = MemStore::new();
        let a = RouteSpec { name: "n".into(), size: Some(3), ..Default::default() };
        let b = RouteSpec { size: Some(5), ..a.clone() };
        s.route(&a).unwrap();
        s.route(&b).unwrap();
        let e = write_routed(&s, &a, b"abc").unwrap_err();
        assert!(matches!(e, StoreError::Busy(_)), "{e}");
        // The other's upload is untouched, and lands whole.
        assert_eq!(write_routed(&s, &b, b"hello").unwrap().size, 5);
        assert_eq!(&s.open_read("n").unwrap().all().unwrap()[..], b"hello");
    }
}
