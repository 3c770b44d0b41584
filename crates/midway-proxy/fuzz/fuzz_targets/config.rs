//! Fuzzes the config loader, `midway_proxy::parse_config(text, origin)`: TOML parsing, defaults
//! and every validation stage, on text from the operator.
//!
//! The input is the text when it is UTF-8, else its lossy conversion (the loader only ever sees
//! a `&str`: `load_config` refuses a file that is not UTF-8 before parsing). Properties:
//!
//! - it never panics (nor overflows, with the debug assertions the fuzz build turns on);
//! - it returns a config, or an error whose `Display` is not empty and names the origin, as the
//!   loader promises for every error, and which is never `ConfigError::Read` (that one is
//!   `load_config`'s).
//!
//! The loader reads a `[keys.*] secret_file` whole, as told. An input whose `secret_file` is a
//! path under /dev, /proc or /sys, or anything but a regular file, is skipped: a fuzzer that
//! found /dev/zero or /dev/stdin would report the read's memory or time, not a parser bug.
//!
//! Run: `cargo fuzz run config` from crates/midway-proxy (or `scripts/fuzz-smoke`).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use midway_proxy::config::ConfigError;

const ORIGIN: &str = "fuzz-origin.toml";

/// Whether `text` gives some `[keys.*]` a `secret_file` that is not a plain file to read.
fn names_special_file(text: &str) -> bool {
    // The key is written `secret_file`, or with \u escapes in a quoted key.
    if !(text.contains("_file") || text.contains("\\u") || text.contains("\\U")) {
        return false;
    }
    let Ok(toml::Value::Table(file)) = text.parse::<toml::Value>() else {
        return false;
    };
    let Some(toml::Value::Table(keys)) = file.get("keys") else {
        return false;
    };
    keys.values()
        .filter_map(|key| key.get("secret_file")?.as_str())
        .any(|path| {
            let special = |p: &Path| ["/dev", "/proc", "/sys"].iter().any(|d| p.starts_with(d));
            let path = Path::new(path);
            special(path)
                || std::fs::canonicalize(path).is_ok_and(|real| {
                    special(&real) || !std::fs::metadata(&real).is_ok_and(|m| m.is_file())
                })
        })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if names_special_file(&text) {
        return;
    }
    if let Err(err) = midway_proxy::parse_config(&text, ORIGIN) {
        assert!(!matches!(err, ConfigError::Read { .. }), "{err:?}");
        let message = err.to_string();
        assert!(!message.is_empty());
        assert!(message.contains(ORIGIN), "{message}");
    }
});
