//! What the stores that keep a catalogue row per blob (the filesystem and object stores) do
//! the same way: look a blob up, refuse to replace one, refuse a blob marked corrupt, mark
//! one corrupt, expire uploads left pending, and (for tests) rot a blob kept in its row.

use std::sync::Arc;

use bs_meta::{BlobRecord, Catalogue, StoredBlob, now_ms};

use crate::claim::Claims;
use crate::error::StoreError;
use crate::name::validate_name;
use crate::source::CorruptionMarker;
use crate::store::may_replace;

type Result<T> = std::result::Result<T, StoreError>;

/// The committed blob `name`.
pub(crate) fn stat(cat: &Catalogue, name: &str) -> Result<BlobRecord> {
    validate_name(name)?;
    let (rec, _) = cat.blob(name)?.ok_or_else(|| StoreError::NotFound(name.to_string()))?;
    Ok(rec)
}

/// Why the committed blob `name` is marked corrupt, if it is.
pub(crate) fn corrupt_mark(cat: &Catalogue, name: &str) -> Result<Option<String>> {
    validate_name(name)?;
    Ok(cat.stored(name)?.ok_or_else(|| StoreError::NotFound(name.to_string()))?.corrupt)
}

/// Fault injection for tests: flip the bits of `mask` in byte `offset` of `data`, the bytes
/// the row `s` keeps, behind the store's back (its digests kept) — bit rot in the catalogue.
pub(crate) fn damage_inline(
    cat: &Catalogue,
    s: &StoredBlob,
    mut data: Vec<u8>,
    offset: u64,
    mask: u8,
) -> Result<()> {
    let name = &s.record.name;
    let b = data
        .get_mut(offset as usize)
        .ok_or_else(|| StoreError::Config(format!("{name:?} has no byte {offset}")))?;
    *b ^= mask;
    cat.set_inline(name, &s.location, &data)?;
    Ok(())
}

/// [`StoreError::AlreadyExists`] if a blob named `name` is there and an upload with these
/// flags may not replace it; [`StoreError::ConditionFailed`] if the upload must replace a
/// version (`REQUIRE_DIGEST`) that is not there.
pub(crate) fn refuse_existing(
    cat: &Catalogue,
    name: &str,
    overwrite: bool,
    refuse: &[String],
) -> Result<()> {
    if overwrite && refuse.is_empty() {
        // Anything there may be replaced: no need to look (a round trip to PostgreSQL).
        return Ok(());
    }
    match cat.blob(name)? {
        there
            if !may_replace(overwrite, refuse, there.as_ref().map(|(b, _)| b.digest.as_str())) =>
        {
            Err(crate::store::refused(name, refuse))
        }
        _ => Ok(()),
    }
}

/// The row of a blob to read; a blob already known to be corrupt is refused at once.
pub(crate) fn readable(cat: &Catalogue, name: &str) -> Result<StoredBlob> {
    validate_name(name)?;
    refuse_unreadable(name, cat.stored(name)?)
}

/// [`readable`] if the catalogue can answer without waiting (see
/// [`Catalogue::stored_at_once`]).
pub(crate) fn readable_at_once(cat: &Catalogue, name: &str) -> Option<Result<StoredBlob>> {
    if let Err(e) = validate_name(name) {
        return Some(Err(e));
    }
    Some(
        cat.stored_at_once(name)?
            .map_err(StoreError::from)
            .and_then(|s| refuse_unreadable(name, s)),
    )
}

fn refuse_unreadable(name: &str, stored: Option<StoredBlob>) -> Result<StoredBlob> {
    let stored = stored.ok_or_else(|| StoreError::NotFound(name.to_string()))?;
    if let Some(reason) = &stored.corrupt {
        return Err(StoreError::Corrupt {
            name: name.to_string(),
            reason: format!("marked corrupt ({reason}); restore or delete it"),
        });
    }
    Ok(stored)
}

/// What a reader calls when it finds `name` (stored at `location`) corrupt.
pub(crate) fn marker(cat: Arc<Catalogue>, name: &str, location: &str) -> CorruptionMarker {
    let (name, loc) = (name.to_string(), location.to_string());
    Arc::new(move |reason: &str| {
        if let Err(e) = cat.set_corrupt(&name, &loc, Some(reason)) {
            tracing::error!(blob = %name, error = %e, "cannot mark blob corrupt");
        }
    })
}

/// Unix milliseconds `age` ago.
pub(crate) fn cutoff_ms(age: std::time::Duration) -> i64 {
    now_ms().saturating_sub(age.as_millis() as i64)
}

/// Discard (with `discard`, which returns the dropped upload's id) the uploads routed more
/// than `age` ago that no transfer is writing right now; returns their names.
pub(crate) fn expire_uploads(
    cat: &Catalogue,
    busy: &Claims,
    age: std::time::Duration,
    mut discard: impl FnMut(&str) -> Result<Option<String>>,
) -> Result<Vec<String>> {
    let cutoff = cutoff_ms(age);
    let mut gone = Vec::new();
    for (name, id) in cat.uploads_created_before(cutoff)? {
        // A transfer writing it right now keeps it.
        let Ok(_claim) = busy.take(&name) else { continue };
        // Under the claim: still the same stale upload (not resumed or replaced since)?
        if cat.upload(&name)?.is_none_or(|u| u.upload_id != id || u.created_ms >= cutoff) {
            continue;
        }
        if discard(&name)?.is_some() {
            tracing::info!(%name, "removing an upload left pending too long");
            gone.push(name);
        }
    }
    Ok(gone)
}
