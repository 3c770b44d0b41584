//! Headless Chromium as a real browser client: the command line, and the page load time read
//! back from its output.
//!
//! How the load time gets out without a DevTools client: the origin's base document carries a
//! tiny inline script that, at the load event, writes navigation start -> load event end (ms)
//! into the document title (`midway-plt:<ms>`). `chromium --headless --dump-dom URL` waits
//! for the page's load event, lets the script's timer run, and prints the serialized DOM on
//! stdout, title included (verified with Chromium 156 on Debian 12; see the tests). With
//! `--timeout` Chromium stops a load that takes too long; the title then has no time and
//! [`parse_chromium_output`] says so.
//!
//! Chromium also writes its net log (`netlog.json`) into the profile directory: which
//! connections it opened, when, and for which host, the evidence for how it uses a proxy.
//!
//! The lab spawns the command itself, in the client's network namespace.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::WebError;
use crate::site::TIMING_TITLE_PREFIX;

/// Where Debian's `chromium` package puts the browser.
pub const CHROMIUM_PATH: &str = "/usr/bin/chromium";

/// One page load by Chromium.
#[derive(Debug, Clone)]
pub struct BrowserSpec {
    /// Page to load, e.g. `http://www.lab/page/0.html`.
    pub url: String,
    /// Explicit HTTP proxy. With names in `resolve`, only requests to those names go through
    /// it (a PAC script says so) and every other name fails to resolve, exactly as without a
    /// proxy: Chromium's own background requests (network time, account and update checks)
    /// then never reach the proxy or the access link. With `resolve` empty (tests on loopback
    /// names, which a PAC script cannot route), every request goes through it.
    pub proxy: Option<SocketAddr>,
    /// The site's host names -> addresses: resolved by Chromium when there is no proxy, routed
    /// to the proxy when there is one; every other name fails to resolve.
    pub resolve: BTreeMap<String, IpAddr>,
    /// A new, empty directory: Chromium's profile, so its cache starts empty.
    pub user_data_dir: PathBuf,
    /// Chromium stops the load after this long.
    pub timeout: Duration,
}

/// The command loading `spec.url` once and printing the DOM (with the load time) on stdout.
/// stdin is null and stdout piped; stderr (Chromium is chatty there) is left to the caller.
/// The browser runs in a new process group whose id is its pid, so a caller that must stop it
/// early can end it and all its helper processes at once with `kill(-pid, SIGKILL)`.
pub fn chromium_command(spec: &BrowserSpec) -> Command {
    let mut command = Command::new(CHROMIUM_PATH);
    command.process_group(0);
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ]);
    command.arg(format!("--user-data-dir={}", spec.user_data_dir.display()));
    command.arg(format!("--timeout={}", spec.timeout.as_millis().max(1)));
    command.arg(format!(
        "--log-net-log={}",
        spec.user_data_dir.join("netlog.json").display()
    ));
    match spec.proxy {
        Some(proxy) if spec.resolve.is_empty() => {
            command.arg(format!("--proxy-server=http://{proxy}"));
            // Chromium bypasses proxies for loopback names by default; a test whose pages are
            // on loopback names still wants every request to go through the proxy.
            command.arg("--proxy-bypass-list=<-loopback>");
        }
        Some(proxy) => {
            command.arg(format!(
                "--proxy-pac-url={}",
                pac_data_url(proxy, &spec.resolve)
            ));
            // The rules apply to IP literals too: the proxy's own address must stay itself.
            command.arg(format!(
                "--host-resolver-rules={}, EXCLUDE {}",
                resolver_rules(&spec.resolve),
                host_text(proxy.ip())
            ));
        }
        None => {
            command.arg(format!(
                "--host-resolver-rules={}",
                resolver_rules(&spec.resolve)
            ));
        }
    }
    command.arg("--dump-dom").arg(&spec.url);
    command.stdin(Stdio::null()).stdout(Stdio::piped());
    command
}

/// A PAC script, as a `data:` URL, sending requests for the names of `resolve` to `proxy` and
/// every other request direct.
fn pac_data_url(proxy: SocketAddr, resolve: &BTreeMap<String, IpAddr>) -> String {
    let names: Vec<String> = resolve
        .keys()
        .map(|name| format!("\"{}\"", name.to_ascii_lowercase()))
        .collect();
    let script = format!(
        "function FindProxyForURL(url, host) {{ \
         var site = [{}]; \
         return site.indexOf(host.toLowerCase()) >= 0 ? \"PROXY {proxy}\" : \"DIRECT\"; }}",
        names.join(", ")
    );
    format!(
        "data:application/x-ns-proxy-autoconfig,{}",
        percent_encode(&script)
    )
}

/// Every byte but ASCII letters and digits as `%XX`: what a `data:` URL may carry unescaped
/// differs between parsers, this form every one reads.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => char::from(byte).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// `MAP name addr` for every entry, then every other name fails at once instead of asking DNS.
fn resolver_rules(resolve: &BTreeMap<String, IpAddr>) -> String {
    let mut rules: Vec<String> = resolve
        .iter()
        .map(|(name, addr)| format!("MAP {name} {}", host_text(*addr)))
        .collect();
    rules.push("MAP * ~NOTFOUND".into());
    rules.join(", ")
}

/// An address as Chromium writes a host: IPv6 in brackets.
fn host_text(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The page load time in seconds (navigation start -> load event end) from the DOM Chromium
/// printed.
pub fn parse_chromium_output(stdout: &str) -> Result<f64, WebError> {
    let marker = format!("<title>{TIMING_TITLE_PREFIX}");
    let start = stdout.find(&marker).ok_or(WebError::ChromiumNoTiming)? + marker.len();
    let rest = &stdout[start..];
    let text = &rest[..rest.find('<').unwrap_or(rest.len())];
    match text.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && ms >= 0.0 => Ok(ms / 1000.0),
        _ => Err(WebError::ChromiumBadTiming {
            text: text.chars().take(40).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    #[test]
    fn timing_is_read_from_the_title() {
        let dom = "<html><head><title>midway-plt:1234.5</title><script>s('midway-plt:'+v)</script>";
        assert_eq!(parse_chromium_output(dom).unwrap(), 1.2345);
        assert!(matches!(
            parse_chromium_output("<title>midway page 0</title>"),
            Err(WebError::ChromiumNoTiming)
        ));
        assert!(matches!(
            parse_chromium_output("<title>midway-plt:NaN</title>"),
            Err(WebError::ChromiumBadTiming { .. })
        ));
        assert!(matches!(
            parse_chromium_output("<title>midway-plt:-3</title>"),
            Err(WebError::ChromiumBadTiming { .. })
        ));
    }

    #[test]
    fn command_maps_names_or_uses_the_proxy() {
        let mut resolve = BTreeMap::new();
        resolve.insert("www.lab".to_string(), IpAddr::from([10, 0, 0, 2]));
        resolve.insert("s1.lab".to_string(), IpAddr::V6(Ipv6Addr::LOCALHOST));
        let spec = BrowserSpec {
            url: "http://www.lab/page/0.html".into(),
            proxy: None,
            resolve,
            user_data_dir: "/tmp/profile".into(),
            timeout: Duration::from_secs(30),
        };
        let args = |command: &Command| -> Vec<String> {
            command
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let direct = args(&chromium_command(&spec));
        assert!(direct.contains(
            &"--host-resolver-rules=MAP s1.lab [::1], MAP www.lab 10.0.0.2, MAP * ~NOTFOUND"
                .to_string()
        ));
        assert!(direct.contains(&"--user-data-dir=/tmp/profile".to_string()));
        assert!(direct.contains(&"--timeout=30000".to_string()));
        assert_eq!(direct.last().unwrap(), "http://www.lab/page/0.html");
        assert!(!direct.iter().any(|a| a.starts_with("--proxy-server")));

        // A proxy for the site's names only: a PAC script routes them, every other name
        // fails to resolve as without a proxy.
        let site_proxied = BrowserSpec {
            proxy: Some("10.1.0.1:3128".parse().unwrap()),
            ..spec.clone()
        };
        let site_proxied = args(&chromium_command(&site_proxied));
        assert!(!site_proxied.iter().any(|a| a.starts_with("--proxy-server")));
        let pac = site_proxied
            .iter()
            .find_map(|a| a.strip_prefix("--proxy-pac-url=data:application/x-ns-proxy-autoconfig,"))
            .expect("a PAC script");
        let pac = percent_decode(pac);
        assert!(
            pac.contains(r#"var site = ["s1.lab", "www.lab"];"#),
            "{pac}"
        );
        assert!(pac.contains(r#""PROXY 10.1.0.1:3128" : "DIRECT""#), "{pac}");
        assert!(site_proxied.contains(
            &"--host-resolver-rules=MAP s1.lab [::1], MAP www.lab 10.0.0.2, MAP * ~NOTFOUND, \
              EXCLUDE 10.1.0.1"
                .to_string()
        ));

        // No names: every request through the proxy, loopback names included.
        let proxied = BrowserSpec {
            proxy: Some("10.1.0.1:3128".parse().unwrap()),
            resolve: BTreeMap::new(),
            ..spec
        };
        let proxied = args(&chromium_command(&proxied));
        assert!(proxied.contains(&"--proxy-server=http://10.1.0.1:3128".to_string()));
        assert!(proxied.contains(&"--proxy-bypass-list=<-loopback>".to_string()));
        assert!(!proxied
            .iter()
            .any(|a| a.starts_with("--host-resolver-rules") || a.starts_with("--proxy-pac")));
        for flag in [
            "--headless",
            "--no-sandbox",
            "--disable-quic",
            "--disable-sync",
        ] {
            assert!(proxied.contains(&flag.to_string()), "{flag} missing");
        }
    }

    fn percent_decode(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }
}
