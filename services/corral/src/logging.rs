//! The services' logs (issue 31): every service logs through `tracing`, as text lines, or as JSON
//! lines with `CORRAL_LOG_FORMAT=json`, on stderr, at the levels `RUST_LOG` names (default
//! `info`). A run's lines carry its run id, and its lease and worker once granted
//! (`corral_api::run`); no line carries code, output or a credential.

use tracing_subscriber::EnvFilter;

/// The setting that chooses the format: `text` (the default) or `json`.
pub const LOG_FORMAT: &str = "CORRAL_LOG_FORMAT";

/// Installs the subscriber for this process, or says why the format is refused.
pub fn init() -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let format = std::env::var(LOG_FORMAT).unwrap_or_default();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format.as_str() {
        "json" => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        "" | "text" => builder.compact().try_init(),
        other => return Err(format!("{LOG_FORMAT} is text or json, not {other:?}")),
    };
    // Installed already (a test's process): the first one stands.
    let _ = installed;
    Ok(())
}
