//! Errors of reading and writing image files.
//!
//! Every variant names the file (or `<memory>` when bytes were decoded without a name) and, where
//! it applies, the format, so that a CLI can print the error as it is and exit non-zero.

use thiserror::Error;

use crate::format::Format;

/// Why an image could not be read or written.
#[derive(Debug, Error)]
pub enum ImageIoError {
    /// The data is not a valid file of its format.
    #[error("{file}: corrupt {format} data: {reason}")]
    Corrupt { file: String, format: Format, reason: String },
    /// The data ends before the format says it should.
    #[error("{file}: truncated {format} data: {reason}")]
    Truncated { file: String, format: Format, reason: String },
    /// Not a format this crate reads (or writes).
    #[error("{file}: unsupported format: {reason}")]
    UnsupportedFormat { file: String, reason: String },
    /// A file of a supported format using a feature this crate cannot decode (DICOM PALETTE
    /// COLOR, 32-bit samples, a TIFF compression, ...), or pixels a format cannot store when
    /// writing (16-bit JPEG, RGBA PGM, ...).
    #[error("{file}: {format}: unsupported: {reason}")]
    Unsupported { file: String, format: Format, reason: String },
    /// A DICOM file whose transfer syntax this crate cannot decode.
    #[error("{file}: DICOM: unsupported: transfer syntax {name} ({uid})")]
    UnsupportedTransferSyntax { file: String, uid: String, name: String },
    /// The image has more pixels than [`Limits::max_pixels`](crate::Limits::max_pixels).
    #[error("{file}: image of {width}×{height} pixels exceeds the limit of {limit} pixels")]
    TooLarge { file: String, width: u64, height: u64, limit: u64 },
    /// The input, or a buffer it asks for, is larger than
    /// [`Limits::max_bytes`](crate::Limits::max_bytes), or it has more frames than
    /// [`Limits::max_frames`](crate::Limits::max_frames) (`unit`: what the limit counts).
    #[error("{file}: {what} exceeds the limit of {limit} {unit}")]
    TooManyBytes { file: String, what: String, limit: u64, unit: &'static str },
    /// Reading or writing the file failed.
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// Placeholder file name for errors built before the caller's name is attached.
pub(crate) const NO_FILE: &str = "<memory>";

impl ImageIoError {
    /// The file (or `<memory>`) the error is about.
    pub fn file(&self) -> &str {
        match self {
            Self::Corrupt { file, .. }
            | Self::Truncated { file, .. }
            | Self::UnsupportedFormat { file, .. }
            | Self::Unsupported { file, .. }
            | Self::UnsupportedTransferSyntax { file, .. }
            | Self::TooLarge { file, .. }
            | Self::TooManyBytes { file, .. }
            | Self::Io { file, .. } => file,
        }
    }

    /// The same error, naming `name` as its file.
    pub(crate) fn with_file(mut self, name: &str) -> Self {
        match &mut self {
            Self::Corrupt { file, .. }
            | Self::Truncated { file, .. }
            | Self::UnsupportedFormat { file, .. }
            | Self::Unsupported { file, .. }
            | Self::UnsupportedTransferSyntax { file, .. }
            | Self::TooLarge { file, .. }
            | Self::TooManyBytes { file, .. }
            | Self::Io { file, .. } => *file = name.to_string(),
        }
        self
    }

    pub(crate) fn corrupt(format: Format, reason: impl Into<String>) -> Self {
        Self::Corrupt { file: NO_FILE.into(), format, reason: one_line(reason.into()) }
    }

    pub(crate) fn truncated(format: Format, reason: impl Into<String>) -> Self {
        Self::Truncated { file: NO_FILE.into(), format, reason: one_line(reason.into()) }
    }

    pub(crate) fn unsupported_format(reason: impl Into<String>) -> Self {
        Self::UnsupportedFormat { file: NO_FILE.into(), reason: reason.into() }
    }

    pub(crate) fn unsupported(format: Format, reason: impl Into<String>) -> Self {
        Self::Unsupported { file: NO_FILE.into(), format, reason: one_line(reason.into()) }
    }

    pub(crate) fn too_large(width: u64, height: u64, limit: u64) -> Self {
        Self::TooLarge { file: NO_FILE.into(), width, height, limit }
    }

    pub(crate) fn too_many_bytes(what: impl Into<String>, limit: u64) -> Self {
        Self::TooManyBytes { file: NO_FILE.into(), what: what.into(), limit, unit: "bytes" }
    }

    pub(crate) fn too_many_frames(frames: i64, limit: u64) -> Self {
        let what = format!("{frames} frames");
        Self::TooManyBytes { file: NO_FILE.into(), what, limit, unit: "frames" }
    }
}

/// A decoder's reason as one line of a message: its line breaks — real ones, and the `\n`
/// some decoders' messages carry as text (a debug-printed string) — become spaces.
fn one_line(reason: String) -> String {
    let spaced = reason.replace("\\n", " ").replace(['\n', '\r'], " ");
    spaced.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoders_reason_is_one_line() {
        let e = ImageIoError::corrupt(Format::Jpeg, "I/O errors Not enough bytes\\n")
            .with_file("a.jpg");
        assert_eq!(e.to_string(), "a.jpg: corrupt JPEG data: I/O errors Not enough bytes");
        let e = ImageIoError::truncated(Format::Png, "cut\nshort\r\n");
        assert!(e.to_string().ends_with("cut short"), "{e}");
    }
}
