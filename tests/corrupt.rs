//! Corrupt Parquet files give a clear error that names the file: no panic, no hang, no
//! allocation larger than the file (that a failed load is not cached is the index cache's
//! own test). Seeded, so every run tries the same
//! corruptions. In its own test binary because it counts allocations process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use datafusion_lakecache::fuzz::parquet_footer;
use datafusion_lakecache::testkit::lake::{LakeSpec, file_bytes};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Records the largest single allocation.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// One random corruption of `good`, aimed at the structures a reader trusts.
fn corrupt(good: &[u8], rng: &mut SmallRng, spans: &[(usize, usize)]) -> (Vec<u8>, String) {
    let mut bad = good.to_vec();
    let n = bad.len();
    let what = match rng.random_range(0..6) {
        0 => {
            bad.truncate(rng.random_range(0..n));
            "truncated"
        }
        1 => {
            let len: u32 = rng.random();
            bad[n - 8..n - 4].copy_from_slice(&len.to_le_bytes());
            "footer length"
        }
        2 => {
            let footer_len = u32::from_le_bytes(good[n - 8..n - 4].try_into().unwrap()) as usize;
            for _ in 0..rng.random_range(1..8) {
                let at = n - 8 - rng.random_range(1..=footer_len);
                bad[at] = rng.random();
            }
            "footer bytes"
        }
        3 | 4 => {
            let (start, end) = spans[rng.random_range(0..spans.len())];
            for _ in 0..rng.random_range(1..8) {
                bad[rng.random_range(start..end)] = rng.random();
            }
            "index or bloom bytes"
        }
        _ => {
            let at = rng.random_range(0..n);
            bad[at] ^= 1 << rng.random_range(0..8);
            "one bit"
        }
    };
    (bad, what.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_corruptions_give_clear_errors() {
    let spec = LakeSpec::small_files(1).with_row_groups_of(1_000);
    let good = file_bytes(&spec, 0).unwrap();
    let metadata = ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Optional)
        .parse_and_finish(&good)
        .unwrap();
    // Byte spans of page indexes and bloom filters, where corruption is aimed half the time.
    let mut spans = Vec::new();
    for c in metadata.row_groups().iter().flat_map(|rg| rg.columns()) {
        for (o, l) in [
            (c.column_index_offset(), c.column_index_length()),
            (c.offset_index_offset(), c.offset_index_length()),
            (c.bloom_filter_offset(), c.bloom_filter_length()),
        ] {
            if let (Some(o), Some(l)) = (o, l.map(i64::from)) {
                spans.push((o as usize, (o + l) as usize));
            }
        }
    }
    assert!(!spans.is_empty());

    let mut rng = SmallRng::seed_from_u64(20261129);
    let (mut failed, mut loaded) = (0, 0);
    // Per kind of corruption: (cases, refused).
    let mut kinds: std::collections::BTreeMap<String, (u32, u32)> = Default::default();
    for i in 0..1000 {
        let (bad, what) = corrupt(&good, &mut rng, &spans);
        LARGEST.store(0, Relaxed);
        let result = parquet_footer(&bad, Some(512 << 10)).await;
        let largest = LARGEST.load(Relaxed);
        let kind = kinds.entry(what.clone()).or_default();
        kind.0 += 1;
        match result {
            Ok(()) => loaded += 1,
            Err(msg) => {
                failed += 1;
                kind.1 += 1;
                assert!(
                    msg.contains("fuzz.parquet"),
                    "#{i} ({what}): error does not name the file: {msg}"
                );
            }
        }
        // The reader holds the file (at most the 512 KiB hint) and its decoded metadata;
        // no single allocation may be larger than a few times the file.
        assert!(
            largest <= 4 * good.len().max(64 << 10),
            "#{i} ({what}): allocated {largest} bytes for a {} byte file",
            bad.len()
        );
    }
    eprintln!(
        "1000 corruptions: {failed} refused with an error naming the file, {loaded} still \
         decodable; by kind (cases, refused): {kinds:?}"
    );
    // A corrupt footer is refused; a corrupt page index is left out (as DataFusion's reader
    // leaves it), so those files still decode.
    let (cases, refused) = kinds["footer bytes"];
    assert!(
        2 * refused > cases,
        "most footer corruptions are caught: {kinds:?}"
    );
}
