//! One writer per pending upload, within this process: a name is claimed while a transfer
//! writes it (or a route, abort or delete decides about it) and released when that ends.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::error::StoreError;

/// The names claimed right now.
#[derive(Default)]
pub(crate) struct Claims(Mutex<HashSet<String>>);

impl Claims {
    /// Claim `name`, or [`StoreError::Busy`] if someone holds it.
    pub(crate) fn take(&self, name: &str) -> Result<Claim<'_>, StoreError> {
        if self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string()) {
            Ok(Claim { claims: self, name: Some(name.to_string()) })
        } else {
            Err(StoreError::Busy(name.to_string()))
        }
    }

    /// Whether someone holds `name`.
    pub(crate) fn is_held(&self, name: &str) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains(name)
    }

    /// Release a claim handed over with [`Claim::keep`].
    pub(crate) fn release(&self, name: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }
}

/// Exclusive use of one name's pending upload, released on drop.
pub(crate) struct Claim<'a> {
    claims: &'a Claims,
    name: Option<String>,
}

impl Claim<'_> {
    /// Hand the claim over to someone who will release it (the upload sink).
    pub(crate) fn keep(mut self) {
        self.name = None;
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.name.take() {
            self.claims.release(&n);
        }
    }
}
