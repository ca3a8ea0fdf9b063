//! Sorting the GETs a [`CountingStore`](super::CountingStore) logged into what they read: a
//! Parquet footer, a page index, a bloom filter, or data.

use std::collections::HashMap;
use std::ops::Range;

use object_store::GetRange;
use object_store::path::Path;
use parquet::file::metadata::ParquetMetaData;

/// What a GET of a Parquet file read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadKind {
    /// The footer: a read reaching the end of the file (or the whole file).
    Footer,
    /// Column and offset indexes.
    PageIndex,
    /// A bloom filter.
    BloomFilter,
    /// Column chunk data.
    Data,
}

/// How many GETs of each kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Footer reads.
    pub footer: u64,
    /// Page-index reads.
    pub page_index: u64,
    /// Bloom-filter reads.
    pub bloom_filter: u64,
    /// Data reads.
    pub data: u64,
}

impl ReadCounts {
    /// Footer, page-index and bloom-filter reads together.
    pub fn metadata(&self) -> u64 {
        self.footer + self.page_index + self.bloom_filter
    }
}

/// What `range` of a file of `size` bytes with `metadata` reads.
pub fn classify(metadata: &ParquetMetaData, size: u64, range: &Range<u64>) -> ReadKind {
    if range.end >= size {
        return ReadKind::Footer;
    }
    let chunks = metadata.row_groups().iter().flat_map(|rg| rg.columns());
    // The span of all column and offset indexes, as (start, end).
    let mut index = (u64::MAX, 0);
    for c in chunks {
        if c.bloom_filter_offset().and_then(|o| u64::try_from(o).ok()) == Some(range.start) {
            return ReadKind::BloomFilter;
        }
        for (offset, length) in [
            (c.column_index_offset(), c.column_index_length()),
            (c.offset_index_offset(), c.offset_index_length()),
        ] {
            if let (Some(o), Some(l)) = (offset, length) {
                let (o, l) = (o as u64, l as u64);
                index = (index.0.min(o), index.1.max(o + l));
            }
        }
    }
    if range.start >= index.0 && range.end <= index.1 {
        ReadKind::PageIndex
    } else {
        ReadKind::Data
    }
}

/// Counts logged GETs by kind; `files` gives each file's metadata and size.
pub fn count_reads(
    gets: &[(Path, Option<GetRange>)],
    files: &HashMap<Path, (std::sync::Arc<ParquetMetaData>, u64)>,
) -> ReadCounts {
    let mut counts = ReadCounts::default();
    for (path, range) in gets {
        let Some((metadata, size)) = files.get(path) else {
            continue;
        };
        let kind = match range.as_ref().map(|r| r.as_range(*size)) {
            Some(Ok(r)) => classify(metadata, *size, &r),
            _ => ReadKind::Footer,
        };
        match kind {
            ReadKind::Footer => counts.footer += 1,
            ReadKind::PageIndex => counts.page_index += 1,
            ReadKind::BloomFilter => counts.bloom_filter += 1,
            ReadKind::Data => counts.data += 1,
        }
    }
    counts
}
