//! The OpenAPI 3.0 document served at `/api/openapi.json`. Written out here rather than
//! derived, so it reads as the contract; a test checks its paths and methods against the
//! router's route table ([`crate::ROUTES`]) so the two cannot drift apart.

use serde_json::{Value, json};

fn err(desc: &str) -> Value {
    json!({ "description": desc, "content": { "application/json": {
        "schema": { "$ref": "#/components/schemas/Error" } } } })
}

fn ok_json(desc: &str, schema: &str) -> Value {
    json!({ "description": desc, "content": { "application/json": {
        "schema": { "$ref": format!("#/components/schemas/{schema}") } } } })
}

/// One key segment, exactly as the server accepts it: no `/`, `\\` or control character
/// (C0, DEL, C1), and not `.` or `..` (spelled without look-ahead, which not every JSON Schema
/// regex engine has).
const SEGMENT: &str = r"([^/\\\x00-\x1f\x7f-\x9f.][^/\\\x00-\x1f\x7f-\x9f]*|\.[^/\\\x00-\x1f\x7f-\x9f.][^/\\\x00-\x1f\x7f-\x9f]*|\.\.[^/\\\x00-\x1f\x7f-\x9f]+)";

/// A whole key: segments joined by `/`.
fn key_schema() -> Value {
    json!({ "type": "string", "maxLength": 1024, "pattern": format!("^{SEGMENT}(/{SEGMENT})*$") })
}

/// 429: the address has presented too many wrong tokens (docs/http-api.md, Authentication).
fn throttled() -> Value {
    json!({ "description": "Too many wrong tokens from this address: token checks are refused \
            (a correct token too) for Retry-After seconds",
        "headers": { "Retry-After": { "schema": { "type": "integer", "minimum": 1 } } },
        "content": { "application/json": {
            "schema": { "$ref": "#/components/schemas/Error" } } } })
}

/// Every operation that checks a token (those that can answer 401) can also answer 429.
fn with_throttling(mut doc: Value) -> Value {
    let paths = doc["paths"].as_object_mut().expect("paths");
    for ops in paths.values_mut() {
        for op in ops.as_object_mut().expect("operations").values_mut() {
            let responses = op["responses"].as_object_mut().expect("responses");
            if responses.contains_key("401") {
                responses.insert("429".into(), throttled());
            }
        }
    }
    doc
}

/// A folder prefix: empty, or segments each followed by `/`.
fn prefix_schema() -> Value {
    json!({ "type": "string", "maxLength": 1025, "pattern": format!("^({SEGMENT}/)*$") })
}

fn dataset_param() -> Value {
    json!({ "name": "dataset", "in": "path", "required": true, "description": "Block-store data set",
        "schema": { "type": "string", "maxLength": 128, "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]*$" } })
}

fn path_param(name: &str, desc: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": desc,
        "schema": { "type": "string", "maxLength": 64 } })
}

/// The `If-Match` header parameter of a write, doing `what`.
fn if_match(what: &str) -> Value {
    json!({ "name": "If-Match", "in": "header", "required": false, "description": what,
        "schema": { "type": "string", "pattern": "^(\\*|(W/)?\"[^\"]*\"(, *(W/)?\"[^\"]*\")*)$" } })
}

fn key_param() -> Value {
    json!({ "name": "key", "in": "path", "required": true,
        "description": "Blob key. In a real URL, keys with folders are written with literal \
            '/' between percent-encoded segments (a/b%20c.png); an encoded '/' (%2F) is refused. \
            OpenAPI path parameters cannot contain '/', so this document describes one segment.",
        "schema": { "type": "string", "maxLength": 1024, "pattern": format!("^{SEGMENT}$") } })
}

fn q(name: &str, schema: Value, desc: &str) -> Value {
    json!({ "name": name, "in": "query", "required": false, "schema": schema, "description": desc })
}

/// The image search criteria (as `/api/search` and `/api/studies` take them), then `more`.
fn criteria_params<const N: usize>(more: [Value; N]) -> Value {
    let mut v = vec![
        q("q", json!({ "type": "string" }), "Free text over the key and every metadata value"),
        q("patient", json!({ "type": "string" }), "Patient name or ID (substring)"),
        q("modality", json!({ "type": "string" }), "Modality, e.g. CT"),
        q(
            "date_from",
            json!({ "type": "string", "pattern": "^([0-9]{8})?$" }),
            "Study date from, YYYYMMDD",
        ),
        q(
            "date_to",
            json!({ "type": "string", "pattern": "^([0-9]{8})?$" }),
            "Study date to, YYYYMMDD",
        ),
    ];
    v.extend(more);
    Value::Array(v)
}

/// Errors any key-addressed request can get.
fn key_errors(mut responses: Value) -> Value {
    let m = responses.as_object_mut().expect("object");
    m.insert("400".into(), err("Invalid key or request"));
    m.insert("401".into(), err("Authentication required"));
    m.insert("404".into(), err("No such blob"));
    m.insert("409".into(), err("Another upload is writing this key right now; retry"));
    m.insert("503".into(), err("Too many uploads in progress; retry"));
    responses
}

fn image_errors(responses: Value) -> Value {
    let mut r = key_errors(responses);
    let m = r.as_object_mut().expect("object");
    m.insert("413".into(), err("Image over the size or pixel limit"));
    m.insert("422".into(), err("Not a readable image, or corrupt"));
    r
}

/// The document.
pub fn document() -> Value {
    let mut doc = contract();
    let paths = doc["paths"].as_object_mut().expect("paths");
    paths.extend(dicomweb_paths());
    with_throttling(doc)
}

/// DICOMweb (docs/dicomweb.md): QIDO-RS, WADO-RS, STOW-RS and WADO-URI, the standard's own
/// media types; each answers 401 without a token where one is required, and the errors as
/// the rest of the API does.
fn dicomweb_paths() -> serde_json::Map<String, Value> {
    let uid = |name: &str, what: &str| path_param(name, &format!("{what} UID (digits and dots)"));
    let (study, series, instance) = (
        uid("study", "Study Instance"),
        uid("series", "Series Instance"),
        uid("instance", "SOP Instance"),
    );
    let errors = |mut r: Value, extra: &[(&str, &str)]| {
        let m = r.as_object_mut().expect("object");
        m.insert("400".into(), err("A malformed UID, parameter or body"));
        m.insert("401".into(), err("Authentication required"));
        for (code, what) in extra {
            m.insert((*code).into(), err(what));
        }
        r
    };
    let media = |desc: &str, kind: &str| json!({ "description": desc, "content": { kind: { "schema": {} } } });
    // PS3.18 8.3.3.1: the query may stand for the Accept and Accept-Charset headers.
    let heads = |params: Value| {
        let mut list = params.as_array().cloned().unwrap_or_default();
        list.push(q(
            "accept",
            json!({ "type": "string" }),
            "In place of the Accept header (replaces it; a + sent unencoded is read as one)",
        ));
        list.push(q(
            "charset",
            json!({ "type": "string" }),
            "In place of Accept-Charset: answers are UTF-8 (406 if it is refused)",
        ));
        Value::Array(list)
    };
    let search = |summary: &str, params: Value| {
        let params = heads(params);
        json!({ "get": { "summary": summary, "parameters": params,
            "description": "Matching attributes (00100010=…, PatientName=…), limit, offset, \
                includefield, fuzzymatching: see docs/dicomweb.md; an unknown key is 400.",
            "responses": errors(json!({
                "200": media("Matches as DICOM JSON (an empty array: none)",
                    "application/dicom+json") }),
                &[("406", "The Accept header takes no application/dicom+json")]) } })
    };
    let retrieve = |summary: &str, params: Value| {
        let params = heads(params);
        json!({ "get": { "summary": summary, "parameters": params,
            "responses": errors(json!({
                "200": media("The instances as stored", "multipart/related") }),
                &[("404", "No such study, series or instance"),
                  ("406", "The Accept header takes only another transfer syntax")]) } })
    };
    let metadata = |params: Value| {
        let params = heads(params);
        json!({ "get": { "summary": "The instances' attributes (no bulk data)",
            "parameters": params,
            "responses": errors(json!({
                "200": media("DICOM JSON", "application/dicom+json") }),
                &[("404", "No such study, series or instance"),
                  ("406", "The Accept header takes no application/dicom+json")]) } })
    };
    let store = |summary: &str, params: Value| {
        json!({ "summary": summary, "parameters": params,
            "requestBody": { "required": true, "content": { "multipart/related": {
                "schema": { "type": "string", "format": "binary" } } } },
            "responses": errors(json!({
                "200": media("Every part stored (PS3.18 store response)", "application/dicom+json"),
                "202": media(
                    "Some parts stored, the others refused, each said",
                    "application/dicom+json") }),
                &[("409", "No part could be stored"),
                  ("415", "Not multipart/related; type=application/dicom")]) })
    };
    let mut m = serde_json::Map::new();
    let mut put = |path: &str, v: Value| {
        m.insert(path.to_string(), v);
    };
    const STUDY: &str = "/dicomweb/studies/{study}";
    const SERIES: &str = "/dicomweb/studies/{study}/series/{series}";
    const INSTANCE: &str = "/dicomweb/studies/{study}/series/{series}/instances/{instance}";
    let mut studies = search("QIDO-RS: search for studies", json!([]));
    studies["post"] = store("STOW-RS: store instances", json!([]));
    put("/dicomweb/studies", studies);
    let mut one = retrieve("WADO-RS: a study's instances", json!([study]));
    one["post"] = store("STOW-RS: store instances of this study", json!([study]));
    put(STUDY, one);
    put(&format!("{STUDY}/metadata"), metadata(json!([study])));
    put(&format!("{STUDY}/series"), search("QIDO-RS: a study's series", json!([study])));
    put(SERIES, retrieve("WADO-RS: a series' instances", json!([study, series])));
    put(&format!("{SERIES}/metadata"), metadata(json!([study, series])));
    put(
        &format!("{SERIES}/instances"),
        search("QIDO-RS: a series' instances", json!([study, series])),
    );
    put(INSTANCE, retrieve("WADO-RS: one instance", json!([study, series, instance])));
    put(&format!("{INSTANCE}/metadata"), metadata(json!([study, series, instance])));
    let frames = json!({ "name": "frames", "in": "path", "required": true,
        "description": "Frame numbers from 1, comma-separated",
        "schema": { "type": "string", "pattern": "^[0-9]+(,[0-9]+)*$" } });
    put(
        &format!("{INSTANCE}/frames/{{frames}}"),
        json!({ "get": { "summary": "WADO-RS: frames, decoded to native samples",
            "parameters": heads(json!([study, series, instance, frames])),
            "responses": errors(json!({
                "200": media("multipart/related; type=application/octet-stream, a part per frame",
                    "multipart/related") }),
                &[("404", "No such instance or frame"),
                  ("406", "The Accept header takes only other forms (compressed frames)"),
                  ("422", "Pixel data that cannot be decoded")]) } }),
    );
    put(
        &format!("{INSTANCE}/rendered"),
        json!({ "get": { "summary": "WADO-RS: the instance for display (PNG or JPEG; a document \
                as itself, a structured report as text)",
            "parameters": heads(json!([study, series, instance])),
            "responses": errors(json!({
                "200": { "description": "The rendering", "content": {
                    "image/png": {}, "image/jpeg": {}, "application/pdf": {},
                    "text/plain": {} } } }),
                &[("404", "No such instance"),
                  ("406", "The Accept header takes none of the forms it comes in"),
                  ("422", "Pixel data that cannot be decoded")]) } }),
    );
    let wado_q = |name: &str, desc: &str| q(name, json!({ "type": "string" }), desc);
    put(
        "/dicomweb/wado",
        json!({ "get": { "summary": "WADO-URI: one instance, as stored or rendered",
            "parameters": [
                wado_q("requestType", "WADO"), wado_q("studyUID", "Study Instance UID"),
                wado_q("seriesUID", "Series Instance UID"), wado_q("objectUID", "SOP Instance UID"),
                wado_q("contentType", "application/dicom (default), image/jpeg or image/png"),
                wado_q("transferSyntax", "With application/dicom: the stored one, or *"),
                wado_q("frameNumber", "With an image type: the frame, from 1")],
            "responses": errors(json!({
                "200": { "description": "The file or its rendering", "content": {
                    "application/dicom": {}, "image/jpeg": {}, "image/png": {} } } }),
                &[("404", "No such instance or frame"),
                  ("406", "Another transfer syntax than the stored one")]) } }),
    );
    m
}

fn contract() -> Value {
    let blob_get = |head: bool| {
        // No body schema: a blob is whatever bytes were stored, under whatever media type.
        let mut ok = json!({ "description": "The blob's bytes",
            "headers": {
                "ETag": { "schema": { "type": "string" } },
                "Accept-Ranges": { "schema": { "type": "string" } } },
            "content": { "*/*": {} } });
        let mut partial = json!({ "description": "One range of the blob",
            "headers": { "Content-Range": { "schema": { "type": "string" } } },
            "content": { "*/*": {} } });
        if head {
            ok.as_object_mut().unwrap().remove("content");
            partial.as_object_mut().unwrap().remove("content");
        }
        let mut r = key_errors(json!({
            "200": ok, "206": partial,
            "304": { "description": "Not modified (If-None-Match)" },
            "416": err("Range not satisfiable") }));
        if head {
            for v in r.as_object_mut().unwrap().values_mut() {
                v.as_object_mut().unwrap().remove("content");
            }
        }
        json!({
            "summary": if head { "Headers of a blob" } else { "Download a blob (Range, ETag)" },
            "parameters": [key_param(),
                { "name": "Range", "in": "header", "required": false, "schema": { "type": "string" } },
                { "name": "If-None-Match", "in": "header", "required": false, "schema": { "type": "string" } }],
            "responses": r,
        })
    };
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "blobstream HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Blob store, image metadata search, filters and thumbnails. See docs/http-api.md."
        },
        "paths": {
            "/blobs/{key}": {
                "get": blob_get(false),
                "head": blob_get(true),
                "put": {
                    "summary": "Upload a blob (streamed; replaces unless If-None-Match: *)",
                    "description": "Headers X-Blobstream-Meta-<key>: <value> (UTF-8, 8 KiB in all) set the blob's user metadata, as `blobstream put --meta key=value` does; images are then found by it and show it.",
                    "parameters": [key_param(),
                        { "name": "If-None-Match", "in": "header", "required": false,
                          "description": "* (create only) or a list of quoted ETags not to replace",
                          "schema": { "type": "string", "pattern": "^(\\*|(W/)?\"[^\"]*\"(, *(W/)?\"[^\"]*\")*)$" } },
                        if_match("replace only an existing blob, or one with a listed ETag")],
                    "requestBody": { "required": false, "content": {
                        "*/*": { "schema": { "type": "string", "format": "binary" } } } },
                    "responses": key_errors(json!({
                        "201": ok_json("Stored", "BlobInfo"),
                        "412": err("If-None-Match or If-Match failed"),
                        "413": err("Over the upload limit"),
                        "415": err("Multipart body; use POST /blobs"),
                        "507": err("Store full") })),
                },
                "delete": {
                    "summary": "Delete a blob",
                    "parameters": [key_param(),
                        if_match("delete only a blob with a listed ETag (* any blob)"),
                        json!({ "name": "If-None-Match", "in": "header", "required": false,
                            "schema": { "type": "string" },
                            "description": "refuse (412) to delete a blob with a listed ETag (* any blob)" })],
                    "responses": key_errors(json!({ "204": { "description": "Deleted" },
                        "412": err("If-Match or If-None-Match failed") })),
                },
            },
            "/blobs": {
                "post": {
                    "summary": "Upload files from a multipart form",
                    "description": "Query parameters other than prefix are refused (400). Form \
                        fields are text: a key field is the key it spells (the text null names \
                        a blob null, like any valid key); without one, a file is stored as \
                        prefix + its file name.",
                    "parameters": [q("prefix", prefix_schema(), "Folder to store into: empty or ending with '/'")],
                    "requestBody": { "required": true, "content": { "multipart/form-data": { "schema": {
                        "type": "object",
                        // A form holds one or more files, and may repeat `key` (the last
                        // one before a file applies), so it is a string or a list of them.
                        "properties": {
                            "file": { "type": "array", "minItems": 1,
                                "items": { "type": "string", "format": "binary" } },
                            "key": { "anyOf": [key_schema(), { "type": "array", "items": key_schema() }] } },
                        "additionalProperties": false,
                        "required": ["file"] } } } },
                    "responses": {
                        "201": ok_json("Stored", "Stored"),
                        "400": err("Bad form, key, prefix, file name or query parameter"),
                        "401": err("Authentication required"),
                        "413": err("Over the upload limit"),
                        "415": err("Not multipart/form-data"),
                        "409": err("Another upload is writing this key right now"),
                        "503": err("Too many uploads in progress"),
                        "507": err("Store full") },
                },
            },
            "/api/list": { "get": {
                "summary": "One folder level: sub-folders and blobs",
                "parameters": [
                    q("prefix", prefix_schema(), "Folder: empty or ending with '/'"),
                    q("after", json!({ "type": "string" }), "Resume after this cursor (next_after)"),
                    q("limit", json!({ "type": "integer", "minimum": 1, "maximum": 2000 }), "Page size")],
                "responses": { "200": ok_json("Listing", "Listing"),
                    "400": err("Bad prefix or limit"), "401": err("Authentication required") },
            } },
            "/api/search": { "get": {
                "summary": "Search image metadata",
                "parameters": criteria_params([
                    q("prefix", prefix_schema(), "Folder"),
                    q("limit", json!({ "type": "integer", "minimum": 1, "maximum": 2000 }), "Most results"),
                    q("after", json!({ "type": "string" }), "Resume after this cursor (next_after)")]),
                "responses": { "200": ok_json("Matches", "SearchResults"),
                    "400": err("Bad criteria"), "401": err("Authentication required") },
            } },
            "/api/studies": { "get": {
                "summary": "The worklist: DICOM studies with at least one image matching the criteria",
                "parameters": criteria_params([
                    q("sort", json!({ "type": "string",
                        "enum": ["date", "patient", "id", "accession", "modality", "description", "series", "images"] }),
                        "Column to sort by (default date)"),
                    q("order", json!({ "type": "string", "enum": ["asc", "desc"] }), "Default: desc for date, else asc"),
                    q("offset", json!({ "type": "integer", "minimum": 0 }), "Studies to skip"),
                    q("limit", json!({ "type": "integer", "minimum": 1, "maximum": 1000 }), "Page size (default 50)")]),
                "responses": { "200": ok_json("A page of studies", "StudyList"),
                    "400": err("Bad criteria"), "401": err("Authentication required") },
            } },
            "/api/studies/{study}/series": { "get": {
                "summary": "The series of a study",
                "parameters": [{ "name": "study", "in": "path", "required": true,
                    "schema": { "type": "string", "minLength": 1 }, "description": "Study Instance UID" }],
                "responses": { "200": ok_json("Series", "SeriesList"),
                    "401": err("Authentication required"), "404": err("No such study") },
            } },
            "/api/series/{series}/instances": { "get": {
                "summary": "The images of a series in slice order",
                "parameters": [{ "name": "series", "in": "path", "required": true,
                    "schema": { "type": "string", "minLength": 1 }, "description": "Series Instance UID" }],
                "responses": { "200": ok_json("Instances", "InstanceList"),
                    "401": err("Authentication required"), "404": err("No such series") },
            } },
            "/api/filters": { "get": {
                "summary": "Filters and their parameters",
                "responses": { "200": ok_json("Filters", "FilterList"), "401": err("Authentication required") },
            } },
            "/api/filter": { "post": {
                "summary": "Apply filters to a stored image; return the result or store it",
                "requestBody": { "required": true, "content": { "application/json": {
                    "schema": { "$ref": "#/components/schemas/FilterRequest" } } } },
                "responses": {
                    "200": { "description": "The filtered image",
                        "headers": {
                            "X-Filter-Ms": { "schema": { "type": "string" } },
                            "X-Filter-Steps": { "schema": { "type": "string" } },
                            "X-Filter-Output": { "description": "what the result's samples are: values (the input's, in its units), scale (the input's scale, not its meaning: invert), grey-levels (for display on their own full scale: window, edge, emboss)",
                                "schema": { "type": "string", "enum": ["values", "scale", "grey-levels"] } },
                            "X-Width": { "description": "format raw only", "schema": { "type": "integer" } },
                            "X-Height": { "description": "format raw only", "schema": { "type": "integer" } },
                            "X-Channels": { "description": "format raw only", "schema": { "type": "integer" } },
                            "X-Bits": { "description": "format raw only", "schema": { "type": "integer" } } },
                        "content": {
                            "image/png": { "schema": { "type": "string", "format": "binary" } },
                            "image/jpeg": { "schema": { "type": "string", "format": "binary" } },
                            "image/tiff": { "schema": { "type": "string", "format": "binary" } },
                            "image/gif": { "schema": { "type": "string", "format": "binary" } },
                            "image/x-portable-anymap": { "schema": { "type": "string", "format": "binary" } },
                            "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                    "201": ok_json("Stored result", "FilterStored"),
                    "400": err("Bad request"),
                    "401": err("Authentication required"),
                    "404": err("No such blob"),
                    "413": err("Too large"),
                    "415": err("Not application/json"),
                    "422": err("Not an image, unknown filter or bad parameter"),
                    "409": err("Another upload is writing store_as right now"),
                    "503": err("Busy"),
                    "507": err("Store full") },
            } },
            "/api/meta/{key}": { "get": {
                "summary": "Image metadata and display defaults",
                "parameters": [key_param()],
                "responses": image_errors(json!({ "200": ok_json("Metadata", "ImageMetaResponse") })),
            } },
            "/api/pixels/{key}": { "get": {
                "summary": "Decoded samples, little-endian, for client-side window/level",
                "parameters": [key_param(),
                    q("frame", json!({ "type": "integer", "minimum": 0 }), "0-based frame of a multi-frame image (default 0)")],
                "responses": image_errors(json!({ "200": {
                    "description": "Samples; X-Width, X-Height, X-Channels, X-Bits describe them, X-Frames counts the image's frames",
                    "headers": {
                        "X-Frames": { "schema": { "type": "integer" } },
                        "X-Width": { "schema": { "type": "integer" } },
                        "X-Height": { "schema": { "type": "integer" } },
                        "X-Channels": { "schema": { "type": "integer" } },
                        "X-Bits": { "schema": { "type": "integer" } },
                        "ETag": { "schema": { "type": "string" } } },
                    "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } },
                    "304": { "description": "Not modified (If-None-Match names its ETag)" } })),
            } },
            "/api/thumbnail/{key}": { "get": {
                "summary": "PNG thumbnail with the default window",
                "parameters": [key_param(),
                    q("size", json!({ "type": "integer", "minimum": 16, "maximum": 512 }), "Longest side")],
                "responses": image_errors(json!({ "200": { "description": "PNG",
                    "headers": { "ETag": { "schema": { "type": "string" } } },
                    "content": { "image/png": { "schema": { "type": "string", "format": "binary" } } } },
                    "304": { "description": "Not modified (If-None-Match names its ETag)" } })),
            } },
            "/api/session": {
                "get": { "summary": "Whether authentication is required and present",
                    "responses": { "200": ok_json("Session", "Session"), "429": throttled() } },
                "post": { "summary": "Log in with the server's token (sets a session cookie)",
                    "requestBody": { "required": true, "content": { "application/json": { "schema": {
                        "type": "object", "properties": { "token": { "type": "string" } }, "required": ["token"] } } } },
                    "responses": { "204": { "description": "Logged in (or no auth configured)" },
                        "400": err("Bad body"), "401": err("Wrong token"), "413": err("Body too large"),
                        "415": err("Not application/json") } },
                "delete": { "summary": "Log out (ends the session on the server, clears its cookie)",
                    "responses": { "204": { "description": "Logged out" } } },
            },
            "/api/health": { "get": { "summary": "Liveness",
                "responses": { "200": { "description": "OK", "content": { "application/json": { "schema": {
                    "type": "object", "properties": { "status": { "type": "string" } }, "required": ["status"] } } } } } } },
            "/api/openapi.json": { "get": { "summary": "This document",
                "responses": { "200": { "description": "OpenAPI 3.0", "content": { "application/json": { "schema": { "type": "object" } } } } } } },
            "/api/dpss/datasets": { "get": { "summary": "The block store's data sets (serve --dpss-master)",
                "responses": { "200": { "description": "Data sets with their layouts", "content": {
                    "application/json": { "schema": { "type": "object" } } } },
                    "401": err("Authentication required"),
                    "404": err("The block store is not configured"),
                    "503": err("The block store's master cannot be reached") } } },
            "/api/dpss/view/{dataset}": { "post": {
                "summary": "The viewer's viewport: the block servers get a new request list",
                "parameters": [dataset_param()],
                "requestBody": { "required": true, "content": { "application/json": { "schema": {
                    "type": "object", "required": ["level", "x0", "y0", "x1", "y1"],
                    "properties": {
                        "level": { "type": "integer", "minimum": 0, "description": "Pyramid level (0: full resolution)" },
                        "x0": { "type": "integer", "minimum": 0 }, "y0": { "type": "integer", "minimum": 0 },
                        "x1": { "type": "integer", "minimum": 0 }, "y1": { "type": "integer", "minimum": 0 } } } } } },
                "responses": { "200": { "description": "Tiles asked per priority", "content": {
                    "application/json": { "schema": { "type": "object" } } } },
                    "400": err("Bad view or data set name"), "401": err("Authentication required"),
                    "404": err("No such data set, or the block store is not configured"),
                    "413": err("Body too large"),
                    "503": err("The block store cannot be reached") } } },
            "/iiif/{dataset}": { "get": {
                "summary": "The image's IIIF base URI: a redirect to its info.json",
                "parameters": [dataset_param()],
                "responses": { "303": { "description": "See /iiif/{dataset}/info.json" },
                    "400": err("Bad data set name"), "401": err("Authentication required"),
                    "404": err("No such data set, or the block store is not configured"),
                    "503": err("The block store cannot be reached") } } },
            "/iiif/{dataset}/info.json": { "get": {
                "summary": "IIIF Image API 3 (level 0) description of a block-store image",
                "parameters": [dataset_param()],
                "responses": { "200": { "description": "info.json", "content": {
                    "application/ld+json": { "schema": { "type": "object" } } } },
                    "400": err("Bad data set name"), "401": err("Authentication required"),
                    "404": err("No such data set, or the block store is not configured"),
                    "503": err("The block store cannot be reached") } } },
            "/iiif/{dataset}/{region}/{size}/{rotation}/{file}": { "get": {
                "summary": "One tile of the pyramid (IIIF Image API 3, level 0)",
                "parameters": [dataset_param(),
                    path_param("region", "full, or x,y,w,h in full-resolution pixels"),
                    path_param("size", "max, w, ,h or w,h"),
                    path_param("rotation", "0"),
                    path_param("file", "default.png (default.jpg for JPEG tiles)")],
                "responses": { "200": { "description": "The tile", "content": {
                    "image/png": { "schema": { "type": "string", "format": "binary" } },
                    "image/jpeg": { "schema": { "type": "string", "format": "binary" } } } },
                    "400": err("Not one of the pyramid's tiles"), "401": err("Authentication required"),
                    "404": err("No such data set, or the block store is not configured"),
                    "503": err("No copy of the tile could be delivered, or the block store cannot be reached") } } },
            "/metrics": { "get": { "summary": "Prometheus metrics",
                "responses": { "200": { "description": "OpenMetrics text", "content": {
                    "application/openmetrics-text": { "schema": { "type": "string" } } } },
                    "401": err("Authentication required") } } },
        },
        "components": { "schemas": schemas(), "securitySchemes": {
            "bearer": { "type": "http", "scheme": "bearer",
                "description": "The server's token, when it requires one (serve \
                    --auth-token-file); a browser logs in with POST /api/session instead" } } },
        "security": [ { "bearer": [] }, {} ],
    })
}

fn with_nullable(mut v: Value) -> Value {
    v["nullable"] = Value::Bool(true);
    v
}

fn schemas() -> Value {
    json!({
        "Error": { "type": "object", "required": ["error"], "properties": { "error": {
            "type": "object", "required": ["code", "message"],
            "properties": { "code": { "type": "string" }, "message": { "type": "string" } } } } },
        "BlobInfo": { "type": "object",
            "required": ["key", "size", "content_type", "digest", "created_ms", "is_image"],
            "properties": {
                "key": { "type": "string" }, "size": { "type": "integer", "minimum": 0 },
                "content_type": { "type": "string" }, "digest": { "type": "string" },
                "created_ms": { "type": "integer" }, "is_image": { "type": "boolean" },
                "metadata": { "type": "object", "additionalProperties": { "type": "string" } },
                "image": { "type": "object" },
                "corrupt": { "type": "string", "description": "why the blob is marked corrupt (listings)" } } },
        "Stored": { "type": "object", "required": ["stored"], "properties": {
            "stored": { "type": "array", "items": { "$ref": "#/components/schemas/BlobInfo" } } } },
        "Listing": { "type": "object", "required": ["prefix", "folders", "items", "next_after"],
            "properties": {
                "prefix": { "type": "string" },
                "folders": { "type": "array", "items": { "type": "object", "required": ["prefix", "name"],
                    "properties": { "prefix": { "type": "string" }, "name": { "type": "string" } } } },
                "items": { "type": "array", "items": { "$ref": "#/components/schemas/BlobInfo" } },
                "next_after": { "type": "string", "nullable": true } } },
        "StudyList": { "type": "object", "required": ["total", "offset", "sort", "order", "studies"], "properties": {
            "total": { "type": "integer" }, "offset": { "type": "integer" },
            "sort": { "type": "string" }, "order": { "type": "string" },
            "studies": { "type": "array", "items": { "type": "object",
                "required": ["study_uid", "patient_name", "patient_id", "study_date", "modalities", "series", "images"],
                "properties": {
                    "study_uid": { "type": "string" }, "patient_name": { "type": "string" },
                    "patient_id": { "type": "string" }, "patient_birth_date": { "type": "string" },
                    "patient_sex": { "type": "string" }, "study_date": { "type": "string" },
                    "study_time": { "type": "string" }, "accession_number": { "type": "string" },
                    "study_description": { "type": "string" },
                    "modalities": { "type": "array", "items": { "type": "string" } },
                    "series": { "type": "integer" }, "images": { "type": "integer" } } } } } },
        "SeriesList": { "type": "object", "required": ["study_uid", "series"], "properties": {
            "study_uid": { "type": "string" },
            "series": { "type": "array", "items": { "type": "object",
                "required": ["series_uid", "images"],
                "properties": {
                    "series_uid": { "type": "string" }, "series_number": { "type": "string" },
                    "series_description": { "type": "string" }, "modality": { "type": "string" },
                    "body_part_examined": { "type": "string" }, "images": { "type": "integer" } } } } } },
        "InstanceList": { "type": "object", "required": ["series_uid", "instances"], "properties": {
            "series_uid": { "type": "string" },
            "instances": { "type": "array", "items": { "type": "object", "required": ["key", "frames"],
                "properties": {
                    "key": { "type": "string" },
                    "instance_number": { "type": "integer", "nullable": true },
                    "slice_location": { "type": "number", "nullable": true },
                    "image_position_patient": { "type": "array", "nullable": true, "items": { "type": "number" } },
                    "frames": { "type": "integer" } } } } } },
        "SearchResults": { "type": "object", "required": ["results", "next_after"], "properties": {
            "results": { "type": "array", "items": { "$ref": "#/components/schemas/BlobInfo" } },
            "next_after": with_nullable(json!({ "type": "string" })) } },
        "FilterList": { "type": "object", "required": ["filters"], "properties": { "filters": {
            "type": "array", "items": { "type": "object", "required": ["name", "summary", "kind", "params"],
                "properties": {
                    "name": { "type": "string" }, "summary": { "type": "string" }, "kind": { "type": "string" },
                    "params": { "type": "array", "items": { "type": "object",
                        "required": ["name", "default", "help"],
                        "properties": {
                            "name": { "type": "string" }, "default": { "type": "string" },
                            "min": { "type": "number", "nullable": true }, "max": { "type": "number", "nullable": true },
                            "help": { "type": "string" } } } } } } } } },
        "FilterRequest": { "type": "object", "required": ["key", "steps"], "additionalProperties": false,
            "example": { "key": "samples/test-card.png", "steps": [{ "filter": "blur", "params": { "size": 3 } }], "format": "png" },
            "properties": {
                "key": key_schema(),
                "frame": { "type": "integer", "minimum": 0, "nullable": true, "description": "0-based frame of a multi-frame image (default 0; null is the default)" },
                "steps": { "type": "array", "minItems": 1, "maxItems": 16, "items": {
                    "type": "object", "required": ["filter"], "additionalProperties": false,
                    "properties": { "filter": { "type": "string" },
                        "params": { "type": "object", "additionalProperties": {
                            "oneOf": [{ "type": "string" }, { "type": "number" }, { "type": "boolean" }] } } } } },
                "format": { "type": "string", "nullable": true, "enum": ["raw", "png", "tiff", "jpeg", "gif", "pgm", null] },
                "store_as": with_nullable(key_schema()) } },
        "FilterStored": { "type": "object", "required": ["key", "filter_ms", "steps", "blob"],
            "properties": {
                "key": { "type": "string" }, "filter_ms": { "type": "number" },
                "steps": { "type": "array", "items": { "type": "object", "required": ["filter", "ms"],
                    "properties": { "filter": { "type": "string" }, "ms": { "type": "number" } } } },
                "blob": { "$ref": "#/components/schemas/BlobInfo" } } },
        "ImageMetaResponse": { "type": "object", "required": ["blob", "image", "display"],
            "properties": {
                "blob": { "$ref": "#/components/schemas/BlobInfo" },
                "image": { "type": "object", "required": ["width", "height", "pixel_kind", "format"],
                    "properties": { "width": { "type": "integer" }, "height": { "type": "integer" },
                        "pixel_kind": { "type": "string" }, "format": { "type": "string" } } },
                "display": { "type": "object",
                    "required": ["center", "width", "min", "max", "offset", "inverted", "unit"],
                    "properties": {
                        "center": { "type": "number" }, "width": { "type": "number" },
                        "min": { "type": "number" }, "max": { "type": "number" },
                        "offset": { "type": "number" }, "inverted": { "type": "boolean" },
                        "unit": { "type": "string" } } } } },
        "Session": { "type": "object", "required": ["auth_required", "authenticated"], "properties": {
            "auth_required": { "type": "boolean" }, "authenticated": { "type": "boolean" } } },
    })
}
