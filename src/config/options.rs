//! What an installed session carries: [`LakeOptions`] (the `lakecache.*` settings for `SET`,
//! `SHOW ALL` and `information_schema.df_settings`) and the [`Installed`] marker.
//!
//! Written by hand rather than with DataFusion's `extensions_options!`, whose entries drop
//! the `lakecache.` prefix: exported session options (as Ballista ships them to executors)
//! must keep it to be read back.
//!
//! Prefetching settings belong to the session: `SET lakecache.prefetch.max_in_flight = 16`
//! changes that session's next scans. Every other setting (the caches', `lakecache.store.*`
//! and `lakecache.sql.*`) belongs to the `LakeCache` every installed session shares; they are
//! listed with their values, and a `SET` to another value is refused with the way to change
//! them, rather than silently applying to other sessions.

use std::any::Any;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::error::{DataFusionError, Result};

use super::{SETTINGS, Scope, Settings, setting};

/// The `lakecache.*` settings of one session.
#[derive(Debug, Clone)]
pub struct LakeOptions {
    /// Every setting: the shared ones as the `LakeCache` was built, this session's prefetching.
    pub settings: Settings,
}

impl LakeOptions {
    /// The options of a session whose shared settings (and prefetching defaults) are
    /// `settings`.
    pub fn new(settings: Settings) -> Self {
        Self { settings }
    }
}

impl ConfigExtension for LakeOptions {
    const PREFIX: &'static str = "lakecache";
}

impl ExtensionOptions for LakeOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    /// `key` comes without its `lakecache.` prefix, as DataFusion routes it.
    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let key = format!("{}.{key}", Self::PREFIX);
        let mut after = self.settings.clone();
        after.set(&key, value)?;
        let shared = setting(&key).is_some_and(|s| s.scope == Scope::Shared);
        if !shared {
            self.settings = after;
            return Ok(());
        }
        let now = self.settings.get(&key).unwrap_or_default();
        if after.get(&key).unwrap_or_default() == now {
            return Ok(());
        }
        Err(DataFusionError::Configuration(format!(
            "{key} is {now} for every session sharing this LakeCache and cannot be changed by \
             one of them; set it where the LakeCache is built: LakeCache::builder().set(\"{key}\", \
             \"{value}\"), the variable {} read by LakeCacheBuilder::from_env, or for the \
             lakecache tool its rc file or --set",
            super::variable_of(&key)
        )))
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        SETTINGS
            .iter()
            .map(|s| ConfigEntry {
                key: s.key.to_string(),
                value: self.settings.get(s.key),
                description: s.description,
            })
            .collect()
    }
}

/// Marks a session built by `LakeCache::install`, whose query planner rewrites the scans of
/// every final plan; `LakeTable` then leaves its scans to the planner.
#[derive(Debug, Default)]
pub struct Installed;
