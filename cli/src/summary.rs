//! The line printed on stderr after each statement: what the caches did for that statement
//! (the difference of two `LakeStats` snapshots), so stdout carries results alone.

use datafusion_lakecache::LakeStats;

/// What happened between `before` and `after`, on one line.
pub fn line(before: &LakeStats, after: &LakeStats) -> String {
    let d = |f: fn(&LakeStats) -> u64| f(after).saturating_sub(f(before));
    let kib = |f: fn(&LakeStats) -> u64| d(f) >> 10;
    format!(
        "lakecache: handles {} hits / {} misses, listings {} / {}; footers {} hits / {} misses; \
         prefetch {} requests, {} KiB; bytes from memory {} KiB, disk {} KiB, store {} KiB",
        d(|s| s.handle.metadata.hits),
        d(|s| s.handle.metadata.misses),
        d(|s| s.handle.listings.hits),
        d(|s| s.handle.listings.misses),
        d(|s| s.index.footers.hits),
        d(|s| s.index.footers.misses),
        d(|s| s.prefetch.requests),
        kib(|s| s.prefetch.bytes_fetched),
        kib(|s| s.range.bytes_from_memory),
        kib(|s| s.range.bytes_from_disk),
        kib(|s| s.range.bytes_from_store),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_the_difference_not_the_totals() {
        let mut before = LakeStats::default();
        before.handle.metadata.hits = 10;
        before.range.bytes_from_memory = 4 << 10;
        let mut after = before;
        after.handle.metadata.hits = 13;
        after.range.bytes_from_memory = 6 << 10;
        let text = line(&before, &after);
        assert!(text.contains("handles 3 hits"), "{text}");
        assert!(text.contains("memory 2 KiB"), "{text}");
    }
}
