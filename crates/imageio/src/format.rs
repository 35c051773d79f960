//! The file formats this crate knows, and how a format is recognised: by the bytes first
//! (magic numbers), by the file name's extension second.

use serde::Serialize;

/// A file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Png,
    Jpeg,
    Tiff,
    Gif,
    /// PGM (P5, grayscale) and PPM (P6, RGB), 8 or 16 bits per sample; PBM and PAM are read too.
    Pnm,
    /// DICOM Part 10 files; read only.
    Dicom,
}

impl Format {
    /// Every format, in a fixed order.
    pub const ALL: [Format; 6] =
        [Format::Png, Format::Jpeg, Format::Tiff, Format::Gif, Format::Pnm, Format::Dicom];

    /// Short upper-case name ("PNG", "DICOM", ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Png => "PNG",
            Self::Jpeg => "JPEG",
            Self::Tiff => "TIFF",
            Self::Gif => "GIF",
            Self::Pnm => "PNM",
            Self::Dicom => "DICOM",
        }
    }

    /// File name extensions (lower case, no dot); the first is the usual one.
    pub fn extensions(self) -> &'static [&'static str] {
        match self {
            Self::Png => &["png"],
            Self::Jpeg => &["jpg", "jpeg", "jpe", "jfif"],
            Self::Tiff => &["tif", "tiff"],
            Self::Gif => &["gif"],
            Self::Pnm => &["pgm", "ppm", "pnm", "pbm", "pam"],
            Self::Dicom => &["dcm", "dicom", "dic"],
        }
    }

    /// Whether [`encode`](crate::encode) can write this format.
    pub fn can_encode(self) -> bool {
        !matches!(self, Self::Dicom)
    }

    /// Whether this format holds 8-bit samples only (a 16-bit image must be windowed for it:
    /// [`to_eight_bits`](crate::to_eight_bits)).
    pub fn eight_bits_only(self) -> bool {
        matches!(self, Self::Jpeg | Self::Gif)
    }

    /// The format for a file name extension (without the dot, any case).
    pub fn from_extension(ext: &str) -> Option<Format> {
        let ext = ext.trim_start_matches('.').to_ascii_lowercase();
        Self::ALL.into_iter().find(|f| f.extensions().contains(&ext.as_str()))
    }

    /// The format for a file name or path by its extension; a bare extension works too.
    pub fn from_name(name: &str) -> Option<Format> {
        let ext = match name.rsplit_once('.') {
            Some((_, ext)) => ext,
            None => name,
        };
        Self::from_extension(ext)
    }

    /// The format recognised from the first bytes of a file, if any.
    pub fn from_magic(bytes: &[u8]) -> Option<Format> {
        if is_dicom(bytes) {
            return Some(Self::Dicom);
        }
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            return Some(Self::Png);
        }
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            return Some(Self::Jpeg);
        }
        if bytes.starts_with(b"II*\0")
            || bytes.starts_with(b"MM\0*")
            || bytes.starts_with(b"II+\0")
            || bytes.starts_with(b"MM\0+")
        {
            return Some(Self::Tiff);
        }
        if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            return Some(Self::Gif);
        }
        if bytes.len() >= 2 && bytes[0] == b'P' && (b'1'..=b'7').contains(&bytes[1]) {
            return Some(Self::Pnm);
        }
        None
    }

    pub(crate) fn to_image_format(self) -> Option<image::ImageFormat> {
        match self {
            Self::Png => Some(image::ImageFormat::Png),
            Self::Jpeg => Some(image::ImageFormat::Jpeg),
            Self::Tiff => Some(image::ImageFormat::Tiff),
            Self::Gif => Some(image::ImageFormat::Gif),
            Self::Pnm => Some(image::ImageFormat::Pnm),
            Self::Dicom => None,
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A DICOM Part 10 file: "DICM" at offset 128 (after the preamble), or at offset 0 when the
/// preamble was left out.
pub(crate) fn is_dicom(bytes: &[u8]) -> bool {
    bytes.get(128..132) == Some(b"DICM") || bytes.starts_with(b"DICM")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_extensions() {
        assert_eq!(Format::from_name("a/b/scan.DCM"), Some(Format::Dicom));
        assert_eq!(Format::from_name("x.jpeg"), Some(Format::Jpeg));
        assert_eq!(Format::from_name("tif"), Some(Format::Tiff));
        assert_eq!(Format::from_name(".pgm"), Some(Format::Pnm));
        assert_eq!(Format::from_name("notes.txt"), None);
        assert_eq!(Format::from_name(""), None);
        for f in Format::ALL {
            assert_eq!(Format::from_extension(f.extensions()[0]), Some(f));
        }
    }

    #[test]
    fn magic() {
        let mut dcm = vec![0u8; 132];
        dcm[128..].copy_from_slice(b"DICM");
        assert_eq!(Format::from_magic(&dcm), Some(Format::Dicom));
        assert_eq!(Format::from_magic(b"DICM\x02\x00"), Some(Format::Dicom));
        assert_eq!(Format::from_magic(b"\x89PNG\r\n\x1a\nrest"), Some(Format::Png));
        assert_eq!(Format::from_magic(b"P5\n1 1\n255\n\0"), Some(Format::Pnm));
        assert_eq!(Format::from_magic(b"GIF89a"), Some(Format::Gif));
        assert_eq!(Format::from_magic(b"II*\0"), Some(Format::Tiff));
        assert_eq!(Format::from_magic(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(Format::Jpeg));
        assert_eq!(Format::from_magic(b""), None);
        assert_eq!(Format::from_magic(b"hello"), None);
    }
}
