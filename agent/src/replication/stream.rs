//! Bridges between the blocking threads that read and write trees and the async
//! connection: a `Write` whose chunks become an HTTP body, and a `Read` fed by the chunks
//! of an HTTP body. Both hold at most a few chunks, so neither side runs ahead of the
//! other by more than that.

use std::io::{self, Read, Write};

use axum::body::{Body, Bytes};
use tokio::sync::mpsc as async_mpsc;

/// Bytes gathered before a chunk is handed to the connection.
const CHUNK_BYTES: usize = 256 * 1024;

type Chunk = Result<Bytes, io::Error>;

/// A `Write` on a blocking thread whose bytes are the body of an answer being sent.
pub(crate) struct ChannelWriter {
    buffer: Vec<u8>,
    chunks: async_mpsc::Sender<Chunk>,
}

impl ChannelWriter {
    /// A writer and the receiver of its chunks, at most `depth` of them waiting.
    pub(crate) fn new(depth: usize) -> (Self, async_mpsc::Receiver<Chunk>) {
        let (chunks, receiver) = async_mpsc::channel(depth.max(1));
        (
            Self {
                buffer: Vec::with_capacity(CHUNK_BYTES),
                chunks,
            },
            receiver,
        )
    }

    fn send(&mut self, chunk: Chunk) -> io::Result<()> {
        self.chunks
            .blocking_send(chunk)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the receiver went away"))
    }

    /// Ends the body with an error: the connection is reset, so the receiver sees a body
    /// cut short, never one that looks whole.
    pub(crate) fn fail(mut self, message: String) {
        self.buffer.clear();
        let _ = self.send(Err(io::Error::other(message)));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK_BYTES {
            self.flush()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buffer,
            Vec::with_capacity(CHUNK_BYTES),
        ));
        self.send(Ok(chunk))
    }
}

impl Drop for ChannelWriter {
    fn drop(&mut self) {
        // What is left is sent; an error ends the body short instead (see `fail`).
        let _ = self.flush();
    }
}

/// The body an answer streams from a [`ChannelWriter`].
pub(crate) fn body_of(chunks: async_mpsc::Receiver<Chunk>) -> Body {
    let stream = futures::stream::unfold(chunks, |mut chunks| async move {
        chunks.recv().await.map(|chunk| (chunk, chunks))
    });
    Body::from_stream(stream)
}

/// A `Read` on a blocking thread fed the chunks of a body being received by an async
/// task; an error sent in place of a chunk is returned to the reader, and a sender gone
/// without one reads as the end.
pub(crate) struct ChannelReader {
    chunks: async_mpsc::Receiver<io::Result<Vec<u8>>>,
    current: Vec<u8>,
    at: usize,
}

impl ChannelReader {
    /// A reader and the sender of its chunks, at most `depth` of them waiting.
    pub(crate) fn new(depth: usize) -> (Self, async_mpsc::Sender<io::Result<Vec<u8>>>) {
        let (sender, chunks) = async_mpsc::channel(depth.max(1));
        (
            Self {
                chunks,
                current: Vec::new(),
                at: 0,
            },
            sender,
        )
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.current.len() {
            match self.chunks.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.current = chunk;
                    self.at = 0;
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len() - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_reads_the_chunks_in_order_then_the_end_or_the_error() {
        let (mut reader, sender) = ChannelReader::new(2);
        let feeder = std::thread::spawn(move || {
            sender.blocking_send(Ok(b"hello ".to_vec())).unwrap();
            sender.blocking_send(Ok(Vec::new())).unwrap();
            sender.blocking_send(Ok(b"world".to_vec())).unwrap();
        });
        let mut all = String::new();
        reader.read_to_string(&mut all).unwrap();
        feeder.join().unwrap();
        assert_eq!(all, "hello world");

        let (mut reader, sender) = ChannelReader::new(1);
        sender.blocking_send(Ok(b"part".to_vec())).unwrap();
        let feeder = std::thread::spawn(move || {
            sender.blocking_send(Err(io::Error::other("cut"))).unwrap();
        });
        let mut all = Vec::new();
        let error = reader.read_to_end(&mut all).unwrap_err();
        feeder.join().unwrap();
        assert_eq!(error.to_string(), "cut");
        assert_eq!(all, b"part");
    }

    #[tokio::test]
    async fn a_writer_s_bytes_arrive_as_chunks_and_its_failure_as_an_error() {
        let (writer, mut chunks) = ChannelWriter::new(2);
        let writing = tokio::task::spawn_blocking(move || {
            let mut writer = writer;
            writer.write_all(&vec![7u8; CHUNK_BYTES + 10]).unwrap();
            writer.write_all(b"tail").unwrap();
            writer.fail("broken".into());
        });
        let mut received = Vec::new();
        let mut error = None;
        while let Some(chunk) = chunks.recv().await {
            match chunk {
                Ok(bytes) => received.extend_from_slice(&bytes),
                Err(e) => error = Some(e.to_string()),
            }
        }
        writing.await.unwrap();
        // The buffered tail is dropped with the failure: nothing after a failure is sent.
        assert_eq!(received.len(), CHUNK_BYTES + 10);
        assert_eq!(error.as_deref(), Some("broken"));
    }
}
