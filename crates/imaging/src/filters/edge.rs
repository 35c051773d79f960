//! (to be written)

use std::sync::Arc;

use crate::filter::Filter;

/// Add this module's filters to `out`.
pub fn register(_out: &mut Vec<Arc<dyn Filter>>) {}
