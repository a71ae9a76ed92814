//! Asking a tracer's `/metrics` endpoint.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

use super::Tracer;

/// A GET of `path` from `addr` (`127.0.0.1:PORT`); returns the status line and the body.
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, body.to_string())
}

/// The metrics address the tracer printed (`Serving metrics at http://ADDR/metrics.`).
pub fn metrics_addr(tracer: &Tracer) -> String {
    tracer
        .early_stderr
        .lines()
        .find_map(|l| l.strip_prefix("Serving metrics at http://"))
        .and_then(|rest| rest.strip_suffix("/metrics."))
        .unwrap_or_else(|| panic!("no metrics address in:\n{}", tracer.early_stderr))
        .to_string()
}
