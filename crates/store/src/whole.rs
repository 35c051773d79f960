//! Storing a blob held whole in memory in one call: route, write, commit — and abort on
//! failure, so nothing pending is left behind.

use bs_meta::BlobRecord;

use crate::error::StoreError;
use crate::store::{RouteSpec, Store};

/// Store `data` as `spec` describes (its `size` is set from `data`).
pub fn put_bytes(
    store: &dyn Store,
    spec: &RouteSpec,
    data: &[u8],
) -> Result<BlobRecord, StoreError> {
    let spec = RouteSpec { size: Some(data.len() as u64), ..spec.clone() };
    store.route(&spec)?;
    let written = store.open_upload(&spec.name).and_then(|mut sink| {
        sink.write_at(0, data)?;
        sink.commit(None)
    });
    if written.as_ref().is_err_and(|e| !e.upload_is_anothers()) {
        let _ = store.abort(&spec.name);
    }
    written
}
