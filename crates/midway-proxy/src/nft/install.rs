//! What midway installed (nftables tables, policy routing, route-knob tables) and the install
//! record that lets the next start remove it after a crash.

use std::path::{Path, PathBuf};

use midway_sys::netlink::Netlink;
use midway_tcp::{InstalledKnob, RouteKnobs};
use serde::{Deserialize, Serialize};

use super::routes::PolicyRoute;
use super::ruleset::InterceptPlan;
use super::{apply_table, delete_table, NftError};

/// File name of the install record, in the spool directory.
const INSTALL_RECORD: &str = "midway-installed.toml";

/// What one midway process installed, written as it goes so that a later start can remove it
/// after a crash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct InstallRecord {
    pid: u32,
    /// The process's start time (clock ticks after boot), so a reused pid is not taken for it.
    start_time: u64,
    tables: Vec<String>,
    /// The fwmark rules and local routes added.
    #[serde(default)]
    policy_routing: Vec<PolicyRoute>,
    /// What records written before `policy_routing` existed list instead: the arguments of the
    /// `ip` commands that delete each rule and route. Read into `policy_routing`, never written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    route_deletes: Vec<Vec<String>>,
    /// Route-knob tables and rules (`midway_tcp::RouteKnobs`), recorded as soon as installed.
    #[serde(default)]
    route_knobs: Vec<InstalledKnob>,
}

impl InstallRecord {
    fn for_this_process() -> InstallRecord {
        let pid = std::process::id();
        InstallRecord {
            pid,
            start_time: midway_sys::procfs::process_start_time(pid as i32).unwrap_or(0),
            ..InstallRecord::default()
        }
    }

    /// Whether the process that wrote the record still runs.
    fn owner_alive(&self) -> bool {
        midway_sys::procfs::process_start_time(self.pid as i32)
            .is_some_and(|start| start == self.start_time)
    }

    fn read(path: &Path) -> Result<Option<InstallRecord>, NftError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(record_error(path, e)),
        };
        let mut record: InstallRecord = toml::from_str(&text).map_err(|e| record_error(path, e))?;
        for old in std::mem::take(&mut record.route_deletes) {
            let entry = PolicyRoute::from_old_delete(&old).ok_or_else(|| {
                record_error(
                    path,
                    format!("unknown policy routing entry `ip {}`", old.join(" ")),
                )
            })?;
            record.policy_routing.push(entry);
        }
        Ok(Some(record))
    }

    /// Replaces the file at once (write to a temporary name, rename), so a crash leaves the old
    /// record or the new one, never half of one.
    fn write(&self, path: &Path) -> Result<(), NftError> {
        let text = toml::to_string(self).map_err(|e| record_error(path, e))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| record_error(path, e))?;
        }
        let temporary = path.with_extension("toml.new");
        std::fs::write(&temporary, text)
            .and_then(|()| std::fs::rename(&temporary, path))
            .map_err(|e| record_error(path, e))
    }
}

fn record_error(path: &Path, err: impl std::fmt::Display) -> NftError {
    NftError::Record {
        path: path.to_path_buf(),
        message: err.to_string(),
    }
}

/// Removes what the record at `path` lists if the midway that wrote it is gone. Returns whether
/// a live midway owns it (then nothing was touched).
fn recover(path: &Path) -> Result<bool, NftError> {
    let Some(record) = InstallRecord::read(path)? else {
        return Ok(false);
    };
    // Our own pid counts as alive: another proxy in this process (tests run several) owns it.
    if record.owner_alive() {
        return Ok(true);
    }
    let mut left = Installed {
        route_knobs: Vec::new(),
        blocked_by: None,
        tables: record.tables.clone(),
        routes: record.policy_routing.clone(),
        record: None,
    };
    tracing::warn!(
        pid = record.pid,
        tables = ?record.tables,
        rules_and_routes = record.policy_routing.len(),
        route_knob_tables = record.route_knobs.len(),
        "removing the interception a midway that did not stop cleanly left behind"
    );
    left.remove_quietly();
    if let Err(err) = RouteKnobs::remove_leftovers(&record.route_knobs) {
        tracing::warn!(error = %err, "could not remove all route-knob tables and rules left behind");
    }
    std::fs::remove_file(path).map_err(|e| record_error(path, e))?;
    Ok(false)
}

/// What midway installed and must remove at stop.
#[derive(Debug, Default)]
pub(crate) struct Installed {
    tables: Vec<String>,
    routes: Vec<PolicyRoute>,
    /// Route-knob tables and rules, recorded here; `RouteKnobs` installs and removes them.
    route_knobs: Vec<InstalledKnob>,
    /// A live midway (this pid) owns the record in this directory: nothing may be installed.
    blocked_by: Option<u32>,
    /// Where the install record is kept (None: nothing recorded, e.g. a crash's leftovers
    /// being removed).
    record: Option<(PathBuf, InstallRecord)>,
}

impl Installed {
    /// The start of a proxy's interception, before anything is installed: removes what a
    /// crashed midway recorded in `record_dir`, and keeps the record path for every later step.
    ///
    /// With `take_over_from` (a binary upgrade, the pid of the running midway that handed its
    /// listeners over), what that midway's record lists becomes this process's instead; the
    /// first [`Installed::update`] then replaces each table in one `nft` transaction and keeps
    /// the routes already there, so interception never pauses.
    pub(crate) fn begin(
        record_dir: &Path,
        take_over_from: Option<u32>,
    ) -> Result<Installed, NftError> {
        let record_path = record_dir.join(INSTALL_RECORD);
        if let Some(pid) = take_over_from {
            return Installed::adopt(&record_path, pid);
        }
        let blocked_by = if recover(&record_path)? {
            Some(InstallRecord::read(&record_path)?.map_or(0, |r| r.pid))
        } else {
            None
        };
        Ok(Installed {
            tables: Vec::new(),
            routes: Vec::new(),
            route_knobs: Vec::new(),
            blocked_by,
            record: Some((record_path, InstallRecord::for_this_process())),
        })
    }

    /// Records the route-knob tables and rules just installed, before anything else happens.
    pub(crate) fn record_route_knobs(&mut self, knobs: Vec<InstalledKnob>) -> Result<(), NftError> {
        self.check_not_blocked()?;
        self.route_knobs = knobs;
        self.write_record()
    }

    fn check_not_blocked(&self) -> Result<(), NftError> {
        match (self.blocked_by, &self.record) {
            (Some(pid), Some((path, _))) => Err(NftError::OwnedByRunning {
                pid,
                path: path.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// What the running midway `pid` recorded in `record_path`, now owned (and recorded) by
    /// this process. No record: that midway had installed nothing.
    fn adopt(record_path: &Path, pid: u32) -> Result<Installed, NftError> {
        let mut installed = Installed {
            tables: Vec::new(),
            routes: Vec::new(),
            route_knobs: Vec::new(),
            blocked_by: None,
            record: Some((record_path.to_path_buf(), InstallRecord::for_this_process())),
        };
        if let Some(record) = InstallRecord::read(record_path)? {
            if record.pid != pid {
                return Err(record_error(
                    record_path,
                    format!(
                        "written by pid {}, not by the midway handing over (pid {pid})",
                        record.pid
                    ),
                ));
            }
            installed.tables = record.tables;
            installed.routes = record.policy_routing;
        }
        Ok(installed)
    }

    /// Makes what is installed match `plan` (a start, a reload, a take-over): every managed
    /// table is (re)written in one transaction each, tables and routes the plan no longer has
    /// are removed, missing routes are added. The record follows each step.
    pub(crate) fn update(&mut self, plan: &InterceptPlan) -> Result<(), NftError> {
        if plan.manages_anything() {
            self.check_not_blocked()?;
        }
        let planned_tables: Vec<&String> = plan
            .tables
            .iter()
            .filter(|(_, _, manage)| *manage)
            .map(|(name, _, _)| name)
            .collect();
        for (name, script, manage) in &plan.tables {
            if !manage {
                continue;
            }
            apply_table(script)?;
            if !self.tables.contains(name) {
                self.tables.push(name.clone());
                self.write_record()?;
            }
        }
        let stale: Vec<String> = self
            .tables
            .iter()
            .filter(|name| !planned_tables.contains(name))
            .cloned()
            .collect();
        for table in stale {
            delete_table(&table)?;
            self.tables.retain(|t| *t != table);
            self.write_record()?;
        }

        let planned_routes: Vec<PolicyRoute> = plan
            .routes
            .iter()
            .filter(|(_, manage)| *manage)
            .map(|(entry, _)| *entry)
            .collect();
        let missing: Vec<PolicyRoute> = planned_routes
            .iter()
            .filter(|entry| !self.routes.contains(entry))
            .copied()
            .collect();
        let stale: Vec<PolicyRoute> = self
            .routes
            .iter()
            .filter(|owned| !planned_routes.contains(owned))
            .copied()
            .collect();
        if !missing.is_empty() || !stale.is_empty() {
            let mut netlink = Netlink::open()?;
            for entry in missing {
                match entry.add(&mut netlink) {
                    Ok(()) => {
                        self.routes.push(entry);
                        self.write_record()?;
                    }
                    // Someone else's identical rule or route: use it, and leave it in place at
                    // stop.
                    Err(err) if err.is_exists() => {
                        tracing::info!(command = %entry, "policy routing already present; not owned by midway");
                    }
                    Err(err) => return Err(err.into()),
                }
            }
            for entry in stale {
                entry.delete(&mut netlink)?;
                self.routes.retain(|owned| *owned != entry);
                self.write_record()?;
            }
        }
        // A take-over that changed nothing still has to put this process's pid in the record.
        if self.is_empty() && self.route_knobs.is_empty() {
            if let Some((path, _)) = &self.record {
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(record_error(path, e)),
                }
            }
            Ok(())
        } else {
            self.write_record()
        }
    }

    /// Forgets what is installed without removing it: another midway owns it now (this one
    /// handed over), or still does (a take-over that failed).
    pub(crate) fn disown(&mut self) {
        self.tables.clear();
        self.routes.clear();
        self.route_knobs.clear();
        self.record = None;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tables.is_empty() && self.routes.is_empty()
    }

    /// The nftables tables midway installed.
    pub(crate) fn tables(&self) -> &[String] {
        &self.tables
    }

    /// Writes what is installed so far to the install record, before anything else happens.
    fn write_record(&mut self) -> Result<(), NftError> {
        let Some((path, record)) = &mut self.record else {
            return Ok(());
        };
        record.tables = self.tables.clone();
        record.policy_routing = self.routes.clone();
        record.route_knobs = self.route_knobs.clone();
        record.write(path)
    }

    /// Removes what was installed, then the install record; failures are logged (this runs
    /// during shutdown).
    pub(crate) fn remove(&mut self) {
        self.remove_with(|what, err| tracing::warn!(error = %err, "could not remove {what}"));
        if let Some((path, _)) = self.record.take() {
            // Absent is fine: a process that took over with nothing installed inherited a
            // record the old one removed when it let go.
            let result = std::fs::remove_file(&path);
            if let Err(err) = result.or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            }) {
                tracing::warn!(error = %err, path = %path.display(), "could not remove the install record");
            }
        }
    }

    /// Removes a crash's leftovers: some may already be gone (removed by hand, or the crash came
    /// between an add and its record), which is not worth a warning each.
    fn remove_quietly(&mut self) {
        self.remove_with(|what, err| tracing::debug!(error = %err, "{what} already gone"));
    }

    fn remove_with(&mut self, on_error: impl Fn(&str, NftError)) {
        if !self.routes.is_empty() {
            match Netlink::open() {
                Ok(mut netlink) => {
                    for entry in self.routes.drain(..).rev() {
                        if let Err(err) = entry.delete(&mut netlink) {
                            on_error("policy routing", err.into());
                        }
                    }
                }
                Err(err) => {
                    self.routes.clear();
                    on_error("policy routing", err.into());
                }
            }
        }
        for table in self.tables.drain(..).rev() {
            if let Err(err) = delete_table(&table) {
                on_error("nftables table", err);
            }
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if !self.is_empty() {
            self.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::routes::IpFamily;
    use super::*;

    /// A record as the version that kept `ip` delete commands wrote it.
    const OLD_RECORD: &str = r#"
pid = 4242
start_time = 99
tables = ["midway"]
route_deletes = [
    ["-4", "rule", "del", "fwmark", "1", "lookup", "100"],
    ["-4", "route", "del", "local", "0.0.0.0/0", "dev", "lo", "table", "100"],
    ["-6", "rule", "del", "fwmark", "1", "lookup", "100"],
    ["-6", "route", "del", "local", "::/0", "dev", "lo", "table", "100"],
]
"#;

    #[test]
    fn a_record_of_the_old_version_reads_as_the_typed_form() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(INSTALL_RECORD);
        std::fs::write(&path, OLD_RECORD).unwrap();
        let record = InstallRecord::read(&path).unwrap().unwrap();
        let mut expected = PolicyRoute::pair(IpFamily::Ipv4, 1, 100).to_vec();
        expected.extend(PolicyRoute::pair(IpFamily::Ipv6, 1, 100));
        assert_eq!(record.policy_routing, expected);
        assert!(record.route_deletes.is_empty());
        assert_eq!(record.tables, ["midway"]);

        // Written again, it keeps only the typed form, which reads back the same.
        record.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("route_deletes"), "{text}");
        assert!(text.contains("kind = \"local_route\""), "{text}");
        assert_eq!(InstallRecord::read(&path).unwrap(), Some(record));
    }

    #[test]
    fn an_unknown_old_entry_is_a_record_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(INSTALL_RECORD);
        let text = OLD_RECORD.replace("\"rule\", \"del\"", "\"rule\", \"flush\"");
        std::fs::write(&path, text).unwrap();
        let error = InstallRecord::read(&path).unwrap_err();
        assert!(matches!(error, NftError::Record { .. }), "{error}");
    }
}
