//! Media types guessed from a blob's or file's name, for blobs stored without one: what
//! medical and media tools expect to see (DICOM, the image formats, video, text).

/// The media type for `name`'s extension (`application/octet-stream` when unknown).
pub fn guess_content_type(name: &str) -> &'static str {
    name.rsplit_once('.')
        .map_or("application/octet-stream", |(_, ext)| content_type_of_extension(ext))
}

/// The media type for an extension without its dot, in any case.
pub fn content_type_of_extension(ext: &str) -> &'static str {
    match ext.to_ascii_lowercase().as_str() {
        "dcm" | "dicom" => "application/dicom",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "tif" | "tiff" => "image/tiff",
        "gif" => "image/gif",
        "pgm" | "ppm" | "pnm" => "image/x-portable-anymap",
        "mp4" => "video/mp4",
        "json" => "application/json",
        "txt" | "log" | "md" | "csv" => "text/plain; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_extension_in_any_case() {
        assert_eq!(guess_content_type("a/scan.DCM"), "application/dicom");
        assert_eq!(guess_content_type("x.tar.gz"), "application/octet-stream");
        assert_eq!(guess_content_type("no-extension"), "application/octet-stream");
        assert_eq!(guess_content_type("dir.png/file"), "application/octet-stream");
        assert_eq!(guess_content_type("notes.txt"), "text/plain; charset=utf-8");
        assert_eq!(content_type_of_extension("TIF"), "image/tiff");
    }
}
