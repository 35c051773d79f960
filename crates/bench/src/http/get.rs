//! A minimal HTTP/1.1 GET over `std::net`, enough to check what a server sends (status,
//! Content-Length, every byte) and to time plain downloads: one request per connection,
//! bodies framed by Content-Length, chunked encoding or the end of the connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::error::BenchError;

/// Longest wait for a byte from the server.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest header section accepted.
const MAX_HEAD: usize = 64 << 10;

/// A response, body read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Header names lower-cased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// From connecting to the last byte of the body.
    pub elapsed: Duration,
}

impl Response {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Content-Length, when sent and a number.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.trim().parse().ok()
    }
}

/// `GET path` from the server at `addr` on a new connection (`Connection: close`).
pub fn get(addr: SocketAddr, path: &str) -> Result<Response, BenchError> {
    request(addr, "GET", path, &[("Accept", "*/*")], &[])
}

/// `method path` with `headers` and `body` (sent with its Content-Length when not empty) on a
/// new connection (`Connection: close`).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, BenchError> {
    let fail = |detail: String| BenchError::Http(format!("{method} http://{addr}{path}: {detail}"));
    let start = Instant::now();
    let mut tcp = TcpStream::connect(addr).map_err(|e| fail(format!("connecting: {e}")))?;
    tcp.set_read_timeout(Some(READ_TIMEOUT)).map_err(|e| fail(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: blobstream-bench\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("Connection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).map_err(|e| fail(format!("sending the request: {e}")))?;
    tcp.write_all(body).map_err(|e| fail(format!("sending the body: {e}")))?;
    let mut r = BufReader::with_capacity(256 << 10, tcp);
    let (status, headers) = read_head(&mut r).map_err(fail)?;
    let mut resp = Response { status, headers, body: Vec::new(), elapsed: Duration::ZERO };
    let chunked = resp
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().split(',').any(|t| t.trim() == "chunked"));
    resp.body = if chunked {
        read_chunked(&mut r).map_err(fail)?
    } else if let Some(len) = resp.content_length() {
        let mut body = vec![0u8; len as usize];
        r.read_exact(&mut body).map_err(|e| fail(format!("reading {len} body bytes: {e}")))?;
        body
    } else {
        let mut body = Vec::new();
        r.read_to_end(&mut body).map_err(|e| fail(format!("reading the body: {e}")))?;
        body
    };
    resp.elapsed = start.elapsed();
    Ok(resp)
}

/// One CRLF- (or LF-) terminated line without its terminator.
fn read_line(r: &mut impl BufRead, what: &str) -> Result<String, String> {
    let mut line = String::new();
    let n = r.read_line(&mut line).map_err(|e| format!("reading the {what}: {e}"))?;
    if n == 0 {
        return Err(format!("connection closed before the {what}"));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Status line and headers.
pub(crate) fn read_head(r: &mut impl BufRead) -> Result<(u16, Vec<(String, String)>), String> {
    let status_line = read_line(r, "status line")?;
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let status = match code.parse::<u16>() {
        Ok(s) if version.starts_with("HTTP/1.") => s,
        _ => return Err(format!("not an HTTP/1.x status line: {status_line:?}")),
    };
    let mut headers = Vec::new();
    let mut total = status_line.len();
    loop {
        let line = read_line(r, "headers")?;
        total += line.len() + 2;
        if total > MAX_HEAD {
            return Err(format!("headers longer than {MAX_HEAD} bytes"));
        }
        if line.is_empty() {
            return Ok((status, headers));
        }
        let (name, value) =
            line.split_once(':').ok_or_else(|| format!("malformed header line {line:?}"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
}

/// A `Transfer-Encoding: chunked` body.
fn read_chunked(r: &mut impl BufRead) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r, "chunk size")?;
        let hex = line.split(';').next().unwrap_or_default().trim();
        let len = usize::from_str_radix(hex, 16)
            .map_err(|_| format!("malformed chunk size line {line:?}"))?;
        if len == 0 {
            // Trailers, then the empty line.
            while !read_line(r, "trailers")?.is_empty() {}
            return Ok(body);
        }
        let at = body.len();
        body.resize(at + len, 0);
        r.read_exact(&mut body[at..]).map_err(|e| format!("reading a chunk: {e}"))?;
        if !read_line(r, "chunk end")?.is_empty() {
            return Err("chunk not followed by CRLF".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::{Ipv4Addr, TcpListener};
    use std::thread;

    /// A one-shot server answering the first request with `response`.
    fn serve_once(response: &'static [u8]) -> (SocketAddr, thread::JoinHandle<String>) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s);
            let mut request = String::new();
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                request.push_str(&line);
                if line == "\r\n" {
                    break;
                }
            }
            r.get_mut().write_all(response).unwrap();
            request
        });
        (addr, t)
    }

    #[test]
    fn reads_content_length_bodies_and_sends_a_plain_request() {
        let (addr, t) = serve_once(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 5\r\n\r\nhello",
        );
        let r = get(addr, "/blobs/a/b.bin").unwrap();
        assert_eq!(
            (r.status, r.body.as_slice(), r.content_length()),
            (200, &b"hello"[..], Some(5))
        );
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
        let request = t.join().unwrap();
        assert!(request.starts_with("GET /blobs/a/b.bin HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("Connection: close\r\n"), "{request}");
    }

    #[test]
    fn reads_chunked_and_close_delimited_bodies() {
        let (addr, _) = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        );
        assert_eq!(get(addr, "/").unwrap().body, b"abcde");
        let (addr, _) = serve_once(b"HTTP/1.0 404 Not Found\r\n\r\nnope");
        let r = get(addr, "/").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"nope"[..]));
    }

    #[test]
    fn refuses_what_is_not_http() {
        let (addr, _) = serve_once(b"SSH-2.0-OpenSSH\r\n\r\n");
        let e = get(addr, "/").unwrap_err();
        assert!(e.to_string().contains("not an HTTP/1.x status line"), "{e}");
        let (addr, _) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort");
        assert!(get(addr, "/").is_err(), "a body shorter than Content-Length");
    }
}
