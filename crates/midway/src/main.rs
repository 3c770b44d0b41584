//! The `midway` binary: parses the command line, sets up logging, and hands over to the libraries.
//! Everything that can be tested lives in the library crates; this file only wires them.
//! The `lab` subcommand exists with the `lab` feature (default); without it the binary is the
//! proxy alone (`proxy`, `check-config`, `status`, `peer`) and does not link the lab or its plotting.

#![forbid(unsafe_code)]

mod manual;
mod service;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

const ABOUT: &str = if cfg!(feature = "lab") {
    "A performance-enhancing proxy for TCP, and the lab that measures it"
} else {
    "A performance-enhancing proxy for TCP"
};

#[derive(Parser)]
#[command(name = "midway", version, about = ABOUT)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy until SIGTERM or SIGINT, then drain and exit. SIGHUP reloads the
    /// configuration file; SIGUSR2 starts this binary's file again with `--take-over` (a binary
    /// upgrade that a service manager follows).
    Proxy {
        /// Configuration file (TOML); see examples/.
        #[arg(long, short)]
        config: PathBuf,
        /// Print the nftables rules the configuration would install, and exit.
        #[arg(long)]
        print_nft: bool,
        /// Binary upgrade: take the listening sockets over from the midway running with the
        /// same spool directory, which then stops accepting and drains.
        #[arg(long, conflicts_with = "print_nft")]
        take_over: bool,
    },
    /// Validate a configuration file (and the running kernel's support for its profiles).
    CheckConfig {
        /// Configuration file (TOML).
        file: PathBuf,
    },
    /// The running proxy's open connections, both segments side by side (tcp_info of each),
    /// from its control socket; also drain or undrain a listener and close a connection.
    Status(StatusArgs),
    /// Another midway's side of the peer segment: keys for `transport = "tls"`.
    Peer {
        #[command(subcommand)]
        command: PeerCommand,
    },
    /// Write midway's man pages (roff: midway.1 and one per subcommand) into a folder; the
    /// package installs them.
    #[command(hide = true)]
    Manual {
        /// Folder for the pages (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// Emulated-network experiments (run as root).
    #[cfg(feature = "lab")]
    Lab {
        #[command(subcommand)]
        command: midway_lab::LabCommand,
    },
}

#[derive(clap::Args)]
struct StatusArgs {
    /// The control socket (default: $RUNTIME_DIRECTORY/control.sock when set, else
    /// /run/midway/control.sock).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// Print JSON (one object per line) for scripts; see docs/control-protocol.md.
    #[arg(long, global = true)]
    json: bool,
    /// A live view, redrawn every --interval until Ctrl-C (or --count frames).
    #[arg(long)]
    watch: bool,
    /// Seconds between the frames of --watch.
    #[arg(long, default_value_t = 2.0, requires = "watch", value_parser = parse_interval)]
    interval: f64,
    /// Stop --watch after this many frames.
    #[arg(long, requires = "watch")]
    count: Option<u64>,
    /// Order: age (oldest first), bytes (most first; with --watch the fastest first), client,
    /// srtt (largest of either segment first).
    #[arg(long, default_value = "bytes")]
    sort: midway_proxy::control::SortKey,
    /// Only clients in this prefix (10.1.0.0/24) or with this address.
    #[arg(long)]
    client: Option<midway_proxy::control::ClientFilter>,
    /// Only connections of this listener.
    #[arg(long)]
    listener: Option<String>,
    /// Only connections through this peer.
    #[arg(long)]
    peer: Option<String>,
    #[command(subcommand)]
    action: Option<StatusAction>,
}

#[derive(Subcommand)]
enum StatusAction {
    /// The listener refuses new connections (closed at once); open ones go on.
    Drain {
        /// The listener's name.
        listener: String,
    },
    /// The listener accepts new connections again.
    Undrain {
        /// The listener's name.
        listener: String,
    },
    /// End one connection with a reset toward both ends (ids: `midway status`).
    Close {
        /// The connection's id.
        id: u64,
    },
}

/// --interval: at least a tenth of a second, at most an hour.
fn parse_interval(text: &str) -> Result<f64, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if (0.1..=3600.0).contains(&seconds) {
        Ok(seconds)
    } else {
        Err("give between 0.1 and 3600 seconds".into())
    }
}

#[derive(Subcommand)]
enum PeerCommand {
    /// Write a new key pair (peer.key, readable by its owner only) and a self-signed
    /// certificate (peer.crt) into DIR for [tls], and print the fingerprint the other midways
    /// pin (their `fingerprint` or `peer_fingerprints`). Existing files are never overwritten.
    Keygen {
        /// Folder for peer.crt and peer.key (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// The certificate's common name (logs and tools show it; the pin is the key).
        #[arg(long, default_value = "midway")]
        name: String,
        /// How long the certificate is valid, e.g. "825d" or "10y"; a peer with an expired
        /// certificate is refused at the handshake.
        #[arg(long, default_value = "825d", value_parser = humantime::parse_duration)]
        valid_for: std::time::Duration,
    },
    /// Print the fingerprint of a certificate file (peer.crt).
    Fingerprint {
        /// PEM certificate file.
        cert: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("midway: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs on stderr: colours only on a terminal (never in a file, a pipe, journald or JSON, and
/// not with `NO_COLOR` set); without midway's own timestamp under systemd, whose journal stamps
/// every line (`JOURNAL_STREAM` names the stream it gave the service).
fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_env("MIDWAY_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let colour = matches!(format, LogFormat::Text)
        && std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none();
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match (format, journald) {
        (LogFormat::Text, false) => builder.init(),
        (LogFormat::Text, true) => builder.without_time().init(),
        (LogFormat::Json, _) => builder.json().init(),
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Proxy {
            config: path,
            print_nft,
            take_over,
        } => {
            let config = midway_proxy::load_config(&path)?;
            if print_nft {
                let rules = midway_proxy::nft_ruleset(&config);
                print!("{rules}");
                if !rules.ends_with('\n') {
                    println!();
                }
                return Ok(());
            }
            serve(config, path, take_over)
        }
        Command::CheckConfig { file } => {
            let config = midway_proxy::load_config(&file)?;
            midway_proxy::check_kernel_support(&config)?;
            println!("{}: ok", file.display());
            Ok(())
        }
        Command::Status(args) => status(args),
        Command::Peer { command } => peer(command),
        Command::Manual { out } => {
            use clap::CommandFactory;
            for page in manual::write_pages(Cli::command(), &out)? {
                println!("{}", page.display());
            }
            Ok(())
        }
        #[cfg(feature = "lab")]
        Command::Lab { command } => midway_lab::execute(command),
    }
}

/// `midway status`: the client, filters and views are midway-proxy's (`control`).
fn status(args: StatusArgs) -> anyhow::Result<()> {
    use midway_proxy::control::{self, Request, StatusOptions};
    use std::io::Write;
    let options = StatusOptions {
        socket: args.socket.unwrap_or_else(|| {
            midway_proxy::config::default_control_socket(
                std::env::var_os("RUNTIME_DIRECTORY").as_deref(),
            )
        }),
        json: args.json,
        filter: control::Filter {
            client: args.client,
            listener: args.listener,
            peer: args.peer,
        },
        sort: args.sort,
        timeout: std::time::Duration::from_secs(10),
    };
    let text = match args.action {
        Some(StatusAction::Drain { listener }) => {
            control::command_text(&options, Request::Drain { listener })?
        }
        Some(StatusAction::Undrain { listener }) => {
            control::command_text(&options, Request::Undrain { listener })?
        }
        Some(StatusAction::Close { id }) => control::command_text(&options, Request::Close { id })?,
        None if args.watch => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            let interval = std::time::Duration::from_secs_f64(args.interval);
            let stop = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            let mut out = std::io::stdout();
            runtime.block_on(control::watch(
                &options,
                interval,
                args.count,
                control::terminal_rows(),
                stop,
                &mut out,
            ))?;
            return Ok(());
        }
        None => control::status_text(&options)?,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

fn peer(command: PeerCommand) -> anyhow::Result<()> {
    match command {
        PeerCommand::Keygen {
            out,
            name,
            valid_for,
        } => {
            let identity = midway_tls::generate_identity(&name, valid_for)?;
            let midway_tls::IdentityPaths { cert, key } =
                midway_tls::write_identity(&out, &identity)?;
            println!("certificate: {}", cert.display());
            println!("private key: {}", key.display());
            println!("fingerprint: {}", identity.fingerprint);
            println!(
                "On this midway: [tls] cert = {:?}, key = {:?}. On the other midway: this \
                 fingerprint as its [[peers]] fingerprint (an edge) or in its peer listener's \
                 peer_fingerprints (a gateway).",
                cert.display().to_string(),
                key.display().to_string()
            );
            Ok(())
        }
        PeerCommand::Fingerprint { cert } => {
            use midway_tls::rustls::pki_types::{pem::PemObject, CertificateDer};
            let der = CertificateDer::from_pem_file(&cert).with_context(|| {
                format!("cannot read a PEM certificate from {}", cert.display())
            })?;
            println!("{}", midway_tls::Fingerprint::of_certificate(&der)?);
            Ok(())
        }
    }
}

/// Runs the proxy on a multi-threaded runtime until a termination signal, then drains. SIGHUP
/// reads `path` again and reloads; a file that does not load is logged and the running
/// configuration stays.
fn serve(
    config: midway_proxy::config::RuntimeConfig,
    path: PathBuf,
    take_over: bool,
) -> anyhow::Result<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.worker_threads {
        builder.worker_threads(threads);
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        // Handlers are registered before anything is bound or installed, so a SIGTERM that
        // arrives during the start (a supervisor stopping midway at once, a test) is taken
        // once serving begins and still ends in a clean drain and removal, not a kill.
        let signals = termination_signals().context("cannot install signal handlers")?;
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot install signal handlers")?;
        let mut registry = prometheus_client::registry::Registry::default();
        let proxy = if take_over {
            service::take_over(config, &mut registry).await?
        } else {
            midway_proxy::Proxy::bind(config, &mut registry).await?
        };
        service::ready(take_over);
        service::spawn_watchdog();
        service::upgrade_on_signal().context("cannot install signal handlers")?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let signal_token = shutdown.clone();
        tokio::spawn(async move {
            signals.await;
            tracing::info!("termination signal received: stop accepting, draining");
            service::stopping();
            signal_token.cancel();
        });
        let handle = proxy.handle();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::info!(file = %path.display(), "SIGHUP: reloading the configuration");
                service::reloading();
                match midway_proxy::load_config(&path) {
                    // The proxy logs the outcome, applied or refused.
                    Ok(config) => {
                        let _ = handle.reload(config).await;
                    }
                    Err(error) => tracing::error!(
                        error = format!("{error:#}"),
                        "reload refused: the configuration file does not load; the running configuration stays"
                    ),
                }
                service::reloaded();
            }
        });
        let summary = proxy.run(shutdown).await?;
        tracing::info!(?summary, "midway stopped");
        anyhow::Ok(())
    })
}

/// Registers SIGTERM and SIGINT handlers now and returns a future that resolves on either.
fn termination_signals() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
