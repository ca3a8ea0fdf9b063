//! [`FaultProxy`]: an HTTP/1.1 proxy on loopback, in front of the S3 server, that injects the
//! faults a real object store's network shows: responses cut short mid-header and
//! mid-body, connections reset, bursts of `503 SlowDown`, and stalls longer than the
//! client's timeout. Which request gets which fault is drawn from a seeded generator, so a
//! failing run can be replayed from its seed.
//!
//! The proxy relays one request and one response at a time per connection (object_store
//! keeps connections alive), reading just enough HTTP to know where a message ends:
//! `Content-Length`, chunked bodies, and bodyless responses to HEAD.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How often each fault is injected: probabilities per request, from 0 to 1.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// The response's head is cut short and the connection closed.
    pub cut_head: f64,
    /// The response's body is cut short and the connection closed.
    pub cut_body: f64,
    /// The connection is reset before the request is forwarded.
    pub reset: f64,
    /// A burst of `503 SlowDown` answers starts (this request and the next few).
    pub slow_down: f64,
    /// The response is held back for [`Faults::stall_for`].
    pub stall: f64,
    /// How long a stalled response is held back: longer than the client's timeout.
    pub stall_for: Duration,
}

impl Faults {
    /// No faults.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every kind of fault, each with probability `p`, stalls of `stall_for`.
    pub fn all(p: f64, stall_for: Duration) -> Self {
        Self {
            cut_head: p,
            cut_body: p,
            reset: p,
            slow_down: p,
            stall: p,
            stall_for,
        }
    }
}

/// What the proxy did, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    /// Requests relayed whole.
    pub relayed: u64,
    /// Responses whose head was cut.
    pub cut_head: u64,
    /// Responses whose body was cut.
    pub cut_body: u64,
    /// Connections reset.
    pub reset: u64,
    /// `503 SlowDown` answers.
    pub slow_down: u64,
    /// Responses stalled.
    pub stalled: u64,
}

impl ProxyCounts {
    /// Faults injected, of every kind.
    pub fn faults(&self) -> u64 {
        self.cut_head + self.cut_body + self.reset + self.slow_down + self.stalled
    }
}

#[derive(Debug, Default)]
struct Counters {
    relayed: AtomicU64,
    cut_head: AtomicU64,
    cut_body: AtomicU64,
    reset: AtomicU64,
    slow_down: AtomicU64,
    stalled: AtomicU64,
}

#[derive(Debug)]
struct Plan {
    faults: Faults,
    rng: SmallRng,
    /// `503`s still to answer in the current burst.
    burst: u32,
}

/// The fault drawn for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    CutHead,
    CutBody,
    Reset,
    SlowDown,
    Stall,
}

/// A fault-injecting HTTP proxy; see the module docs. Stops when dropped.
///
/// ```no_run
/// # use datafusion_lakecache::testkit::{FaultProxy, Faults};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let proxy = FaultProxy::start("127.0.0.1:9000".parse().unwrap(), 42).await?;
/// proxy.set(Faults::all(0.05, std::time::Duration::from_secs(2)));
/// // Point the S3 client at proxy.endpoint().
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    plan: Arc<Mutex<Plan>>,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and relays to `target`, drawing faults from `seed`.
    /// Starts with no faults.
    pub async fn start(target: SocketAddr, seed: u64) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let plan = Arc::new(Mutex::new(Plan {
            faults: Faults::none(),
            rng: SmallRng::seed_from_u64(seed),
            burst: 0,
        }));
        let counters = Arc::new(Counters::default());
        let (p, c) = (Arc::clone(&plan), Arc::clone(&counters));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (p, c) = (Arc::clone(&p), Arc::clone(&c));
                tokio::spawn(async move {
                    let _ = connection(client, target, p, c).await;
                });
            }
        });
        Ok(Self {
            addr,
            plan,
            counters,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`, the endpoint to give the client.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Injects `faults` from now on.
    pub fn set(&self, faults: Faults) {
        let mut plan = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        plan.faults = faults;
        plan.burst = 0;
    }

    /// What the proxy did so far.
    pub fn counts(&self) -> ProxyCounts {
        let c = &self.counters;
        ProxyCounts {
            relayed: c.relayed.load(Relaxed),
            cut_head: c.cut_head.load(Relaxed),
            cut_body: c.cut_body.load(Relaxed),
            reset: c.reset.load(Relaxed),
            slow_down: c.slow_down.load(Relaxed),
            stalled: c.stalled.load(Relaxed),
        }
    }
}

impl Plan {
    fn draw(&mut self) -> Fault {
        if self.burst > 0 {
            self.burst -= 1;
            return Fault::SlowDown;
        }
        let f = self.faults;
        let x: f64 = self.rng.random();
        let mut at = 0.0;
        for (p, fault) in [
            (f.cut_head, Fault::CutHead),
            (f.cut_body, Fault::CutBody),
            (f.reset, Fault::Reset),
            (f.slow_down, Fault::SlowDown),
            (f.stall, Fault::Stall),
        ] {
            at += p;
            if x < at {
                if fault == Fault::SlowDown {
                    self.burst = self.rng.random_range(0..4);
                }
                return fault;
            }
        }
        Fault::None
    }
}

const SLOW_DOWN_BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

/// Relays the requests of one client connection, injecting faults.
async fn connection(
    mut client: TcpStream,
    target: SocketAddr,
    plan: Arc<Mutex<Plan>>,
    counters: Arc<Counters>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    let mut from_client = Buffered::default();
    let mut from_upstream = Buffered::default();
    loop {
        let Some(request) = from_client.message(&mut client, false).await? else {
            return Ok(());
        };
        let head_request = request.starts_with(b"HEAD ");
        let fault = plan.lock().unwrap_or_else(|e| e.into_inner()).draw();
        let stall_for = plan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .faults
            .stall_for;
        match fault {
            Fault::Reset => {
                counters.reset.fetch_add(1, Relaxed);
                // SO_LINGER 0: closing sends a reset, not a clean end.
                let _ = client.set_zero_linger();
                return Ok(());
            }
            Fault::SlowDown => {
                counters.slow_down.fetch_add(1, Relaxed);
                let body = if head_request { "" } else { SLOW_DOWN_BODY };
                let answer = format!(
                    "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n\
                     Content-Length: {}\r\nRetry-After: 0\r\n\r\n{body}",
                    SLOW_DOWN_BODY.len()
                );
                client.write_all(answer.as_bytes()).await?;
                continue;
            }
            _ => {}
        }
        upstream.write_all(&request).await?;
        let Some(response) = from_upstream.message(&mut upstream, head_request).await? else {
            return Ok(());
        };
        match fault {
            Fault::CutHead => {
                counters.cut_head.fetch_add(1, Relaxed);
                let head_end = find(&response, b"\r\n\r\n").unwrap_or(response.len());
                client.write_all(&response[..head_end / 2]).await?;
                return Ok(());
            }
            Fault::CutBody => {
                counters.cut_body.fetch_add(1, Relaxed);
                let head_end = find(&response, b"\r\n\r\n").map_or(response.len(), |i| i + 4);
                let cut = head_end + (response.len() - head_end) / 2;
                client.write_all(&response[..cut]).await?;
                return Ok(());
            }
            Fault::Stall => {
                counters.stalled.fetch_add(1, Relaxed);
                tokio::time::sleep(stall_for).await;
            }
            _ => {
                counters.relayed.fetch_add(1, Relaxed);
            }
        }
        client.write_all(&response).await?;
    }
}

/// Bytes read from one side of a connection and not yet relayed.
#[derive(Default)]
struct Buffered {
    buf: Vec<u8>,
}

impl Buffered {
    /// The next whole HTTP message from `from` (`None` once it closed between messages).
    /// `bodyless` says a response to HEAD is expected, whose length headers describe no
    /// body.
    async fn message<R: AsyncRead + Unpin>(
        &mut self,
        from: &mut R,
        bodyless: bool,
    ) -> std::io::Result<Option<Vec<u8>>> {
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            if !self.fill(from).await? {
                return Ok(None);
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_ascii_lowercase();
        let status_without_body =
            head.starts_with("http/1.1 204") || head.starts_with("http/1.1 304");
        let end = if bodyless || status_without_body {
            head_end
        } else if head.contains("transfer-encoding: chunked") {
            loop {
                if let Some(end) = chunked_end(&self.buf[head_end..]) {
                    break head_end + end;
                }
                if !self.fill(from).await? {
                    return Ok(None);
                }
            }
        } else {
            let length = header(&head, "content-length")
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while self.buf.len() < head_end + length {
                if !self.fill(from).await? {
                    return Ok(None);
                }
            }
            head_end + length
        };
        Ok(Some(self.buf.drain(..end).collect()))
    }

    async fn fill<R: AsyncRead + Unpin>(&mut self, from: &mut R) -> std::io::Result<bool> {
        let mut chunk = [0u8; 64 << 10];
        let n = from.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
}

/// Where a chunked body that starts `body` ends, if all of it is there.
fn chunked_end(body: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let line_end = at + find(&body[at..], b"\r\n")?;
        let size_text = std::str::from_utf8(&body[at..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // Trailers end with an empty line.
            let end = at + find(&body[at..], b"\r\n")?;
            return Some(end + 2);
        }
        at += size + 2;
        if at > body.len() {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_end_at_the_last_chunk() {
        let body = b"4\r\nWiki\r\n5;x=1\r\npedia\r\n0\r\n\r\nNEXT";
        assert_eq!(chunked_end(body), Some(body.len() - 4));
        assert_eq!(chunked_end(&body[..10]), None);
    }

    #[tokio::test]
    async fn messages_are_split_by_their_lengths() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        )
        .await
        .unwrap();
        drop(a);
        let mut buffered = Buffered::default();
        let first = buffered.message(&mut b, false).await.unwrap().unwrap();
        assert!(first.ends_with(b"abc"));
        let second = buffered.message(&mut b, false).await.unwrap().unwrap();
        assert!(second.ends_with(b"\r\n\r\n"));
        assert!(buffered.message(&mut b, false).await.unwrap().is_none());
    }

    #[test]
    fn faults_are_drawn_at_their_rates_and_slow_downs_come_in_bursts() {
        let mut plan = Plan {
            faults: Faults::all(0.02, Duration::from_millis(1)),
            rng: SmallRng::seed_from_u64(7),
            burst: 0,
        };
        let draws: Vec<Fault> = (0..10_000).map(|_| plan.draw()).collect();
        let none = draws.iter().filter(|f| **f == Fault::None).count();
        assert!((8_500..9_400).contains(&none), "{none}");
        for fault in [Fault::CutHead, Fault::CutBody, Fault::Reset, Fault::Stall] {
            let n = draws.iter().filter(|f| **f == fault).count();
            assert!((120..300).contains(&n), "{fault:?}: {n}");
        }
    }
}
