use std::time::Duration;

use datafusion::common::config::ExtensionOptions;

use super::kinds::{format_bytes, format_duration};
use super::*;

#[test]
fn durations_parse_with_units() {
    let ok = |s| parse_duration("k", s).unwrap();
    assert_eq!(ok("0"), Duration::ZERO);
    assert_eq!(ok("500ms"), Duration::from_millis(500));
    assert_eq!(ok("30s"), Duration::from_secs(30));
    assert_eq!(ok("30"), Duration::from_secs(30));
    assert_eq!(ok("10m"), Duration::from_secs(600));
    assert_eq!(ok("1.5h"), Duration::from_secs(5400));
}

#[test]
fn bad_values_name_the_setting_and_the_range() {
    let mut s = Settings::default();
    for (key, value) in [
        ("lakecache.handle.capacity", "0"),
        ("lakecache.handle.capacity", "-3"),
        ("lakecache.handle.capacity", "many"),
        ("lakecache.handle.ttl", "-5s"),
        ("lakecache.handle.ttl", "ten minutes"),
        ("lakecache.handle.ttl", "5 fortnights"),
        ("lakecache.handle.list_ttl", "1e400"),
        ("lakecache.handle.idle_timeout", "-1"),
        ("lakecache.handle.max_open_files", "-1"),
        ("lakecache.index.capacity", "1.5G"),
        ("lakecache.index.capacity", "2000TiB"),
        ("lakecache.index.max_entry_percent", "0"),
        ("lakecache.prefetch.max_in_flight", "0"),
        ("lakecache.prefetch.split_size", "1KiB"),
        ("lakecache.range.memory", "1KiB"),
        ("lakecache.range.enabled", "maybe"),
    ] {
        let msg = s.set(key, value).unwrap_err().to_string();
        assert!(msg.contains(key), "{msg}");
        assert!(msg.contains(value), "{msg}");
        assert!(msg.contains("expected"), "{msg}");
    }
    assert_eq!(s, Settings::default(), "a refused value changes nothing");
}

#[test]
fn an_unknown_key_is_reported_as_unknown_with_the_known_ones() {
    let mut s = Settings::default();
    for key in [
        "lakecache.handle.nope",
        "lakecache.nope",
        "lakecache.prefetch.x",
    ] {
        let msg = s.set(key, "1").unwrap_err().to_string();
        assert!(msg.contains(&format!("unknown setting '{key}'")), "{msg}");
        assert!(msg.contains("lakecache.range.disk_dir"), "{msg}");
    }
}

#[test]
fn every_setting_reads_back_as_set_accepts_it() {
    let mut s = Settings::default();
    for setting in SETTINGS {
        let value = s.get(setting.key).unwrap();
        s.set(setting.key, &value)
            .unwrap_or_else(|e| panic!("{}: {e}", setting.key));
    }
    assert_eq!(s, Settings::default());
    for bytes in [1, 1023, 1024, 512 << 10, 256 << 20, 3 << 30, (1 << 20) + 1] {
        assert_eq!(parse_bytes("k", &format_bytes(bytes)).unwrap(), bytes);
    }
    for ms in [1, 500, 1_000, 60_000, 90_000, 3_600_000, 86_400_000] {
        let d = Duration::from_millis(ms);
        assert_eq!(parse_duration("k", &format_duration(d)).unwrap(), d);
    }
}

#[test]
fn good_values_are_applied() {
    let mut s = Settings::default();
    s.set("lakecache.handle.capacity", "5_000").unwrap();
    s.set("lakecache.handle.ttl", "0").unwrap();
    s.set("lakecache.handle.idle_timeout", "2m").unwrap();
    s.set("lakecache.handle.max_open_files", "0").unwrap();
    s.set("lakecache.index.max_entry_percent", "50").unwrap();
    s.set("lakecache.index.capacity", "1MiB").unwrap();
    s.set("lakecache.range.disk_dir", "/tmp/x").unwrap();
    assert_eq!(s.handle.capacity, 5_000);
    assert_eq!(s.handle.ttl, Duration::ZERO);
    assert_eq!(s.handle.idle_timeout, Some(Duration::from_secs(120)));
    assert_eq!(s.handle.max_open_files, 0);
    assert_eq!(s.index.max_entry_bytes(), 1 << 19);
    assert_eq!(
        s.range.disk_dir.as_deref(),
        Some(std::path::Path::new("/tmp/x"))
    );
    s.set("lakecache.range.disk_dir", "").unwrap();
    assert_eq!(s.range.disk_dir, None);
    s.validate().unwrap();
}

#[test]
fn the_budget_floor_may_not_exceed_its_cap() {
    let mut s = Settings::default();
    let msg = s
        .set("lakecache.prefetch.buffer", "1GiB")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("lakecache.prefetch.max_bytes"), "{msg}");
    let config = PrefetchConfig {
        buffer_bytes: 10,
        max_bytes: 35,
        ..PrefetchConfig::default()
    };
    assert_eq!(config.budget(2, 1, 0), 10, "never below the buffer");
    assert_eq!(config.budget(3, 5, 0), 15, "downloads x largest in between");
    assert_eq!(config.budget(64, 100, 0), 35, "never above max_bytes");
    assert_eq!(
        config.budget(2, 1, 20),
        30,
        "the bytes wanted in flight and a buffer"
    );
    let wide = PrefetchConfig {
        max_bytes: 1000,
        ..config
    };
    assert_eq!(wide.budget(64, 100, 0), 40, "never above 4 x buffer");
    assert_eq!(
        wide.budget(64, 100, 500),
        510,
        "unless that much is wanted in flight"
    );
}

#[test]
fn sessions_set_their_prefetching_and_are_refused_shared_settings() {
    let mut options = LakeOptions::new(Settings::default());
    options.set("prefetch.max_in_flight", "16").unwrap();
    assert_eq!(options.settings.prefetch.max_in_flight, 16);
    options.set("handle.capacity", "100000").unwrap();
    let msg = options.set("handle.capacity", "5").unwrap_err().to_string();
    assert!(msg.contains("LakeCache::builder().set"), "{msg}");
    let entries = options.entries();
    assert_eq!(entries.len(), SETTINGS.len());
    for e in entries {
        assert!(e.key.starts_with("lakecache."), "{}", e.key);
        assert!(e.value.is_some(), "{}", e.key);
    }
}
