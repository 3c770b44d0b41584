//! Shared HTTP cache: RFC 9111 decisions from `http-cache-semantics`, storage here.
//!
//! Bodies live in memory up to a byte cap; least recently used ones spill to a disk directory
//! (its own cap, LRU deletion) when a disk store is configured, otherwise they are dropped.
//! The index is in memory only, so the disk store is a second tier, not a persistent cache:
//! leftover body files are deleted at start. Concurrent misses of one key are collapsed by
//! [`Cache::begin_fill`]: one leader fetches, followers wait for it and then look again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use bytes::Bytes;
use http_cache_semantics::{AfterResponse, BeforeRequest, CacheOptions, CachePolicy};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::config::CacheConfig;
use crate::error::HttpError;
use crate::metrics::HttpMetrics;

const BODY_FILE_SUFFIX: &str = ".mwbody";

enum StoredBody {
    Memory(Bytes),
    Disk { path: PathBuf, len: u64 },
}

struct Entry {
    policy: CachePolicy,
    body: StoredBody,
    last_used: u64,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    clock: u64,
    memory_bytes: u64,
    disk_bytes: u64,
    file_seq: u64,
}

/// Result of a cache lookup.
pub(crate) enum Lookup {
    /// Serve this without contacting the origin.
    Fresh {
        response: http::response::Parts,
        body: Bytes,
    },
    /// A stored response exists but must be revalidated with `request` (conditional headers
    /// added). `body` is used if the origin answers 304.
    Stale {
        request: http::request::Parts,
        policy: Box<CachePolicy>,
        body: Bytes,
    },
    /// Nothing usable is stored.
    Miss,
}

/// Outcome of trying to become the one fetcher of a key.
pub(crate) enum FillTicket {
    /// This caller fetches; dropping the guard wakes the followers.
    Leader(FillGuard),
    /// Another fetch is running; wait on this until it ends, then look up again.
    Follower(watch::Receiver<()>),
}

/// Held by the leader of a fill; dropping it releases the followers.
pub(crate) struct FillGuard {
    key: String,
    fills: std::sync::Arc<Mutex<HashMap<String, watch::Receiver<()>>>>,
    _sender: watch::Sender<()>,
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        let mut fills = self.fills.lock().unwrap_or_else(|p| p.into_inner());
        fills.remove(&self.key);
    }
}

/// The shared cache.
pub(crate) struct Cache {
    config: CacheConfig,
    options: CacheOptions,
    state: Mutex<State>,
    fills: std::sync::Arc<Mutex<HashMap<String, watch::Receiver<()>>>>,
    metrics: HttpMetrics,
}

impl Cache {
    /// Creates the cache; prepares the disk directory (removing stale body files).
    pub(crate) fn new(config: CacheConfig, metrics: HttpMetrics) -> Result<Self, HttpError> {
        if let Some(disk) = &config.disk {
            std::fs::create_dir_all(&disk.dir).map_err(HttpError::CacheDir)?;
            for entry in std::fs::read_dir(&disk.dir).map_err(HttpError::CacheDir)? {
                let path = entry.map_err(HttpError::CacheDir)?.path();
                if path.to_string_lossy().ends_with(BODY_FILE_SUFFIX) {
                    std::fs::remove_file(&path).map_err(HttpError::CacheDir)?;
                }
            }
        }
        Ok(Self {
            config,
            options: CacheOptions {
                shared: true,
                ..CacheOptions::default()
            },
            state: Mutex::new(State::default()),
            fills: Default::default(),
            metrics,
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        self.config.enabled
    }

    pub(crate) fn max_object_bytes(&self) -> u64 {
        self.config.max_object_bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Builds the policy for a fresh response (whether it may be stored is `is_storable`).
    pub(crate) fn policy_for(
        &self,
        request: &http::request::Parts,
        response: &http::response::Parts,
        response_time: SystemTime,
    ) -> CachePolicy {
        CachePolicy::new_options(request, response, response_time, self.options)
    }

    /// Looks `key` up for `request` at `now`.
    pub(crate) fn lookup(
        &self,
        key: &str,
        request: &http::request::Parts,
        now: SystemTime,
    ) -> Lookup {
        // Decide under the lock, read a disk body outside it so one slow read does not
        // stall every other lookup.
        let (decision, policy, located) = {
            let mut state = self.lock();
            state.clock += 1;
            let clock = state.clock;
            let Some(entry) = state.entries.get_mut(key) else {
                return Lookup::Miss;
            };
            entry.last_used = clock;
            let decision = entry.policy.before_request(request, now);
            let located = match &entry.body {
                StoredBody::Memory(bytes) => Ok(bytes.clone()),
                StoredBody::Disk { path, len } => Err((path.clone(), *len)),
            };
            (decision, entry.policy.clone(), located)
        };
        if matches!(decision, BeforeRequest::Stale { matches: false, .. }) {
            return Lookup::Miss;
        }
        let body = match located {
            Ok(bytes) => bytes,
            Err((path, len)) => match std::fs::read(&path) {
                Ok(data) if data.len() as u64 == len => Bytes::from(data),
                // A vanished or cut file is a miss, not an error for the client.
                _ => {
                    self.remove_if_stored_at(key, &path);
                    return Lookup::Miss;
                }
            },
        };
        match decision {
            BeforeRequest::Fresh(response) => Lookup::Fresh { response, body },
            BeforeRequest::Stale { request, .. } => Lookup::Stale {
                request,
                policy: Box::new(policy),
                body,
            },
        }
    }

    /// Drops `key` only if its body is still the file at `path` (not a newer replacement).
    fn remove_if_stored_at(&self, key: &str, path: &Path) {
        let mut state = self.lock();
        let same = state
            .entries
            .get(key)
            .is_some_and(|e| matches!(&e.body, StoredBody::Disk { path: p, .. } if p == path));
        if same {
            remove_entry(&mut state, key);
            self.metrics
                .cache_stored_bytes
                .set((state.memory_bytes + state.disk_bytes) as i64);
        }
    }

    /// Combines a revalidation answer with the stored policy.
    pub(crate) fn after_revalidation(
        &self,
        policy: &CachePolicy,
        request: &http::request::Parts,
        response: &http::response::Parts,
        now: SystemTime,
    ) -> AfterResponse {
        policy.after_response(request, response, now)
    }

    /// Replaces the policy of a stored response after a 304 (body unchanged).
    pub(crate) fn refresh(&self, key: &str, policy: CachePolicy) {
        let mut state = self.lock();
        if let Some(entry) = state.entries.get_mut(key) {
            entry.policy = policy;
        }
    }

    /// Stores a complete response body; evicts as needed.
    pub(crate) fn store(&self, key: &str, policy: CachePolicy, body: Bytes) {
        if !self.config.enabled || body.len() as u64 > self.config.max_object_bytes {
            return;
        }
        let mut state = self.lock();
        remove_entry(&mut state, key);
        state.clock += 1;
        let last_used = state.clock;
        state.memory_bytes += body.len() as u64;
        state.entries.insert(
            key.to_string(),
            Entry {
                policy,
                body: StoredBody::Memory(body),
                last_used,
            },
        );
        self.evict(&mut state, key);
        self.metrics
            .cache_stored_bytes
            .set((state.memory_bytes + state.disk_bytes) as i64);
    }

    /// Drops `key` (RFC 9111 section 4.4: unsafe methods invalidate the target URI).
    pub(crate) fn remove(&self, key: &str) {
        let mut state = self.lock();
        remove_entry(&mut state, key);
        self.metrics
            .cache_stored_bytes
            .set((state.memory_bytes + state.disk_bytes) as i64);
    }

    /// Body bytes held in memory and on disk.
    pub(crate) fn stored_bytes(&self) -> (u64, u64) {
        let state = self.lock();
        (state.memory_bytes, state.disk_bytes)
    }

    fn evict(&self, state: &mut State, keep: &str) {
        while state.memory_bytes > self.config.memory_bytes {
            let victim = state
                .entries
                .iter()
                .filter(|(k, e)| matches!(e.body, StoredBody::Memory(_)) && k.as_str() != keep)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            let Some(victim) = victim else { break };
            let spilled = self.config.disk.as_ref().and_then(|disk| {
                let entry = state.entries.get(&victim)?;
                let StoredBody::Memory(bytes) = &entry.body else {
                    return None;
                };
                state.file_seq += 1;
                let path = body_path(&disk.dir, &victim, state.file_seq);
                std::fs::write(&path, bytes).ok()?;
                Some((path, bytes.len() as u64))
            });
            // Found above under the same lock, so always present.
            let Some(entry) = state.entries.get_mut(&victim) else {
                break;
            };
            let StoredBody::Memory(bytes) = &entry.body else {
                unreachable!("victim is in memory")
            };
            state.memory_bytes -= bytes.len() as u64;
            match spilled {
                Some((path, len)) => {
                    entry.body = StoredBody::Disk { path, len };
                    state.disk_bytes += len;
                }
                None => {
                    state.entries.remove(&victim);
                }
            }
        }
        if let Some(disk) = &self.config.disk {
            while state.disk_bytes > disk.max_bytes {
                let victim = state
                    .entries
                    .iter()
                    .filter(|(_, e)| matches!(e.body, StoredBody::Disk { .. }))
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(k, _)| k.clone());
                let Some(victim) = victim else { break };
                remove_entry(state, &victim);
            }
        }
    }

    /// Becomes the single fetcher of `key`, or learns whom to wait for.
    pub(crate) fn begin_fill(&self, key: &str) -> FillTicket {
        let mut fills = self.fills.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(receiver) = fills.get(key) {
            return FillTicket::Follower(receiver.clone());
        }
        let (sender, receiver) = watch::channel(());
        fills.insert(key.to_string(), receiver);
        FillTicket::Leader(FillGuard {
            key: key.to_string(),
            fills: self.fills.clone(),
            _sender: sender,
        })
    }
}

fn remove_entry(state: &mut State, key: &str) {
    if let Some(entry) = state.entries.remove(key) {
        match entry.body {
            StoredBody::Memory(bytes) => state.memory_bytes -= bytes.len() as u64,
            StoredBody::Disk { path, len } => {
                state.disk_bytes -= len;
                // Already gone is fine; anything else leaves a file the next start removes.
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn body_path(dir: &Path, key: &str, seq: u64) -> PathBuf {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{hex}-{seq}{BODY_FILE_SUFFIX}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DiskCacheConfig;
    use std::time::Duration;

    fn request(uri: &str) -> http::request::Parts {
        http::Request::get(uri).body(()).unwrap().into_parts().0
    }

    fn response(cache_control: &str) -> http::response::Parts {
        http::Response::builder()
            .status(200)
            .header("cache-control", cache_control)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    fn config(memory: u64, disk: Option<PathBuf>) -> CacheConfig {
        CacheConfig {
            enabled: true,
            memory_bytes: memory,
            max_object_bytes: memory,
            disk: disk.map(|dir| DiskCacheConfig {
                dir,
                max_bytes: memory * 2,
            }),
        }
    }

    #[test]
    fn fresh_then_stale() {
        let cache = Cache::new(config(1000, None), HttpMetrics::default()).unwrap();
        let req = request("http://a/x");
        let res = response("max-age=60");
        let now = SystemTime::now();
        let policy = cache.policy_for(&req, &res, now);
        assert!(policy.is_storable());
        cache.store("k", policy, Bytes::from_static(b"body"));
        assert!(
            matches!(cache.lookup("k", &req, now), Lookup::Fresh { ref body, .. } if body == "body")
        );
        assert!(matches!(
            cache.lookup("k", &req, now + Duration::from_secs(120)),
            Lookup::Stale { .. }
        ));
        assert!(matches!(cache.lookup("other", &req, now), Lookup::Miss));
    }

    #[test]
    fn lru_spills_to_disk_and_disk_cap_evicts() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(
            config(100, Some(dir.path().to_path_buf())),
            HttpMetrics::default(),
        )
        .unwrap();
        let now = SystemTime::now();
        let req = request("http://a/x");
        for i in 0..5u8 {
            let policy = cache.policy_for(&req, &response("max-age=60"), now);
            cache.store(&format!("k{i}"), policy, Bytes::from(vec![i; 60]));
        }
        let (memory, disk) = cache.stored_bytes();
        assert!(memory <= 100, "memory {memory}");
        assert!(disk <= 200, "disk {disk}");
        // The newest is in memory, two older ones on disk, the oldest ones evicted.
        assert!(matches!(
            cache.lookup("k4", &req, now),
            Lookup::Fresh { .. }
        ));
        match cache.lookup("k3", &req, now) {
            Lookup::Fresh { body, .. } => assert_eq!(body, vec![3u8; 60]),
            _ => panic!("k3 should come back from disk"),
        }
        assert!(matches!(cache.lookup("k0", &req, now), Lookup::Miss));
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files as u64 * 60, cache.stored_bytes().1);
    }

    #[test]
    fn fill_lock_has_one_leader() {
        let cache = Cache::new(config(100, None), HttpMetrics::default()).unwrap();
        let leader = cache.begin_fill("k");
        assert!(matches!(leader, FillTicket::Leader(_)));
        let FillTicket::Follower(mut waiter) = cache.begin_fill("k") else {
            panic!("second must follow")
        };
        drop(leader);
        // The sender is gone: the follower's wait ends.
        assert!(futures::executor::block_on(waiter.changed()).is_err());
        assert!(matches!(cache.begin_fill("k"), FillTicket::Leader(_)));
    }
}
