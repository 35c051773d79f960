//! (to be written: the registry of built-in and loaded filters, chains, reload)

/// The filters a program can use by name.
pub struct Registry;
