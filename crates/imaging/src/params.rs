//! Filter parameters as given on a command line or in a definition file: `key=value` text,
//! checked and typed by the filter that receives them.

use std::collections::BTreeMap;

use crate::error::ImagingError;

/// Parameters for one filter application.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params(pub BTreeMap<String, String>);

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse `key=value` items (as from repeated `--param` flags).
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self, ImagingError> {
        let mut p = Self::new();
        for item in items {
            let item = item.as_ref();
            let (k, v) = item.split_once('=').ok_or_else(|| ImagingError::BadParam {
                filter: String::new(),
                param: item.to_string(),
                reason: "expected KEY=VALUE".into(),
            })?;
            let k = k.trim();
            if k.is_empty() {
                return Err(ImagingError::BadParam {
                    filter: String::new(),
                    param: item.to_string(),
                    reason: "empty key".into(),
                });
            }
            // Given twice, one would silently win: which was meant is the user's to say.
            if p.0.insert(k.to_string(), v.trim().to_string()).is_some() {
                return Err(ImagingError::BadParam {
                    filter: String::new(),
                    param: k.to_string(),
                    reason: "given twice".into(),
                });
            }
        }
        Ok(p)
    }

    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.0.insert(key.to_string(), value.to_string());
        self
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// These parameters over `base` (ours win).
    pub fn over(&self, base: &Params) -> Params {
        let mut m = base.0.clone();
        m.extend(self.0.clone());
        Params(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let p = Params::parse(&["radius=3", " amount = 0.5 "]).unwrap();
        assert_eq!(p.get("radius"), Some("3"));
        assert_eq!(p.get("amount"), Some("0.5"));
        assert!(Params::parse(&["novalue"]).is_err());
        assert!(Params::parse(&["=3"]).is_err());
        let twice = Params::parse(&["size=3", "size = 5"]).unwrap_err().to_string();
        assert!(twice.contains("size") && twice.contains("given twice"), "{twice}");
        let base = Params::new().with("a", 1).with("b", 2);
        assert_eq!(Params::new().with("b", 9).over(&base).get("b"), Some("9"));
    }
}
