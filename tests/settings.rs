//! The `lakecache.*` settings in SQL: `SET` applies or refuses with the key and the accepted
//! range, `SHOW ALL` lists every key with its description, exported options keep the prefix,
//! and a session's prefetching follows its settings.

mod common;

use common::{WORKLOAD, installed, local_backend, rows};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::LakeSpec;

/// A session built as README.md builds it (`information_schema` on, for `SHOW ALL`).
fn session(lake: &LakeCache) -> SessionContext {
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_information_schema(true));
    SessionContext::new_with_state(lake.install(builder).unwrap().build())
}

async fn set(ctx: &SessionContext, key: &str, value: &str) -> Result<(), String> {
    let sql = format!("SET {key} = '{value}'");
    match ctx.sql(&sql).await {
        Ok(df) => df.collect().await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test]
async fn a_bad_set_is_refused_with_the_key_and_the_accepted_range() {
    let lake = LakeCache::builder().build().unwrap();
    let ctx = session(&lake);
    for (key, value, expected) in [
        (
            "lakecache.prefetch.max_in_flight",
            "0",
            "an integer from 1 to 4096",
        ),
        (
            "lakecache.prefetch.max_in_flight",
            "many",
            "an integer from 1 to 4096",
        ),
        (
            "lakecache.prefetch.buffer",
            "lots",
            "a size from 1 byte to 1PiB",
        ),
        (
            "lakecache.prefetch.buffer",
            "0",
            "a size from 1 byte to 1PiB",
        ),
        (
            "lakecache.prefetch.max_bytes",
            "1KiB",
            "no smaller than lakecache.prefetch.buffer",
        ),
        (
            "lakecache.prefetch.small_file",
            "-1",
            "a size from 1 byte to 1PiB",
        ),
        (
            "lakecache.prefetch.split_size",
            "1KiB",
            "a size from 64KiB to 1PiB",
        ),
        ("lakecache.prefetch.enabled", "maybe", "true or false"),
        ("lakecache.handle.capacity", "0", "an integer from 1"),
        (
            "lakecache.handle.ttl",
            "forever",
            "a duration from 0 to 3650d",
        ),
        (
            "lakecache.index.capacity",
            "1EiB",
            "a size from 1 byte to 1PiB",
        ),
        (
            "lakecache.index.max_entry_percent",
            "101",
            "an integer from 1 to 100",
        ),
        ("lakecache.range.memory", "1KiB", "a size from 1MiB to 1PiB"),
        ("lakecache.range.enabled", "maybe", "true or false"),
        ("lakecache.prefetch.nope", "1", "unknown setting"),
        ("lakecache.nope", "1", "the lakecache settings are"),
    ] {
        let err = set(&ctx, key, value).await.expect_err(key);
        assert!(err.contains(key), "{key} = {value}: names the key: {err}");
        assert!(
            err.contains(expected),
            "{key} = {value}: says '{expected}': {err}"
        );
    }
    // A valid value for a setting shared by every session is refused, with the way to set it.
    let err = set(&ctx, "lakecache.index.capacity", "1GiB")
        .await
        .unwrap_err();
    assert!(err.contains("LakeCache::builder"), "{err}");
    // The value it already has is accepted.
    set(&ctx, "lakecache.index.capacity", "256MiB")
        .await
        .unwrap();
    // Nothing was changed by the refusals.
    let options = ctx.state().config().options().entries();
    let value = |key: &str| {
        options
            .iter()
            .find(|e| e.key == key)
            .and_then(|e| e.value.clone())
            .unwrap_or_default()
    };
    assert_eq!(value("lakecache.prefetch.max_in_flight"), "512");
    assert_eq!(value("lakecache.prefetch.buffer"), "32MiB");
}

#[tokio::test]
async fn show_all_lists_every_key_with_its_description_and_exports_keep_the_prefix() {
    let lake = LakeCache::builder()
        .list_ttl(std::time::Duration::from_secs(30))
        .build()
        .unwrap();
    let ctx = session(&lake);
    set(&ctx, "lakecache.prefetch.max_in_flight", "16")
        .await
        .unwrap();
    let lines = rows(
        &ctx,
        "SELECT name, value, description FROM information_schema.df_settings \
         WHERE name LIKE 'lakecache.%'",
    )
    .await
    .unwrap();
    let text = lines.join("\n");
    for line in [
        "lakecache.handle.list_ttl",
        "30s",
        "lakecache.prefetch.max_in_flight",
        "| 16 ",
        "lakecache.index.capacity",
        "256MiB",
        "Ceiling on one scan's downloads in flight",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    let keys = lines
        .iter()
        .filter(|l| l.starts_with("| lakecache."))
        .count();
    assert_eq!(
        keys,
        datafusion_lakecache::config::SETTINGS.len(),
        "every key:\n{text}"
    );
    // SHOW ALL runs and includes them too.
    let all = rows(&ctx, "SHOW ALL").await.unwrap().join("\n");
    assert!(all.contains("lakecache.prefetch.split_size"), "{all}");
    // Options exported from the session (as Ballista ships them) keep the prefix and read back.
    let exported = ctx.state().config().options().entries();
    let entry = exported
        .iter()
        .find(|e| e.key == "lakecache.prefetch.max_in_flight")
        .expect("exported with its prefix");
    assert_eq!(entry.value.as_deref(), Some("16"));
    let other = session(&lake);
    set(&other, &entry.key, entry.value.as_deref().unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_scans_follow_its_prefetch_settings() {
    let b = local_backend();
    b.write(&LakeSpec::small_files(24)).await;
    let sql = WORKLOAD[2];
    let session_of = |lake: LakeCache| {
        let config = SessionConfig::new().with_target_partitions(2);
        let b = &b;
        async move { installed(b, b.raw.clone(), &lake, SessionStateBuilder::new(), config).await }
    };
    // By default local files are left to the operating system's read-ahead and page cache.
    let default = LakeCache::builder().build().unwrap();
    let local = session_of(default.clone()).await;
    local.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(
        default.stats().prefetch.requests,
        0,
        "local files: no prefetch"
    );
    // A session turns it on for its own scans.
    set(&local, "lakecache.prefetch.local_files", "true")
        .await
        .unwrap();
    local.sql(sql).await.unwrap().collect().await.unwrap();
    assert!(
        default.stats().prefetch.requests > 0,
        "local files prefetched"
    );

    let lake = LakeCache::builder()
        .prefetch_local_files(true)
        .build()
        .unwrap();
    let session = || session_of(lake.clone());

    let off = session().await;
    set(&off, "lakecache.prefetch.enabled", "false")
        .await
        .unwrap();
    off.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(lake.stats().prefetch.requests, 0, "off: no prefetch");

    let narrow = session().await;
    set(&narrow, "lakecache.prefetch.max_in_flight", "2")
        .await
        .unwrap();
    narrow.sql(sql).await.unwrap().collect().await.unwrap();
    let p = lake.stats().prefetch;
    assert!(p.requests > 0, "{p:?}");
    assert!(p.peak_in_flight <= 2, "at most 2 in flight: {p:?}");

    // Another session of the same LakeCache keeps the defaults.
    let wide = session().await;
    wide.sql(sql).await.unwrap().collect().await.unwrap();
    assert!(lake.stats().prefetch.peak_in_flight > 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shared_cache_has_an_off_switch() {
    let sql = WORKLOAD[2];
    // (handle, index, range) on or off; a second run's requests and what the caches hold.
    for (handle, index, range) in [
        (true, true, true),
        (false, true, true),
        (true, false, false),
    ] {
        let b = common::memory_backend();
        b.write(&LakeSpec::small_files(4)).await;
        let lake = LakeCache::builder()
            .set("lakecache.handle.enabled", &handle.to_string())
            .set("lakecache.index.enabled", &index.to_string())
            .set("lakecache.range.enabled", &range.to_string())
            .build()
            .unwrap();
        let counted = b.counting();
        let config = SessionConfig::new().with_target_partitions(2);
        let ctx = installed(
            &b,
            counted.clone(),
            &lake,
            SessionStateBuilder::new(),
            config,
        )
        .await;
        let want = common::scan(&b, b.raw.clone(), sql).await.unwrap();
        assert_eq!(rows(&ctx, sql).await.unwrap(), want);
        counted.reset();
        assert_eq!(rows(&ctx, sql).await.unwrap(), want);
        let again = counted.counts();
        let s = lake.stats();
        let label = format!("handle {handle}, index {index}, range {range}: {again:?}");
        assert_eq!(s.handle.metadata.entries > 0, handle, "{label}");
        assert_eq!(s.index.footers.entries > 0, index, "{label}");
        // Scans read at the version they planned with, so the range cache keeps their bytes
        // with the handle cache off too.
        assert_eq!(s.range.memory_bytes > 0, range, "{label}");
        assert_eq!(again.get == 0, range, "{label}");
        // SET can name the value the LakeCache was built with, and nothing else.
        let shown = if handle { "true" } else { "false" };
        let other = if handle { "false" } else { "true" };
        ctx.sql(&format!("SET lakecache.handle.enabled = {shown}"))
            .await
            .unwrap();
        let refused = ctx
            .sql(&format!("SET lakecache.handle.enabled = {other}"))
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("lakecache.handle.enabled"),
            "{refused}"
        );
    }
}

const GENERATED_FROM: &str = "<!-- generated: the settings sections below";
const GENERATED_UNTIL: &str = "<!-- end of the generated settings sections -->";

/// The part of docs/configuration.md between its markers.
fn generated_part(page: &str) -> Option<&str> {
    let start = page.find(GENERATED_FROM)?;
    let start = start + page[start..].find("-->\n")? + "-->\n".len();
    let end = page.find(GENERATED_UNTIL)?;
    page.get(start..end)
}

/// Where `page`'s generated part differs from `reference`, naming the first differing line.
fn differences(page: &str, reference: &str) -> Option<String> {
    let Some(part) = generated_part(page) else {
        return Some("the page has no generated settings sections between markers".into());
    };
    if part == reference {
        return None;
    }
    let (n, (old, new)) = part
        .lines()
        .chain(std::iter::repeat(""))
        .zip(reference.lines().chain(std::iter::repeat("")))
        .enumerate()
        .find(|(_, (a, b))| a != b)?;
    Some(format!(
        "line {} of the generated sections differs:\n  page:     {old}\n  settings: {new}",
        n + 1
    ))
}

/// docs/configuration.md's settings sections are rendered from the settings table: a setting,
/// default, range or text changed in `setting_table!` without its doc fails here. Rewrite the
/// page's sections with `LAKECACHE_WRITE_DOCS=1 cargo test --test settings`.
#[test]
fn the_configuration_page_is_what_the_settings_table_renders() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let page = std::fs::read_to_string(path).unwrap();
    let reference = datafusion_lakecache::config::settings_reference();
    if std::env::var_os("LAKECACHE_WRITE_DOCS").is_some() {
        let part = generated_part(&page).expect("markers in docs/configuration.md");
        let at = part.as_ptr() as usize - page.as_ptr() as usize;
        let rewritten = format!("{}{reference}{}", &page[..at], &page[at + part.len()..]);
        std::fs::write(path, rewritten).unwrap();
        return;
    }
    if let Some(diff) = differences(&page, &reference) {
        panic!(
            "docs/configuration.md is not what the settings table renders; {diff}\n\
             (LAKECACHE_WRITE_DOCS=1 cargo test --test settings rewrites it)"
        );
    }
    let documented = page.matches("| `lakecache.").count();
    assert_eq!(documented, datafusion_lakecache::config::SETTINGS.len());
}

#[test]
fn a_page_whose_row_lags_the_table_is_told_apart_by_the_line() {
    let reference = "## A\n| `lakecache.a` | 1 |\n";
    let page = format!("intro\n{GENERATED_FROM} -->\n{reference}{GENERATED_UNTIL}\n");
    assert_eq!(differences(&page, reference), None);
    let lagging = page.replace("| 1 |", "| 2 |");
    let diff = differences(&lagging, reference).unwrap();
    assert!(diff.contains("line 2") && diff.contains("| 2 |"), "{diff}");
    assert!(differences("no markers", reference).is_some());
}

#[tokio::test]
async fn datafusions_statistics_cache_holds_what_the_setting_says() {
    let lake = LakeCache::builder()
        .set("lakecache.index.datafusion_statistics", "64MiB")
        .build()
        .unwrap();
    let installed = session(&lake).runtime_env();
    let own = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
        .with_cache_manager(lake.cache_manager_config())
        .build_arc()
        .unwrap();
    for runtime in [installed, own] {
        assert_eq!(
            runtime.cache_manager.get_file_statistic_cache_limit(),
            64 << 20
        );
    }
}
