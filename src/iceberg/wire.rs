//! The bytes [`IcebergScanExec`](super::IcebergScanExec) crosses to another process in:
//! little-endian integers, length-prefixed text and bytes. Every length and count read is
//! bounded by the bytes left, so a bad buffer is an error, never a huge allocation.

use datafusion::error::{DataFusionError, Result};

/// The error of any buffer that is not an encoded node.
pub(super) fn bad() -> DataFusionError {
    DataFusionError::Plan("not an encoded IcebergScanExec".to_string())
}

/// Writes the encoding.
#[derive(Default)]
pub(super) struct Encoder(pub(super) Vec<u8>);

impl Encoder {
    pub(super) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// A count or an index.
    pub(super) fn usize(&mut self, v: usize) {
        self.u64(v as u64);
    }

    pub(super) fn byte(&mut self, v: u8) {
        self.0.push(v);
    }

    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.usize(b.len());
        self.0.extend_from_slice(b);
    }

    pub(super) fn text(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
}

/// Reads the encoding.
pub(super) struct Decoder<'a>(pub(super) &'a [u8]);

impl<'a> Decoder<'a> {
    pub(super) fn u64(&mut self) -> Result<u64> {
        let (v, rest) = self.0.split_first_chunk::<8>().ok_or_else(bad)?;
        self.0 = rest;
        Ok(u64::from_le_bytes(*v))
    }

    /// An index or a size.
    pub(super) fn usize(&mut self) -> Result<usize> {
        usize::try_from(self.u64()?).map_err(|_| bad())
    }

    /// The number of items that follow, each of at least `item_bytes` bytes: no more than
    /// the bytes left can hold.
    pub(super) fn count(&mut self, item_bytes: usize) -> Result<usize> {
        let n = self.usize()?;
        match n.checked_mul(item_bytes.max(1)) {
            Some(bytes) if bytes <= self.0.len() => Ok(n),
            _ => Err(bad()),
        }
    }

    pub(super) fn byte(&mut self) -> Result<u8> {
        let (v, rest) = self.0.split_first().ok_or_else(bad)?;
        self.0 = rest;
        Ok(*v)
    }

    pub(super) fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.count(1)?;
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(b)
    }

    pub(super) fn text(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| bad())
    }

    /// Whether every byte was read.
    pub(super) fn is_done(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_is_read_back_and_an_overlong_count_is_refused() {
        let mut e = Encoder::default();
        e.u64(7);
        e.text("s3://bucket/t");
        e.byte(1);
        e.bytes(&[1, 2, 3]);
        e.usize(2);
        let mut d = Decoder(&e.0);
        assert_eq!(d.u64().unwrap(), 7);
        assert_eq!(d.text().unwrap(), "s3://bucket/t");
        assert_eq!(d.byte().unwrap(), 1);
        assert_eq!(d.bytes().unwrap(), &[1, 2, 3]);
        // Two items of 8 bytes do not fit in the nothing left.
        assert!(d.count(8).is_err());
        assert!(d.is_done());
        let mut d = Decoder(&[0xff; 8]);
        assert!(d.count(1).is_err());
    }
}
