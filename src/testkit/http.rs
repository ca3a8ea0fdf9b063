//! [`HttpDir`]: a small HTTP/1.1 server on loopback that serves a directory's files the way
//! object stores' HTTP front ends do: `HEAD` and `GET` with `Range`, `ETag`, `Last-Modified`,
//! `If-Match`, and keep-alive. It is what `https://` tables are tested against (object_store's
//! `HttpStore` reads a single file by `HEAD` and ranged `GET`s).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Serves the files below a directory over HTTP on a loopback port until dropped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("a.txt"), b"hello")?;
/// let server = datafusion_lakecache::testkit::HttpDir::serve(dir.path()).await?;
/// assert!(server.url().starts_with("http://127.0.0.1:"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct HttpDir {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl HttpDir {
    /// Starts serving `root` on a free loopback port, on the current Tokio runtime.
    pub async fn serve(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root: Arc<Path> = root.into().into();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (root, counted) = (Arc::clone(&root), Arc::clone(&counted));
                tokio::spawn(async move {
                    let _ = connection(conn, &root, &counted).await;
                });
            }
        });
        Ok(Self {
            addr,
            requests,
            task,
        })
    }

    /// The server's base URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests served so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Relaxed)
    }
}

impl Drop for HttpDir {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request's line and the headers that matter here.
struct Request {
    method: String,
    path: String,
    range: Option<String>,
    if_match: Option<String>,
}

/// Serves requests on `conn` until the client closes it.
async fn connection(conn: TcpStream, root: &Path, requests: &AtomicU64) -> io::Result<()> {
    let (read, mut write) = conn.into_split();
    let mut read = BufReader::new(read);
    while let Some(request) = read_request(&mut read).await? {
        requests.fetch_add(1, Relaxed);
        respond(&mut write, root, &request).await?;
    }
    Ok(())
}

async fn read_request<R: AsyncBufReadExt + Unpin>(read: &mut R) -> io::Result<Option<Request>> {
    let mut line = String::new();
    if read.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (method, path) = match (parts.next(), parts.next()) {
        (Some(m), Some(p)) => (m.to_string(), p.to_string()),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad request line",
            ));
        }
    };
    let mut request = Request {
        method,
        path,
        range: None,
        if_match: None,
    };
    loop {
        let mut header = String::new();
        if read.read_line(&mut header).await? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = Some(value.trim().to_string());
            match name.trim().to_ascii_lowercase().as_str() {
                "range" => request.range = value,
                "if-match" => request.if_match = value,
                _ => {}
            }
        }
    }
    Ok(Some(request))
}

async fn respond<W: AsyncWriteExt + Unpin>(
    write: &mut W,
    root: &Path,
    request: &Request,
) -> io::Result<()> {
    let relative = request.path.split('?').next().unwrap_or("");
    let relative = relative.trim_start_matches('/');
    let file = root.join(relative);
    let inside = !relative.split('/').any(|p| p == ".." || p.is_empty());
    let meta = match tokio::fs::metadata(&file).await {
        Ok(meta) if inside && meta.is_file() => meta,
        _ => return status(write, "404 Not Found", &[]).await,
    };
    let size = meta.len();
    let modified: chrono::DateTime<chrono::Utc> = meta
        .modified()
        .map(Into::into)
        .unwrap_or_else(|_| chrono::Utc::now());
    let etag = format!(
        "\"{size:x}-{:x}\"",
        modified.timestamp_nanos_opt().unwrap_or(0)
    );
    let last_modified = modified.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    if let Some(wanted) = &request.if_match
        && wanted != "*"
        && wanted != &etag
    {
        return status(write, "412 Precondition Failed", &[("ETag", &etag)]).await;
    }
    let range = match request.range.as_deref().map(|r| parse_range(r, size)) {
        None => None,
        Some(Some(range)) => Some(range),
        Some(None) => {
            let unsatisfied = format!("bytes */{size}");
            return status(
                write,
                "416 Range Not Satisfiable",
                &[("Content-Range", &unsatisfied)],
            )
            .await;
        }
    };
    let (code, start, len) = match range {
        Some((start, end)) => ("206 Partial Content", start, end - start),
        None => ("200 OK", 0, size),
    };
    let mut head = format!(
        "HTTP/1.1 {code}\r\nContent-Length: {len}\r\nETag: {etag}\r\nLast-Modified: {last_modified}\r\nAccept-Ranges: bytes\r\n"
    );
    if range.is_some() {
        head.push_str(&format!(
            "Content-Range: bytes {start}-{}/{size}\r\n",
            start + len - 1
        ));
    }
    head.push_str("\r\n");
    write.write_all(head.as_bytes()).await?;
    if request.method == "GET" {
        let mut f = tokio::fs::File::open(&file).await?;
        f.seek(io::SeekFrom::Start(start)).await?;
        let mut body = Vec::new();
        f.take(len).read_to_end(&mut body).await?;
        write.write_all(&body).await?;
    }
    write.flush().await
}

async fn status<W: AsyncWriteExt + Unpin>(
    write: &mut W,
    code: &str,
    headers: &[(&str, &str)],
) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {code}\r\nContent-Length: 0\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    write.write_all(head.as_bytes()).await?;
    write.flush().await
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` of an object of `size` bytes, as `[start, end)`;
/// `None` if it is not satisfiable.
fn parse_range(header: &str, size: u64) -> Option<(u64, u64)> {
    let spec = header.trim().strip_prefix("bytes=")?;
    let (first, last) = spec.split_once('-')?;
    let (start, end) = match (first.trim(), last.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (size.saturating_sub(n), size)
        }
        (a, "") => (a.parse().ok()?, size),
        (a, b) => {
            let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
            (a, b.checked_add(1)?.min(size))
        }
    };
    (start < end && start < size).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_as_http_says() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 10)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=-8", 100), Some((92, 100)));
        assert_eq!(parse_range("bytes=95-200", 100), Some((95, 100)));
        assert_eq!(parse_range("bytes=100-", 100), None);
        assert_eq!(parse_range("bytes=9-3", 100), None);
        assert_eq!(parse_range("items=0-9", 100), None);
    }
}
