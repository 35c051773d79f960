//! Storing a blob held whole in memory in one call: route, write, commit — and abort on
//! failure, so nothing pending is left behind.

use bs_meta::BlobRecord;

use crate::error::StoreError;
use crate::store::{RouteSpec, Routed, Store, open_routed};

/// Store `data` as `spec` describes (its `size` is set from `data`).
pub fn put_bytes(
    store: &dyn Store,
    spec: &RouteSpec,
    data: &[u8],
) -> Result<BlobRecord, StoreError> {
    let spec = RouteSpec { size: Some(data.len() as u64), ..spec.clone() };
    let routed = store.route(&spec)?;
    write_routed(store, &spec, &routed, data)
}

/// Write and commit `data` into the upload `spec` routed, aborting it on failure unless
/// the upload turned out to be another transfer's.
fn write_routed(
    store: &dyn Store,
    spec: &RouteSpec,
    routed: &Routed,
    data: &[u8],
) -> Result<BlobRecord, StoreError> {
    let written = open_routed(store, spec, routed).and_then(|mut sink| {
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
        let dir = tempfile::tempdir().unwrap();
        let (mem, fs) = (MemStore::new(), crate::fs::FsStore::open(dir.path()).unwrap());
        let stores: [&dyn Store; 2] = [&mem, &fs];
        for s in stores {
            // Taken over by a put of another size, then by one of the same size with other
            // metadata: either way the upload is the other put's, and so is the blob.
            for (size, bytes) in [(5, &b"hello"[..]), (3, &b"xyz"[..])] {
                let a = RouteSpec {
                    name: "n".into(),
                    size: Some(3),
                    overwrite: true,
                    ..Default::default()
                };
                let who = [("who".to_string(), "b".to_string())].into();
                let b = RouteSpec { size: Some(size), metadata: who, ..a.clone() };
                let (ra, rb) = (s.route(&a).unwrap(), s.route(&b).unwrap());
                let e = write_routed(s, &a, &ra, b"abc").unwrap_err();
                assert!(matches!(e, StoreError::Busy(_)), "{} {size}: {e}", s.describe());
                // The other's upload is untouched, and lands whole.
                let rec = write_routed(s, &b, &rb, bytes).unwrap();
                assert_eq!(rec.metadata["who"], "b");
                assert_eq!(&s.open_read("n").unwrap().all().unwrap()[..], bytes);
            }
        }
    }
}
