//! The HTTP endpoint of `--metrics ADDR`: it answers `GET /metrics` with what the run's
//! own loop writes at that moment ([`Scrapes::next`]), so a scrape reads the kernel's
//! figures when it comes and nothing is kept between scrapes. Each connection is served
//! by a task of its own: a slow or silent client never holds the tracing loop up.

use std::{net::SocketAddr, time::Duration};

use anyhow::{Context as _, Result};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot},
};

use super::render::prometheus::CONTENT_TYPE;

/// How long a client has to send its request, and the run to write the answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request head read; a scrape's is a few hundred bytes.
const MAX_REQUEST_BYTES: usize = 16 * 1024;

/// The endpoint's socket, bound before the run starts so that a wrong or taken address
/// fails at once.
pub(crate) struct Endpoint {
    listener: std::net::TcpListener,
}

impl Endpoint {
    /// Binds `addr` (`127.0.0.1:9090`, `[::]:9464`, `:9464` for every address).
    pub(crate) fn bind(addr: &str) -> Result<Self> {
        let parsed = parse_addr(addr)?;
        let listener = std::net::TcpListener::bind(parsed)
            .with_context(|| format!("--metrics {addr}: cannot listen there"))?;
        listener.set_nonblocking(true)?;
        Ok(Self { listener })
    }

    /// The address bound (with the port the system chose for port 0).
    pub(crate) fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Starts serving on the current tokio runtime; the scrapes come out of the result.
    pub(crate) fn serve(self) -> Result<Scrapes> {
        let listener = TcpListener::from_std(self.listener)?;
        let (requests, receiver) = mpsc::channel(16);
        tokio::spawn(accept(listener, requests));
        Ok(Scrapes { receiver })
    }
}

/// `HOST:PORT`, `[V6]:PORT`, or `:PORT` for every IPv4 address.
fn parse_addr(addr: &str) -> Result<SocketAddr> {
    let full = match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_string(),
    };
    full.parse().with_context(|| {
        format!("--metrics {addr}: not an address and port (say 127.0.0.1:9464 or :9464)")
    })
}

/// A scrape waiting for its answer.
pub(crate) struct Scrape {
    reply: oneshot::Sender<String>,
}

impl Scrape {
    /// Answers with `text` in the exposition format.
    pub(crate) fn answer(self, text: String) {
        // The client may have gone: nothing to do then.
        let _ = self.reply.send(text);
    }
}

/// The scrapes as they come.
pub(crate) struct Scrapes {
    receiver: mpsc::Receiver<Scrape>,
}

impl Scrapes {
    /// The next scrape; pending for ever once the endpoint is gone.
    pub(crate) async fn next(&mut self) -> Scrape {
        match self.receiver.recv().await {
            Some(scrape) => scrape,
            None => std::future::pending().await,
        }
    }
}

async fn accept(listener: TcpListener, requests: mpsc::Sender<Scrape>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_connection(stream, requests.clone()));
            }
            Err(e) => {
                // Out of descriptors, say: the next accept may succeed.
                log::debug!("--metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve_connection(mut stream: TcpStream, requests: mpsc::Sender<Scrape>) {
    let response = match tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream)).await {
        Ok(Ok(request)) => respond(request, &requests).await,
        Ok(Err(status)) => plain(status, status_text(status)),
        Err(_) => return,
    };
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, stream.write_all(&response)).await;
    let _ = stream.shutdown().await;
}

/// What a client asked.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    head_only: bool,
    path: String,
}

/// Reads and parses a request head; an error is the HTTP status to answer with.
async fn read_request(stream: &mut TcpStream) -> Result<Request, u16> {
    let mut buffer = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 2048];
        let read = stream.read(&mut chunk).await.map_err(|_| 400u16)?;
        if read == 0 {
            return Err(400);
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(request) = parse_request(&buffer)? {
            return Ok(request);
        }
        if buffer.len() > MAX_REQUEST_BYTES {
            return Err(431);
        }
    }
}

/// The request in `bytes`, `None` while its head is incomplete.
fn parse_request(bytes: &[u8]) -> Result<Option<Request>, u16> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(400),
    }
    let head_only = match request.method {
        Some("GET") => false,
        Some("HEAD") => true,
        _ => return Err(405),
    };
    let target = request.path.unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/").to_string();
    Ok(Some(Request { head_only, path }))
}

async fn respond(request: Request, requests: &mpsc::Sender<Scrape>) -> Vec<u8> {
    let (status, content_type, body) = match request.path.as_str() {
        "/metrics" => {
            let (reply, answer) = oneshot::channel();
            if requests.send(Scrape { reply }).await.is_err() {
                return plain(503, "the tracer is stopping\n");
            }
            match tokio::time::timeout(REQUEST_TIMEOUT, answer).await {
                Ok(Ok(text)) => (200, CONTENT_TYPE, text),
                _ => return plain(503, "the tracer did not answer in time\n"),
            }
        }
        "/" => (
            200,
            "text/plain; charset=utf-8",
            "tracer: metrics at /metrics\n".to_string(),
        ),
        _ => return plain(404, "not found: metrics are at /metrics\n"),
    };
    let mut response = head(status, content_type, body.len());
    if !request.head_only {
        response.extend_from_slice(body.as_bytes());
    }
    response
}

fn plain(status: u16, body: &str) -> Vec<u8> {
    let mut response = head(status, "text/plain; charset=utf-8", body.len());
    response.extend_from_slice(body.as_bytes());
    response
}

fn head(status: u16, content_type: &str, length: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n\
         Connection: close\r\n\r\n",
        status_text(status)
    )
    .into_bytes()
}

fn status_text(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_request_is_parsed_once_its_head_is_complete() {
        let request = b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: text/plain\r\n\r\n";
        assert_eq!(parse_request(&request[..20]), Ok(None));
        assert_eq!(
            parse_request(request),
            Ok(Some(Request {
                head_only: false,
                path: "/metrics".into()
            }))
        );
        assert_eq!(
            parse_request(b"HEAD / HTTP/1.0\r\n\r\n"),
            Ok(Some(Request {
                head_only: true,
                path: "/".into()
            }))
        );
        assert_eq!(parse_request(b"POST /metrics HTTP/1.1\r\n\r\n"), Err(405));
        assert_eq!(parse_request(b"\x01\x02 nonsense\r\n\r\n"), Err(400));
    }

    #[test]
    fn addresses_take_a_host_or_only_a_port() {
        assert_eq!(
            parse_addr(":9464").unwrap(),
            "0.0.0.0:9464".parse().unwrap()
        );
        assert_eq!(parse_addr("[::1]:80").unwrap(), "[::1]:80".parse().unwrap());
        let error = parse_addr("localhost").unwrap_err().to_string();
        assert!(error.contains("--metrics localhost"), "{error}");
    }

    #[tokio::test]
    async fn a_scrape_gets_what_the_run_answers_and_other_paths_do_not() {
        let endpoint = Endpoint::bind("127.0.0.1:0").unwrap();
        let addr = endpoint.local_addr().unwrap();
        let mut scrapes = endpoint.serve().unwrap();
        tokio::spawn(async move {
            loop {
                scrapes.next().await.answer("tracer_processes 2\n".into());
            }
        });
        let get = |path: &'static str| async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response
        };
        let metrics = get("/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.contains(CONTENT_TYPE), "{metrics}");
        assert!(
            metrics.ends_with("\r\n\r\ntracer_processes 2\n"),
            "{metrics}"
        );
        let missing = get("/nothing").await;
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
    }
}
