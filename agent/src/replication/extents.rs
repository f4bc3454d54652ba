//! The content of one regular file on the wire, holes kept: a frame per piece of data,
//! `[offset: u64 BE][len: u64 BE][len bytes]`, in increasing offsets, never overlapping,
//! then an end frame `[size: u64 BE][0: u64 BE]`. A hole is what no frame covers, so a
//! sparse file travels as its data only and is written back as sparse.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;

use rustix::io::Errno;

use super::common::BLOCK;
use crate::store::copy::data::next_data;
use crate::store::error::{Result, StoreError, io_error};

/// Most data bytes in one frame: a receiver reads a frame in pieces anyway, this only
/// keeps a sender's buffer small.
pub const MAX_FRAME_DATA: u64 = BLOCK as u64;

fn wire_error(what: &str, e: std::io::Error) -> StoreError {
    StoreError::Io {
        context: what.to_owned(),
        source: e,
    }
}

fn refused(reason: String) -> StoreError {
    StoreError::Invalid(format!("file data refused: {reason}"))
}

/// Writes the data extents of `file` (its whole size, as it is now) as frames, then the
/// end frame; answers the data bytes sent. A file that shrinks while it is sent is an
/// error: the data of a snapshot does not change.
pub fn send_extents(file: &File, out: &mut impl Write) -> Result<u64> {
    let fd = file.as_fd();
    let size = file
        .metadata()
        .map_err(|e| wire_error("stat the file to send", e))?
        .len();
    let mut buffer = vec![0u8; BLOCK];
    let (mut offset, mut sent) = (0, 0);
    while let Some((start, stop)) =
        next_data(fd, offset, size).map_err(|e| io_error("read the file to send", e))?
    {
        let mut position = start;
        while position < stop {
            let len = (stop - position).min(MAX_FRAME_DATA) as usize;
            let mut filled = 0;
            while filled < len {
                match rustix::io::pread(fd, &mut buffer[filled..len], position + filled as u64) {
                    Ok(0) => {
                        return Err(StoreError::Conflict(
                            "the file being sent shrank".to_owned(),
                        ));
                    }
                    Ok(read) => filled += read,
                    Err(Errno::INTR) => {}
                    Err(e) => return Err(io_error("read the file to send", e)),
                }
            }
            write_header(out, position, len as u64)?;
            out.write_all(&buffer[..len])
                .map_err(|e| wire_error("send file data", e))?;
            position += len as u64;
            sent += len as u64;
        }
        offset = stop;
    }
    write_header(out, size, 0)?;
    Ok(sent)
}

fn write_header(out: &mut impl Write, offset: u64, len: u64) -> Result<()> {
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&offset.to_be_bytes());
    header[8..].copy_from_slice(&len.to_be_bytes());
    out.write_all(&header)
        .map_err(|e| wire_error("send file data", e))
}

/// Reads frames from `input` into `file`, which it first empties and sets to `size`
/// bytes (all hole), writing each frame's data at its offset; answers the data bytes
/// received. Refuses a frame before the end of the previous one (out of order or
/// overlapping), one reaching beyond `size`, an end frame not at `size`, and input that
/// ends before the end frame. Data received is at most `size` bytes, whatever is sent.
/// Reads nothing after the end frame.
pub fn receive_extents(input: &mut impl Read, file: &File, size: u64) -> Result<u64> {
    let fd = file.as_fd();
    for len in [0, size] {
        rustix::fs::ftruncate(fd, len).map_err(|e| io_error("size the file received", e))?;
    }
    let mut buffer = vec![0u8; BLOCK];
    let (mut next, mut received) = (0u64, 0u64);
    loop {
        let mut header = [0u8; 16];
        input.read_exact(&mut header).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => refused("the data ended before its end frame".into()),
            _ => wire_error("receive file data", e),
        })?;
        let offset = u64::from_be_bytes(header[..8].try_into().expect("8 bytes"));
        let len = u64::from_be_bytes(header[8..].try_into().expect("8 bytes"));
        if len == 0 {
            if offset != size {
                return Err(refused(format!(
                    "an end frame at {offset} for a file of {size} bytes"
                )));
            }
            return Ok(received);
        }
        if offset < next {
            return Err(refused(format!(
                "a frame at {offset}, before the end of the previous one ({next}): out of order or overlapping"
            )));
        }
        let end = offset
            .checked_add(len)
            .filter(|end| *end <= size)
            .ok_or_else(|| {
                refused(format!(
                    "a frame of {len} bytes at {offset}, beyond the file's {size} bytes"
                ))
            })?;
        let mut position = offset;
        while position < end {
            let step = (end - position).min(BLOCK as u64) as usize;
            input
                .read_exact(&mut buffer[..step])
                .map_err(|e| match e.kind() {
                    ErrorKind::UnexpectedEof => refused("the data ended inside a frame".into()),
                    _ => wire_error("receive file data", e),
                })?;
            let mut written = 0;
            while written < step {
                match rustix::io::pwrite(fd, &buffer[written..step], position + written as u64) {
                    Ok(0) => return Err(io_error("write the file received", Errno::IO)),
                    Ok(n) => written += n,
                    Err(Errno::INTR) => {}
                    Err(e) => return Err(io_error("write the file received", e)),
                }
            }
            position += step as u64;
        }
        next = end;
        received += len;
    }
}
