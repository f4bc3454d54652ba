//! XDR (RFC 4506) by hand: big-endian 32-bit units, opaque data padded to four bytes.

use thiserror::Error;

#[derive(Debug, Error)]
#[error("XDR reply cut short: wanted {wanted} bytes at offset {offset} of {len}")]
pub struct Truncated {
    pub wanted: usize,
    pub offset: usize,
    pub len: usize,
}

#[derive(Default)]
pub struct Encoder {
    bytes: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.u32(u32::from(value))
    }

    /// Fixed-length opaque data: the bytes, padded.
    pub fn fixed(&mut self, data: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(data);
        self.bytes.resize(self.bytes.len() + padding(data.len()), 0);
        self
    }

    /// Variable-length opaque data: its length, then the bytes, padded.
    pub fn opaque(&mut self, data: &[u8]) -> &mut Self {
        self.u32(data.len() as u32).fixed(data)
    }

    pub fn string(&mut self, text: &str) -> &mut Self {
        self.opaque(text.as_bytes())
    }

    pub fn bytes(&mut self, raw: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(raw);
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

pub struct Decoder<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, offset: 0 }
    }

    fn take(&mut self, wanted: usize) -> Result<&'a [u8], Truncated> {
        let end = self
            .offset
            .checked_add(wanted)
            .filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(Truncated {
                wanted,
                offset: self.offset,
                len: self.bytes.len(),
            });
        };
        let taken = &self.bytes[self.offset..end];
        self.offset = end;
        Ok(taken)
    }

    pub fn u32(&mut self) -> Result<u32, Truncated> {
        let raw = self.take(4)?;
        Ok(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, Truncated> {
        Ok((u64::from(self.u32()?) << 32) | u64::from(self.u32()?))
    }

    pub fn bool(&mut self) -> Result<bool, Truncated> {
        Ok(self.u32()? != 0)
    }

    pub fn fixed(&mut self, len: usize) -> Result<&'a [u8], Truncated> {
        let data = self.take(len)?;
        self.take(padding(len))?;
        Ok(data)
    }

    pub fn opaque(&mut self) -> Result<&'a [u8], Truncated> {
        let len = self.u32()? as usize;
        self.fixed(len)
    }

    pub fn string(&mut self) -> Result<String, Truncated> {
        Ok(String::from_utf8_lossy(self.opaque()?).into_owned())
    }

    /// What is left, undecoded.
    pub fn rest(&self) -> &'a [u8] {
        &self.bytes[self.offset..]
    }
}

fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_data_is_padded_to_four_bytes_and_read_back() {
        let mut encoder = Encoder::new();
        encoder.opaque(b"abcde").u64(1 << 40).bool(true).string("");
        let bytes = encoder.finish();
        assert_eq!(bytes.len(), 4 + 8 + 8 + 4 + 4);
        assert_eq!(&bytes[..9], &[0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e']);
        let mut decoder = Decoder::new(&bytes);
        assert_eq!(decoder.opaque().unwrap(), b"abcde");
        assert_eq!(decoder.u64().unwrap(), 1 << 40);
        assert!(decoder.bool().unwrap());
        assert_eq!(decoder.string().unwrap(), "");
        assert!(decoder.rest().is_empty());
    }

    #[test]
    fn a_length_past_the_end_is_refused() {
        let bytes = [0, 0, 0, 9, 1, 2];
        assert!(Decoder::new(&bytes).opaque().is_err());
    }
}
