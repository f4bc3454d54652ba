//! A proxy in front of the API simulator for what it does not serve (Secrets,
//! Deployments): the caller's `answer` answers some requests itself, on the client's
//! connection, kept alive; anything else is forwarded to the simulator on a connection of
//! its own, and the client's connection ends with the answer.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The status code and JSON body of an answer the proxy makes itself.
pub type Answer = (u16, String);

/// Starts the proxy in front of `upstream`; answers its address. `answer` gets each
/// request's method and path (without its query) and answers it, or `None` to forward it.
pub async fn start<F>(upstream: SocketAddr, answer: F) -> anyhow::Result<SocketAddr>
where
    F: Fn(&str, &str) -> Option<Answer> + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move { serve(conn, upstream, &*answer).await });
        }
    });
    Ok(address)
}

async fn serve(
    conn: TcpStream,
    upstream: SocketAddr,
    answer: &(dyn Fn(&str, &str) -> Option<Answer> + Send + Sync),
) -> std::io::Result<()> {
    let mut conn = BufReader::new(conn);
    loop {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            if conn.read_until(b'\n', &mut head).await? == 0 {
                return Ok(());
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_owned();
        let mut parts = request_line.split(' ');
        let method = parts.next().unwrap_or_default();
        let target = parts.next().unwrap_or_default();
        let headers: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
        let length: usize = headers
            .iter()
            .find_map(|h| {
                let (name, value) = h.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0; length];
        conn.read_exact(&mut body).await?;
        let path = target.split('?').next().unwrap_or_default();
        if let Some((code, answer)) = answer(method, path) {
            let response = format!(
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                answer.len()
            );
            conn.get_mut().write_all(response.as_bytes()).await?;
            continue;
        }
        let mut forwarded = format!("{request_line}\r\n");
        for header in headers
            .iter()
            .filter(|h| !h.to_ascii_lowercase().starts_with("connection:"))
        {
            forwarded.push_str(header);
            forwarded.push_str("\r\n");
        }
        // One request per upstream connection: the answer then ends where the stream
        // does, and its `connection: close` keeps the client from reusing ours.
        forwarded.push_str("Connection: close\r\n\r\n");
        let mut sim = TcpStream::connect(upstream).await?;
        sim.write_all(forwarded.as_bytes()).await?;
        sim.write_all(&body).await?;
        tokio::io::copy(&mut sim, conn.get_mut()).await?;
        return Ok(());
    }
}
