//! Deep merge of TOML tables: how extra settings written by a person (a scenario's `config` and
//! `listener` tables, the benchmark's `--midway-*-extra` lines) go on top of a config a program
//! wrote. Tables merge key by key; any other value replaces the one below it; a value that is not
//! a table never replaces a table, since that would silently drop everything the program wrote
//! under it.

/// An overlay tried to replace a table with a value that is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayConflict {
    /// Dotted path of the key, from the top of the table merged into.
    pub key: String,
}

impl std::fmt::Display for OverlayConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` is a table in the generated config; the extra settings give it a plain value",
            self.key
        )
    }
}

impl std::error::Error for OverlayConflict {}

/// Merges `from` into `into`; `at` is the dotted path of `into` (empty at the top), used in
/// errors.
pub fn overlay(
    into: &mut toml::Table,
    from: &toml::Table,
    at: &str,
) -> Result<(), OverlayConflict> {
    for (key, value) in from {
        let path = if at.is_empty() {
            key.clone()
        } else {
            format!("{at}.{key}")
        };
        match (into.get_mut(key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(extra)) => {
                overlay(existing, extra, &path)?
            }
            (Some(toml::Value::Table(_)), _) => return Err(OverlayConflict { key: path }),
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().expect("valid TOML")
    }

    #[test]
    fn tables_merge_and_values_replace() {
        let mut base = table("a = 1\n[t]\nx = 1\ny = 2\n");
        overlay(&mut base, &table("a = 2\nb = 3\n[t]\ny = 5\n"), "").unwrap();
        assert_eq!(base, table("a = 2\nb = 3\n[t]\nx = 1\ny = 5\n"));
    }

    #[test]
    fn a_value_over_a_table_is_refused_with_its_path() {
        let mut base = table("[t]\n[t.u]\nx = 1\n");
        let err = overlay(&mut base, &table("[t]\nu = 3\n"), "").unwrap_err();
        assert_eq!(err.key, "t.u");
    }
}
