//! The seeded in-test version of the fuzz targets (`fuzz/`, `cargo fuzz run footer`): the
//! decode paths that read bytes from outside must give a value or an error for any input,
//! never a panic.
//!
//! - Parquet footers, page indexes and bloom filters: real files with bytes flipped, lengths
//!   rewritten and ends cut, decoded as a footer load does;
//! - the same corruptions queried end to end through an installed session, which must answer
//!   what DataFusion alone answers over the same bytes, and refuse only what DataFusion
//!   refuses (a query the caches refuse while DataFusion answers fails the test);
//! - disk-tier entries: file names with extreme numbers and random contents, half of them
//!   starting with the entries' magic bytes.
//!
//! `LAKECACHE_FUZZ_CASES` (default 2000) sets the cases of each; `LAKECACHE_FUZZ_SEED` the seed.

mod common;

use std::sync::Arc;

use common::{rows, sorted_lines};
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::fuzz::{disk_entry, parquet_footer};
use datafusion_lakecache::testkit::lake::{LakeSpec, file_bytes};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn cases() -> usize {
    std::env::var("LAKECACHE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn rng() -> (u64, SmallRng) {
    let seed = std::env::var("LAKECACHE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_261_201);
    (seed, SmallRng::seed_from_u64(seed))
}

/// `good` with one corruption in its last `tail` bytes (footer, page index, bloom filters).
fn corrupt(good: &[u8], tail: usize, rng: &mut SmallRng) -> Vec<u8> {
    let mut bad = good.to_vec();
    let from = good.len().saturating_sub(tail);
    match rng.random_range(0..4) {
        0 => {
            for _ in 0..rng.random_range(1..8) {
                let i = rng.random_range(from..bad.len());
                bad[i] ^= 1 << rng.random_range(0..8);
            }
        }
        1 => {
            // A length or offset field rewritten with a random, often huge, value.
            let i = rng.random_range(from..bad.len() - 4);
            let v: u32 = match rng.random_range(0..3) {
                0 => u32::MAX,
                1 => rng.random(),
                _ => rng.random_range(0..1024),
            };
            bad[i..i + 4].copy_from_slice(&v.to_le_bytes());
        }
        2 => bad.truncate(rng.random_range(0..bad.len())),
        _ => {
            let i = rng.random_range(from..bad.len());
            let n = rng.random_range(1..64).min(bad.len() - i);
            rng.fill(&mut bad[i..i + n]);
        }
    }
    bad
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn footers_page_indexes_and_bloom_filters_of_any_bytes_decode_or_fail() {
    let (seed, mut rng) = rng();
    let spec = LakeSpec::small_files(1).with_row_groups_of(500);
    let good = file_bytes(&spec, 0).unwrap();
    assert!(
        parquet_footer(&good, None).await.is_ok(),
        "the good file decodes"
    );
    let mut decoded = 0;
    for case in 0..cases() {
        let bad = match case % 10 {
            // Now and then, bytes that were never a Parquet file.
            9 => {
                let mut noise = vec![0u8; rng.random_range(0..4096)];
                rng.fill(&mut noise[..]);
                if noise.len() >= 4 && rng.random_bool(0.5) {
                    let n = noise.len();
                    noise[n - 4..].copy_from_slice(b"PAR1");
                }
                noise
            }
            _ => corrupt(&good, 64 << 10, &mut rng),
        };
        let hint = [None, Some(64), Some(512 << 10)][case % 3];
        let join = tokio::spawn(async move { parquet_footer(&bad, hint).await }).await;
        match join {
            Ok(Ok(())) => decoded += 1,
            Ok(Err(e)) => assert!(e.contains("fuzz.parquet"), "seed {seed}, case {case}: {e}"),
            Err(e) => panic!("seed {seed}, case {case}: the decode panicked: {e}"),
        }
    }
    common::report(
        "fuzz",
        &format!(
            "fuzz footers: seed {seed}, {} cases, {decoded} still decodable, the rest refused \
             naming the file, 0 panics",
            cases()
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_over_corrupt_index_bytes_answer_what_datafusion_answers() {
    let (seed, mut rng) = rng();
    let spec = LakeSpec::small_files(1).with_row_groups_of(500);
    let good = file_bytes(&spec, 0).unwrap();
    // Two stores per session whose e_tags are counters (each store's first write is "0"),
    // holding the same path: a corrupt file in one, in the other the good file (same size,
    // other bytes, same e_tag) or another corruption. Each table must answer what
    // DataFusion answers over its own store.
    let urls = [
        url::Url::parse("memory://one").unwrap(),
        url::Url::parse("memory://two").unwrap(),
    ];
    let lake = LakeCache::builder().build().unwrap();
    let sqls = [
        "SELECT id, name FROM t WHERE name = 'name-012345'",
        "SELECT count(*), sum(value) FROM t WHERE id BETWEEN 1200 AND 1260",
    ];
    // Answered alike; refused by both; refused by the caches while DataFusion answered.
    let (mut same, mut both_refused, mut refused_answered) = (0, 0, Vec::new());
    let (mut alike, cases) = (0, cases() / 10);
    for case in 0..cases {
        let bad = corrupt(&good, 32 << 10, &mut rng);
        let other = match bad.len() == good.len() && rng.random_bool(0.5) {
            true => good.to_vec(),
            false => corrupt(&good, 32 << 10, &mut rng),
        };
        let path = Path::from(format!("fuzz/f{case}.parquet"));
        let stores: [Arc<dyn ObjectStore>; 2] =
            [Arc::new(InMemory::new()), Arc::new(InMemory::new())];
        for (store, bytes) in stores.iter().zip([bad, other]) {
            store.put(&path, PutPayload::from(bytes)).await.unwrap();
        }
        let (one, two) = (
            stores[0].head(&path).await.unwrap(),
            stores[1].head(&path).await.unwrap(),
        );
        if (one.size, one.e_tag) == (two.size, two.e_tag) {
            alike += 1;
        }
        let builder = SessionStateBuilder::new().with_default_features();
        let cached = SessionContext::new_with_state(lake.install(builder).unwrap().build());
        for (url, store) in urls.iter().zip(&stores) {
            cached.register_object_store(url, Arc::clone(store));
        }
        let options = ParquetReadOptions::default;
        // Each on a task of its own: DataFusion's own schema inference can panic on a
        // corrupt embedded Arrow schema (arrow-ipc), for both sessions alike.
        let register = |ctx: &SessionContext, name: &'static str, table: String| {
            let ctx = ctx.clone();
            async move {
                tokio::spawn(async move { ctx.register_parquet(name, table, options()).await })
                    .await
                    .unwrap_or_else(|e| Err(DataFusionError::External(Box::new(e))))
            }
        };
        for ((name, url), store) in ["t", "u"].into_iter().zip(&urls).zip(&stores) {
            let table = format!("{url}/fuzz/");
            let alone = SessionContext::new_with_config(SessionConfig::new());
            alone.register_object_store(url, Arc::clone(store));
            let registered = (
                register(&alone, name, table.clone()).await,
                register(&cached, name, table.clone()).await,
            );
            match registered {
                (Ok(()), Ok(())) => {}
                (Err(_), Err(_)) => {
                    both_refused += sqls.len();
                    continue;
                }
                (Ok(()), Err(e)) => {
                    refused_answered.push(format!("case {case}, {url}: registration: {e}"));
                    continue;
                }
                // Nothing to compare the caches' answers with; they are checked against the
                // good file's below when DataFusion's reader refuses a query.
                (Err(_), Ok(())) => continue,
            }
            for sql in sqls {
                let sql = sql.replace("FROM t", &format!("FROM {name}"));
                let want = alone.sql(&sql).await;
                let want = match want {
                    Ok(df) => df.collect().await.and_then(|b| sorted_lines(&b)),
                    Err(e) => Err(e),
                };
                let got = tokio::spawn({
                    let (cached, sql) = (cached.clone(), sql.clone());
                    async move { rows(&cached, &sql).await }
                })
                .await
                .unwrap_or_else(|e| panic!("seed {seed}, case {case}: `{sql}` panicked: {e}"));
                match (want, got) {
                    (Ok(w), Ok(g)) => {
                        assert_eq!(g, w, "seed {seed}, case {case}, {url}: `{sql}`");
                        same += 1;
                    }
                    (Err(_), Err(_)) => both_refused += 1,
                    (Ok(_), Err(e)) => {
                        refused_answered.push(format!("case {case}, {url}: `{sql}`: {e}"))
                    }
                    (Err(e), Ok(g)) => {
                        // The caches may decode what DataFusion's own reader refuses (its
                        // footer reader is stricter about what precedes the footer); rows then
                        // must be DataFusion's over the good bytes' layout, so accept only an
                        // answer of the good file.
                        let good_answer = {
                            let good_store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
                            good_store
                                .put(&path, PutPayload::from(good.clone()))
                                .await
                                .unwrap();
                            let ctx = SessionContext::new();
                            ctx.register_object_store(url, good_store);
                            ctx.register_parquet(name, &table, options()).await.unwrap();
                            rows(&ctx, &sql).await.unwrap()
                        };
                        assert_eq!(
                            g, good_answer,
                            "seed {seed}, case {case}, {url}: `{sql}`: {e}"
                        );
                        same += 1;
                    }
                }
            }
        }
    }
    common::report(
        "fuzz",
        &format!(
            "fuzz queries: seed {seed}, {cases} corrupt files, each beside another file at the \
             same path in a second store of the session ({alike} of the same size and counter \
             e_tag); {same} answers as DataFusion's, {both_refused} refused by both, {} \
             refused by the caches that DataFusion answered, 0 panics in a cached query",
            refused_answered.len()
        ),
    );
    assert!(
        refused_answered.is_empty(),
        "seed {seed}: the caches refused what DataFusion answered: {refused_answered:#?}"
    );
}

#[test]
fn disk_entries_of_any_name_and_contents_are_served_only_when_whole() {
    let (seed, mut rng) = rng();
    // A real entry's file, as the tier writes it (through the public fuzz entry point the
    // name and contents must both hold up).
    let mut served = 0;
    for case in 0..cases() {
        let start: u64 = match rng.random_range(0..4) {
            0 => u64::MAX - rng.random_range(0..16),
            1 => rng.random(),
            _ => rng.random_range(0..1 << 20),
        };
        let len: u64 = match rng.random_range(0..3) {
            0 => u64::MAX,
            1 => 0,
            _ => rng.random_range(1..4096),
        };
        let name = format!(
            "{:016x}-{:016x}-{start}-{len}.range",
            rng.random::<u64>(),
            rng.random::<u64>()
        );
        let mut contents = vec![0u8; rng.random_range(0..256)];
        rng.fill(&mut contents[..]);
        if contents.len() >= 8 && rng.random_bool(0.5) {
            contents[..8].copy_from_slice(b"LKRANGE1");
        }
        let name = match case % 7 {
            0 => name.replace('-', ""),
            1 => format!("../{name}"),
            _ => name,
        };
        match std::panic::catch_unwind(|| disk_entry(&name, &contents)) {
            Ok(true) => served += 1,
            Ok(false) => {}
            Err(_) => panic!("seed {seed}, case {case}: {name} panicked"),
        }
    }
    assert_eq!(served, 0, "random contents never pass the checksum");
    common::report(
        "fuzz",
        &format!(
            "fuzz disk entries: seed {seed}, {} cases, none served, 0 panics",
            cases()
        ),
    );
}
