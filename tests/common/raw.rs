//! Raw HTTP/1.1 over TCP, for what a client library would not send: a
//! declared length without its body, a chosen source address, a request
//! cut short.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Connects to `to`, from `from` (a loopback address of the test's
/// choosing, so that it counts as another client) if given.
pub async fn connect(to: &str, from: Option<&str>) -> std::io::Result<TcpStream> {
    let to: std::net::SocketAddr = to.parse().unwrap();
    let socket = TcpSocket::new_v4()?;
    if let Some(from) = from {
        socket.bind(format!("{from}:0").parse().unwrap())?;
    }
    socket.connect(to).await
}

/// One raw HTTP/1.1 request (`Connection: close`); the status and body, or
/// `None` if no answer came within `timeout`.
pub async fn raw(
    to: &str,
    from: Option<&str>,
    head: &str,
    body: &str,
    timeout: Duration,
) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = connect(to, from).await.ok()?;
        let request = format!(
            "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer.split_whitespace().nth(1)?.parse().ok()?;
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Some((status, body.to_string()))
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// Writes `bytes` on a new connection to `addr` and reads what comes back
/// until the server closes or 2 s pass without a byte.
pub async fn exchange(addr: &str, bytes: &[u8]) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}
