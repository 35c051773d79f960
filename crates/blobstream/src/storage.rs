//! Where `serve` keeps blobs and its catalogue: the embedded default (a data directory with
//! files and SQLite), memory, or an S3-compatible bucket; the catalogue in SQLite or a
//! shared PostgreSQL; optionally a memory tier in front. Set by a TOML file (`--config`),
//! environment variables and flags — a flag wins over the environment, which wins over the
//! file. Credentials are taken from the file or the environment only (never a flag, which
//! every user of the host can read in `ps`), and never printed or logged.
//!
//! ```toml
//! data = "data"                       # the data directory (fs backend; SQLite catalogue)
//!
//! [s3]                                # blobs in a bucket instead of the data directory
//! endpoint = "http://127.0.0.1:3900"  # omit for AWS
//! region = "garage"
//! bucket = "blobstream"
//! prefix = "blobs"
//! access_key_id = "GK..."
//! secret_access_key = "..."           # or BLOBSTREAM_S3_SECRET_ACCESS_KEY
//!
//! [catalogue]
//! url = "postgres://blobstream@db.example:5432/blobstream"   # or BLOBSTREAM_CATALOGUE
//!
//! [cache]
//! memory = "1g"                       # memory tier budget (k/m/g suffixes); 0: none
//! disk = "/var/cache/blobstream"      # disk tier directory (behind the memory tier)
//! disk_size = "100g"                  # disk tier budget
//! max_blob = "64m"                    # largest blob a tier holds
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use bs_meta::{Catalogue, ImageIndex};
use bs_store::{FsStore, MemStore, ObjStore, S3Config, Store, Tier};
use serde::Deserialize;

use crate::cli::ServeArgs;

/// The file's shape (every part optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data: Option<PathBuf>,
    pub s3: Option<S3File>,
    pub catalogue: Option<CatalogueFile>,
    pub cache: Option<CacheFile>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3File {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub bucket: Option<String>,
    pub prefix: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Seconds one request to the bucket may take.
    pub timeout: Option<u64>,
}

impl std::fmt::Debug for S3File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3File").field("bucket", &self.bucket).finish_non_exhaustive()
    }
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogueFile {
    pub url: Option<String>,
}

impl std::fmt::Debug for CatalogueFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CatalogueFile { url: (hidden) }")
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheFile {
    pub memory: Option<Bytes>,
    pub disk: Option<PathBuf>,
    pub disk_size: Option<Bytes>,
    pub max_blob: Option<Bytes>,
}

/// A size in the file: a number of bytes, or a string with a suffix (`"64m"`, `"1 GiB"`),
/// read while the file is parsed, so a bad one is refused with its line.
#[derive(Debug, Clone, Copy)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Number(u64),
            Text(String),
        }
        match Given::deserialize(d)? {
            Given::Number(n) => Ok(Bytes(n)),
            Given::Text(t) => bs_binding::qos::parse_size(&t).map(Bytes).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "{t:?} is not a number of bytes (k/m/g/t suffixes: \"64m\", \"1 GiB\")"
                ))
            }),
        }
    }
}

/// Read and check a configuration file; a bad one is refused with the line at fault.
pub fn read_file(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration {}", path.display()))?;
    let cfg: FileConfig = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| text[..s.start].matches('\n').count() + 1);
        let at = line.map(|l| format!(" (line {l})")).unwrap_or_default();
        anyhow::anyhow!("configuration {}{at}: {}", path.display(), e.message())
    })?;
    let secret_key = cfg.s3.as_ref().is_some_and(|s| s.secret_access_key.is_some());
    let password = cfg.catalogue.as_ref().and_then(|c| c.url.as_deref()).is_some_and(|u| {
        u.split_once("://")
            .and_then(|(_, rest)| rest.split_once('@'))
            .is_some_and(|(user, _)| user.contains(':'))
    });
    if secret_key || password {
        warn_if_readable_by_others(path);
    }
    Ok(cfg)
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o044 != 0
    {
        tracing::warn!(
            "{} holds a secret (S3 key or database password) and other users can read it \
             (chmod 600 it)",
            path.display()
        );
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// What the server stores into, ready: the store (with its tier, if any) and the image
/// index beside its catalogue.
pub struct Storage {
    pub store: Arc<dyn Store>,
    pub index: ImageIndex,
    /// For logs: where blobs and the catalogue are (no credentials).
    pub describe: String,
}

/// Open the storage `a` (and its configuration file) describe.
pub fn open(a: &ServeArgs) -> Result<Storage> {
    let file = match &a.config {
        Some(p) => read_file(p)?,
        None => FileConfig::default(),
    };
    let data = a.data.clone().or(file.data.clone()).unwrap_or_else(|| PathBuf::from("data"));
    let s3f = file.s3.unwrap_or_default();
    let bucket = a.s3_bucket.clone().or(s3f.bucket.clone());
    let catalogue_url = a.catalogue.clone().or(file.catalogue.and_then(|c| c.url));
    let cache = file.cache.unwrap_or_default();
    let cache_memory = match (&a.cache_memory, &cache.memory) {
        (Some(v), _) => *v,
        (None, Some(b)) => b.0,
        (None, None) => 0,
    };
    let cache_max_blob = match (&a.cache_max_blob, &cache.max_blob) {
        (Some(v), _) => *v,
        (None, Some(b)) => b.0,
        (None, None) => 64 << 20,
    };
    let cache_disk = a.cache_disk.clone().or(cache.disk.clone());
    let cache_disk_size = match (&a.cache_disk_size, &cache.disk_size) {
        (Some(v), _) => *v,
        (None, Some(b)) => b.0,
        (None, None) => 10 << 30,
    };
    if a.memory && (bucket.is_some() || catalogue_url.is_some()) {
        bail!("--memory keeps everything in this process: it takes no bucket or catalogue URL");
    }

    let catalogue = || -> Result<(Catalogue, ImageIndex)> {
        match &catalogue_url {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                let cat = Catalogue::connect_postgres(url)
                    .context("connecting to the PostgreSQL catalogue")?;
                let index = ImageIndex::connect_postgres(url)
                    .context("opening the image index in PostgreSQL")?;
                Ok((cat, index))
            }
            Some(url) => bail!(
                "catalogue URL {:?} is not postgres://...; leave it out for SQLite in the data directory",
                url.split('@').next_back().unwrap_or("")
            ),
            None => {
                std::fs::create_dir_all(&data)
                    .with_context(|| format!("creating {}", data.display()))?;
                let db = data.join("meta.db");
                let cat = Catalogue::open(&db)
                    .with_context(|| format!("opening the catalogue {}", db.display()))?;
                Ok((cat, ImageIndex::open(&db).context("opening the image index")?))
            }
        }
    };

    let (store, index, describe): (Arc<dyn Store>, ImageIndex, String) = if a.memory {
        let store = MemStore::with_capacity(a.memory_limit.unwrap_or_else(half_the_memory));
        (Arc::new(store), ImageIndex::open_in_memory()?, "memory".into())
    } else if let Some(bucket) = bucket {
        let cfg = S3Config {
            endpoint: a.s3_endpoint.clone().or(s3f.endpoint),
            region: a.s3_region.clone().or(s3f.region).unwrap_or_default(),
            bucket,
            prefix: a.s3_prefix.clone().or(s3f.prefix).unwrap_or_default(),
            access_key_id: a
                .s3_access_key_id
                .clone()
                .or(s3f.access_key_id)
                .or_else(|| env("AWS_ACCESS_KEY_ID"))
                .context("no S3 access key id: --s3-access-key-id, BLOBSTREAM_S3_ACCESS_KEY_ID or [s3] access_key_id")?,
            secret_access_key: env("BLOBSTREAM_S3_SECRET_ACCESS_KEY")
                .or(s3f.secret_access_key)
                .or_else(|| env("AWS_SECRET_ACCESS_KEY"))
                .context("no S3 secret key: BLOBSTREAM_S3_SECRET_ACCESS_KEY or [s3] secret_access_key")?,
            timeout: s3f.timeout.map(std::time::Duration::from_secs),
        };
        let (cat, index) = catalogue()?;
        let describe = format!("{}, catalogue {}", cfg.describe(), cat.describe());
        let store = ObjStore::open_s3(&cfg, cat)
            .with_context(|| format!("opening the bucket {}", cfg.describe()))?;
        (Arc::new(store), index, describe)
    } else {
        if catalogue_url.is_some() {
            bail!(
                "a PostgreSQL catalogue is for blobs several front ends share: give it a bucket \
                 (--s3-bucket or [s3]); the data directory's files are this host's alone"
            );
        }
        let store = FsStore::open(&data)
            .with_context(|| format!("opening the store in {}", data.display()))?;
        // The image index lives in the catalogue's database file.
        let index =
            ImageIndex::open(&store.root().join("meta.db")).context("opening the image index")?;
        (Arc::new(store), index, format!("fs:{}", data.display()))
    };
    let (store, describe): (Arc<dyn Store>, String) = match &cache_disk {
        Some(dir) => {
            let tier = Tier::on_disk(store, dir, cache_disk_size, cache_max_blob)
                .with_context(|| format!("opening the disk tier in {}", dir.display()))?;
            let d =
                format!("{describe}, disk tier of {cache_disk_size} bytes in {}", dir.display());
            (Arc::new(tier), d)
        }
        None => (store, describe),
    };
    let (store, describe): (Arc<dyn Store>, String) = if cache_memory > 0 {
        let tier = Tier::new(store, cache_memory, cache_max_blob);
        (Arc::new(tier), format!("{describe}, memory tier of {cache_memory} bytes"))
    } else {
        (store, describe)
    };
    Ok(Storage { store, index, describe })
}

/// Half of MemTotal from /proc/meminfo (1 GiB if it cannot be read).
fn half_the_memory() -> u64 {
    let kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    });
    kib.map_or(1 << 30, |k| k * 1024 / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_file_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "data = \"d\"\n\n[s3]\nbucket = \"b\"\nbukcet = \"x\"\n").unwrap();
        let e = read_file(&p).unwrap_err().to_string();
        assert!(e.contains("line 5") && e.contains("bukcet"), "{e}");
        std::fs::write(
            &p,
            "[cache]\nmemory = \"1g\"\n[catalogue]\nurl = \"postgres://u:pw@h/db\"\n",
        )
        .unwrap();
        let c = read_file(&p).unwrap();
        assert_eq!(c.cache.unwrap().memory.map(|b| b.0), Some(1 << 30));
        assert!(!format!("{:?}", c.catalogue).contains("pw"), "never the password");
        // A size that is none is refused with its line too, as the file is read.
        std::fs::write(&p, "data = \"d\"\n\n[cache]\nmemory = \"lots\"\n").unwrap();
        let e = read_file(&p).unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("\"lots\" is not a number of bytes"), "{e}");
    }
}
