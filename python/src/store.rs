//! The object store of a table's URL and `storage_options`, made as datafusion-python's
//! `AmazonS3`, `GoogleCloud` and `MicrosoftAzure` stores make theirs: object_store's builder
//! for the URL's scheme, set from the environment first (`AWS_*`, `GOOGLE_*`, `AZURE_*`),
//! then from the options, which win.
//!
//! A key the scheme's builder does not know is an error naming it. object_store's own
//! `parse_url_opts` skips such a key, so a misspelt `aws_regoin` would be read as if it were
//! absent: the default region, or the environment's, and a request failing far from its cause.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::{ClientConfigKey, ObjectStore, ObjectStoreScheme};
use url::Url;

/// The variables of the environment every remote store's HTTP client reads.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// What a store is made from: its `storage_options`, and the variables of the environment
/// its builder and client read, so stores made from different ones are told apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StoreSettings {
    options: BTreeMap<String, String>,
    environment: BTreeMap<String, String>,
}

impl StoreSettings {
    /// The settings a store of `url` is made from: `options`, and each variable of the
    /// environment now that its scheme's builder reads.
    pub fn of(url: &Url, options: impl IntoIterator<Item = (String, String)>) -> Self {
        let prefixes: &[&str] = match ObjectStoreScheme::parse(url) {
            Ok((ObjectStoreScheme::AmazonS3, _)) => &["AWS_"],
            Ok((ObjectStoreScheme::GoogleCloudStorage, _)) => &["GOOGLE_", "SERVICE_ACCOUNT"],
            Ok((ObjectStoreScheme::MicrosoftAzure, _)) => &["AZURE_", "IDENTITY_ENDPOINT"],
            _ => &[],
        };
        // As the builders read it: variables whose name or value is not UTF-8 are skipped.
        let environment = std::env::vars_os()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
            .filter(|(name, _)| {
                prefixes.iter().any(|p| name.starts_with(p))
                    || PROXY_VARIABLES.contains(&name.as_str())
            })
            .collect();
        Self {
            options: options.into_iter().collect(),
            environment,
        }
    }

    /// The store of `url` made with these settings; `None` for a local path, which the
    /// session's registry serves. The error names the option or says why the store could
    /// not be made.
    pub fn store(&self, url: &Url) -> Result<Option<Arc<dyn ObjectStore>>, String> {
        let (scheme, _) = ObjectStoreScheme::parse(url).map_err(|e| e.to_string())?;
        let built = match scheme {
            ObjectStoreScheme::Local => {
                return match self.options.keys().next() {
                    None => Ok(None),
                    Some(key) => Err(format!(
                        "storage option {key:?} given for a local path, which takes none"
                    )),
                };
            }
            ObjectStoreScheme::AmazonS3 => self
                .configured(
                    AmazonS3Builder::from_env().with_url(url.as_str()),
                    "S3",
                    |b, k, v| b.with_config(k, v),
                )?
                .build()
                .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            ObjectStoreScheme::GoogleCloudStorage => self
                .configured(
                    GoogleCloudStorageBuilder::from_env().with_url(url.as_str()),
                    "Google Cloud Storage",
                    |b, k, v| b.with_config(k, v),
                )?
                .build()
                .map(|s| Arc::new(s) as _),
            ObjectStoreScheme::MicrosoftAzure => self
                .configured(
                    MicrosoftAzureBuilder::from_env().with_url(url.as_str()),
                    "Azure",
                    |b, k, v| b.with_config(k, v),
                )?
                .build()
                .map(|s| Arc::new(s) as _),
            ObjectStoreScheme::Http => self
                .configured(
                    HttpBuilder::new().with_url(&url[..url::Position::BeforePath]),
                    "HTTP",
                    |b, k: ClientConfigKey, v| b.with_config(k, v),
                )?
                .build()
                .map(|s| Arc::new(s) as _),
            other => return Err(format!("no store is built in for {other:?} URLs")),
        };
        built.map(Some).map_err(|e| e.to_string())
    }

    /// `builder` with each option set by `set`, its key parsed as object_store parses it
    /// (lower-cased); a key that does not parse is an error naming it and the `store`.
    fn configured<B, K: FromStr>(
        &self,
        builder: B,
        store: &str,
        set: impl Fn(B, K, String) -> B,
    ) -> Result<B, String> {
        self.options
            .iter()
            .try_fold(builder, |builder, (key, value)| {
                match key.to_ascii_lowercase().parse::<K>() {
                    Ok(key) => Ok(set(builder, key, value.clone())),
                    Err(_) => Err(format!(
                        "storage option {key:?} is not a setting of object_store's {store} store"
                    )),
                }
            })
    }
}
