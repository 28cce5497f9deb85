//! The gateway's configuration: parse the YAML (keeping every value's line
//! and column), then validate it into a [`Config`] ready to run, reporting
//! every error found. One validator serves `serve`, `validate` and reload.
//!
//! * [`schema`]: the file as written (serde, unknown keys refused);
//! * [`model`]: the validated configuration;
//! * [`validate`]: from one to the other;
//! * [`diag`]: errors with file, line, column and key;
//! * [`compat`]: the Go gateway's format of seed 002 (root key
//!   `rateLimiter:`), translated;
//! * [`tls`]: the TLS sections, their files read and checked;
//! * [`rls`]: Envoy's rate limit descriptors (`rls:`), their files read and
//!   their tree built;
//! * [`env`]: `${VAR}` from the environment, before parsing.

mod compat;
mod diag;
mod env;
mod model;
pub mod rls;
mod schema;
mod tls;
mod validate;

pub use diag::{ConfigError, ConfigErrors, parse_duration, suggest};
pub use model::*;
pub(crate) use schema::DistributionFile;
pub(crate) use validate::distribution;
pub use validate::{BODY_TIMEOUT, HEADER_TIMEOUT, MAX_BODY_SIZE, parse_size};

use diag::{Diag, parse_error};

/// Parses and validates a configuration text; `file` names it in errors.
/// `${VAR}` and `${VAR:-default}` are read from the environment first.
pub fn load(text: &str, file: &str, overrides: &Overrides) -> Result<Config, ConfigErrors> {
    let text = &env::interpolate(text, file, |name| std::env::var(name).ok())
        .map_err(ConfigErrors::from)?;
    let d = Diag::new(file);
    let is_compat = text
        .lines()
        .any(|l| l.trim_end().starts_with("rateLimiter:"));
    let config = if is_compat {
        let f: compat::CompatFile =
            serde_saphyr::from_str(text).map_err(|e| parse_error(file, text, &e))?;
        compat::translate(f, &d, overrides)
    } else {
        let f: schema::File =
            serde_saphyr::from_str(text).map_err(|e| parse_error(file, text, &e))?;
        validate::validate(f, &d, overrides)
    };
    d.finish(config)
}
