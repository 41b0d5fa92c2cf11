//! A minimal HTTP/1.1 client over a raw TcpStream (one request per connection), enough to
//! test the server without a heavy client crate.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut s = connect(addr);
    // The server may answer (413) and close before reading a large body: a failed write
    // is fine as long as the answer can be read.
    let _ = s.write_all(&request_bytes(method, path, headers, body));
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse(&raw)
}

pub fn parse(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let rest = &raw[split + 4..];
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Reply { status, head, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = String::from_utf8_lossy(&data[..eol]).into_owned();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        let start = eol + 2;
        out.extend_from_slice(&data[start..start + size]);
        data = &data[start + size + 2..];
    }
}

/// The JSON payloads of an SSE body, and whether it ended with `data: [DONE]`.
pub fn sse_events(body: &str) -> (Vec<serde_json::Value>, bool) {
    let mut events = Vec::new();
    let mut done = false;
    for block in body.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let data = block
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("not SSE: {block:?}"));
        if data == "[DONE]" {
            done = true;
        } else {
            assert!(!done, "an event after [DONE]");
            events.push(serde_json::from_str(data).unwrap());
        }
    }
    (events, done)
}

/// POST a JSON body to `path`.
pub fn post_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Reply {
    send(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// The value of one unlabelled series of GET /metrics.
pub fn metric<T: std::str::FromStr>(addr: SocketAddr, name: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    metric_value(&send(addr, "GET", "/metrics", &[], b"").text(), name)
}

/// The value of one unlabelled series in a /metrics body.
pub fn metric_value<T: std::str::FromStr>(text: &str, name: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Log lines of every thread, captured (a `tracing` writer), e.g. the scheduler's
/// end-of-request lines.
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    pub fn lines(&self) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines().map(str::to_string).collect()
    }
}
