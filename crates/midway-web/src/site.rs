//! What the origin serves, derived purely from a [`SiteSpec`]: page layout, deterministic
//! bodies, checksums, and the link syntax the loader parses. No I/O and no clock here, so the
//! origin and the loader compute the very same bytes and tests can check them exactly.
//!
//! A page is a base document `/page/{i}.html` on `hosts[0]` plus `objects` embedded objects
//! `/obj/{i}/{j}`, spread round-robin over `hosts[1..=object_hosts]` (or all on `hosts[0]`).
//! Sizes follow the satellite paper's Table VII files: the page's total (`page_bytes`) is split
//! into `objects + 1` equal bodies, the base document taking the remainder, so "65 KB with 19
//! objects" is 20 bodies of 3250 bytes. When that share is too small to hold the base
//! document's HTML (many objects on a tiny page), the base document gets the size its HTML
//! needs and the objects share the rest; the page total stays exact either way.
//!
//! Objects are small valid GIF images whose filler sits in a GIF comment, so a real browser
//! downloads them completely (an undecodable image would make it cancel the download early)
//! and only knows the image is complete at its last byte. The base document carries a tiny
//! inline script that writes the browser's page load time into the title, counted in the page
//! bytes like everything else.

use crate::error::WebError;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;
use std::time::Duration;

/// Apache's default `KeepAliveTimeout` (the umts paper's servers).
pub const APACHE_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(15);
/// Apache's default `MaxKeepAliveRequests`.
pub const APACHE_MAX_KEEPALIVE_REQUESTS: u32 = 100;

/// Header carrying the body's checksum (FNV-1a 64, 16 lowercase hex digits).
pub(crate) const SUM_HEADER: &str = "x-midway-sum";
/// Title prefix the inline script writes, followed by the load time in milliseconds.
pub(crate) const TIMING_TITLE_PREFIX: &str = "midway-plt:";

/// The inline script: at the load event it writes navigation start -> load event end (ms) into
/// the title. It first writes `performance.now()` (= load event start) in case the page is
/// dumped before the timer runs, then the exact `loadEventEnd`, which is only set once the
/// load handlers have returned.
const TIMING_SCRIPT: &str = "<script>onload=function(){var p=performance,s=function(v){document.title='midway-plt:'+v};s(p.now());setTimeout(function(){var n=p.getEntriesByType('navigation')[0];if(n&&n.loadEventEnd>0)s(n.loadEventEnd)})}</script>";

/// Port suffix assumed when sizing the base document, so the layout does not depend on the
/// port the page is fetched on (links carry the port when it is not 80).
const WORST_PORT_SUFFIX: &str = ":65535";

/// Smallest GIF image (1x1, two-colour table), without the comment that pads it.
const GIF_HEAD: [u8; 19] = [
    b'G', b'I', b'F', b'8', b'9', b'a', // signature
    0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, // logical screen: 1x1, global colour table of 2
    0x00, 0x00, 0x00, 0xff, 0xff, 0xff, // colour table: black, white
];
const GIF_TAIL: [u8; 16] = [
    0x2c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, // image descriptor 1x1
    0x02, 0x02, 0x44, 0x01, 0x00, // LZW minimum code size 2, one data block, terminator
    0x3b, // trailer
];
/// Smallest object body.
pub(crate) const MIN_OBJECT_BYTES: u64 = (GIF_HEAD.len() + GIF_TAIL.len()) as u64;

/// What the origin serves, derived purely from the workload description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteSpec {
    /// Host names the origin answers for, e.g. `["www.lab", "s1.lab", "s2.lab"]`.
    pub hosts: Vec<String>,
    /// Number of distinct pages (page i = `/page/{i}.html` on `hosts[0]`).
    pub pages: u32,
    /// Total body bytes of one page: base document + all its objects.
    pub page_bytes: u64,
    /// Embedded objects per page.
    pub objects: u32,
    /// Objects spread round-robin over `hosts[1..=object_hosts]` (0 = all on `hosts[0]`).
    pub object_hosts: u32,
    /// `Cache-Control: max-age` the origin sends (`None` = `no-cache`); ETag and
    /// Last-Modified are always sent.
    pub cache_max_age: Option<u32>,
    /// The origin closes a persistent connection idle for this long (Apache: 15 s).
    pub keepalive_timeout: Duration,
    /// The origin closes a persistent connection after this many requests (Apache: 100).
    pub max_keepalive_requests: u32,
}

/// Body sizes of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLayout {
    /// Bytes of the base document.
    pub base_bytes: u64,
    /// Bytes of each embedded object.
    pub object_bytes: u64,
}

/// One body the origin serves, with everything a response needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Document {
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// FNV-1a 64 of `body`.
    pub sum: u64,
}

/// What a path names within a site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    Base { page: u32 },
    Object { page: u32, index: u32 },
}

impl SiteSpec {
    /// Checks the description and computes the body sizes of a page.
    pub fn layout(&self) -> Result<PageLayout, WebError> {
        let invalid = |field, problem: String| WebError::InvalidSite { field, problem };
        if self.hosts.is_empty() {
            return Err(invalid(
                "hosts",
                "is empty; give at least one host name".into(),
            ));
        }
        for (i, host) in self.hosts.iter().enumerate() {
            let clean = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
            if !clean {
                return Err(invalid(
                    "hosts",
                    format!("entry {host:?} is not a host name (letters, digits, '.', '-')"),
                ));
            }
            if self.hosts[..i].iter().any(|h| h.eq_ignore_ascii_case(host)) {
                return Err(invalid("hosts", format!("lists {host:?} twice")));
            }
        }
        if self.pages == 0 {
            return Err(invalid(
                "pages",
                "is 0; a site needs at least one page".into(),
            ));
        }
        if self.object_hosts as usize > self.hosts.len() - 1 {
            return Err(invalid(
                "object_hosts",
                format!(
                    "is {} but only {} host names follow hosts[0]; add hosts or lower it",
                    self.object_hosts,
                    self.hosts.len() - 1
                ),
            ));
        }
        if self.max_keepalive_requests == 0 {
            return Err(invalid(
                "max_keepalive_requests",
                "is 0; use 1 to serve one request per connection".into(),
            ));
        }
        let min_base = self.base_html_len(self.pages - 1, WORST_PORT_SUFFIX);
        if self.page_bytes < min_base {
            return Err(invalid(
                "page_bytes",
                format!(
                    "is {} but the base document's HTML alone needs {min_base} bytes",
                    self.page_bytes
                ),
            ));
        }
        if self.objects == 0 {
            return Ok(PageLayout {
                base_bytes: self.page_bytes,
                object_bytes: 0,
            });
        }
        let objects = u64::from(self.objects);
        let equal_share = self.page_bytes / (objects + 1);
        let object_bytes = if equal_share >= min_base {
            equal_share
        } else {
            (self.page_bytes - min_base) / objects
        };
        if object_bytes < MIN_OBJECT_BYTES {
            return Err(invalid(
                "page_bytes",
                format!(
                    "is {} which leaves {object_bytes} bytes per object; an object needs at least \
                     {MIN_OBJECT_BYTES} (raise page_bytes or lower objects)",
                    self.page_bytes
                ),
            ));
        }
        Ok(PageLayout {
            base_bytes: self.page_bytes - objects * object_bytes,
            object_bytes,
        })
    }

    /// Path of page `page`'s base document (on `hosts[0]`).
    pub fn page_path(page: u32) -> String {
        format!("/page/{page}.html")
    }

    /// Path of object `index` of page `page`.
    pub fn object_path(page: u32, index: u32) -> String {
        format!("/obj/{page}/{index}")
    }

    /// Host serving object `index` (of any page).
    pub fn object_host(&self, index: u32) -> &str {
        if self.object_hosts == 0 {
            &self.hosts[0]
        } else {
            &self.hosts[1 + (index % self.object_hosts) as usize]
        }
    }

    /// Length of the base document's HTML without padding.
    fn base_html_len(&self, page: u32, port_suffix: &str) -> u64 {
        self.base_html(page, port_suffix).len() as u64
    }

    /// The base document's HTML without padding: the head with the timing script, one image
    /// tag per object; the padding goes before [`HTML_END`].
    fn base_html(&self, page: u32, port_suffix: &str) -> String {
        let mut html = format!(
            "<!DOCTYPE html>\n<html><head><title>midway page {page}</title>\n{TIMING_SCRIPT}\n\
             </head><body>\n"
        );
        for index in 0..self.objects {
            html.push_str(&format!(
                "<img src=\"http://{}{port_suffix}{}\">\n",
                self.object_host(index),
                Self::object_path(page, index)
            ));
        }
        html.push_str(HTML_END);
        html
    }
}

const HTML_END: &str = "</body></html>\n";

/// A validated site: the spec plus its layout. Shared by origin and loader.
#[derive(Debug, Clone)]
pub(crate) struct Site {
    pub spec: SiteSpec,
    pub layout: PageLayout,
}

impl Site {
    pub(crate) fn new(spec: SiteSpec) -> Result<Site, WebError> {
        let layout = spec.layout()?;
        Ok(Site { spec, layout })
    }

    /// What `path` on `host` names, if anything.
    pub(crate) fn resource(&self, host: &str, path: &str) -> Option<Resource> {
        if let Some(rest) = path.strip_prefix("/page/") {
            let page = parse_index(rest.strip_suffix(".html")?)?;
            let on_host = self.spec.hosts[0].eq_ignore_ascii_case(host);
            return (on_host && page < self.spec.pages).then_some(Resource::Base { page });
        }
        let rest = path.strip_prefix("/obj/")?;
        let (page, index) = rest.split_once('/')?;
        let (page, index) = (parse_index(page)?, parse_index(index)?);
        let valid = page < self.spec.pages
            && index < self.spec.objects
            && self.spec.object_host(index).eq_ignore_ascii_case(host);
        valid.then_some(Resource::Object { page, index })
    }

    /// Whether the site answers for `host`.
    pub(crate) fn has_host(&self, host: &str) -> bool {
        self.spec.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    /// The body of `resource` as fetched on `port` (links in a base document carry the port
    /// unless it is 80).
    pub(crate) fn document(&self, resource: Resource, port: u16) -> Document {
        match resource {
            Resource::Base { page } => {
                let suffix = if port == 80 {
                    String::new()
                } else {
                    format!(":{port}")
                };
                let body = self.base_document(page, &suffix);
                Document {
                    content_type: "text/html; charset=utf-8",
                    sum: fnv1a(&body),
                    body,
                }
            }
            Resource::Object { page, index } => {
                let body = gif_object(
                    self.layout.object_bytes,
                    seed_of(&SiteSpec::object_path(page, index)),
                );
                Document {
                    content_type: "image/gif",
                    sum: fnv1a(&body),
                    body,
                }
            }
        }
    }

    fn base_document(&self, page: u32, port_suffix: &str) -> Vec<u8> {
        let html = self.spec.base_html(page, port_suffix);
        let head = &html[..html.len() - HTML_END.len()];
        // `layout` guarantees the HTML fits: it was sized with the longest port suffix.
        let pad = (self.layout.base_bytes as usize).saturating_sub(html.len());
        let mut body = Vec::with_capacity(self.layout.base_bytes as usize);
        body.extend_from_slice(head.as_bytes());
        if pad >= 7 {
            body.extend_from_slice(b"<!--");
            fill_text(&mut body, pad - 7, seed_of(&SiteSpec::page_path(page)));
            body.extend_from_slice(b"-->");
        } else {
            body.resize(body.len() + pad, b'\n');
        }
        body.extend_from_slice(HTML_END.as_bytes());
        body
    }
}

fn parse_index(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A GIF of exactly `size` bytes (`size >= MIN_OBJECT_BYTES`), padded with a comment
/// extension of text derived from `seed`.
fn gif_object(size: u64, seed: u64) -> Vec<u8> {
    let size = size as usize;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&GIF_HEAD);
    let extra = size.saturating_sub(GIF_HEAD.len() + GIF_TAIL.len());
    // A comment extension costs 3 bytes (introducer, label, terminator) plus sub-blocks of
    // 2..=256 bytes (length byte + data). 1, 2 or 4 extra bytes cannot be a comment; they go
    // after the trailer, where decoders ignore them.
    let (comment, trailing) = match extra {
        0 | 1 | 2 | 4 => (None, extra),
        n => (Some(n - 3), 0),
    };
    if let Some(mut block_bytes) = comment {
        out.extend_from_slice(&[0x21, 0xfe]);
        let mut rng = FillerText::new(seed);
        while block_bytes > 0 {
            let take = if block_bytes <= 256 {
                block_bytes
            } else if block_bytes - 256 >= 2 {
                256
            } else {
                255
            };
            out.push((take - 1) as u8);
            rng.fill_text(&mut out, take - 1);
            block_bytes -= take;
        }
        out.push(0x00);
    }
    out.extend_from_slice(&GIF_TAIL);
    out.resize(out.len() + trailing, 0);
    out
}

fn fill_text(out: &mut Vec<u8>, len: usize, seed: u64) {
    FillerText::new(seed).fill_text(out, len);
}

/// Seed of a path's filler bytes.
fn seed_of(path: &str) -> u64 {
    fnv1a(path.as_bytes())
}

/// FNV-1a 64: tiny, dependency-free, and enough to catch corrupted or misplaced bytes.
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in data {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Filler text from a seeded splitmix64 (rand_xoshiro's, the generator the lab's seeds and the
/// fault campaign use too): the same bytes for a path on every run.
struct FillerText(SplitMix64);

impl FillerText {
    fn new(seed: u64) -> FillerText {
        FillerText(SplitMix64::seed_from_u64(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Appends `len` characters from a 32-letter alphabet without '-', '<' or '>' (safe
    /// inside an HTML comment).
    fn fill_text(&mut self, out: &mut Vec<u8>, len: usize) {
        const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz 01234";
        let mut left = len;
        while left > 0 {
            let mut word = self.next();
            for _ in 0..left.min(12) {
                out.push(ALPHABET[(word & 31) as usize]);
                word >>= 5;
            }
            left -= left.min(12);
        }
    }
}

/// The values of every `src="..."` attribute of an HTML document, in order.
pub(crate) fn extract_links(html: &[u8]) -> Vec<String> {
    const MARK: &[u8] = b"src=\"";
    let mut links = Vec::new();
    let mut at = 0;
    while let Some(offset) = find(&html[at..], MARK) {
        let start = at + offset + MARK.len();
        let Some(len) = html[start..].iter().position(|&b| b == b'"') else {
            break;
        };
        links.push(String::from_utf8_lossy(&html[start..start + len]).into_owned());
        at = start + len + 1;
    }
    links
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// An `http://host[:port]/path` URL split into (lowercase host, port, path).
pub(crate) fn parse_http_url(url: &str) -> Option<(String, u16, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
    let (host, port) = split_authority(authority)?;
    Some((host, port, path.to_string()))
}

/// `host[:port]` into (lowercase host, port; 80 when absent).
pub(crate) fn split_authority(authority: &str) -> Option<(String, u16)> {
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()?),
        None => (authority, 80),
    };
    if host.is_empty() {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(page_bytes: u64, objects: u32) -> SiteSpec {
        SiteSpec {
            hosts: vec!["www.lab".into(), "s1.lab".into(), "s2.lab".into()],
            pages: 2,
            page_bytes,
            objects,
            object_hosts: 2,
            cache_max_age: Some(3600),
            keepalive_timeout: APACHE_KEEPALIVE_TIMEOUT,
            max_keepalive_requests: APACHE_MAX_KEEPALIVE_REQUESTS,
        }
    }

    #[test]
    fn table_vii_page_of_65_kb_with_19_objects_is_20_bodies_of_3250_bytes() {
        let layout = spec(65_000, 19).layout().unwrap();
        assert_eq!(
            layout,
            PageLayout {
                base_bytes: 3250,
                object_bytes: 3250
            }
        );
    }

    #[test]
    fn remainder_goes_to_the_base_document() {
        let layout = spec(65_003, 19).layout().unwrap();
        assert_eq!(layout.object_bytes, 3250);
        assert_eq!(layout.base_bytes, 3253);
        let layout = spec(11_000, 0).layout().unwrap();
        assert_eq!(layout.base_bytes, 11_000);
    }

    #[test]
    fn base_document_keeps_its_html_when_the_equal_share_is_too_small() {
        // 16 KB with 18 objects: an equal share (842 bytes) cannot hold 18 image tags + script.
        let site = spec(16_000, 18);
        let layout = site.layout().unwrap();
        let min = site.base_html_len(1, WORST_PORT_SUFFIX);
        assert!(min > 16_000 / 19, "test premise: HTML {min} fits the share");
        assert!(layout.base_bytes >= min);
        assert_eq!(layout.base_bytes + 18 * layout.object_bytes, 16_000);
    }

    #[test]
    fn bodies_have_exact_sizes_and_the_page_total_is_exact() {
        for (bytes, objects) in [(65_000, 19), (16_000, 18), (2_500, 0), (180_000, 23)] {
            let site = Site::new(spec(bytes, objects)).unwrap();
            for port in [80, 8080, 65535] {
                let base = site.document(Resource::Base { page: 1 }, port);
                let mut total = base.body.len() as u64;
                for index in 0..objects {
                    let object = site.document(Resource::Object { page: 1, index }, port);
                    assert_eq!(object.sum, fnv1a(&object.body));
                    total += object.body.len() as u64;
                }
                assert_eq!(
                    total, bytes,
                    "{bytes} bytes / {objects} objects, port {port}"
                );
            }
        }
    }

    #[test]
    fn gif_objects_are_well_formed_for_every_small_size() {
        for size in MIN_OBJECT_BYTES..MIN_OBJECT_BYTES + 600 {
            let gif = gif_object(size, 7);
            assert_eq!(gif.len() as u64, size);
            assert!(gif.starts_with(b"GIF89a"));
            // Walk the blocks like a decoder: comment sub-blocks must end exactly at the image.
            let mut at = GIF_HEAD.len();
            if gif[at] == 0x21 {
                assert_eq!(gif[at + 1], 0xfe);
                at += 2;
                while gif[at] != 0 {
                    at += 1 + gif[at] as usize;
                }
                at += 1;
            }
            assert_eq!(&gif[at..at + GIF_TAIL.len()], &GIF_TAIL, "size {size}");
        }
    }

    #[test]
    fn bodies_are_deterministic_per_path_and_differ_between_paths() {
        let site = Site::new(spec(65_000, 19)).unwrap();
        let a = site.document(Resource::Object { page: 0, index: 3 }, 80);
        let again = site.document(Resource::Object { page: 0, index: 3 }, 80);
        let other = site.document(Resource::Object { page: 1, index: 3 }, 80);
        assert_eq!(a, again);
        assert_ne!(a.sum, other.sum);
    }

    #[test]
    fn base_document_links_every_object_on_its_host() {
        let site = Site::new(spec(65_000, 5)).unwrap();
        let base = site.document(Resource::Base { page: 1 }, 8080);
        let links = extract_links(&base.body);
        let expected: Vec<String> = (0..5)
            .map(|j| {
                format!(
                    "http://{}:8080{}",
                    site.spec.object_host(j),
                    SiteSpec::object_path(1, j)
                )
            })
            .collect();
        assert_eq!(links, expected);
        assert_eq!(site.spec.object_host(0), "s1.lab");
        assert_eq!(site.spec.object_host(1), "s2.lab");
        let text = String::from_utf8(base.body).unwrap();
        assert!(text.contains(TIMING_SCRIPT));
        assert!(!text[text.find("<!--").unwrap() + 4..text.rfind("-->").unwrap()].contains("--"));
    }

    #[test]
    fn paths_resolve_only_on_their_host() {
        let site = Site::new(spec(65_000, 5)).unwrap();
        assert_eq!(
            site.resource("www.lab", "/page/1.html"),
            Some(Resource::Base { page: 1 })
        );
        assert_eq!(site.resource("s1.lab", "/page/1.html"), None);
        assert_eq!(site.resource("www.lab", "/page/2.html"), None);
        assert_eq!(
            site.resource("S2.lab", "/obj/0/1"),
            Some(Resource::Object { page: 0, index: 1 })
        );
        assert_eq!(site.resource("s1.lab", "/obj/0/1"), None);
        assert_eq!(site.resource("s1.lab", "/obj/0/5"), None);
        assert_eq!(site.resource("www.lab", "/favicon.ico"), None);
        assert_eq!(site.resource("www.lab", "/page/+1.html"), None);
    }

    #[test]
    fn invalid_sites_are_refused_with_the_field_named() {
        let field_of = |s: SiteSpec| match s.layout() {
            Err(WebError::InvalidSite { field, .. }) => field,
            other => panic!("expected an invalid site, got {other:?}"),
        };
        assert_eq!(
            field_of(SiteSpec {
                hosts: vec![],
                ..spec(65_000, 1)
            }),
            "hosts"
        );
        assert_eq!(
            field_of(SiteSpec {
                pages: 0,
                ..spec(65_000, 1)
            }),
            "pages"
        );
        assert_eq!(
            field_of(SiteSpec {
                object_hosts: 3,
                ..spec(65_000, 1)
            }),
            "object_hosts"
        );
        assert_eq!(field_of(spec(100, 0)), "page_bytes");
        assert_eq!(field_of(spec(2_000, 40)), "page_bytes");
        let bad_host = SiteSpec {
            hosts: vec!["www.lab:80".into()],
            object_hosts: 0,
            ..spec(65_000, 1)
        };
        assert_eq!(field_of(bad_host), "hosts");
    }

    #[test]
    fn urls_split_into_host_port_and_path() {
        assert_eq!(
            parse_http_url("http://S1.lab:8080/obj/0/1"),
            Some(("s1.lab".into(), 8080, "/obj/0/1".into()))
        );
        assert_eq!(
            parse_http_url("http://www.lab/page/0.html"),
            Some(("www.lab".into(), 80, "/page/0.html".into()))
        );
        assert_eq!(parse_http_url("https://www.lab/"), None);
        assert_eq!(parse_http_url("http://:80/"), None);
        assert_eq!(parse_http_url("http://a:x/"), None);
    }

    /// The bodies the origin served before the generator was shared, byte for byte.
    #[test]
    fn filler_is_what_it_was() {
        let mut out = Vec::new();
        fill_text(&mut out, 40, 12345);
        assert_eq!(out, b"anec2uclcmeenh3hr0x11w0i2q1moasxxsg2kwq3");
        assert_eq!(fnv1a(&gif_object(700, 99)), 944870733309577091);
    }
}
