//! Blob keys: where a blob lives (memory, a local file, or a remote store) plus its name.
//!
//! Text forms: `mem:NAME`, `file:PATH` (or any other string: a local path), and
//! `blob://HOST:PORT/NAME` for a blob on a blobstream server.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::BlobError;

/// The slot a blob lives in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// The factory's in-process memory store.
    Memory,
    /// A local file (the name is its path).
    File,
    /// A blobstream server, by control-plane address.
    Remote(String),
}

/// Names one blob: its location plus a name within it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlobKey {
    location: Location,
    name: String,
}

impl BlobKey {
    /// A blob in the factory's memory store.
    pub fn memory(name: impl Into<String>) -> Self {
        Self { location: Location::Memory, name: name.into() }
    }

    /// A local file.
    pub fn file(path: impl AsRef<Path>) -> Self {
        Self { location: Location::File, name: path.as_ref().to_string_lossy().into_owned() }
    }

    /// A blob named `name` on the server at `server` (`host:port`).
    pub fn remote(server: impl Into<String>, name: impl Into<String>) -> Self {
        Self { location: Location::Remote(server.into()), name: name.into() }
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path of a file key.
    pub fn path(&self) -> Option<PathBuf> {
        (self.location == Location::File).then(|| PathBuf::from(&self.name))
    }
}

impl FromStr for BlobKey {
    type Err = BlobError;
    fn from_str(s: &str) -> Result<Self, BlobError> {
        let bad =
            |reason: &str| BlobError::InvalidKey { key: s.to_string(), reason: reason.into() };
        if let Some(rest) = s.strip_prefix("blob://") {
            let (server, name) =
                rest.split_once('/').ok_or_else(|| bad("expected blob://HOST:PORT/NAME"))?;
            if server.is_empty() || name.is_empty() {
                return Err(bad("expected blob://HOST:PORT/NAME"));
            }
            return Ok(Self::remote(server, name));
        }
        if let Some(name) = s.strip_prefix("mem:") {
            return Ok(Self::memory(name));
        }
        let path = s.strip_prefix("file:").unwrap_or(s);
        if path.is_empty() {
            return Err(bad("empty path"));
        }
        Ok(Self::file(path))
    }
}

impl fmt::Display for BlobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Location::Memory => write!(f, "mem:{}", self.name),
            Location::File => write!(f, "file:{}", self.name),
            Location::Remote(server) => write!(f, "blob://{server}/{}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_and_print() {
        for (text, key) in [
            ("mem:a/b", BlobKey::memory("a/b")),
            ("file:/tmp/x", BlobKey::file("/tmp/x")),
            ("blob://127.0.0.1:7070/ct/1.dcm", BlobKey::remote("127.0.0.1:7070", "ct/1.dcm")),
        ] {
            assert_eq!(text.parse::<BlobKey>().unwrap(), key);
            assert_eq!(key.to_string(), text);
        }
        assert_eq!("rel/path".parse::<BlobKey>().unwrap(), BlobKey::file("rel/path"));
        assert!("blob://host-only".parse::<BlobKey>().is_err());
        assert!("blob:///name".parse::<BlobKey>().is_err());
        assert!("".parse::<BlobKey>().is_err());
    }
}
