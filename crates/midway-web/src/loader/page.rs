//! Loading one page like a browser with an empty cache: the base document first, then the
//! objects its links name, grouped by connection key and fetched together; the page's time runs
//! from its first network action to its last body byte. Every body is verified against the site
//! description here, so a short or corrupt body is an error, never a timing.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use futures::future::try_join_all;
use tokio::time::Instant;

use super::connections::{Conn, ConnKey};
use super::response::Response;
use super::{CacheMode, ConnectionLimit, LoadResult, LoadSpec, PageTiming};
use crate::error::WebError;
use crate::site::{extract_links, fnv1a, parse_http_url, Resource, Site, SiteSpec};

/// One request to make.
#[derive(Debug, Clone)]
pub(super) struct Fetch {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) path: String,
    /// What the path names on the site (checked before the request is made).
    pub(super) resource: Resource,
    /// Connections that closed without answering anything while this request was on them.
    pub(super) failed_attempts: u32,
}

impl Fetch {
    pub(super) fn authority(&self) -> String {
        if self.port == 80 {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    pub(super) fn url(&self) -> String {
        format!("http://{}{}", self.authority(), self.path)
    }
}

/// A verified response.
pub(super) struct Fetched {
    pub(super) body: Vec<u8>,
    /// When its last byte arrived.
    pub(super) finished: Instant,
}

pub(super) struct Loader<'a> {
    pub(super) spec: &'a LoadSpec,
    pub(super) site: &'a Site,
    /// Idle persistent connections, kept across pages.
    pub(super) pool: RefCell<HashMap<ConnKey, Vec<Conn>>>,
    pub(super) connections_opened: Cell<u32>,
}

impl Loader<'_> {
    pub(super) async fn run(&self) -> Result<LoadResult, WebError> {
        let phases: &[bool] = if self.spec.cache == CacheMode::WarmHit {
            &[true, false]
        } else {
            &[false]
        };
        let mut result = LoadResult {
            pages: Vec::new(),
            connections_opened: 0,
            bytes: 0,
        };
        for &warm_up in phases {
            for page in 0..self.site.spec.pages {
                if page > 0 && !self.spec.think_time.is_zero() {
                    tokio::time::sleep(self.spec.think_time).await;
                }
                let timing = self.load_page(page).await?;
                if !warm_up {
                    result.bytes += timing.bytes;
                    result.pages.push(timing);
                }
            }
            if warm_up {
                // The measured load starts like a new browser session: the warm-up only
                // served to fill caches on the way.
                self.pool.borrow_mut().clear();
                self.connections_opened.set(0);
            }
        }
        result.connections_opened = self.connections_opened.get();
        Ok(result)
    }

    async fn load_page(&self, page: u32) -> Result<PageTiming, WebError> {
        let spec = &self.site.spec;
        let start = Instant::now();
        let base = Fetch {
            host: spec.hosts[0].to_ascii_lowercase(),
            port: self.spec.port,
            path: SiteSpec::page_path(page),
            resource: Resource::Base { page },
            failed_attempts: 0,
        };
        let base_url = base.url();
        let mut fetched = self.fetch_all(self.key_for(&base), vec![base]).await?;
        let Some(base_doc) = fetched.pop() else {
            return Err(WebError::ConnectionClosed {
                url: base_url,
                attempts: 0,
            });
        };
        let mut end = base_doc.finished;
        let mut bytes = base_doc.body.len() as u64;

        let links = extract_links(&base_doc.body);
        if links.len() != spec.objects as usize {
            return Err(WebError::ObjectCount {
                page,
                found: links.len() as u32,
                expected: spec.objects,
            });
        }
        let mut groups: Vec<(ConnKey, Vec<Fetch>)> = Vec::new();
        for link in links {
            let (host, port, path) = match parse_http_url(&link) {
                Some(parts) => parts,
                None => return Err(WebError::UnexpectedLink { page, url: link }),
            };
            let Some(resource) = self.site.resource(&host, &path) else {
                return Err(WebError::UnexpectedLink { page, url: link });
            };
            let fetch = Fetch {
                host,
                port,
                path,
                resource,
                failed_attempts: 0,
            };
            let key = self.key_for(&fetch);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, fetches)) => fetches.push(fetch),
                None => groups.push((key, vec![fetch])),
            }
        }
        let objects = spec.objects;
        let per_host = try_join_all(
            groups
                .into_iter()
                .map(|(key, fetches)| self.fetch_all(key, fetches)),
        )
        .await?;
        for done in per_host.iter().flatten() {
            end = end.max(done.finished);
            bytes += done.body.len() as u64;
        }
        Ok(PageTiming {
            page,
            seconds: end.saturating_duration_since(start).as_secs_f64(),
            bytes,
            objects,
        })
    }

    fn key_for(&self, fetch: &Fetch) -> ConnKey {
        match (self.spec.proxy, self.spec.connection_limit) {
            (Some(_), ConnectionLimit::PerServer) => ConnKey::Proxy,
            _ => ConnKey::Origin {
                host: fetch.host.clone(),
                port: fetch.port,
            },
        }
    }

    pub(super) fn expected_len(&self, fetch: &Fetch) -> u64 {
        let layout = self.site.layout;
        match fetch.resource {
            Resource::Base { .. } => layout.base_bytes,
            Resource::Object { .. } => layout.object_bytes,
        }
    }

    pub(super) fn verify(&self, fetch: &Fetch, response: Response) -> Result<Fetched, WebError> {
        if response.status != 200 {
            return Err(WebError::Status {
                url: fetch.url(),
                status: response.status,
            });
        }
        let expected = self.site.document(fetch.resource, fetch.port);
        let got_len = response.body.len() as u64;
        if got_len != expected.body.len() as u64 {
            return Err(WebError::BodyLength {
                url: fetch.url(),
                expected: expected.body.len() as u64,
                got: got_len,
            });
        }
        let got_sum = fnv1a(&response.body);
        let header_sum = response
            .sum_header
            .as_deref()
            .map(|text| u64::from_str_radix(text, 16).unwrap_or(!expected.sum));
        for got in [Some(got_sum), header_sum].into_iter().flatten() {
            if got != expected.sum {
                return Err(WebError::BodyChecksum {
                    url: fetch.url(),
                    expected: expected.sum,
                    got,
                });
            }
        }
        Ok(Fetched {
            body: response.body,
            finished: response.finished,
        })
    }
}
